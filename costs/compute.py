"""Compute seconds of a GPU task: a one-kernel roofline, or operator by operator where the hardware says how.

Roofline (every preset): ``max(flops / (peak * eff(flops)), hbm_bytes / hbm_bw) + launch overhead`` -- the
layer task as ONE kernel of its total FLOPs, with the efficiency curve standing for everything else.

Operator level (a spec with ``gpu.op_overhead``, as ``tiersim calibrate`` writes): a task of a known
``layer`` and ``phase`` (fwd | bwd | recompute) runs the operators that :func:`workloads.ops.layer_ops`
lists, and costs::

    max( sum_i f_i / (peak * eff(f_i))  +  elementwise_bytes / elementwise_bw  +  n_ops * op_overhead,
         hbm_bytes / hbm_bw )

(the task's own HBM traffic stays a floor, as in the roofline) where f_i are its matmul kernels (each at
its own size on the curve). A task that carries a share of the layer (a tensor-parallel rank, a chunk of
the tokens) has FLOPs ``k`` times the layer's: every kernel and the element-wise bytes are scaled by ``k``
(kernels get smaller, so less efficient), the operator count is not. A task of no known layer keeps the
roofline.
"""

from __future__ import annotations

from typing import Any

from hardware_models import HardwareSpec
from workloads import ModelSpec, WorkloadConfig
from workloads.ops import PHASES, LayerOps, layer_ops

__all__ = ["ComputePricer", "compute_seconds", "kernel_seconds", "ops_seconds"]


def compute_seconds(hw: HardwareSpec, flops: float, hbm_bytes: float, dtype: str) -> float:
    """Roofline seconds of one kernel on one GPU of ``hw`` (without the launch overhead)."""
    t_flops = flops / (hw.peak_flops_for(dtype) * hw.gpu.gemm_efficiency(flops)) if flops > 0 else 0.0
    t_mem = hbm_bytes / hw.gpu.hbm_bw if hbm_bytes > 0 else 0.0
    return max(t_flops, t_mem)


def kernel_seconds(hw: HardwareSpec, flops: float, hbm_bytes: float, dtype: str) -> float:
    """Seconds of one roofline compute task: :func:`compute_seconds` plus the launch overhead."""
    return compute_seconds(hw, flops, hbm_bytes, dtype) + hw.gpu.launch_overhead_s


def ops_seconds(hw: HardwareSpec, ops: LayerOps, dtype: str) -> float:
    """Seconds of a list of operators on one GPU of ``hw`` (needs ``gpu.op_overhead``)."""
    g = hw.gpu
    peak = hw.peak_flops_for(dtype)
    t = sum(f / (peak * g.gemm_efficiency(f)) for f in ops.matmul_flops if f > 0)
    t += ops.elementwise_bytes / (g.elementwise_bw or g.hbm_bw)
    return t + ops.n_ops * (g.op_overhead_s or 0.0)


class ComputePricer:
    """Prices compute tasks on one GPU of ``hw`` in ``dtype``: operator by operator where ``hw`` has
    ``gpu.op_overhead`` and the task's layer of ``workload`` (model, config) is known, else the roofline.
    Memoised per distinct task shape."""

    def __init__(self, hw: HardwareSpec, dtype: str, workload: tuple[ModelSpec, WorkloadConfig] | None = None):
        self.hw = hw
        self.dtype = dtype
        self.op_level = hw.gpu.op_overhead_s is not None
        self.workload = workload if self.op_level else None
        self._memo: dict[tuple[float, float, Any, Any], float] = {}

    def seconds(self, flops: float, hbm_bytes: float, layer: Any = None, phase: Any = None) -> float:
        """Seconds of work of a compute task (launch or operator overheads included); ``layer`` (an int)
        and ``phase`` (fwd | bwd | recompute) name what it computes, where known."""
        key = (flops, hbm_bytes, layer, phase)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._price(flops, hbm_bytes, layer, phase)
        return got

    def layer_ops(self, layer: Any, phase: Any, flops: float) -> LayerOps | None:
        """The operators of a task of ``flops`` FLOPs of ``layer`` in ``phase``; None where not known."""
        if self.workload is None or phase not in PHASES or not isinstance(layer, int) or isinstance(layer, bool):
            return None
        model, config = self.workload
        if not 0 <= layer <= model.n_layers + 1:
            return None
        ops = layer_ops(model, config, layer, phase)
        if ops.flops > 0 and flops > 0:
            ops = ops.scaled(flops / ops.flops)
        return ops

    def _price(self, flops: float, hbm_bytes: float, layer: Any, phase: Any) -> float:
        ops = self.layer_ops(layer, phase, flops) if self.op_level else None
        if ops is None:
            return kernel_seconds(self.hw, flops, hbm_bytes, self.dtype)
        return max(ops_seconds(self.hw, ops, self.dtype), hbm_bytes / self.hw.gpu.hbm_bw)
