"""``tiersim validate``: prints each case, the mean and max error, and fails above a case's tolerance.

Three tables: mechanism figures, the throughput of published training runs in both FLOP conventions
(model FLOPs / MFU, hardware FLOPs incl. recompute / HFU; the source's own convention is the one compared),
and verdicts (fits / does not fit). A case marked as a known gap is listed with its reason and does not
fail the command; any other case outside its tolerance does (exit 1).

``--llm-foundry``: instead, the held-out check against every 8-GPU bf16 row of llm-foundry's benchmark tables
(:mod:`tiersim.validate_table`): the MFU error per row and per group, no tolerance (exit 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from planner.result_json import versioned
from reports.units import pct, table
from tiersim.command import Command
from tiersim.exit_codes import EXIT_FAILED, EXIT_OK
from tiersim.validate import Outcome, run_cases
from tiersim.validate_runs import published_both
from tiersim.validate_table import TableOutcome, group_summaries, load_rows, simulate_rows


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--llm-foundry", action="store_true",
                   help="held-out check: simulate every 8-GPU bf16 row of llm-foundry's MPT benchmark tables "
                        "(tiersim/published/llm_foundry_8gpu.csv) and print the MFU error per row and per group")


def _status(o: Outcome) -> str:
    if o.case.known_gap:
        return "known gap" if not o.ok else "FIXED? (retire the known gap)"
    return "ok" if o.ok else "FAIL"


def _json(o: Outcome) -> dict[str, Any]:
    d: dict[str, Any] = {"name": o.case.name, "kind": o.case.kind, "source": o.case.source,
                         "published": o.case.published, "simulated": o.simulated, "unit": o.case.unit,
                         "error": o.error, "tolerance": o.case.tolerance, "ok": o.ok, "note": o.case.note,
                         "known_gap": o.case.known_gap or None}
    run = o.case.run
    if run is not None and run.flops is not None and o.figures is not None:
        mfu, hfu, converted = published_both(run)
        d.update(convention=run.convention, flop_formula=run.flops.name, published_mfu=mfu, published_hfu=hfu,
                 published_converted=converted or None, simulated_mfu=o.figures.mfu, simulated_hfu=o.figures.hfu,
                 simulated_tflops_per_gpu=o.figures.model_tflops, simulated_hw_tflops_per_gpu=o.figures.hw_tflops)
    if run is not None and run.flops is None:
        d["why"] = o.why or None
    return d


def _figure_rows(outcomes: list[Outcome]) -> list[list[str]]:
    return [[o.case.name, f"{o.case.published:.4g}", f"{o.simulated:.4g}", o.case.unit, f"{o.error * 100:+.1f}%",
             f"±{o.case.tolerance * 100:g}%", _status(o)] for o in outcomes]


def _throughput_rows(outcomes: list[Outcome]) -> list[list[str]]:
    rows = []
    for o in outcomes:
        run, f = o.case.run, o.figures
        assert run is not None and f is not None
        mfu, hfu, converted = published_both(run)
        rows.append([o.case.name, run.convention, pct(mfu) + ("*" if converted == "mfu" else ""), pct(f.mfu),
                     pct(hfu) + ("*" if converted == "hfu" else ""), pct(f.hfu), f"{f.model_tflops:,.1f}",
                     f"{f.hw_tflops:,.1f}", f"{o.error * 100:+.1f}%", f"±{o.case.tolerance * 100:g}%",
                     _status(o) + ("" if f.result is None or f.result.feasible else " (does not fit)")])
    return rows


def _verdict_rows(outcomes: list[Outcome]) -> list[list[str]]:
    def word(x: float) -> str:
        return "fits" if x else "does not fit"
    return [[o.case.name, word(o.case.published), word(o.simulated), _short(o.why) or "-", _status(o)]
            for o in outcomes]


def _short(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _print_text(outcomes: list[Outcome]) -> None:
    by_kind = {k: [o for o in outcomes if o.case.kind == k] for k in ("figure", "throughput", "verdict")}
    print("Mechanisms against published figures")
    print(table(_figure_rows(by_kind["figure"]), ["case", "published", "simulated", "unit", "error", "tolerance", ""],
                "lrrlrrl"))
    if by_kind["throughput"]:
        print()
        print("Throughput of published training runs (per GPU; compared in the source's convention: model = "
              "MFU, no recompute; hardware = HFU, recompute included; * = converted with the source's formula)")
        print(table(_throughput_rows(by_kind["throughput"]),
                    ["run", "compared", "MFU pub", "MFU sim", "HFU pub", "HFU sim", "TFLOP/s sim", "HW TFLOP/s sim",
                     "error", "tolerance", ""], "llrrrrrrrrl"))
    if by_kind["verdict"]:
        print()
        print("Verdicts of published training runs (exact)")
        print(table(_verdict_rows(by_kind["verdict"]), ["run", "published", "simulated", "why not", ""], "lllll"))
    print()
    for o in outcomes:
        extra = f" ({o.case.note})" if o.case.note else ""
        print(f"- {o.case.name}: {o.case.source}{extra}")
        if o.case.run is not None and o.case.run.overrides:
            print(f"    hardware: {o.case.run.hw} --set {' '.join(o.case.run.overrides)} ({o.case.run.hw_note})")
        if o.case.run is not None and o.case.run.flops is not None:
            print(f"    FLOP convention: {o.case.run.flops.name}")
        if o.why:
            print(f"    simulated: {o.why}")
        if o.case.known_gap:
            print(f"    known gap: {o.case.known_gap}")


def _table_json(outcomes: list[TableOutcome]) -> dict[str, Any]:
    rows = [{"row": o.row.label, "table": o.row.table, "gpu": o.row.gpu, "model": o.row.model, "seq_len": o.row.seq_len,
             "micro_batch": o.row.micro_batch, "grad_accum": o.row.grad_accum, "checkpointing": o.row.checkpointing,
             "published_mfu": o.row.mfu, "simulated_mfu": o.simulated_mfu, "fits": o.fits,
             "error": o.error if o.fits else None, "role": o.row.role} for o in outcomes]
    groups = [{"group": g.name, "rows": g.n, "median_error": g.median, "mean_abs_error": g.mean_abs,
               "min_error": g.low, "max_error": g.high, "does_not_fit": g.infeasible}
              for g in group_summaries(outcomes)]
    return {"rows": rows, "groups": groups}


def run_table(args: argparse.Namespace) -> int:
    rows = load_rows()
    show = sys.stderr.isatty()

    def progress(i: int, n: int, label: str) -> None:
        if show and i % 20 == 0:
            print(f"[{i}/{n}] {label}", file=sys.stderr, flush=True)

    outcomes = simulate_rows(rows, progress)
    if args.json:
        print(json.dumps(versioned(_table_json(outcomes)), indent=1))
        return EXIT_OK
    print("llm-foundry MPT benchmarks, every 8-GPU bf16 row (tiersim/published/llm_foundry_8gpu.csv; + = simulated "
          "faster than published)")
    print(table([[o.row.label, pct(o.row.mfu), pct(o.simulated_mfu) if o.fits else "does not fit",
                  f"{o.error * 100:+.1f}%" if o.fits else "-", o.row.role]
                 for o in outcomes], ["row", "MFU pub", "MFU sim", "error", ""], "lrrrl"))
    print()
    print(table([[g.name, str(g.n), f"{g.median * 100:+.1f}%", f"{g.mean_abs * 100:.1f}%",
                  f"{g.low * 100:+.1f}% .. {g.high * 100:+.1f}%", str(g.infeasible)]
                 for g in group_summaries(outcomes)],
                ["group", "rows", "median error", "mean |error|", "range", "does not fit"], "lrrrrr"))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.llm_foundry:
        return run_table(args)
    outcomes = run_cases()
    errors = [abs(o.error) for o in outcomes if o.case.kind != "verdict"]
    outside = [o for o in outcomes if not o.ok]
    unexpected = [o for o in outcomes if not o.expected]
    if args.json:
        print(json.dumps(versioned({"cases": [_json(o) for o in outcomes], "mean_abs_error": statistics.fmean(errors),
                                    "max_abs_error": max(errors), "failed": len(outside),
                                    "unexpected": len(unexpected)}), indent=1))
    else:
        _print_text(outcomes)
        print()
        gaps = sum(1 for o in outside if o.case.known_gap)
        print(f"mean |error| {statistics.fmean(errors) * 100:.1f}%, max |error| {max(errors) * 100:.1f}% "
              f"(figures and throughput); {len(outside)} of {len(outcomes)} outside tolerance "
              f"({gaps} known gap(s), {len(unexpected)} unexpected)")
    return EXIT_FAILED if unexpected else EXIT_OK


COMMAND = Command("validate", "compare the simulator with published figures and training runs", add_args, run)
