"""``tiersim whatif``: plan a job on a grid of hardware changes; rank the single changes.

    tiersim whatif --hw a100x8 --model 70b --vary host.dram=512GB,1TB,2TB --vary pcie.gen=4,5 --vary nvme.count=1,4
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from planner.result_json import dumps
from tiersim import deepspeed_cli as ds_cli
from tiersim.command import Command
from tiersim.exit_codes import EXIT_CUT
from tiersim.job_flags import (
    DEFAULT_HW,
    DEFAULT_MODEL,
    SEARCH,
    add_deepspeed_flag,
    add_hardware_flags,
    add_model_flag,
    add_workload_flags,
    request_from_args,
)
from tiersim.search_flags import (
    add_search_args,
    fmt_rate,
    progress_printer,
    search_exit,
    search_options,
    split_names,
)


def fmt_gain(x: float | None) -> str:
    if x is None:
        return "-"
    return "0.0%" if abs(x) < 5e-4 else f"{x * 100:+.1f}%"


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Plan the job on every combination of hardware changes (the cartesian product of the "
                     "--vary values) and rank each single change from the hardware as given.")
    p.epilog = ("example: tiersim whatif --hw a100x8 --model 70b --vary host.dram=512GB,1TB,2TB "
                "--vary pcie.gen=4,5 --vary nvme.count=1,4.  exit codes: 0 some scenario is feasible, "
                "2 bad input, 3 no scenario is feasible, 4 not settled: none is known to be feasible and the "
                "budget cut a search before it proved that none is")
    add_hardware_flags(p, SEARCH)
    add_model_flag(p, SEARCH)
    p.add_argument("--vary", action="append", default=[], metavar="PATH=V1,V2,...",
                   help="a hardware field and the values it takes (repeatable; paths as in --set)")
    p.add_argument("--policies", default=None, metavar="P1,P2,...",
                   help="comma-separated policies to search (default: all)")
    add_workload_flags(p, SEARCH)
    add_deepspeed_flag(p)
    add_search_args(p, "whatif", "the whole what-if (each machine still to plan gets an equal share of what is "
                               "left; machines it cut are searched again, exactly, with the time left at the end)")


def rate(b: Any) -> str:
    """A Best's tokens/s, with '*' when its search was cut short (the throughput is not proven the best)."""
    return fmt_rate(b.tokens_per_s) + ("*" if b.cut_short and b.feasible else "")


def run(args: argparse.Namespace) -> int:
    from planner.whatif import parse_vary, whatif
    from reports.units import table

    ds = ds_cli.apply_deepspeed(args, DEFAULT_HW, DEFAULT_MODEL, sets_policy=False)
    if ds is not None:
        ds_cli.print_mapping(ds, to_stderr=True)
    axes = [parse_vary(v) for v in args.vary]
    policies = split_names(args.policies, "--policies", "none,tinypipe") if args.policies else None
    out = whatif(args.hw, args.model, axes, request=request_from_args(args), hw_overrides=args.sets,
                 objective=args.objective, policies=policies, progress=progress_printer(args),
                 **search_options(args))
    any_feasible = out.base.feasible or any(s.best.feasible for s in out.scenarios)
    bests = [out.base, *(x.best for x in out.scenarios), *(x.best for x in out.sensitivity)]
    rc = search_exit(any_feasible, any(b.cut_short and not b.feasible for b in bests))
    print(f"tiersim whatif: {out.wall_s:.1f} s wall, {out.n_searches} searches", file=sys.stderr)
    if args.json:
        print(dumps(out.to_dict()))
        return rc
    b = out.base
    print(f"tiersim whatif: {out.model} on {out.hardware}; {len(out.scenarios)} scenario"
          f"{'s' if len(out.scenarios) != 1 else ''}, {out.n_searches} distinct machines planned")
    base_what = (f"{b.policy}, {rate(b)} tokens/s, "
                 f"{b.tflops_per_gpu:.1f} TFLOP/s per GPU"
                 if b.feasible else f"infeasible ({b.binding})")
    print(f"base (hardware as given{', with --set' if args.sets else ''}): {base_what}")
    if axes:
        paths = [a.path for a in axes]
        rows = []
        for s in out.scenarios:
            r = s.best
            gain = r.tokens_per_s / b.tokens_per_s - 1 if r.tokens_per_s is not None and b.tokens_per_s else None
            vs = fmt_gain(gain) if r.feasible else "-"
            rows.append([*(s.changes[p] for p in paths), r.policy or "-", "yes" if r.feasible else "no",
                         rate(r), "-" if r.tflops_per_gpu is None else f"{r.tflops_per_gpu:.1f}",
                         vs, r.binding or ""])
        print()
        print(table(rows, [*paths, "best policy", "feasible", "tokens/s", "TFLOP/s/GPU", "vs base", "binding"],
                    "l" * len(paths) + "lrrrrl"))
        print()
        print("sensitivity: each single change from the base")
        srows = [[s.change, rate(s.base), rate(s.best), fmt_gain(s.gain),
                  "yes" if s.makes_feasible else "", s.best.policy or f"infeasible ({s.best.binding})"]
                 for s in out.sensitivity]
        if srows:
            print(table(srows, ["change", "base tokens/s", "tokens/s", "gain", "makes feasible", "best policy"],
                        "lrrrll"))
        else:
            print("  (none: every value equals the base's)")
    for note in out.notes:
        print(f"  note: {note}")
    if any(b.cut_short and b.feasible for b in bests):
        print("* feasible, but the search was cut short by its bounds: the throughput may not be the best")
    if any(b.binding == "budget" for b in bests):
        print("budget: the bounds cut the search before it found a plan or proved that none fits")
    if rc == EXIT_CUT:
        print("NOT SETTLED (exit 4): no machine is known to fit the job, and the budget cut a search before it "
              "proved that none does")
    return rc


COMMAND = Command("whatif", "plan a job on a grid of hardware changes; rank each single change", add_args, run)
