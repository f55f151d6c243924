"""``tiersim sweep sweep.yaml``: simulate a grid of points into a resumable SQLite store.

    tiersim sweep examples/sweep.yaml                         # local process pool, store sweep.sqlite
    tiersim sweep examples/sweep.yaml --store runs.sqlite --workers 4          # a local Dask cluster
    tiersim sweep examples/sweep.yaml --scheduler tcp://10.0.0.5:8786         # a running Dask cluster
    tiersim sweep examples/sweep.yaml --nodes 4        # every hardware entry as 4 nodes (set: {nodes: N})

A ``nodes`` axis is a hardware entry's ``set``: ``{preset: a100x8, set: {nodes: [1, 2, 4]}}``.

Run it again to resume: points already stored (done or failed) are skipped; ``--retry-failed`` reruns the
failed ones. Exit codes: 0 every point of the grid is stored as done, 1 some failed (listed; or the
executor broke down mid-way), 2 bad input, 130 interrupted (Ctrl-C) or 143 terminated (SIGTERM): what
finished is stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner.result_json import versioned
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_FAILED, EXIT_OK
from tiersim.job_flags import add_nodes_flag
from tiersim.signals import keeping

SHOW_FAILURES = 10


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Simulate every point of a sweep file (hardware x models x policies x knobs x workload) "
                     "into a SQLite store; a rerun computes only what the store lacks.")
    p.epilog = ("exit codes: 0 all points done, 1 some failed (or the executor broke down), 2 bad input, "
                "130 interrupted; see examples/sweep.yaml for the file format")
    p.add_argument("grid", metavar="SWEEP.yaml", help="the sweep file")
    p.add_argument("--store", default=None,
                   help="the SQLite results file (default: SWEEP.sqlite in the current directory)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--processes", type=int, default=None, metavar="N",
                       help="size of the local process pool (default: the CPUs available; 1 = serial)")
    where.add_argument("--workers", type=int, default=None, metavar="N",
                       help="start a local Dask cluster of N worker processes (needs the dask extra)")
    where.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                       help="run on the Dask cluster whose scheduler is at this address")
    p.add_argument("--retry-failed", action="store_true", help="run points stored as failed again")
    p.add_argument("--progress", action="store_true",
                   help="show the progress line on stderr even when it is not a terminal")
    p.add_argument("--json", action="store_true", help="print one JSON object (the summary and the failures)")
    add_nodes_flag(p)


def read_grid_file(path: str) -> object:
    """The sweep file, read as ``load_grid`` reads it (``userfiles``: size, UTF-8, keys, depth, numbers)."""
    import userfiles
    from planner.sweep import SweepFileError

    try:
        return userfiles.read_yaml(Path(path), "sweep")
    except userfiles.UserFileError as e:
        raise SweepFileError(str(e)) from e


def with_nodes(data: object, nodes: int, label: str) -> object:
    """The sweep file's mapping with ``nodes: N`` added to every hardware entry's ``set`` (``--nodes N``); an entry
    that sets ``nodes`` itself is refused as given twice. Anything malformed is left for the grid's own checks."""
    if not isinstance(data, dict) or "hardware" not in data:
        return data
    entries = data["hardware"] if isinstance(data["hardware"], list) else [data["hardware"]]
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"preset": entry, "set": {}}
        if isinstance(entry, dict) and isinstance(entry.get("set") or {}, dict):
            sets = dict(entry.get("set") or {})
            if "nodes" in sets:
                raise UsageError(f"{label}: hardware[{i}].set.nodes and --nodes are both given; give one")
            entry = {**entry, "set": {**sets, "nodes": nodes}}
        out.append(entry)
    return {**data, "hardware": out}


def run(args: argparse.Namespace) -> int:
    from planner.sweep import (
        StoreError,
        SweepAborted,
        SweepFileError,
        SweepSetupError,
        expand_grid,
        load_grid,
        read_failures,
        run_sweep,
    )

    if not args.grid.strip():
        raise UsageError("SWEEP.yaml: empty path; give a sweep file such as examples/sweep.yaml")
    store = args.store if args.store is not None else f"{Path(args.grid).stem}.sqlite"
    show = sys.stderr if (args.progress or sys.stderr.isatty()) else None
    try:
        from tiersim.deepspeed_cli import sweep_reader

        if args.nodes is None:
            points = load_grid(args.grid, deepspeed=sweep_reader)
        else:
            points = expand_grid(with_nodes(read_grid_file(args.grid), args.nodes, args.grid), label=args.grid,
                                 base=Path(args.grid).parent, deepspeed=sweep_reader)
        summary = run_sweep(points, store, processes=args.processes, workers=args.workers,
                            scheduler=args.scheduler, retry_failed=args.retry_failed, progress=show)
    except (SweepFileError, SweepSetupError, StoreError) as e:
        raise UsageError(str(e)) from None
    except SweepAborted as e:
        print(f"tiersim sweep: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM: the line (tiersim.cli) says what is kept
        raise keeping(e, f"what finished is stored in {store}: run the same command again to resume") from None
    keys = {p.key for p in points}
    failures = [f for f in read_failures(store) if f["key"] in keys]
    if args.json:
        print(json.dumps(versioned({"kind": "tiersim.sweep", **summary.to_dict(),
                          "failures": [{k: f[k] for k in ("key", "point", "error")} for f in failures]}), indent=1))
    else:
        s = summary
        print(f"sweep {args.grid}: {s.points} points, {s.already} already stored; this run: {s.done} done, "
              f"{s.failed} failed in {s.wall_s:.1f} s ({s.executor}, {s.workers} worker"
              f"{'s' if s.workers != 1 else ''}) -> {store}")
        for f in failures[:SHOW_FAILURES]:
            print(f"  failed: {_point_text(f['point'])}: {f['error']}")
        if len(failures) > SHOW_FAILURES:
            print(f"  ... and {len(failures) - SHOW_FAILURES} more (tiersim results {store} --status failed)")
        print(f"list or export: tiersim results {store} [--where EXPR] [--csv out.csv]")
    return EXIT_FAILED if failures else EXIT_OK


def _point_text(point: dict) -> str:
    sets = "".join(f" --set {s}" for s in point.get("set", []))
    knobs = "".join(f" --knob {k}={v}" for k, v in point.get("knobs", {}).items())
    work = "".join(f" --{k.replace('_', '-')} {v}" if k != "flash_attention" else
                   (" --flash-attention" if v else " --no-flash-attention")
                   for k, v in point.get("workload", {}).items())
    return f"--hw {point['hardware']}{sets} --model {point['model']} --policy {point['policy']}{knobs}{work}"


COMMAND = Command("sweep", "simulate a grid (YAML) on a process pool or Dask into a resumable SQLite store",
                  add_args, run)
