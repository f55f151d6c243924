"""``tiersim results STORE``: list, filter or export the runs of a sweep store.

    tiersim results sweep.sqlite                                   # a table of every run
    tiersim results sweep.sqlite --where "feasible and model == 'gpt2'" --where "tokens_per_s > 5e4"
    tiersim results sweep.sqlite --status failed                   # the failures with their errors
    tiersim results sweep.sqlite --csv runs.csv                    # every column, for a spreadsheet
    tiersim results sweep.sqlite --json                            # one JSON object, one row per run

``--where`` is a row filter over the columns of ``planner.sweep.store.COLUMNS`` (hardware, hw_set, model,
policy, knobs, global_batch, micro_batch, seq_len, precision, checkpointing, status, feasible, tokens_per_s,
step_time_s, tflops_per_gpu, mfu, peak_gpu_bytes, ...) in a grammar of its own (``tiersim.row_filter``:
FIELD OP VALUE, ``in (...)``, ``and``/``or``/``not``, parentheses), parsed here and never handed to Python;
several are combined with "and".
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from planner.result_json import versioned
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_OK
from tiersim.output_files import check_output_path, write_or_fail


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = "List, filter or export the runs stored by `tiersim sweep`."
    p.add_argument("store", metavar="STORE", help="the SQLite file written by tiersim sweep --store")
    p.add_argument("--where", action="append", default=[], metavar="EXPR",
                   help="keep rows where this holds: FIELD OP VALUE (== != < <= > >=), FIELD in (A, B), and/or/not, "
                        "parentheses, e.g. \"feasible and policy == 'none'\"")
    p.add_argument("--status", choices=["done", "failed", "all"], default="all", help="which runs (default: all)")
    p.add_argument("--csv", default=None, metavar="FILE", help="write the selected rows, every column, as CSV")
    p.add_argument("--json", action="store_true", help="print one JSON object with the selected rows")


def select(store: str, where: list[str], status: str) -> Any:
    """The store's DataFrame filtered by ``status`` and every ``--where`` query (bad query: UsageError)."""
    from planner.sweep import StoreError, results_frame
    from planner.sweep.store import column_kinds
    from tiersim.row_filter import WhereError, filter_frame

    try:
        frame = results_frame(store)
    except StoreError as e:
        raise UsageError(str(e)) from None
    if status != "all":
        frame = frame[frame["status"] == status]
    for expr in where:
        if not expr.strip():
            raise UsageError("--where: empty expression; give e.g. --where \"policy == 'none'\"")
        try:
            frame = filter_frame(frame, expr, column_kinds())
        except WhereError as e:
            raise UsageError(f"--where {expr!r}: {' '.join(str(e).split())}") from None
    return frame.reset_index(drop=True)


def run(args: argparse.Namespace) -> int:
    check_output_path("--csv", args.csv)
    frame = select(args.store, args.where, args.status)
    if args.csv:
        write_or_fail("--csv", args.csv, lambda path: frame.to_csv(path, index=False))
    if args.json:
        rows = [{k: _plain(v) for k, v in r.items()} for r in frame.to_dict(orient="records")]
        print(json.dumps(versioned({"kind": "tiersim.results", "store": args.store, "count": len(rows),
                                    "rows": rows}), indent=1))
    elif args.csv:
        print(f"{len(frame)} run{'s' if len(frame) != 1 else ''} written to {args.csv}")
    else:
        print(format_table(frame, args.store))
    return EXIT_OK


def _plain(v: Any) -> Any:
    """numpy / pandas scalars to JSON values; NaN and NA to null."""
    if v is None:
        return None
    try:
        import pandas as pd

        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def format_table(frame: Any, store: str) -> str:
    from reports.units import pct, secs, table

    header = ["hardware", "model", "policy", "knobs", "batch", "seq", "prec", "ckpt", "verdict", "step",
              "tokens/s", "TFLOP/s/GPU", "MFU", "HFU", "GPU peak GB"]
    rows = []
    failures = []
    for r in frame.to_dict(orient="records"):
        hw = r["hardware"] + (f" ({r['hw_set']})" if r["hw_set"] else "")
        batch = f"{_int(r['global_batch'])}/{_int(r['micro_batch'])}"
        cells = [hw, r["model"], r["policy"], r["knobs"] or "-", batch, _int(r["seq_len"]),
                 _text(r["precision"]), _text(r["checkpointing"])]
        if r["status"] == "failed":
            failures.append(f"  {hw} {r['model']} {r['policy']} {r['knobs']}: {r['error']}")
            rows.append([*cells, "FAILED", *["-"] * 6])
            continue
        verdict = "feasible" if r["feasible"] else f"OOM {r['oom_pool']}"
        simulated = _plain(r["step_time_s"]) is not None
        rows.append([*cells, verdict,
                     secs(r["step_time_s"]) if simulated else "-",
                     f"{r['tokens_per_s']:,.0f}" if simulated else "-",
                     f"{r['tflops_per_gpu']:,.1f}" if simulated else "-",
                     pct(r["mfu"]) if simulated else "-",
                     pct(r["hfu"]) if simulated and _plain(r.get("hfu")) is not None else "-",
                     f"{r['peak_gpu_bytes'] / 1e9:,.1f}" if _plain(r["peak_gpu_bytes"]) is not None else "-"])
    n_failed = len(failures)
    lines = [f"{store}: {len(rows)} runs ({len(rows) - n_failed} done, {n_failed} failed)"]
    if rows:
        lines.append(table(rows, header, align="llll" + "r" * 11))
    if failures:
        lines.append("failed:")
        lines.extend(failures)
    lines.append("batch: global/micro-batch; OOM POOL: the pool that overflows (simulated or the policy's "
                 "estimate); --csv or --json for every column")
    return "\n".join(lines)


def _int(v: Any) -> str:
    v = _plain(v)
    return "-" if v is None else str(int(v))


def _text(v: Any) -> str:
    v = _plain(v)
    return "-" if v is None else str(v)


COMMAND = Command("results", "list, filter or export the runs of a sweep store (table, --csv, --json)", add_args, run)
