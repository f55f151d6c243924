"""``tiersim coverage``: the policy x model matrix of feasible (with throughput) or infeasible (and why).

    tiersim coverage --hw a100x8 --models 7b,13b,70b,175b,405b
"""

from __future__ import annotations

import argparse
import sys

from planner.result_json import dumps
from policies import POLICIES
from tiersim.command import Command
from tiersim.errors import UsageError
from tiersim.job_flags import SEARCH, add_hardware_flags, add_workload_flags, request_from_args
from tiersim.search_flags import (
    add_search_args,
    fmt_rate,
    parse_budget,
    progress_printer,
    search_exit,
    search_options,
    split_names,
)


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Training coverage: for each policy and model, the best plan the search finds (tokens/s) "
                     "or infeasible with the pool that binds (the comparison of the Tiny-Pipe paper).")
    p.epilog = ("exit codes: 0 some cell is feasible, 2 bad input, 3 no cell is feasible, 4 not settled: none is "
                "known to be feasible and the budget cut a cell before it proved that none is")
    add_hardware_flags(p, SEARCH)
    p.add_argument("--models", required=True, metavar="M1,M2,...",
                   help="comma-separated model presets, shorthands or files, e.g. 7b,13b,70b,175b,405b")
    p.add_argument("--policies", default=None, metavar="P1,P2,...",
                   help="comma-separated policies (default: every policy)")
    p.add_argument("--knob", dest="knobs", action="append", default=[], metavar="NAME=VALUE",
                   help="fix a policy knob in every cell of the policies that declare it, e.g. "
                        "--knob optimizer_device=nvme; repeatable")
    p.add_argument("--cell-budget", default=None, metavar="TIME",
                   help="also bound each cell's search by wall time, e.g. 30s (default: only its share of --budget)")
    p.add_argument("--total-budget", default=None, metavar="TIME",
                   help="the former name of --budget (the whole matrix); the shorter of the two applies")
    add_workload_flags(p, SEARCH)
    add_search_args(p, "coverage", "the whole matrix (each cell still to do gets an equal share of what is left; "
                                 "cells it cut are searched again, exactly, with the time left at the end)")


def _shorter(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def run(args: argparse.Namespace) -> int:
    from planner.candidates import check_fixed_knobs
    from planner.coverage import coverage
    from reports.units import table

    models = split_names(args.models, "--models", "7b,13b")
    policies = split_names(args.policies, "--policies", "none,tinypipe") if args.policies else list(POLICIES)
    for p in policies:
        if p not in POLICIES:
            raise UsageError(f"--policies: unknown policy {p!r}; choose from {', '.join(POLICIES)}")
    check_fixed_knobs(policies, args.knobs)
    opts = search_options(args)
    out = coverage(args.hw, models, policies=policies, request=request_from_args(args), hw_overrides=args.sets,
                   objective=args.objective, cell_budget_s=parse_budget(args.cell_budget, "--cell-budget"),
                   total_budget_s=_shorter(opts.pop("budget_s"), parse_budget(args.total_budget, "--total-budget")),
                   progress=progress_printer(args),
                   knobs=args.knobs, **opts)
    rc = search_exit(any(c.best.feasible for c in out.cells), any(c.best.cut_short for c in out.cells))
    print(f"tiersim coverage: {out.wall_s:.1f} s wall, {sum(c.best.n_simulated for c in out.cells)} simulated",
          file=sys.stderr)
    if args.json:
        print(dumps(out.to_dict()))
        return rc
    print(f"tiersim coverage: {len(out.policies)} policies x {len(out.models)} models on {out.hardware}"
          f"{' with ' + ', '.join(args.sets) if args.sets else ''}; cell: best tokens/s, or the binding reason")
    header = ["policy", *(f"{m.name} ({m.params() / 1e9:.1f}B)" for m in out.models)]
    rows = []
    for policy in out.policies:
        row = [policy]
        for m in out.models:
            b = out.cell(policy, m.name).best
            if b.feasible:
                row.append(fmt_rate(b.tokens_per_s) + ("*" if b.cut_short else ""))
            elif b.binding == "budget":
                row.append("? (budget)")
            else:
                row.append(f"no: {b.binding or 'infeasible'}")
        rows.append(row)
    print(table(rows, header))
    n_ok = sum(c.best.feasible for c in out.cells)
    print(f"{n_ok} of {len(out.cells)} cells feasible")
    if any(c.best.cut_short and c.best.feasible for c in out.cells):
        print("* feasible, but the search was cut short by its bounds: the throughput may not be the best")
    if any(c.best.binding == "budget" for c in out.cells):
        print("? (budget): the bounds cut the search before it found a plan or proved that none fits; "
              "give more --budget / --max-candidates")
    return rc


COMMAND = Command("coverage", "policy x model matrix: feasible with throughput, or the binding pool", add_args, run)
