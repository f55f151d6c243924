"""``simulate --policy all``: every policy on the same job, one comparison table (or one JSON list)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

from planner.job import make_plan, simulate_job
from planner.result_json import dumps, infeasible_json, simulated_json
from planner.workers import Workers
from policies import POLICIES, Job, PlanInfeasible, parse_knobs
from simulator import Result
from tiersim.errors import UsageError
from tiersim.exit_codes import EXIT_INFEASIBLE, EXIT_OK
from tiersim.report_files import write_report_for
from tiersim.signals import stderr_line


def _one(name: str, job: Job, extrapolate: bool, keep: bool = False) -> tuple[dict[str, Any], Result | None]:
    """Plan and simulate one policy with its default knobs: the JSON-shaped result (picklable, small) and,
    when ``keep`` (for a report), the Result itself without its plan (the figures need its time series)."""
    knobs = parse_knobs(POLICIES[name], [])
    t0 = time.perf_counter()
    try:
        plan = make_plan(job, name, template=True)  # a rank template where the policy can: the same figures
    except PlanInfeasible as e:
        d = infeasible_json(e, job, knobs)
        d["sim"]["wall_s"] = time.perf_counter() - t0
        return d, None
    _, result = simulate_job(job, name, extrapolate=extrapolate, plan=plan)
    return simulated_json(result), dataclasses.replace(result, simulated_plan=None) if keep else None


def run_all(args: argparse.Namespace, job: Job) -> int:
    from reports.compare import format_comparison

    if args.knobs:
        raise UsageError("--knob cannot be combined with --policy all (knobs belong to one policy); "
                         "run that policy alone")
    if args.plan_out or args.trace:
        raise UsageError("--plan-out/--trace need one policy; run that policy alone")
    names = list(POLICIES)
    keep = args.report is not None
    workers = min(len(names), os.cpu_count() or 1)
    show = sys.stderr.isatty()  # progress for a person watching; pipes and scripts get only the result
    t0 = time.perf_counter()
    done: dict[str, tuple[dict[str, Any], Result | None]] = {}

    def progress(name: str) -> None:
        if show:
            stderr_line(f"[{len(done)}/{len(names)}] {name} done ({time.perf_counter() - t0:.1f} s)")

    if workers > 1:  # the policies are independent: plan and simulate them in parallel processes
        # planner.workers: leaving early (Ctrl-C, SIGTERM, an error) stops the running simulations at once
        with Workers(workers) as pool:
            for i, name in enumerate(names):
                pool.submit(i, _one, name, job, args.extrapolate, keep)
            while pool.pending():
                for i, value in pool.wait():
                    done[names[i]] = value
                    progress(names[i])
    else:
        for name in names:
            done[name] = _one(name, job, args.extrapolate, keep)
            progress(name)
    rows = [done[name][0] for name in names]
    if args.json:
        print(dumps({"job": {"hardware": job.hw.name, "model": job.model.name,
                              "workload": job.config.to_dict(), "assumed": list(job.assumed)},
                      "results": rows}))
    else:
        c = job.config
        gpus = f"{job.n_gpus} GPU{'s' if job.n_gpus != 1 else ''}"
        head = (f"tiersim: every policy, {job.model.name} ({job.model.params() / 1e9:.2f}B) on {job.hw.name} "
                f"({gpus}); global batch {c.global_batch}, micro-batch {c.micro_batch}, seq {c.seq_len}, "
                f"{c.precision}, checkpointing {c.checkpointing}")
        print(format_comparison(rows, head))
        for a in job.assumed:
            print(f"  default picked: {a}")
        print("GPU/CPU/NVMe GB: peak of the busiest pool of that kind; exposed s: transfer time not hidden by compute")
    if keep:
        c = job.config
        title = (f"Every policy: {job.model.name} ({job.model.params() / 1e9:.2f}B) on {job.hw.name}, global batch "
                 f"{c.global_batch}, micro-batch {c.micro_batch}, seq {c.seq_len}, {c.precision}")
        write_report_for(args, [done[n][1] if done[n][1] is not None else done[n][0] for n in names], title)
    return EXIT_OK if any(r["feasible"] for r in rows) else EXIT_INFEASIBLE
