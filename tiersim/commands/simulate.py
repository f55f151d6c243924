"""``tiersim simulate``."""

from __future__ import annotations

import argparse
import json

from simulator import Plan, simulate_plan
from tiersim.api import JobRequest, make_job, make_plan, resolve_hardware

EXIT_OK, EXIT_INFEASIBLE = 0, 3


def request_from_args(args: argparse.Namespace) -> JobRequest:
    return JobRequest(micro_batch=args.micro_batch, seq_len=args.seq_len, global_batch=args.global_batch,
                      precision=args.precision, checkpointing=args.checkpointing, flash_attention=args.flash)


def run_simulate(args: argparse.Namespace) -> int:
    from reports import format_result, write_trace

    if args.plan_in:
        plan = Plan.load(args.plan_in)
        from hardware_models import spec_from_dict

        hw = spec_from_dict(plan.hardware, args.sets) if args.sets or args.hw == "a100x8" else \
            resolve_hardware(args.hw, args.sets)
    else:
        job, _ = make_job(args.hw, args.model, request_from_args(args), hw_overrides=args.sets)
        plan = make_plan(job, args.policy, args.knobs)
        hw = job.hw
    if args.plan_out:
        plan.save(args.plan_out)
    result = simulate_plan(plan, hw, extrapolate=args.extrapolate)
    violations: list[str] = []
    if args.check:
        from simulator.invariants import check_invariants

        violations = check_invariants(result)
    if args.trace:
        write_trace(result, args.trace)
    if args.json:
        d = result.to_dict()
        if args.check:
            d["invariant_violations"] = violations
        print(json.dumps(d, indent=1))
    else:
        print(format_result(result))
        if args.check:
            print("invariants: " + ("all hold" if not violations else f"{len(violations)} VIOLATED"))
            for v in violations:
                print(f"  {v}")
    if violations:
        return 1
    return EXIT_OK if result.feasible else EXIT_INFEASIBLE
