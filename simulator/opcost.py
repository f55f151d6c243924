"""The engine's price of one compute task: the plan's workload and the task's tags handed to ``costs``.

The pricing itself (roofline, or operator by operator where the hardware has ``gpu.op_overhead``) is
:class:`costs.ComputePricer`; what stays here needs a Plan: reading the plan's workload (model and
config; a plan without a usable one is priced with the roofline) and a task's ``layer`` / ``phase`` tags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from costs import ComputePricer
from hardware_models import HardwareSpec
from simulator.plan import Plan, TaskSpec
from workloads import ModelSpec, WorkloadConfig, WorkloadInputError

__all__ = ["plan_pricer", "task_seconds"]


def _workload(workload: Mapping[str, Any]) -> tuple[ModelSpec, WorkloadConfig] | None:
    m = workload.get("model")
    if not isinstance(m, Mapping):
        return None
    try:
        model = ModelSpec.from_dict({k: v for k, v in m.items() if k != "params"})
        keys = WorkloadConfig.__dataclass_fields__
        config = WorkloadConfig.from_dict({k: v for k, v in workload.items() if k in keys})
    except (WorkloadInputError, TypeError):
        return None
    return model, config


def plan_pricer(plan: Plan, hw: HardwareSpec, dtype: str) -> ComputePricer:
    """The compute pricer of ``plan`` on ``hw``: operator level where ``hw`` has ``gpu.op_overhead`` and
    the plan names its model, else the roofline."""
    return ComputePricer(hw, dtype, _workload(plan.workload) if hw.gpu.op_overhead_s is not None else None)


def task_seconds(pricer: ComputePricer, s: TaskSpec) -> float:
    """Seconds of work of compute task ``s`` (launch or operator overheads included), from its tags."""
    return pricer.seconds(s.flops, s.hbm_bytes, s.tags.get("layer"), s.tags.get("phase"))
