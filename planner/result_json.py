"""The ``simulate --json`` object of one run and its verdict line: the one place they are built.

``tiersim simulate --json``, ``--policy all``, the planner, sweeps (``planner.sweep``) and reports
(``reports.text``) all use these functions, so the keys and the verdict wording cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from hardware_models import build_topology
from hardware_models.units import gb, secs
from planner.version import tiersim_version
from policies import Job, PlanInfeasible
from simulator import Result
from workloads import ModelSpec

NOT_SIMULATED = {"events": 0, "wall_s": 0.0, "method": "not simulated (the policy found the job infeasible)",
                 "simulated_tasks": 0}
# figures that only a simulation yields: null when the policy rejected the job up front
SIMULATED_FIELDS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hw_tflops_per_gpu", "hfu",
                    "peak_bytes", "peak_by_kind",
                    "link_bytes", "link_busy_s", "stream_busy_s", "compute_busy_s", "exposed_transfer_s")


def simulated_json(result: Result) -> dict[str, Any]:
    """``Result.to_dict()`` with ``verdict`` after ``feasible`` and ``stage``/``what``/``message`` on every oom."""
    d = result.to_dict()
    for o in [d["oom"], *d["ooms"]]:
        if o is not None:
            o.setdefault("stage", "simulation")
            o.setdefault("what", None)
            o.setdefault("message", oom_verdict(o))
    verdict = "FEASIBLE" if result.feasible else oom_verdict(d["oom"])
    d["model"] = with_model_counts(d["model"])
    return finite({"feasible": d.pop("feasible"), "verdict": verdict, **d, "tiersim_version": tiersim_version()})


def with_model_counts(model: Mapping[str, Any]) -> dict[str, Any]:
    """A result's model object plus ``active_params`` (MoE: parameters a token passes through), ``route``
    (how the model was described) and ``notes`` (what its source holds that is not modelled)."""
    spec = ModelSpec.from_dict({k: v for k, v in model.items() if k != "params"})
    return {**model, "params": spec.params(), "active_params": spec.active_params(), "route": spec.route,
            "notes": list(spec.notes)}


def infeasible_json(e: PlanInfeasible, job: Job | None = None, knobs: Any = None) -> dict[str, Any]:
    """The same keys for a job its policy rejected before simulating (simulated figures null); fields that
    need the job are null when it is unknown (a plan file's policy raising outside ``simulate``)."""
    oom = {"stage": "plan", "pool": e.pool, "requested_bytes": e.need_bytes, "capacity_bytes": e.capacity_bytes,
           "over_by_bytes": e.need_bytes - e.capacity_bytes, "total_demand_bytes": e.need_bytes,
           "free_bytes": None, "time_s": None, "task": None, "tensor": None, "what": e.what, "message": str(e)}
    pools = build_topology(job.hw).pools if job is not None else None
    model: dict[str, Any] | None = None
    if job is not None:
        model = with_model_counts(dataclasses.asdict(job.model))
    return finite({
        "feasible": False,
        "verdict": oom_verdict(oom),
        "policy": e.policy,
        "knobs": dataclasses.asdict(knobs) if knobs is not None else {},
        "hardware": job.hw.name if job is not None else None,
        "model": model,
        "workload": {**job.config.to_dict(), "provenance": job.trace.provenance, "assumed": list(job.assumed)}
        if job is not None else None,
        "n_gpus": job.n_gpus if job is not None else None,
        **dict.fromkeys(SIMULATED_FIELDS),
        "capacity_bytes": {p.name: p.capacity_bytes for p in pools.values()} if pools is not None else None,
        "reserved_bytes": {p.name: dict(p.reserved) for p in pools.values()} if pools is not None else None,
        "oom": oom,
        "ooms": [oom],
        "sim": dict(NOT_SIMULATED),
        "notes": [],
        "info": {},
        "tiersim_version": tiersim_version(),
    })


def dumps(d: Mapping[str, Any]) -> str:
    """The JSON text the commands print: indented, NaN and Infinity written as null, with ``tiersim_version``."""
    return json.dumps(finite(versioned(d)), indent=1)


def versioned(d: Mapping[str, Any]) -> dict[str, Any]:
    """``d`` with the ``tiersim_version`` key every ``--json`` object carries (kept when already there)."""
    return {**d, "tiersim_version": d.get("tiersim_version", tiersim_version())}


def oom_verdict(oom: Mapping[str, Any]) -> str:
    """The INFEASIBLE line of an ``oom`` object of the JSON (a simulated OOM or a policy's verdict)."""
    over = f"over by {gb(oom['over_by_bytes'])}"
    if oom.get("stage") == "plan":
        return (f"INFEASIBLE: {oom['pool']} needs {gb(oom['requested_bytes'])} for {oom.get('what') or 'the job'} "
                f"but holds {gb(oom['capacity_bytes'])}: {over} (the policy's own estimate; nothing simulated)")
    return (f"INFEASIBLE: {oom['pool']} runs out of memory at t={secs(oom['time_s'])} ({oom['task']} asks "
            f"{gb(oom['requested_bytes'])} with {gb(oom['free_bytes'])} free); total demand "
            f"{gb(oom['total_demand_bytes'])} vs capacity {gb(oom['capacity_bytes'])}: {over}")


def finite(x: Any) -> Any:
    """JSON has no NaN or Infinity: null instead (as ``simulate --json`` writes)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x
