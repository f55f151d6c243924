"""``simulate --policy all``: every policy on the same job, one comparison table (or one JSON list)."""

from __future__ import annotations

import argparse
import time

from policies import POLICIES, Job, PlanInfeasible, parse_knobs
from simulator import simulate_plan
from tiersim.cli import UsageError

EXIT_OK, EXIT_INFEASIBLE = 0, 3


def run_all(args: argparse.Namespace, job: Job) -> int:
    from reports.compare import format_comparison
    from tiersim.commands.simulate import _dumps, plan_infeasible_dict, result_dict

    if args.knobs:
        raise UsageError("--knob cannot be combined with --policy all (knobs belong to one policy); "
                         "run that policy alone")
    if args.plan_out or args.trace:
        raise UsageError("--plan-out/--trace need one policy; run that policy alone")
    rows = []
    for info in POLICIES.values():
        knobs = parse_knobs(info, [])
        t0 = time.perf_counter()
        try:
            plan = info.plan(job, knobs)
        except PlanInfeasible as e:
            d = plan_infeasible_dict(e, job, knobs)
            d["sim"]["wall_s"] = time.perf_counter() - t0
            rows.append(d)
            continue
        rows.append(result_dict(simulate_plan(plan, job.hw, extrapolate=args.extrapolate)))
    if args.json:
        print(_dumps({"job": {"hardware": job.hw.name, "model": job.model.name,
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
    return EXIT_OK if any(r["feasible"] for r in rows) else EXIT_INFEASIBLE
