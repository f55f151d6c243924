"""The engine's price of one compute task: the plan's workload and the task's tags handed to ``costs``.

The pricing itself (kernel by kernel on the curve, or operator by operator where the hardware has
``gpu.op_overhead``) is
:class:`costs.ComputePricer`; what stays here needs a Plan: the plan's typed workload (model and config)
and a task's ``layer`` / ``phase`` tags.
"""

from __future__ import annotations

from costs import ComputePricer
from hardware_models import HardwareSpec
from simulator.plan import Plan, TaskSpec

__all__ = ["plan_pricer", "task_seconds"]


def plan_pricer(plan: Plan, hw: HardwareSpec, dtype: str) -> ComputePricer:
    """The compute pricer of ``plan`` on ``hw``: operator level where ``hw`` has ``gpu.op_overhead``, else
    kernel by kernel on the efficiency curve (the roofline for tasks of no known layer)."""
    return ComputePricer(hw, dtype, (plan.workload.model, plan.workload.config),
                         tile_factor=int(plan.info.get("tile_factor", 1)))


def task_seconds(pricer: ComputePricer, s: TaskSpec) -> float:
    """Seconds of work of compute task ``s`` (launch or operator overheads included), from its tags. A part of a
    layer's use (tag ``layer_share``: its share of the use's FLOPs, ``policies.kit.tp_layer``) is that share of
    the whole use's seconds, so that splitting a layer at its tensor-parallel all-reduces does not price its
    kernels smaller than they are."""
    share = s.tags.get("layer_share")
    if isinstance(share, float) and 0.0 < share < 1.0:
        return share * pricer.seconds(s.flops / share, s.hbm_bytes / share, s.tags.get("layer"), s.tags.get("phase"))
    return pricer.seconds(s.flops, s.hbm_bytes, s.tags.get("layer"), s.tags.get("phase"))
