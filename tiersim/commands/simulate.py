"""``tiersim simulate`` (and the ``simulate`` entry point); the JSON schema is documented in ``tiersim.cli``.

``--budget`` (default :data:`DEFAULT_BUDGET`) bounds the whole command's wall time: past it the command
stops, says so in one line on stderr and exits 4 (``EXIT_CUT``: no answer is not a verdict);
``--budget none`` lifts it.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from hardware_models import HardwareSpec, build_topology, spec_from_dict
from planner.job import make_job, make_plan, resolve_hardware, simulate_job
from planner.plan_check import check_saved_plan
from planner.result_json import dumps, infeasible_json, simulated_json
from policies import PlanInfeasible, get_policy, parse_knobs
from simulator import Plan, simulate_plan
from tiersim import deepspeed_cli as ds_cli
from tiersim.command import Command
from tiersim.deepspeed_export import check_exportable
from tiersim.deepspeed_memory import beyond_model_states, compare
from tiersim.exit_codes import EXIT_CUT, EXIT_INFEASIBLE, EXIT_INVARIANT, EXIT_OK
from tiersim.job_flags import (
    DEFAULT_HW,
    DEFAULT_MODEL,
    DEFAULT_POLICY,
    SIMULATE,
    add_deepspeed_out_flag,
    add_job_flags,
    check_no_job_flags,
    nonempty,
    request_from_args,
)
from tiersim.output_files import check_output_dir, check_output_path, write_or_fail
from tiersim.report_files import write_report_for
from tiersim.search_flags import parse_budget

DEFAULT_BUDGET = "10m"  # as long as `tiersim plan`'s: a 1024-GPU symmetric job answers in seconds


def add_args(p: argparse.ArgumentParser) -> None:
    add_job_flags(p, SIMULATE)
    p.add_argument("--policy", default=None, type=nonempty("a policy (tiersim policies list)"),
                   help=f"policy name (tiersim policies list; default: {DEFAULT_POLICY})")
    p.add_argument("--knob", dest="knobs", action="append", default=[], metavar="NAME=VALUE",
                   help="policy knob (tiersim policies show NAME)")
    p.add_argument("--plan", dest="plan_in", type=nonempty("a plan file written by --plan-out"),
                   help="simulate this plan file instead of planning")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plan-out", help="write the plan (JSON) here")
    add_deepspeed_out_flag(p)
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the simulated step here")
    p.add_argument("--report", metavar="DIR", help="also write a report (HTML, Markdown, figures, CSV) into DIR")
    p.add_argument("--check", action="store_true", help="also check the simulator's invariants")
    p.add_argument("--no-extrapolate", dest="extrapolate", action="store_false",
                   help="simulate every micro-step even in a steady state")
    p.add_argument("--budget", default=DEFAULT_BUDGET, metavar="TIME",
                   help=f"wall-clock budget of the whole command, e.g. 60s, 5m or 1h: past it the command stops "
                        f"with one line and exit {EXIT_CUT} (default {DEFAULT_BUDGET}; 'none' for no "
                        "limit; enforced where the platform has interval timers, i.e. not on Windows)")


class _OutOfBudget(BaseException):
    """The budget's timer fired (a BaseException: no ``except Exception`` on the way swallows it)."""


RERAISE_S = 0.1  # the timer fires again this long after each ring, until the budget's block has ended


@contextmanager
def _budget(seconds: float | None) -> Iterator[None]:
    """Raise :class:`_OutOfBudget` in this (the main) thread ``seconds`` from now; None: never.

    A signal handler's exception can land in code that swallows it (a ``gc`` callback's exceptions are
    only reported, e.g. Hypothesis's), so each ring re-arms the timer: it rings again every
    :data:`RERAISE_S` until the exception leaves the block.
    """
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    closing = False

    def ring(_signum: int, _frame: object) -> None:
        if closing:
            return
        signal.setitimer(signal.ITIMER_REAL, RERAISE_S)
        raise _OutOfBudget

    before = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        closing = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def run(args: argparse.Namespace) -> int:
    budget = parse_budget(args.budget)
    try:
        with _budget(budget):
            return _run(args)
    except _OutOfBudget:
        print(f"simulate: no answer within the budget of {budget:g} s (--budget {args.budget}); give it more "
              "time with --budget 30m, or none for no limit", file=sys.stderr)
        return EXIT_CUT


def _saved_plan(args: argparse.Namespace, extra_assumed: list[str]) -> tuple[Plan, HardwareSpec]:
    """``--plan FILE``: the plan and the hardware it runs on (``--hw``, else the plan's own)."""
    check_no_job_flags(args)
    plan = Plan.load(args.plan_in)
    if args.hw is not None:
        hw = resolve_hardware(args.hw, args.sets)
    else:
        hw = spec_from_dict(plan.hardware.to_dict(), file=f"{args.plan_in} (embedded hardware)",
                            overrides=args.sets)
        extra_assumed.append(f"hardware={hw.name} (embedded in {args.plan_in}; pass --hw to change)")
    # name the file and the machine when the plan does not fit this hardware (e.g. 8 GPUs planned, 1 here)
    check_saved_plan(plan, f"{args.plan_in} on hardware {hw.name!r}", build_topology(hw).locations)
    return plan, hw


def _run(args: argparse.Namespace) -> int:
    from reports import format_result, write_trace
    from reports.text import format_infeasible

    check_output_path("--plan-out", args.plan_out)
    check_output_path("--trace", args.trace)
    check_output_path("--deepspeed-out", args.deepspeed_out)
    if args.report is not None:
        check_output_dir("--report", args.report)
    extra_assumed: list[str] = []
    ds = ds_cli.apply_deepspeed(args, DEFAULT_HW, DEFAULT_MODEL)
    if args.deepspeed_out and args.plan_in is None:
        check_exportable(DEFAULT_POLICY if args.policy is None else args.policy)
    if ds is not None and not args.json:
        ds_cli.print_mapping(ds, to_stderr=False)
    if args.plan_in is not None:
        plan, hw = _saved_plan(args, extra_assumed)
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
            from tiersim.compare_policies import run_all

            job, _ = make_job(hw_name, model_name, request_from_args(args), hw_overrides=args.sets)
            return run_all(args, dataclasses.replace(job, assumed=(*picked, *job.assumed)))
        policy = get_policy(DEFAULT_POLICY if args.policy is None else args.policy)
        knobs = parse_knobs(policy, args.knobs)
        job, _ = make_job(hw_name, model_name, request_from_args(args), hw_overrides=args.sets)
        job = dataclasses.replace(job, assumed=(*picked, *job.assumed))
        hw = job.hw
        try:
            # a rank template where the policy can (identical figures at a cost independent of the rank count),
            # unless the plan itself is wanted: written, exported or compared with DeepSpeed's
            wanted = bool(args.plan_out or args.deepspeed_out) or ds is not None
            plan = make_plan(job, policy.name, args.knobs, template=not wanted)
        except PlanInfeasible as e:
            d = infeasible_json(e, job, knobs)
            if args.json:
                if ds is not None:
                    d["deepspeed"] = ds_cli.json_section(ds, None, None)
                print(dumps(d))
            else:
                print(format_infeasible(d, hw, args.sets))
                skipped = [f for f, v in (("--plan-out", args.plan_out), ("--trace", args.trace)) if v]
                if skipped:
                    print(f"(no plan, so {' and '.join(skipped)} not written)")
            write_report_for(args, [d])
            return EXIT_INFEASIBLE
    if args.plan_out:
        write_or_fail("--plan-out", args.plan_out, plan.save)
    exported = None
    if args.deepspeed_out:
        check_exportable(plan.policy)
        exported = ds_cli.write_deepspeed_out(args.deepspeed_out, plan, to_stderr=args.json)
    if args.plan_in is None:  # a rank template whose ranks do not play one role here is simulated in full
        plan, result = simulate_job(job, plan.policy, args.knobs, extrapolate=args.extrapolate, plan=plan)
    else:
        result = simulate_plan(plan, hw, extrapolate=args.extrapolate)
    memory = compare(plan) if ds is not None or exported is not None else None
    violations: list[str] = []
    if args.check:
        from simulator.invariants import check_invariants

        violations = check_invariants(result)
    if args.trace:
        write_or_fail("--trace", args.trace, lambda p: write_trace(result, p))
    if args.json:
        d = simulated_json(result)
        if extra_assumed:
            d["workload"]["assumed"] = [*extra_assumed, *d["workload"].get("assumed", [])]
        if args.check:
            d["invariant_violations"] = violations
        if ds is not None or exported is not None:
            d["deepspeed"] = ds_cli.json_section(ds, exported, memory)
        print(dumps(d))
    else:
        print(format_result(result, hw, args.sets, extra_assumed))
        if memory is not None:
            print("\n".join(["", *memory.lines(), *beyond_model_states(result.peak_by_kind)]))
        if args.check:
            print("invariants: " + ("all hold" if not violations else f"{len(violations)} VIOLATED"))
            for v in violations:
                print(f"  {v}")
    write_report_for(args, [result])
    if violations:
        return EXIT_INVARIANT
    return EXIT_OK if result.feasible else EXIT_INFEASIBLE


COMMAND = Command("simulate", "simulate one training step of a policy", add_args, run)
