"""Compute seconds of a GPU task: kernel by kernel on the efficiency curve, or operator by operator where the
hardware says how.

Kernel level (every preset): a task of a known ``layer`` and ``phase`` (fwd | bwd | recompute) runs the
matmul kernels that :func:`workloads.ops.layer_ops` lists, each at its own size on its curve and never
faster than its own operands move over HBM::

    max( sum_i max(f_i / (peak * eff_i(f_i)), e * (M_i*K_i + K_i*N_i + M_i*N_i) / hbm_bw)
           + ew_bytes / ew_bw,
         hbm_bytes / hbm_bw ) + launch overhead

(f_i the kernel's FLOPs, (M_i, N_i, K_i) its GEMM shape, e the bytes of the training dtype). Each preset's
curves are its GPU generation's (``hardware_specs.yaml`` ``gemm_efficiency_by_generation``), so a small
micro-batch, a tensor-parallel shard or a thin model gets small, inefficient kernels. Two forms:

- element-wise work priced apart (``gpu.elementwise_efficiency`` given: the Ampere and Hopper presets, fitted
  to llm-foundry's published tables by ``tiersim.foundry_fit``): ``eff_i`` is the GEMM curve for a linear
  layer's kernel and ``gpu.attention_efficiency`` for the FlashAttention kernel; ``ew_bytes`` are all the
  element-wise operators' bytes (``LayerOps.elementwise_bytes``), over ``ew_bw`` = ``gpu.elementwise_bw`` where
  measured, else ``gpu.elementwise_efficiency`` x ``hbm_bw``;
- a folded curve (the other generations): one curve that folds in what a layer runs besides its matmuls
  (norms, activations, dispatch gaps), set against runs with fused attention (FlashAttention, whose s x s
  scores never reach HBM). Without it (``flash_attention`` off) the scores are materialised and their
  non-matmul operators (softmax, dropout and their backwards: ``score_bytes``, :mod:`workloads.ops`) stream
  a*s^2*b-sized tensors that the folded factor does not stand for, so ``ew_bytes`` are those alone, over
  ``gpu.elementwise_bw`` where measured, else ``hbm_bw``.

Either way, without flash attention the two score matmuls are kernels of their own, held to their s x s
operand's traffic.

Roofline (a task of no known layer): ``max(flops / (peak * eff(flops)), hbm_bytes / hbm_bw) + launch
overhead`` -- the task as ONE kernel of its total FLOPs.

Operator level (a spec with ``gpu.op_overhead``, as ``tiersim calibrate`` writes): a task of a known
``layer`` and ``phase`` (fwd | bwd | recompute) runs the operators that :func:`workloads.ops.layer_ops`
lists, and costs::

    max( sum_i f_i / (peak * eff(f_i))  +  elementwise_bytes / elementwise_bw  +  n_ops * op_overhead,
         hbm_bytes / hbm_bw )

(with ``gpu.dispatch_overlap``, a CUDA device whose host issues operators ahead of its kernels, the first
term's ``+ n_ops * op_overhead`` is a ``max`` with the kernels instead: the host's dispatch and the device's
kernels overlap within a task, which the runner ends with one synchronisation; where the spec has them the
host's side is ``n_matmuls * gemm_op_overhead + (n_ops - n_matmuls) * op_overhead``, and ``task_overhead`` is
added once per task: the module call around the operators and the synchronisation, which overlap nothing)

(the task's own HBM traffic stays a floor, as in the roofline) where f_i are its matmul kernels (each at
its own size on its kind's curve, :func:`kernel_efficiency`: a backward's products on
``gpu.gemm_backward_efficiency`` and the attention kernel on ``gpu.attention_efficiency`` /
``gpu.attention_backward_efficiency`` where the spec has them, as ``tiersim calibrate`` measures them in the
runner's precision; else the forward GEMM curve). A task that carries a share of the layer (a tensor-parallel
rank, a chunk of the tokens) has FLOPs ``k`` times the layer's: every kernel and the element-wise bytes are
scaled by ``k`` (kernels get smaller, so less efficient), the operator count is not. A task of no known layer keeps the
roofline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hardware_models import Curve, GpuSpec, HardwareSpec
from workloads import ModelSpec, WorkloadConfig
from workloads.config import DTYPE_BYTES
from workloads.ops import ATTENTION, NO_SHAPE, PHASES, LayerOps, layer_ops

UNALIGNED_ELEMENTS = 8  # a GEMM dimension that is a multiple of 8 elements runs at the curve's rate

__all__ = ["UNALIGNED_ELEMENTS", "ComputePricer", "KernelCurves", "compute_seconds", "elementwise_apart",
           "elementwise_bandwidth", "gemm_kernels_seconds",
           "kernel_efficiency", "kernel_seconds", "kernel_level_seconds", "matmul_seconds", "ops_seconds",
           "unaligned_factor"]


@dataclass(frozen=True)
class KernelCurves:
    """The efficiency curves (fractions of one peak, over FLOPs per kernel) a layer's kernels run on: the
    forward GEMM curve, and where measured the backward products' and the attention kernel's (forward and
    backward; each None where not measured: the forward GEMM curve is used)."""

    gemm: Curve
    gemm_backward: Curve | None = None
    attention: Curve | None = None
    attention_backward: Curve | None = None
    unaligned: float | None = None  # gpu.gemm_unaligned_efficiency

    @classmethod
    def of(cls, gpu: GpuSpec) -> KernelCurves:
        return cls(gpu.gemm_efficiency, gpu.gemm_backward_efficiency, gpu.attention_efficiency,
                   gpu.attention_backward_efficiency, gpu.gemm_unaligned_efficiency)


def unaligned_factor(unaligned: float | None, phase: str | None, shape: tuple[float, float, float]) -> float:
    """The share of its curve's rate a GEMM kernel of ``shape`` (M, N, K) runs at: ``unaligned``
    (``gpu.gemm_unaligned_efficiency``, where measured) for a forward (or recomputed) GEMM whose output width N
    is not a multiple of ``UNALIGNED_ELEMENTS``, else 1. A backward's products of that layer are not charged
    (measured on a CPU: an odd K ran at 0.81, an odd M at 0.94 of the aligned rate; the curve stands)."""
    n = shape[1]
    if unaligned is None or phase == "bwd" or n <= 0 or n % UNALIGNED_ELEMENTS == 0:
        return 1.0
    return unaligned


def kernel_efficiency(curves: KernelCurves, kind: str, phase: str | None, flops: float) -> float:
    """The efficiency of one kernel of ``kind`` (gemm | attention) and ``flops`` FLOPs in ``phase`` (fwd |
    bwd | recompute; a recomputation runs forward kernels): its kind's curve where known (a backward's
    attention kernel: its own curve, else the forward attention kernel's), else the forward GEMM curve."""
    bwd = phase == "bwd"
    if kind == ATTENTION:
        curve = (curves.attention_backward or curves.attention) if bwd else curves.attention
    else:
        curve = curves.gemm_backward if bwd else None
    return (curve or curves.gemm)(flops)


def matmul_seconds(ops: LayerOps, peak: float, curves: KernelCurves, phase: str | None = None) -> float:
    """Seconds of the matmul kernels of ``ops`` (no HBM floor): each ``f / (peak * efficiency)`` on its kind's
    curve (:func:`kernel_efficiency`; a kernel of unknown kind is a gemm), a GEMM with an unaligned output
    width at its share of that (:func:`unaligned_factor`)."""
    kinds = ops.kinds or ("",) * len(ops.matmul_flops)
    shapes = ops.matmul_shapes or (NO_SHAPE,) * len(ops.matmul_flops)
    return sum(f / (peak * kernel_efficiency(curves, kind, phase, f)
                    * (unaligned_factor(curves.unaligned, phase, shape) if kind != ATTENTION else 1.0))
               for f, kind, shape in zip(ops.matmul_flops, kinds, shapes, strict=True) if f > 0)


def compute_seconds(hw: HardwareSpec, flops: float, hbm_bytes: float, dtype: str) -> float:
    """Roofline seconds of one kernel on one GPU of ``hw`` (without the launch overhead)."""
    t_flops = flops / (hw.peak_flops_for(dtype) * hw.gpu.gemm_efficiency(flops)) if flops > 0 else 0.0
    t_mem = hbm_bytes / hw.gpu.hbm_bw if hbm_bytes > 0 else 0.0
    return max(t_flops, t_mem)


def kernel_seconds(hw: HardwareSpec, flops: float, hbm_bytes: float, dtype: str) -> float:
    """Seconds of one roofline compute task: :func:`compute_seconds` plus the launch overhead."""
    return compute_seconds(hw, flops, hbm_bytes, dtype) + hw.gpu.launch_overhead_s


def gemm_kernels_seconds(hw: HardwareSpec, ops: LayerOps, dtype: str, phase: str | None = None) -> float:
    """Seconds of the matmul kernels of ``ops`` on one GPU of ``hw``, each at its own size on its curve and
    no faster than its operands (M*K + K*N + M*N elements of ``dtype``) move over HBM. The attention kernel
    (kind ``attention``) runs on ``gpu.attention_efficiency`` where the spec has it (``gpu.attention_backward_
    efficiency`` in a backward, where given), every other kernel on ``gpu.gemm_efficiency``."""
    g = hw.gpu
    peak = hw.peak_flops_for(dtype)
    e = DTYPE_BYTES.get(dtype, 2)
    shapes = ops.matmul_shapes or ((0.0, 0.0, 0.0),) * len(ops.matmul_flops)
    kinds = ops.kinds or ("",) * len(ops.matmul_flops)
    attention = (g.attention_backward_efficiency if phase == "bwd" else None) or g.attention_efficiency
    t = 0.0
    for f, (m, n, k), kind in zip(ops.matmul_flops, shapes, kinds, strict=True):
        if f > 0:
            curve = attention if kind == ATTENTION and attention is not None else g.gemm_efficiency
            t += max(f / (peak * curve(f)), e * (m * k + k * n + m * n) / g.hbm_bw)
    return t


def elementwise_apart(gpu: GpuSpec) -> bool:
    """Whether ``gpu``'s curve is its matmuls' alone, a layer's element-wise work priced apart
    (``gpu.elementwise_efficiency`` given: the Ampere and Hopper presets, ``tiersim.foundry_fit``)."""
    return gpu.elementwise_efficiency is not None


def elementwise_bandwidth(gpu: GpuSpec) -> float:
    """Bytes/s of a layer's element-wise operators: ``gpu.elementwise_bw`` where measured, else
    ``gpu.elementwise_efficiency`` x ``gpu.hbm_bw`` where given, else ``gpu.hbm_bw``."""
    if gpu.elementwise_bw:
        return gpu.elementwise_bw
    return gpu.hbm_bw * (gpu.elementwise_efficiency or 1.0)


def kernel_level_seconds(hw: HardwareSpec, ops: LayerOps, dtype: str, phase: str | None = None) -> float:
    """Seconds of a layer task's work at kernel level (no HBM floor, no launch overhead): its matmul kernels
    (:func:`gemm_kernels_seconds`) plus, over :func:`elementwise_bandwidth`, the bytes of its element-wise
    operators where the spec prices them apart (:func:`elementwise_apart`), else those of the attention-score
    operators alone (``ops.score_bytes``: without flash attention; the curve folds in the rest)."""
    g = hw.gpu
    ew = ops.elementwise_bytes if elementwise_apart(g) else ops.score_bytes
    return gemm_kernels_seconds(hw, ops, dtype, phase) + ew / elementwise_bandwidth(g)


def ops_seconds(hw: HardwareSpec, ops: LayerOps, dtype: str, phase: str | None = None) -> float:
    """Seconds of a list of operators of ``phase`` on one GPU of ``hw`` (needs ``gpu.op_overhead``): their
    kernels plus their fixed cost, or the larger of the two where the host issues operators ahead of the device
    (``gpu.dispatch_overlap``: CUDA's asynchronous launches; a CPU "GPU" runs each operator as it is issued)."""
    g = hw.gpu
    t = matmul_seconds(ops, hw.peak_flops_for(dtype), KernelCurves.of(g), phase)
    t += ops.elementwise_bytes / elementwise_bandwidth(g)
    fixed = dispatch_seconds(hw, ops)
    task = (g.task_overhead_s or 0.0) if ops.n_ops > 0 else 0.0
    return (max(t, fixed) if g.dispatch_overlap else t + fixed) + task


def dispatch_seconds(hw: HardwareSpec, ops: LayerOps) -> float:
    """The host's fixed cost of issuing ``ops``: ``gpu.gemm_op_overhead`` per matmul or attention operator
    (default ``gpu.op_overhead``) and ``gpu.op_overhead`` per other operator."""
    g = hw.gpu
    op = g.op_overhead_s or 0.0
    n_mm = min(len(ops.matmul_flops), ops.n_ops)
    gemm_op = op if g.gemm_op_overhead_s is None else g.gemm_op_overhead_s
    return n_mm * gemm_op + (ops.n_ops - n_mm) * op


class ComputePricer:
    """Prices compute tasks on one GPU of ``hw`` in ``dtype`` where the task's layer of ``workload`` (model,
    config) is known: operator by operator where ``hw`` has ``gpu.op_overhead`` (a calibrated spec), else
    kernel by kernel on the curve; the roofline for any other task. Memoised per distinct task shape.

    ``tile_factor`` T > 1: the plan's layer tags count tiles (ZeRO-Infinity's memory-centric tiling,
    ``plan.info['tile_factor']``: embedding 0, block k's T tiles 1 + (k-1)*T .. k*T, head L*T + 1), and a tile's
    task is priced as its block's operators at the tile's share of the FLOPs."""

    def __init__(self, hw: HardwareSpec, dtype: str, workload: tuple[ModelSpec, WorkloadConfig] | None = None,
                 tile_factor: int = 1):
        self.hw = hw
        self.dtype = dtype
        self.op_level = hw.gpu.op_overhead_s is not None
        self.workload = workload
        self.tile_factor = max(1, tile_factor)
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
        layer = self.model_layer(layer)
        if layer is None:
            return None
        ops = layer_ops(model, config, layer, phase)
        if ops.flops > 0 and flops > 0:
            ops = ops.scaled(flops / ops.flops)
        return ops

    def model_layer(self, layer: int) -> int | None:
        """The model's layer (0 embedding, 1..L blocks, L+1 head) of plan layer ``layer`` (a tile's block where
        the plan is tiled); None where the plan has no such layer."""
        assert self.workload is not None
        n, t = self.workload[0].n_layers, self.tile_factor
        if not 0 <= layer <= n * t + 1:
            return None
        if layer == 0:
            return 0
        return n + 1 if layer == n * t + 1 else (layer - 1) // t + 1

    def _price(self, flops: float, hbm_bytes: float, layer: Any, phase: Any) -> float:
        ops = self.layer_ops(layer, phase, flops)
        floor = hbm_bytes / self.hw.gpu.hbm_bw
        if ops is not None and self.op_level:
            return max(ops_seconds(self.hw, ops, self.dtype, phase), floor)
        if ops is None or not ops.matmul_flops or flops <= 0:
            return kernel_seconds(self.hw, flops, hbm_bytes, self.dtype)
        return max(kernel_level_seconds(self.hw, ops, self.dtype, phase), floor) + self.hw.gpu.launch_overhead_s
