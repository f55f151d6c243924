"""``tiersim simulate`` (and the ``simulate`` entry point); the JSON schema is documented in ``tiersim.cli``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from hardware_models import HardwareSpec, build_topology, spec_from_dict
from planner.result_json import dumps as _dumps
from planner.result_json import infeasible_json, simulated_json
from policies import Job, PlanInfeasible, get_policy, parse_knobs
from simulator import Plan, Result, simulate_plan, validate_plan
from tiersim.api import JobRequest, make_job, resolve_hardware
from tiersim.cli import DEFAULT_HW, DEFAULT_MODEL, DEFAULT_POLICY, JOB_FLAGS, UsageError

EXIT_OK, EXIT_INVARIANT, EXIT_INFEASIBLE = 0, 1, 3


def request_from_args(args: argparse.Namespace) -> JobRequest:
    return JobRequest(micro_batch=args.micro_batch, seq_len=args.seq_len, global_batch=args.global_batch,
                      precision=args.precision, checkpointing=args.checkpointing, flash_attention=args.flash)


def check_output_path(flag: str, path: str | None) -> None:
    """Fail before any work when ``path`` cannot be written: its directory must exist."""
    if path is None:
        return
    if not path.strip():
        raise UsageError(f"{flag}: empty path; give a file name, e.g. {flag} out.json")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name, e.g. {p / 'out.json'}")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: directory '{parent}' does not exist; create it first or pick another path")


def _check_not_empty(args: argparse.Namespace) -> None:
    for dest, flag, hint in (("hw", "--hw", "a preset (tiersim hardware list) or a YAML file"),
                             ("model", "--model", "a preset (tiersim models list), a config.json or a YAML file"),
                             ("policy", "--policy", "a policy (tiersim policies list)"),
                             ("plan_in", "--plan", "a plan file written by --plan-out")):
        value = getattr(args, dest, None)
        if value is not None and not value.strip():
            raise UsageError(f"{flag}: empty value; give {hint}")


def _write(flag: str, path: str, write: Any) -> None:
    try:
        write(path)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write ({e.strerror or e})") from None


def _check_plan_flags(args: argparse.Namespace) -> None:
    for dest, flag in JOB_FLAGS.items():
        value = getattr(args, dest, None)
        if value not in (None, []):
            raise UsageError(f"{flag} cannot be combined with --plan (the plan fixes model, workload, policy and "
                             f"knobs); drop {flag} or plan afresh without --plan")


def plan_infeasible_dict(e: PlanInfeasible, job: Job | None = None, knobs: Any = None) -> dict[str, Any]:
    """The JSON of a job its policy rejected before simulating (``planner.result_json.infeasible_json``)."""
    return infeasible_json(e, job, knobs)


def result_dict(result: Result) -> dict[str, Any]:
    """``Result.to_dict()`` plus ``verdict`` (``planner.result_json.simulated_json``)."""
    return simulated_json(result)


def run_simulate(args: argparse.Namespace) -> int:
    from reports import format_result, write_trace
    from reports.text import format_infeasible

    _check_not_empty(args)
    check_output_path("--plan-out", args.plan_out)
    check_output_path("--trace", args.trace)
    if args.report is not None:
        from tiersim.commands.report import check_report_dir

        check_report_dir("--report", args.report)
    extra_assumed: list[str] = []
    hw: HardwareSpec
    if args.plan_in is not None:
        _check_plan_flags(args)
        plan = Plan.load(args.plan_in)
        if args.hw is not None:
            hw = resolve_hardware(args.hw, args.sets)
        else:
            hw = spec_from_dict(plan.hardware.to_dict(), file=f"{args.plan_in} (embedded hardware)",
                                overrides=args.sets)
            extra_assumed.append(f"hardware={hw.name} (embedded in {args.plan_in}; pass --hw to change)")
        # name the file and the machine when the plan does not fit this hardware (e.g. 8 GPUs planned, 1 here)
        validate_plan(plan, f"{args.plan_in} on hardware {hw.name!r}", build_topology(hw).locations)
    else:
        picked = []
        for name, value, default, flag in (("hardware", args.hw, DEFAULT_HW, "--hw"),
                                           ("model", args.model, DEFAULT_MODEL, "--model"),
                                           ("policy", args.policy, DEFAULT_POLICY, "--policy")):
            if value is None:
                picked.append(f"{name}={default} (default; pick with {flag})")
        hw_name = DEFAULT_HW if args.hw is None else args.hw
        model_name = DEFAULT_MODEL if args.model is None else args.model
        if args.policy == "all":
            from tiersim.commands.compare import run_all

            job, _ = make_job(hw_name, model_name, request_from_args(args), hw_overrides=args.sets)
            return run_all(args, dataclasses.replace(job, assumed=(*picked, *job.assumed)))
        policy = get_policy(DEFAULT_POLICY if args.policy is None else args.policy)
        knobs = parse_knobs(policy, args.knobs)
        job, _ = make_job(hw_name, model_name, request_from_args(args), hw_overrides=args.sets)
        job = dataclasses.replace(job, assumed=(*picked, *job.assumed))
        hw = job.hw
        try:
            plan = policy.plan(job, knobs)
        except PlanInfeasible as e:
            d = plan_infeasible_dict(e, job, knobs)
            if args.json:
                print(_dumps(d))
            else:
                print(format_infeasible(d, hw, args.sets))
                skipped = [f for f, v in (("--plan-out", args.plan_out), ("--trace", args.trace)) if v]
                if skipped:
                    print(f"(no plan, so {' and '.join(skipped)} not written)")
            write_report_for(args, [d])
            return EXIT_INFEASIBLE
    if args.plan_out:
        _write("--plan-out", args.plan_out, plan.save)
    result = simulate_plan(plan, hw, extrapolate=args.extrapolate)
    violations: list[str] = []
    if args.check:
        from simulator.invariants import check_invariants

        violations = check_invariants(result)
    if args.trace:
        _write("--trace", args.trace, lambda p: write_trace(result, p))
    if args.json:
        d = result_dict(result)
        if extra_assumed:
            d["workload"]["assumed"] = [*extra_assumed, *d["workload"].get("assumed", [])]
        if args.check:
            d["invariant_violations"] = violations
        print(_dumps(d))
    else:
        print(format_result(result, hw, args.sets, extra_assumed))
        if args.check:
            print("invariants: " + ("all hold" if not violations else f"{len(violations)} VIOLATED"))
            for v in violations:
                print(f"  {v}")
    write_report_for(args, [result])
    if violations:
        return EXIT_INVARIANT
    return EXIT_OK if result.feasible else EXIT_INFEASIBLE


def write_report_for(args: argparse.Namespace, items: list[Any], title: str | None = None) -> None:
    """``--report DIR``: the report of these results (Results simulated here, or result dicts)."""
    if args.report is None:
        return
    import sys

    from reports.build import ReportInputs
    from tiersim.commands.report import write

    inputs = ReportInputs(items=list(items))
    if title:
        inputs.title = title
    else:
        from reports.inputs import default_title

        inputs.title = default_title(inputs)
    paths = write(Path(args.report), inputs, sys.stderr.isatty())
    line = f"report: {Path(args.report) / 'report.html'} ({sum(1 for p in paths if p.suffix == '.png')} figures)"
    if not args.json:
        print(line)
    elif sys.stderr.isatty():
        print(line, file=sys.stderr)
