"""``--deepspeed ds.json`` and ``--deepspeed-out ds.json`` for the commands (simulate, plan, whatif).

:func:`apply_deepspeed` reads the config into the parsed arguments (policy, knobs and the workload flags),
as if the user had typed them, and returns what it did so the command can print it; the config's keys and
the flags must agree (a flag the config contradicts is bad input). :func:`write_deepspeed_out` writes a
plan as a DeepSpeed config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hardware_models import HardwareSpec
from planner.search import SearchOutcome
from policies.job import JobRequest, resolve_hardware
from simulator import Plan
from tiersim.deepspeed_config import DeepSpeedJob, map_config
from tiersim.deepspeed_export import Exported, export_plan, to_deepspeed, write_config
from tiersim.deepspeed_keys import DS_POLICIES, NO_DS_EQUIVALENT
from tiersim.deepspeed_source import load_source
from tiersim.errors import UsageError
from tiersim.output_files import write_or_fail
from workloads import ModelSpec, load_model


def apply_deepspeed(args: argparse.Namespace, default_hw: str, default_model: str,
                    *, sets_policy: bool = True) -> DeepSpeedJob | None:
    """Read ``args.deepspeed`` (None: nothing to do) and set the policy, knobs and workload flags it fixes."""
    path = getattr(args, "deepspeed", None)
    if path is None:
        return None
    if sets_policy and getattr(args, "policy", None) is not None:
        raise UsageError("--policy cannot be combined with --deepspeed (the config picks the policy); drop one")
    if getattr(args, "plan_in", None) is not None:
        raise UsageError("--deepspeed cannot be combined with --plan (the plan fixes the job); drop one")
    hw = resolve_hardware(args.hw or default_hw, args.sets)
    model = load_model(args.model or default_model)
    flags = JobRequest(micro_batch=args.micro_batch, seq_len=args.seq_len, global_batch=args.global_batch,
                       precision=args.precision, checkpointing=args.checkpointing, flash_attention=args.flash)
    job = map_config(load_source(path), n_gpus=hw.gpu.count, hidden=model.hidden, flags=flags)
    if sets_policy:
        given = {k.split("=", 1)[0].strip() for k in getattr(args, "knobs", [])}
        clash = sorted(given & set(job.knobs))
        if clash:
            raise UsageError(f"--knob {clash[0]}: the DeepSpeed config {job.source} sets it; drop the --knob or "
                             "change the config")
        args.policy = job.policy
        args.knobs = [*(f"{k}={v}" for k, v in job.knobs.items()), *getattr(args, "knobs", [])]
    r = job.request
    args.global_batch, args.precision = r.global_batch, r.precision
    if sets_policy:  # simulate: the config's run; a search (plan, whatif) searches micro-batch and checkpointing
        args.micro_batch, args.checkpointing = r.micro_batch, r.checkpointing
    return job


def sweep_reader(path: str, hw: HardwareSpec, model: ModelSpec,
                 flags: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A sweep's ``deepspeed:`` entry on one machine and model: (policy, knobs, workload) for its points."""
    job = map_config(load_source(path), n_gpus=hw.gpu.count, hidden=model.hidden, flags=JobRequest(**flags))
    workload = {k: v for k, v in dataclasses.asdict(job.request).items() if v is not None}
    return job.policy, dict(job.knobs), workload


def write_best_as_deepspeed(path: str, outcome: SearchOutcome, hw: str, sets: Sequence[str]) -> None:
    """``plan --deepspeed-out``: the best plan as a DeepSpeed config, or, when the best has no DeepSpeed
    equivalent, the best one that has (said plainly, on stderr)."""
    best = outcome.best
    if best is None:
        print("--deepspeed-out: no feasible plan, so no DeepSpeed config written", file=sys.stderr)
        return
    if best.policy in DS_POLICIES and best.plan is not None:
        write_deepspeed_out(path, best.plan, to_stderr=True)
        return
    print(f"--deepspeed-out: the best plan ({best.policy}) {NO_DS_EQUIVALENT}", file=sys.stderr)
    alt = next((e for e in outcome.ranked if e.policy in DS_POLICIES), None)
    if alt is None:
        print("--deepspeed-out: no feasible plan of none, zero-offload or zero-infinity, so no DeepSpeed config "
              "written", file=sys.stderr)
        return
    exported = to_deepspeed(alt.policy, alt.knobs, micro_batch=int(alt.micro_batch),
                            global_batch=int(outcome.workload["global_batch"]),
                            precision=str(outcome.workload["precision"]), checkpointing=str(alt.checkpointing),
                            n_gpus=resolve_hardware(hw, sets).gpu.count)
    write_or_fail("--deepspeed-out", path, lambda p: write_config(exported, p))
    rate = f"{alt.tokens_per_s:,.0f}" if alt.tokens_per_s is not None else "?"
    best_rate = f"{best.tokens_per_s:,.0f}" if best.tokens_per_s is not None else "?"
    print(f"--deepspeed-out: wrote the best plan DeepSpeed can run instead: {alt.policy} "
          f"{' '.join(f'{k}={v}' for k, v in alt.knobs.items())}, micro-batch {alt.micro_batch}, checkpointing "
          f"{alt.checkpointing}: {rate} tokens/s (the best: {best_rate}) -> {path}", file=sys.stderr)
    for note in exported.notes:
        print(f"  note: {note}", file=sys.stderr)


def print_mapping(job: DeepSpeedJob, *, to_stderr: bool) -> None:
    """The key-by-key lines; for a search (on stderr) also what the config fixes and what stays searched."""
    print("\n".join(job.lines()), file=sys.stderr if to_stderr else sys.stdout)
    if to_stderr:
        r = job.request
        print(f"the search keeps the config's global batch {r.global_batch} and precision {r.precision}; it "
              f"searches policies, knobs, micro-batch and checkpointing unless flags fix them (the config's own "
              f"run: simulate --deepspeed {job.source.split(':')[0]})", file=sys.stderr)
    else:
        print()


def write_deepspeed_out(path: str, plan: Plan, *, to_stderr: bool = False) -> Exported:
    """Write ``plan`` as a DeepSpeed config at ``path`` and say so, with the notes on what it cannot carry."""
    exported = export_plan(plan)
    write_or_fail("--deepspeed-out", path, lambda p: write_config(exported, p))
    out = sys.stderr if to_stderr else sys.stdout
    print(f"DeepSpeed config of the plan ({plan.policy}) written to {path}", file=out)
    for note in exported.notes:
        print(f"  note: {note}", file=out)
    return exported


def json_section(job: DeepSpeedJob | None, exported: Exported | None, memory: Any) -> dict[str, Any]:
    """The ``deepspeed`` key of a ``--json`` object."""
    d: dict[str, Any] = {}
    if job is not None:
        d["input"] = job.to_dict()
    if exported is not None:
        d["output"] = {"config": exported.config, "notes": list(exported.notes)}
    if memory is not None:
        d["estimator"] = memory.to_dict()
    return json.loads(json.dumps(d, default=str))
