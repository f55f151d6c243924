"""Measuring this machine for ``tiersim calibrate``: GEMM rates, copy bandwidth between the runner's pools,
disk bandwidth with the page cache out of the way, the Adam rate, and the host's DRAM and cores.

On a CPU-only machine the runner's "gpu0" pool is host memory (design: copies gpu0 <-> cpu are host
memcpys, "nvme" is files in a directory), so the figures measured here are those the runner will see.
On a CUDA machine the GPU path measures pinned H2D / D2H (alone and at once), device-to-device copies
and bf16 GEMMs on the GPU. Every function takes its sizes as parameters so that tests run in seconds.
torch is imported here (``replay`` is the only package that may import it); nothing runs at import time.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from replay.host_memory import keep_freed_memory
from replay.precision import TORCH_DTYPES, Precision, gemm16_note, gemm16_path
from replay.threads import cpu_op_threads

__all__ = [
    "Calibration",
    "CalibrationSizes",
    "DiskResult",
    "calibrate",
    "filesystem_type",
    "host_info",
    "measure_adam",
    "measure_attention",
    "measure_copy",
    "measure_disk",
    "measure_duplex",
    "measure_elementwise",
    "measure_layer_elementwise",
    "measure_gemm",
    "measure_gemm_backward",
    "measure_op_overhead",
    "measure_small_op",
]

Progress = Callable[[str], None]
_ALIGN = 4096


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class CalibrationSizes:
    """How much work each measurement does. The defaults take ~30-60 s on a small CPU-only host."""

    gemm_flops: tuple[float, ...] = tuple(10 ** (6 + k / 2) for k in range(9))  # 1e6 .. 1e10 FLOP per op
    gpu_gemm_flops: tuple[float, ...] = tuple(10 ** (6 + k / 2) for k in range(15))  # CUDA: up to 1e13 FLOP
    gemm_peak_points: int = 3  # other dtypes: only the largest few sizes (their peak)
    # the backward products of a linear layer (FLOPs per product): up to ~3e9 (a CPU's 16-bit backward is slow;
    # the curve is flat beyond its last point)
    gemm_backward_flops: tuple[float, ...] = tuple(10 ** (6 + k / 2) for k in range(8))
    gpu_gemm_backward_flops: tuple[float, ...] = tuple(10 ** (6 + k / 2) for k in range(15))
    attention_seqs: tuple[int, ...] = (128, 256, 512, 1024)  # the attention kernel, batch 1 ...
    attention_heads: tuple[int, int] = (8, 64)  # ... at (heads, head_dim)
    gpu_attention_seqs: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    gemm_min_time_s: float = 0.15  # per size: repeat until this much time is spent (at least `repeats` times)
    copy_bytes: int = 256 * 2**20
    disk_bytes: int = 256 * 2**20
    disk_chunk: int = 8 * 2**20
    adam_params: int = 8_000_000  # at least; more where the host's last-level cache would hold its state
    adam_beyond_cache: bool = True  # (adam_sample_params)
    gpu_adam_params: int = 64_000_000  # CUDA: enough that a fused step is bandwidth-bound, not launch-bound
    elementwise_bytes: tuple[int, ...] = (2**18, 2**20, 2**22)  # operand sizes of the element-wise chain
    # CUDA: operands large enough that the chain is bound by the device's memory, not the host's dispatch
    gpu_elementwise_bytes: tuple[int, ...] = (2**24, 2**26, 2**28)
    repeats: int = 5
    ranks_allreduce_bytes: int = 64 * 2**20  # calibrate --ranks (replay.calibrate_ranks)
    ranks_gemm_n: int = 1024
    ranks_copy_bytes: int = 64 * 2**20
    ranks_share_s: float = 0.2  # each window of calibrate --ranks' compute and copy rates (measure_ranks)
    unaligned_gemm: tuple[int, int, int] = (1024, 4096, 256)  # (M, N, K) against N + 1 (measure_unaligned_gemm)
    probe_layer: tuple[int, int, int, int] | None = None  # (hidden, heads, ffn, tokens); None: PROBE_LAYER

    def ranks_kwargs(self) -> dict[str, Any]:
        return {"allreduce_bytes": self.ranks_allreduce_bytes, "gemm_n": self.ranks_gemm_n,
                "copy_bytes": self.ranks_copy_bytes, "repeats": self.repeats, "share_s": self.ranks_share_s}

    @classmethod
    def tiny(cls) -> CalibrationSizes:
        """Sizes for tests: a second or two in all."""
        return cls(gemm_flops=(1e5, 1e6, 1e7), gpu_gemm_flops=(1e6, 1e8), gemm_peak_points=1, gemm_min_time_s=0.005,
                   gemm_backward_flops=(1e5, 1e6), gpu_gemm_backward_flops=(1e6, 1e8), attention_seqs=(16, 32),
                   attention_heads=(2, 16), gpu_attention_seqs=(64, 128),
                   copy_bytes=2**20, disk_bytes=4 * 2**20, disk_chunk=2**20, adam_params=20_000,
                   adam_beyond_cache=False, gpu_adam_params=20_000, elementwise_bytes=(2**16,),
                   gpu_elementwise_bytes=(2**16,), repeats=3,
                   ranks_allreduce_bytes=2**20,
                   unaligned_gemm=(64, 256, 32),
                   ranks_gemm_n=128, ranks_copy_bytes=2**20, ranks_share_s=0.02, probe_layer=(64, 2, 128, 32))


@dataclass(frozen=True)
class DiskResult:
    read_bw: float
    write_bw: float
    method: str  # "O_DIRECT" or "fsync+fadvise"
    capacity_free: int
    directory: str
    file_bytes: int
    fs_type: str = "unknown"  # from /proc/mounts; tmpfs/ramfs mean the "disk" is memory


@dataclass
class Calibration:
    """Everything measured (bytes, seconds, FLOP/s, bytes/s), plus how each figure was obtained."""

    host: str
    date: str
    device: str  # "cpu" or "cuda"
    gpu_model: str
    gpu_count: int
    gpu_memory: float
    gpu_memory_method: str
    cpu_model: str
    cores: int
    dram: float
    gemm_dtype: str
    gemm_curve: list[tuple[float, float]]  # (FLOPs of one op, FLOP/s achieved) for gemm_dtype
    peak_flops: dict[str, float]
    peak_at: dict[str, float]  # dtype -> FLOPs of the op that reached the peak
    h2d_bw: float
    d2h_bw: float
    duplex_bw: float  # both directions at once, total bytes/s
    copy_method: str
    copy_latency_s: float
    hbm_bw: float
    hbm_method: str
    dram_bw: float
    launch_overhead_s: float
    optimizer_params_per_s: float  # CPU Adam
    optimizer_variant: str
    gpu_optimizer_params_per_s: float  # Adam on the compute device (same as the CPU one on CPU-only)
    disk: DiskResult
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    op_overhead_s: float | None = None  # fixed cost of one eager operator (the replay block's, see below)
    dispatch_overlap: bool = False  # the host issues operators ahead of the device (CUDA), see GpuSpec
    op_overhead_method: str = ""
    gemm_op_overhead_s: float | None = None  # CUDA: the host's cost per matmul operator (calibrate_dispatch)
    task_overhead_s: float | None = None  # CUDA: the host's cost per layer task (calibrate_dispatch)
    elementwise_bw: float | None = None  # bytes read + written per second by element-wise operators
    elementwise_method: str = ""
    # (FLOPs of one kernel, FLOP/s) in gemm_dtype: a linear layer's backward products, and the attention kernel
    # forward and backward (its FLOPs as workloads.flops counts them); empty where not measured
    gemm_backward_curve: list[tuple[float, float]] = field(default_factory=list)
    attention_curve: list[tuple[float, float]] = field(default_factory=list)
    attention_backward_curve: list[tuple[float, float]] = field(default_factory=list)
    attention_method: str = ""
    # 16-bit dtype -> "native" | "emulated": the GEMM path every 16-bit figure was measured on, the runner's
    # (replay.precision.gemm16_path); its citation carries it so a replay can tell a mismatch
    gemm16: dict[str, str] = field(default_factory=dict)
    # a forward GEMM whose output width is not a multiple of 8, against the aligned one (measure_unaligned_gemm)
    gemm_unaligned: float | None = None
    gemm_unaligned_method: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("gemm_curve", "gemm_backward_curve", "attention_curve", "attention_backward_curve"):
            d[key] = [list(p) for p in getattr(self, key)]
        return d


# ------------------------------------------------------------------------------------------ timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], object], device: torch.device, repeats: int, min_time_s: float = 0.0,
                 max_repeats: int = 1000) -> float:
    """Median seconds of one call of `fn` (after one warm-up), over >= `repeats` calls and >= `min_time_s`."""
    fn()
    _sync(device)
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats or (spent < min_time_s and len(times) < max_repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times)


# -------------------------------------------------------------------------------------------- GEMM


def measure_gemm(device: torch.device, dtype: torch.dtype, flops: Sequence[float], repeats: int = 5,
                 min_time_s: float = 0.1) -> list[tuple[float, float]]:
    """(FLOPs of one square product, FLOP/s) for n x n by n x n with 2 n^3 close to each of `flops`, computed
    as the runner computes a linear layer in `dtype` (``replay.precision.linear_rate_op``: ``F.linear`` of fp32
    operands under the precision's autocast, the 16-bit casts included), so the rate a plan is priced at is
    the rate its replay gets. Small ops are timed in batches (one timed call lasts >= ~2 ms) and divided;
    median of repeats."""
    from replay.precision import linear_rate_op

    name = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    out: list[tuple[float, float]] = []
    for n in _square_sizes(flops):
        one = 2.0 * n**3
        out.append((one, one / _batched_time(linear_rate_op(device, name, n, n, n), device, repeats, min_time_s)))
    return out


GEMM_ALIGN = 8  # the curve's sizes are multiples of 8, as a model's dimensions are (module constant, see below)


def _square_sizes(flops: Sequence[float]) -> list[int]:
    """The distinct n, a multiple of ``GEMM_ALIGN``, whose square product n x n by n x n, 2 n^3 FLOPs, is
    closest to each of `flops`. A model's GEMM dimensions are multiples of 8 (hidden sizes, heads x head_dim,
    FFN widths), and a GEMM with a dimension that is not runs at another rate: on a 2-core AVX512 EPYC VM, one
    fp32 thread, 1024 x 4097 x 256 ran at 58 GFLOP/s against 87-92 for 1024 x 4096 x 256 and 89 for
    1024 x 4104 x 256 (2026-12-04). The curve used to be measured at n = round(cbrt(f / 2)) (79, 171, 251,
    541, 1165, 1710: odd), and its only multiple of 8 (368) was its peak: a model's aligned GEMMs were priced
    at the misaligned rate (blocks 15-28% slower than measured)."""
    def aligned(target: float) -> int:
        return max(GEMM_ALIGN, GEMM_ALIGN * round((target / 2) ** (1 / 3) / GEMM_ALIGN))

    return list(dict.fromkeys(aligned(target) for target in flops))


def _batched_time(op: Callable[[], object], device: torch.device, repeats: int, min_time_s: float) -> float:
    """Median seconds of one call of `op`, small ops timed in batches of calls lasting >= ~2 ms."""
    def run(k: int = 1) -> None:
        for _ in range(k):
            op()

    probe = _median_time(run, device, 1)
    batch = max(1, min(10_000, math.ceil(2e-3 / max(probe, 1e-9))))
    return _median_time(functools.partial(run, k=batch), device, repeats, min_time_s) / batch


def measure_unaligned_gemm(device: torch.device, precision: str, shape: tuple[int, int, int], repeats: int = 5,
                           min_time_s: float = 0.1) -> tuple[float, str]:
    """The rate of a linear layer ``M x K -> N + 1`` (output width not a multiple of 8, as a GPT-2 vocabulary of
    50257) as a fraction of ``M x K -> N`` (N a multiple of 8), in `precision` through the runner's path, at most
    1 (the larger of the two is the aligned one's due). One fp32 thread on a 2-core AVX512 EPYC VM: 1024 x 4097
    x 256 at 58 GFLOP/s against 87-92 aligned (0.63-0.67); bf16 unaffected there (0.98)."""
    from replay.precision import linear_rate_op

    m, n, k = shape
    t_aligned = _batched_time(linear_rate_op(device, precision, m, n, k), device, repeats, min_time_s)
    t_odd = _batched_time(linear_rate_op(device, precision, m, n + 1, k), device, repeats, min_time_s)
    share = min(1.0, (2.0 * m * (n + 1) * k / t_odd) / (2.0 * m * n * k / t_aligned))
    return share, (f"{precision} linear layer {m} x {k} -> {n + 1} as the runner computes it (replay.precision), "
                   f"{2e-9 * m * (n + 1) * k / t_odd:.3g} GFLOP/s, against {m} x {k} -> {n}: "
                   f"{2e-9 * m * n * k / t_aligned:.3g} GFLOP/s; median of repeats")


def measure_gemm_backward(device: torch.device, dtype: torch.dtype, flops: Sequence[float], repeats: int = 5,
                          min_time_s: float = 0.1) -> list[tuple[float, float]]:
    """(FLOPs of one backward product, FLOP/s) of a square n x n linear layer's backward as the runner computes
    it in `dtype` (``replay.precision.linear_backward_rate_op``): forward + backward timed, minus the forward,
    is the time of its two products (input gradient, weight gradient) of 2 n^3 FLOPs each; n with 2 n^3 close
    to each of `flops`. A 16-bit backward can run far slower than its forward on a CPU without native 16-bit
    arithmetic (8x on an AVX2 EPYC), which the forward curve alone cannot price."""
    from replay.precision import linear_backward_rate_op, linear_rate_op

    name = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    out: list[tuple[float, float]] = []
    for n in _square_sizes(flops):
        t_fwd = _batched_time(linear_rate_op(device, name, n, n, n), device, repeats, min_time_s)
        t_both = _batched_time(linear_backward_rate_op(device, name, n, n, n), device, repeats, min_time_s)
        one = 2.0 * n**3
        out.append((one, 2 * one / backward_seconds(t_fwd, t_both)))
    return out


def backward_seconds(t_fwd: float, t_both: float) -> float:
    """The time of a linear layer's two backward products: forward + backward minus forward, at least one
    forward's time (two products of the forward's FLOPs each, on the same machine: at most 2x the forward's
    rate). Under load the two timings' noise made the difference near zero at small sizes: one bf16 point at
    3e6 FLOP came out at 68 GFLOP/s against a 4 GFLOP/s forward (2026-12-03, load 8) and, as the largest rate
    measured, became the peak every curve is a fraction of."""
    return max(t_both - t_fwd, t_fwd)


def measure_attention(device: torch.device, precision: str, seqs: Sequence[int], heads: int, head_dim: int,
                      repeats: int = 5, min_time_s: float = 0.05) -> tuple[list[tuple[float, float]],
                                                                           list[tuple[float, float]], str]:
    """The runner's attention kernel (causal ``F.scaled_dot_product_attention``, ``replay.precision
    .attention_rate_ops``) in `precision`, batch 1, `heads` x `head_dim`, at each sequence of `seqs`:
    (forward points, backward points, how), each point (FLOPs, FLOP/s) on the FLOPs ``workloads.flops``
    counts for it (4 s^2 heads head_dim forward at causal factor 1, twice that backward), so that a plan's
    attention kernel is priced at the rate measured for its size. Backward = forward + backward - forward."""
    from replay.precision import attention_rate_ops

    fwd_pts: list[tuple[float, float]] = []
    bwd_pts: list[tuple[float, float]] = []
    for s in sorted(set(seqs)):
        fwd, both = attention_rate_ops(device, precision, 1, s, heads, head_dim)
        t_f = _batched_time(fwd, device, repeats, min_time_s)
        t_b = max(_batched_time(both, device, repeats, min_time_s) - t_f, 0.05 * t_f)
        flops = 4.0 * s * s * heads * head_dim
        fwd_pts.append((flops, flops / t_f))
        bwd_pts.append((2 * flops, 2 * flops / t_b))
    how = (f"causal F.scaled_dot_product_attention on {device.type} as the runner computes it ({precision}, "
           f"replay.precision), batch 1, {heads} heads x {head_dim}, seq {', '.join(map(str, sorted(set(seqs))))}; "
           f"FLOPs as workloads.flops counts them (4 s^2 h forward, twice that backward; backward = forward + "
           f"backward - forward), median of repeats")
    return fwd_pts, bwd_pts, how


def measure_small_op(device: torch.device, repeats: int = 50) -> float:
    """Seconds of a tiny (8x8) matmul, synchronised: the per-op launch + dispatch overhead."""
    a = torch.ones(8, 8, device=device)
    b = torch.ones(8, 8, device=device)
    return _median_time(lambda: torch.mm(a, b), device, repeats)


def measure_op_overhead(device: torch.device, repeats: int = 20, precision: str = "fp32") -> tuple[float, str]:
    """Seconds per operator of eager PyTorch as the replay runs a layer: the replay's LLaMA-style block
    (``replay.model.Block``) at tiny dimensions (its matmuls and element-wise work are a few hundred
    FLOPs), forward with autograd recording (under the runner's autocast for `precision`) then backward,
    divided by its operator count (``workloads.ops.layer_ops`` fwd + bwd, the same inventory the simulator
    prices)."""
    from replay.model import Block, Dims
    from workloads import ModelSpec, WorkloadConfig
    from workloads.ops import layer_ops

    m = ModelSpec(name="tiny", family="llama", n_layers=1, hidden=16, n_heads=2, n_kv_heads=2, ffn=32, vocab=32,
                  max_pos=64, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False)
    cfg = WorkloadConfig(micro_batch=1, seq_len=4, precision=precision)  # 16 bits: its weight casts counted
    block = Block(Dims.from_model(m)).to(device)
    x = torch.randn(1, 4, 16, device=device, requires_grad=True)
    params = list(block.parameters())

    prec = Precision(precision, device.type)

    def step() -> None:
        with torch.enable_grad():
            with prec.autocast():
                y = block(x)
            torch.autograd.grad(y, [x, *params], torch.ones_like(y))

    n_ops = layer_ops(m, cfg, 1, "fwd").n_ops + layer_ops(m, cfg, 1, "bwd").n_ops
    dt = _median_time(step, device, max(repeats, 20), 0.05)
    return dt / n_ops, (f"median time of the replay's decoder block (replay.model.Block, hidden 16, 4 tokens) "
                        f"forward ({precision} as the runner computes it, replay.precision) + backward on "
                        f"{device.type} / its {n_ops} operators (workloads.ops)")


def measure_elementwise(device: torch.device, sizes: Sequence[int], repeats: int = 5) -> tuple[float, str]:
    """Bytes/s (read + written) of a chain of fresh-output element-wise operators (mul, add, silu: what norms,
    activations and residuals do), median over operand sizes `sizes` (bytes), each a median of repeats.
    Hot caches and contiguous operands: an upper bound for operators inside a layer (see
    :func:`measure_layer_elementwise`)."""
    rates = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        a = torch.randn(n, device=device)
        b = torch.randn(n, device=device)
        moved = 8.0 * n * 4  # mul 3 + add 3 + silu 2 tensors of n fp32 read or written
        per = max(1, math.ceil(2**22 / nbytes))  # small operands: several chains per timed call

        def chain(a: torch.Tensor = a, b: torch.Tensor = b, k: int = per) -> None:
            for _ in range(k):
                torch.nn.functional.silu(a * b + a)

        rates.append(moved * per / _median_time(chain, device, repeats, 0.02))
    how = (f"fresh-output fp32 mul, add, silu chain on {device.type}, bytes read + written / s, median over operands "
           f"of {', '.join(f'{s / 2**20:g}' for s in sizes)} MiB (each a median of repeats)")
    return statistics.median(rates), how


# The layer measure_layer_elementwise runs: LLaMA-style, sized unlike any validation case (replay.validation)
PROBE_LAYER = {"hidden": 384, "n_heads": 6, "ffn": 1024, "seq_len": 192}


def kernel_curves(peak: float, gemm_curve: Sequence[tuple[float, float]],
                  gemm_backward_curve: Sequence[tuple[float, float]] = (),
                  attention_curve: Sequence[tuple[float, float]] = (),
                  attention_backward_curve: Sequence[tuple[float, float]] = ()) -> tuple[Any, float]:
    """(``costs.compute.KernelCurves``, the peak they are fractions of) of measured (FLOPs, FLOP/s) points: the
    peak is the largest of `peak` and every point (a kernel may run faster than the best forward linear layer:
    bf16 attention on a CPU without native bf16), as ``replay.calibrate_spec`` writes them: what the simulator
    will price the kernels with."""
    from costs.compute import KernelCurves
    from hardware_models import Curve

    top = max([peak, *(r for pts in (gemm_curve, gemm_backward_curve, attention_curve, attention_backward_curve)
                       for _, r in pts)])

    def curve(pts: Sequence[tuple[float, float]]) -> Curve | None:
        if not pts:
            return None
        return Curve(tuple((fl, max(1e-6, min(1.0, rate / top))) for fl, rate in sorted(dict(pts).items())))

    gemm = curve(gemm_curve)
    assert gemm is not None, "the forward GEMM curve is always measured"
    return KernelCurves(gemm, curve(gemm_backward_curve), curve(attention_curve), curve(attention_backward_curve)), top


def measure_layer_elementwise(device: torch.device, dtype: str, gemm_curve: Sequence[tuple[float, float]],
                              peak: float, op_overhead_s: float, repeats: int = 5,
                              probe: dict[str, int] | None = None, curves: Any = None,
                              overlap: bool = False, gemm_op_s: float | None = None,
                              task_s: float = 0.0) -> tuple[float | None, str]:
    """Bytes/s of the element-wise operators *inside* a layer, derived from one real layer: the replay's
    decoder block (``replay.model.Block``, :data:`PROBE_LAYER`) forward + backward is timed, and what the
    matmuls and the attention kernel (each at its size on its measured curve; `curves`: a
    ``costs.compute.KernelCurves`` and its peak, as :func:`kernel_curves` makes them; default: `gemm_curve`
    for every kernel) and the operators' fixed cost (`op_overhead_s` x their count) do not explain is charged
    to its element-wise bytes (``workloads.ops``, the 16-bit weight casts included). Inside a layer those
    operators broadcast over transposed activations, reduce rows, run on cold caches and wake the
    thread pool after every matmul, which the hot chain of :func:`measure_elementwise` does not see.
    Returns (None, why) when the layer is no slower than its matmuls and overheads (nothing to charge).
    ``overlap`` (a CUDA device, ``gpu.dispatch_overlap``): the layer costs the larger of its kernels and its
    operators' fixed cost, so only a layer well above that fixed cost (twice it: bound by the device) says
    anything about its element-wise kernels: the rest is then its time minus its matmuls. ``gemm_op_s`` and
    ``task_s``: the host's cost per matmul and per task where measured (``replay.calibrate_dispatch``)."""
    from costs.compute import matmul_seconds
    from replay.model import Block, Dims
    from workloads import ModelSpec, WorkloadConfig
    from workloads.ops import layer_ops

    h, heads, f, s = ((probe or PROBE_LAYER)[k] for k in ("hidden", "n_heads", "ffn", "seq_len"))
    m = ModelSpec(name="probe", family="llama", n_layers=1, hidden=h, n_heads=heads, n_kv_heads=heads, ffn=f,
                  vocab=256, max_pos=4 * s, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False,
                  learned_pos=False)
    cfg = WorkloadConfig(micro_batch=1, seq_len=s, precision=dtype)
    block = Block(Dims.from_model(m)).to(device=device)  # fp32 weights under autocast: the runner's path
    x = torch.randn(1, s, h, device=device, requires_grad=True)
    params = list(block.parameters())
    prec = Precision(dtype, device.type)

    def step() -> None:
        with torch.enable_grad():
            with prec.autocast():
                y = block(x)
            torch.autograd.grad(y, [x, *params], torch.ones_like(y))

    t = _median_time(step, device, max(repeats, 10), 0.2)
    curves, top = curves if curves is not None else kernel_curves(peak, gemm_curve)
    ops = {phase: layer_ops(m, cfg, 1, phase) for phase in ("fwd", "bwd")}
    t_mm = sum(matmul_seconds(o, top, curves, phase) for phase, o in ops.items())
    ops_list = list(ops.values())
    n_mm = sum(len(o.matmul_flops) for o in ops_list)
    t_fixed = (sum(o.n_ops for o in ops_list) - n_mm) * op_overhead_s \
        + n_mm * (op_overhead_s if gemm_op_s is None else gemm_op_s) + 2 * task_s
    moved = sum(o.elementwise_bytes for o in ops_list)
    how = (f"derived: the replay's decoder block (hidden {h}, {heads} heads, ffn {f}, {s} tokens, {dtype} as the "
           f"runner computes it) forward + "
           f"backward on {device.type}, {t * 1e3:.2f} ms (median), minus its matmuls and attention kernel on their "
           f"measured curves ({t_mm * 1e3:.2f} ms) and its operators' fixed cost ({t_fixed * 1e3:.2f} ms); "
           f"the rest carries its "
           f"{moved / 1e6:.1f} MB of element-wise bytes (workloads.ops)")
    if overlap:
        if t <= 2.0 * t_fixed:
            return None, how + ": bound by the host's dispatch (the operators' fixed cost), nothing to derive"
        rest = t - t_mm
    else:
        rest = t - t_mm - t_fixed
    if rest <= 0.05 * t:
        return None, how + ": nothing left to charge"
    return moved / rest, how


# -------------------------------------------------------------------------------------------- copies


def measure_copy(src: torch.Tensor, dst: torch.Tensor, repeats: int = 5) -> float:
    """Bytes/s of ``dst.copy_(src)`` (bytes copied per second, one direction), median of repeats."""
    device = dst.device if dst.device.type == "cuda" else src.device
    dt = _median_time(lambda: dst.copy_(src, non_blocking=True), device, repeats)
    return src.numel() * src.element_size() / dt


def measure_duplex(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], repeats: int = 5) -> float:
    """Total bytes/s of several copies (dst.copy_(src) per pair) running at once.

    CUDA: one stream per copy. CPU: one thread per copy (torch releases the GIL inside copy_).
    """
    total = sum(s.numel() * s.element_size() for s, _ in pairs)
    cuda = [d.device if d.device.type == "cuda" else s.device for s, d in pairs]
    if any(dev.type == "cuda" for dev in cuda):
        dev = next(d for d in cuda if d.type == "cuda")
        streams = [torch.cuda.Stream(dev) for _ in pairs]

        def both() -> None:
            for (s, d), st in zip(pairs, streams, strict=True):
                with torch.cuda.stream(st):
                    d.copy_(s, non_blocking=True)

        return total / _median_time(both, dev, repeats)

    errors: list[BaseException] = []

    def copy(s: torch.Tensor, d: torch.Tensor) -> None:
        try:
            d.copy_(s)
        except BaseException as e:  # re-raised in the caller: no unhandled exception in a thread
            errors.append(e)

    def threaded() -> None:
        threads = [threading.Thread(target=copy, args=p) for p in pairs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    return total / _median_time(threaded, torch.device("cpu"), repeats)


# -------------------------------------------------------------------------------------------- disk


def filesystem_type(directory: str | os.PathLike[str]) -> str:
    """The type of the filesystem holding `directory` (longest mount point in /proc/mounts), or 'unknown'."""
    target = os.path.realpath(directory)
    best, kind = "", "unknown"
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, parts[2]
    return kind




def measure_disk(directory: str | os.PathLike[str], nbytes: int = 256 * 2**20, chunk: int = 8 * 2**20,
                 direct: bool | None = None, repeats: int = 3) -> DiskResult:
    """Write then read bandwidth of ~`nbytes` in `directory` as the runner moves tensors to and from "nvme"
    (``replay.nvme_files``: tensors of `chunk` bytes laid out in one file, copied into a reused page-aligned
    staging buffer and written past the page cache; read back the same way and copied out into tensors), the
    median of `repeats` passes after one untimed pass that maps the buffers.

    O_DIRECT where the filesystem accepts it (``direct=None``: try it, fall back on EINVAL); otherwise write +
    fsync + ``posix_fadvise(DONTNEED)``, then read. The files are removed afterwards. `capacity_free` is the
    free space of that filesystem. (Raw O_DIRECT of one buffer measured 1.4-2.5 GB/s on the validation VM
    where the runner's ``torch.save`` got 0.18-0.38 GB/s: the price and the replay now move bytes one way.)
    """
    from replay.nvme_files import Staging, reading, write_tensors

    chunk = max(_ALIGN, chunk // _ALIGN * _ALIGN)
    count = max(1, nbytes // chunk)
    folder = Path(directory)
    src = {f"t{i}": torch.randn(chunk // 4) for i in range(count)}
    dst = {k: torch.empty_like(v) for k, v in src.items()}
    staging = Staging()
    writes: list[float] = []
    reads: list[float] = []
    method = ""
    try:
        for k in range(repeats + 1):
            fd, name = tempfile.mkstemp(prefix="tiersim-calibrate-", suffix=".bin", dir=folder)
            os.close(fd)
            path = Path(name)
            try:
                t0 = time.perf_counter()
                try:
                    f = write_tensors(path, src, staging, direct)
                except OSError as e:
                    if direct or e.errno not in (22, 95):  # EINVAL / EOPNOTSUPP: no O_DIRECT here
                        raise
                    f = write_tensors(path, src, staging, False)
                t1 = time.perf_counter()
                with reading(f, staging) as views:
                    for n, v in views.items():
                        dst[n].copy_(v)
                t2 = time.perf_counter()
                method = "O_DIRECT" if f.direct else "fsync+fadvise"
            finally:
                path.unlink(missing_ok=True)
            if k:  # the first pass maps the staging buffer and the destinations
                writes.append(t1 - t0)
                reads.append(t2 - t1)
    finally:
        staging.close()
    total = chunk * count
    free = shutil.disk_usage(folder).free
    return DiskResult(read_bw=total / statistics.median(reads), write_bw=total / statistics.median(writes),
                      method=method, capacity_free=int(free), directory=str(folder.resolve()), file_bytes=total,
                      fs_type=filesystem_type(folder))


# -------------------------------------------------------------------------------------------- Adam


def _adam(params: list[torch.Tensor], device: torch.device) -> tuple[torch.optim.Adam, str]:
    for variant in ("fused", "foreach"):
        try:
            opt = torch.optim.Adam(params, lr=1e-4, **{variant: True})  # type: ignore[arg-type]
            opt.step()
            _sync(device)
            return opt, variant
        except (RuntimeError, TypeError, ValueError):
            continue
    opt = torch.optim.Adam(params, lr=1e-4, foreach=False)
    return opt, "single-tensor"


ADAM_STATE_BYTES = 16  # per parameter: the fp32 weight, its gradient, exp_avg and exp_avg_sq
ADAM_MAX_PARAMS = 256_000_000  # 4 GB of state at most
CACHE_MULTIPLE = 4  # the sample's state is this many times the last-level cache


def last_level_cache_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Bytes of cpu0's largest cache (Linux sysfs, ``index*/size`` such as ``32768K``); 0 where unknown."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    best = 0
    for d in sorted(cache_dir.glob("index*")):
        try:
            text = (d / "size").read_text().strip()
        except OSError:
            continue
        num, unit = (text[:-1], text[-1].upper()) if text[-1:].isalpha() else (text, "")
        if num.isdigit() and unit in (*units, ""):
            best = max(best, int(num) * units.get(unit, 1))
    return best


def adam_sample_params(sizes: CalibrationSizes, llc_bytes: int | None = None) -> int:
    """Parameters of the host-Adam measurement: ``sizes.adam_params``, or more where the host's last-level cache
    would hold that much state (an offloaded model's optimizer sweeps gigabytes from DRAM: on an H200's 16-core
    Xeon host 8 M parameters measured 8.95 G params/s, 250 GB/s of state against 118 GB/s of DRAM, and gpt2's
    124 M parameters then ran ~16x slower than priced)."""
    if not sizes.adam_beyond_cache:
        return sizes.adam_params
    llc = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    return max(sizes.adam_params, min(ADAM_MAX_PARAMS, CACHE_MULTIPLE * llc // ADAM_STATE_BYTES))


def measure_adam(n_params: int, device: torch.device, repeats: int = 5, tensors: int = 8) -> tuple[float, str]:
    """Params/s of one torch.optim.Adam step over ~`n_params` fp32 params in `tensors` tensors."""
    each = max(1, n_params // tensors)
    params = [torch.zeros(each, device=device, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(each, device=device)
    opt, variant = _adam(params, device)
    dt = _median_time(opt.step, device, repeats)
    return each * tensors / dt, variant


# -------------------------------------------------------------------------------------------- host


def _meminfo_total() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def host_info() -> dict[str, Any]:
    """DRAM bytes (sysconf, else /proc/meminfo), logical cores, CPU model and host name."""
    try:
        dram = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        method = "os.sysconf(SC_PAGE_SIZE x SC_PHYS_PAGES)"
    except (ValueError, OSError, AttributeError):
        dram, method = _meminfo_total(), "/proc/meminfo MemTotal"
    return {"dram": dram, "dram_method": method, "cores": os.cpu_count() or 1, "cpu_model": _cpu_model(),
            "host": socket.gethostname() or "localhost"}


# -------------------------------------------------------------------------------------------- all


def _gemm_all(device: torch.device, dtypes: Sequence[torch.dtype], flops: Sequence[float], sizes: CalibrationSizes,
              progress: Progress) -> tuple[list[tuple[float, float]], dict[str, float], dict[str, float]]:
    names = {v: k for k, v in TORCH_DTYPES.items()}
    curve: list[tuple[float, float]] = []
    peaks: dict[str, float] = {}
    at: dict[str, float] = {}
    for i, dt in enumerate(dtypes):
        targets = tuple(flops) if i == 0 else tuple(flops)[-sizes.gemm_peak_points:]
        progress(f"GEMM {names[dt]} on {device.type}: {len(targets)} sizes "
                 f"{min(targets):.0e}..{max(targets):.0e} FLOP")
        try:
            pts = measure_gemm(device, dt, targets, sizes.repeats, sizes.gemm_min_time_s)
        except RuntimeError as e:  # a dtype this device cannot multiply
            progress(f"GEMM {names[dt]}: skipped ({str(e).splitlines()[0]})")
            continue
        if i == 0:
            curve = pts
        best = max(pts, key=lambda p: p[1])
        peaks[names[dt]], at[names[dt]] = best[1], best[0]
        progress(f"GEMM {names[dt]}: best {best[1] / 1e9:.1f} GFLOP/s at {best[0]:.1e} FLOP")
    return curve, peaks, at


def calibrate(directory: str | os.PathLike[str] | None = None, sizes: CalibrationSizes | None = None,
              progress: Progress = _quiet, device: str | None = None, precision: str = "bf16") -> Calibration:
    """Measure this machine. `directory`: whose disk is measured (default: a temporary directory).
    `precision`: the training precision whose GEMM efficiency curve and per-operator figures are measured
    (every dtype's peak is measured; all through the runner's code path, ``replay.precision``).

    On a CPU-only machine torch runs one thread per op while measuring, as the replay does (``replay.threads``).
    """
    Precision(precision)  # a ReplayError naming the precision the runner cannot compute
    cuda = torch.cuda.is_available() if device is None else device == "cuda"
    with cpu_op_threads(torch.device("cuda" if cuda else "cpu")), keep_freed_memory("cuda" if cuda else "cpu"):
        return _calibrate(directory, sizes or CalibrationSizes(), progress, device, precision)


def _dtype_order(precision: str) -> tuple[torch.dtype, ...]:
    """`precision` first (its whole curve is measured), then the others (their peaks)."""
    return (TORCH_DTYPES[precision], *(d for k, d in TORCH_DTYPES.items() if k != precision))


def _calibrate(directory: str | os.PathLike[str] | None, sizes: CalibrationSizes, progress: Progress,
               device: str | None, precision: str) -> Calibration:
    t_start = time.perf_counter()
    host = host_info()
    cuda = torch.cuda.is_available() if device is None else device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    notes: list[str] = []
    progress(f"host {host['host']}: {host['cores']} cores, {host['dram'] / 2**30:.1f} GiB DRAM, "
             f"{host['cpu_model']}; compute device {dev}")
    gemm16 = {k: gemm16_path(dev.type, d) for k, d in TORCH_DTYPES.items() if d != torch.float32}
    note16 = gemm16_note(precision, dev.type)
    if note16 is not None:  # the path the runner takes is the one measured here (replay.precision.linear)
        progress(note16)
        notes.append(note16)

    if cuda:
        props = torch.cuda.get_device_properties(dev)
        gpu_model, gpu_count = str(props.name), torch.cuda.device_count()
        gpu_memory, mem_method = float(props.total_memory), "torch.cuda.get_device_properties().total_memory"
        curve, peaks, at = _gemm_all(dev, _dtype_order(precision), sizes.gpu_gemm_flops, sizes, progress)
        n = sizes.copy_bytes // 4
        host_a = torch.empty(n, pin_memory=True)
        host_b = torch.empty(n, pin_memory=True)
        dev_a = torch.empty(n, device=dev)
        dev_b = torch.empty(n, device=dev)
        progress(f"copies: pinned H2D, D2H, both at once, D2D ({sizes.copy_bytes / 2**20:.0f} MiB)")
        h2d = measure_copy(host_a, dev_a, sizes.repeats)
        d2h = measure_copy(dev_b, host_b, sizes.repeats)
        duplex = measure_duplex([(host_a, dev_a), (dev_b, host_b)], sizes.repeats)
        d2d = measure_copy(dev_a, dev_b, sizes.repeats)
        copy_method = "pinned host <-> cuda:0 tensor copy_ (non_blocking, synchronised), one stream per direction"
        hbm_bw = 2 * d2d
        hbm_method = "cuda:0 device-to-device tensor copy, read + write bytes counted (2 x bytes copied / s)"
        small = torch.empty(16, pin_memory=True)
        small_d = torch.empty(16, device=dev)
        latency = _median_time(lambda: small_d.copy_(small, non_blocking=True), dev, 50)
        cpu_a = torch.empty(n)
        cpu_b = torch.empty(n)
        dram_bw = 2 * measure_copy(cpu_a, cpu_b, sizes.repeats)
        del host_a, host_b, dev_a, dev_b, cpu_a, cpu_b
    else:
        gpu_model, gpu_count = f"CPU as GPU ({host['cpu_model']})", 1
        gpu_memory = host["dram"] / 4
        mem_method = "no GPU: a budget of a quarter of host DRAM (override with --set gpu.memory=...)"
        curve, peaks, at = _gemm_all(dev, _dtype_order(precision), sizes.gemm_flops, sizes, progress)
        n = sizes.copy_bytes // 4
        a, b = torch.empty(n), torch.empty(n)
        a.fill_(1.0)
        b.fill_(0.0)
        progress(f"copies gpu0 <-> cpu: host memcpy of {sizes.copy_bytes / 2**20:.0f} MiB, alone and two at once")
        h2d = measure_copy(a, b, sizes.repeats)
        d2h = measure_copy(b, a, sizes.repeats)
        half = n // 2
        duplex = measure_duplex([(a[:half], b[:half]), (b[half:], a[half:])], sizes.repeats)
        copy_method = ("CPU-only: gpu0 and cpu are both host memory, so a transfer is a tensor copy_ between two "
                       "host buffers; pinned vs pageable does not apply on CPU")
        hbm_bw = dram_bw = h2d + d2h  # 2 x bytes copied / s (read + write), both directions' median averaged
        hbm_method = "CPU-only: host memcpy (tensor copy_), read + write bytes counted (2 x bytes copied / s)"
        small_a, small_b = torch.empty(16), torch.empty(16)
        latency = _median_time(lambda: small_b.copy_(small_a), dev, 50)
        del a, b
        notes.append("no GPU: gpu.memory is a budget (a quarter of DRAM) that shares the same DRAM as host.dram")
    if precision not in peaks:
        from replay.errors import ReplayError

        raise ReplayError(f"calibrate --precision {precision}: this {dev.type} device cannot multiply in {precision} "
                          "(see the progress lines); calibrate with --precision fp32")
    progress(f"copies: H2D {h2d / 1e9:.2f} GB/s, D2H {d2h / 1e9:.2f} GB/s, both at once {duplex / 1e9:.2f} GB/s")

    bwd_flops = sizes.gpu_gemm_backward_flops if cuda else sizes.gemm_backward_flops
    progress(f"GEMM {precision} backward (input and weight gradients) on {dev.type}: {len(bwd_flops)} sizes")
    bwd_curve = measure_gemm_backward(dev, TORCH_DTYPES[precision], bwd_flops, sizes.repeats, sizes.gemm_min_time_s)
    progress(f"GEMM {precision} backward: " + ", ".join(f"{f:.0e}: {r / 1e9:.1f}" for f, r in bwd_curve)
             + " GFLOP/s")
    heads, head_dim = sizes.attention_heads
    att_fwd, att_bwd, att_how = measure_attention(dev, precision, sizes.gpu_attention_seqs if cuda
                                                  else sizes.attention_seqs, heads, head_dim, sizes.repeats)
    progress(f"attention {precision} forward / backward: "
             + ", ".join(f"{f:.0e}: {a / 1e9:.1f} / {b / 1e9:.1f}" for (f, a), (_, b) in zip(att_fwd, att_bwd,
                                                                                          strict=True))
             + " GFLOP/s")
    curves = kernel_curves(peaks[precision], curve, bwd_curve, att_fwd, att_bwd)
    unaligned, unaligned_how = measure_unaligned_gemm(dev, precision, sizes.unaligned_gemm, sizes.repeats,
                                                      sizes.gemm_min_time_s)
    progress(f"GEMM {precision} with an output width not a multiple of 8: {unaligned:.2f} of the aligned rate")

    launch = measure_small_op(dev)
    progress(f"eager operators on {dev.type}: per-operator overhead, element-wise bandwidth")
    dispatch = None
    if cuda:  # the host's side as the runner issues a task: per task, per matmul, per other operator
        from replay.calibrate_dispatch import measure_dispatch

        dispatch, op_method = measure_dispatch(dev, precision, max(sizes.repeats, 20), _median_time)
        op_overhead = dispatch.op_s
    else:
        op_overhead, op_method = measure_op_overhead(dev, sizes.repeats, precision)
    gemm_dtype = precision
    layer_bw, ew_method = None, f"no {gemm_dtype} GEMM curve to derive it from"
    if curve and gemm_dtype in peaks:
        probe = dict(zip(("hidden", "n_heads", "ffn", "seq_len"), sizes.probe_layer, strict=True)) \
            if sizes.probe_layer else None
        layer_bw, ew_method = measure_layer_elementwise(
            dev, gemm_dtype, curve, peaks[gemm_dtype], op_overhead, sizes.repeats, probe, curves, overlap=cuda,
            gemm_op_s=dispatch.gemm_op_s if dispatch else None, task_s=dispatch.task_s if dispatch else 0.0)
    if layer_bw is None:  # the layer is all matmuls and overheads: use the hot chain's rate
        ew_bw, chain_how = measure_elementwise(dev, sizes.gpu_elementwise_bytes if cuda else sizes.elementwise_bytes,
                                               sizes.repeats)
        ew_method = f"{chain_how} ({ew_method})"
    else:
        ew_bw = layer_bw
    if dispatch is not None:
        progress(f"per task {dispatch.task_s * 1e6:.1f} us, per matmul {dispatch.gemm_op_s * 1e6:.1f} us "
                 f"(the fit's worst task off by {dispatch.worst_error * 100:.0f}%)")
    progress(f"per operator {op_overhead * 1e6:.1f} us; element-wise in a layer {ew_bw / 1e9:.2f} GB/s")
    n_adam = adam_sample_params(sizes)
    progress(f"Adam ({n_adam / 1e6:.2f} M fp32 params) on cpu")
    opt_rate, variant = measure_adam(n_adam, torch.device("cpu"), sizes.repeats)
    gpu_opt_rate = opt_rate
    if cuda:
        gpu_opt_rate, _ = measure_adam(sizes.gpu_adam_params, dev, sizes.repeats)
        progress(f"Adam on {dev}: {gpu_opt_rate / 1e6:.1f} M params/s")
    progress(f"Adam: {opt_rate / 1e6:.1f} M params/s ({variant})")

    tmp: str | None = None
    try:
        if directory is None:
            tmp = tempfile.mkdtemp(prefix="tiersim-calibrate-")
            directory = tmp
        progress(f"disk: {sizes.disk_bytes / 2**20:.0f} MiB sequential write + read in {directory}")
        disk = measure_disk(directory, sizes.disk_bytes, sizes.disk_chunk)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"disk ({disk.method}, {disk.fs_type}): write {disk.write_bw / 1e9:.2f} GB/s, "
             f"read {disk.read_bw / 1e9:.2f} GB/s, {disk.capacity_free / 1e9:.0f} GB free")
    if disk.fs_type in ("tmpfs", "ramfs"):
        notes.append(f"disk: {disk.directory} is on {disk.fs_type}, i.e. memory, not a drive; pass --dir on a disk")
    if disk.method != "O_DIRECT":
        notes.append("disk: O_DIRECT not supported there; write + fsync, then read after "
                     "posix_fadvise(DONTNEED) (a memory-backed filesystem still reads from memory)")

    return Calibration(
        host=host["host"], date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device=dev.type,
        gpu_model=gpu_model, gpu_count=gpu_count, gpu_memory=gpu_memory, gpu_memory_method=mem_method,
        cpu_model=host["cpu_model"], cores=int(host["cores"]), dram=host["dram"],
        gemm_dtype=gemm_dtype, gemm_curve=curve, peak_flops=peaks, peak_at=at,
        h2d_bw=h2d, d2h_bw=d2h, duplex_bw=duplex, copy_method=copy_method, copy_latency_s=latency,
        hbm_bw=hbm_bw, hbm_method=hbm_method, dram_bw=dram_bw, launch_overhead_s=launch,
        optimizer_params_per_s=opt_rate, optimizer_variant=variant, gpu_optimizer_params_per_s=gpu_opt_rate,
        disk=disk, wall_s=time.perf_counter() - t_start, notes=notes, op_overhead_s=op_overhead,
        op_overhead_method=op_method, elementwise_bw=ew_bw, elementwise_method=ew_method, dispatch_overlap=cuda,
        gemm_op_overhead_s=dispatch.gemm_op_s if dispatch else None,
        task_overhead_s=dispatch.task_s if dispatch else None,
        gemm_backward_curve=bwd_curve, attention_curve=att_fwd, attention_backward_curve=att_bwd,
        attention_method=att_how, gemm16=gemm16, gemm_unaligned=unaligned, gemm_unaligned_method=unaligned_how,
    )
