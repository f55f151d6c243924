"""The plan's precision as the runner computes it: mixed precision with fp32 master weights.

A plan made for ``precision: bf16`` or ``fp16`` is priced at that dtype's rate (``costs.compute``), so the
runner computes in it (issue 12 item 3: it used to compute in fp32 whatever the plan said, 4x off where bf16
is fast):

- **autocast** (``torch.autocast`` on the plan's device, CPU or CUDA) around every layer's forward,
  recomputation and the autograd graph its backward differentiates: matmuls, linear layers and the attention
  kernel run in the 16-bit dtype, the ops autocast keeps in fp32 stay in fp32. The parameters the forward
  reads are fp32 (each layer's version on the compute device, and the master where the optimizer runs), as
  in PyTorch AMP: autocast casts a weight to 16 bits where a kernel reads it, and its gradient arrives in
  fp32. Adam runs on the fp32 master weights and fp32 moments (mixed-precision training, Micikevicius et al.
  2018, "Mixed Precision Training", ICLR; the 16 B/param the policies price).
- **loss scaling** for fp16 (not bf16, whose exponent range is fp32's): the loss gradient fed into the
  backward is multiplied by :data:`FP16_LOSS_SCALE` and every gradient is divided by it before the optimizer
  step. The scale is *static* (DeepSpeed's ``fp16.loss_scale`` > 0 mode; Micikevicius et al. 2018 trained
  with constant scales of 8 to 32K): a dynamic scale must decide to skip a step from *every* layer's
  gradients before *any* layer is updated, while an offloading plan updates the first layers while the last
  are still in their backward. A non-finite gradient therefore stops the replay with a ReplayError naming
  the layer and step (replay in bf16 or fp32 then), never a silent skipped or corrupted step.

**16-bit GEMMs** (:func:`linear`, every linear layer and the LM head of ``replay.model`` and the
tensor-parallel shards): where the device has a native 16-bit GEMM (CUDA always) autocast runs it. A CPU
without one (no AVX512-BF16 / AMX: torch's CPU kernels then convert the 16-bit operands to fp32 inside a slow
generic loop, measured ~0.4 GFLOP/s against ~32 GFLOP/s fp32 on one AVX2 core) computes the *same* numbers
at fp32 GEMM speed: the operands rounded to the 16-bit dtype, multiplied exactly in fp32 (a product of two
bf16 / fp16 values is exact in fp32), accumulated in fp32 and the result rounded to the 16-bit dtype once --
what a 16-bit tensor-core GEMM with fp32 accumulation computes (:class:`_Linear16`; its backward keeps the
same roundings: the input and weight gradients are fp32-accumulated products of 16-bit operands, rounded to
16 bits, the weight's then widened to the fp32 master's dtype as autocast's cast does). Only the 16-bit
operands are kept for the backward (the bytes autocast's native GEMM keeps); the fp32 copies live for the
duration of one product and are freed (the plan's activation bytes are unchanged). The path is picked by
measurement (:func:`gemm16_path`: native unless the emulated product is measured faster on this device),
overridden by ``TIERSIM_GEMM16=native|emulated`` (``--gemm16`` of ``calibrate``, ``replay`` and
``python -m replay.validation`` set it for the command and the rank processes it starts), and printed by
those commands (:func:`gemm16_note`).

``tiersim calibrate`` measures its GEMM rates through :func:`linear_rate_op` (the same :func:`linear` over
fp32 operands under the same autocast the runner's layers call), so the rate a plan is priced at is the rate
the runner gets, on the path it takes.

Verification (``--verify``): the plain-training reference (``replay.reference``) trains in the same
precision (autocast, the same loss scale). Both run the same kernels on the same inputs, in a different
grouping (layer by layer vs one graph): in fp32 that differs by a few ulps (``RTOL_FP32`` 1e-5). In 16 bits
one ulp is 2^-8 (bf16) or 2^-11 (fp16) relative, and a different rounding of one element of an activation
propagates through later layers; :func:`tolerance` gives 1e-2 for bf16 and 4e-3 for fp16. Measured: 0 (the
two are bit-identical on the test suite's tiny plans), while a bf16 replay checked against an fp32 reference is
5-9e-2 off in its weights: the tolerance tells the precisions apart, and a real mistake is larger still (a
missed micro-batch changes a loss by O(1/accum), stale weights differ by ~5%).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from replay.errors import ReplayError

__all__ = ["FP16_LOSS_SCALE", "GEMM16_ENV", "GEMM16_PATHS", "Precision", "TORCH_DTYPES", "attention_rate_ops",
           "gemm16_note", "gemm16_override", "gemm16_path", "linear", "linear_backward_rate_op", "linear_rate_op",
           "replay_gemm16_lines", "spec_gemm16", "tolerance", "gemm16_forced"]

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP16_LOSS_SCALE = 2.0**10  # static; within the 8..32K range of Micikevicius et al. 2018
RTOL_FP32 = 1e-5
_RTOL = {"fp32": RTOL_FP32, "bf16": 1e-2, "fp16": 4e-3}
GEMM16_ENV = "TIERSIM_GEMM16"  # native | emulated | auto (unset): the override of the measured pick
GEMM16_PATHS = ("auto", "native", "emulated")
# the emulated path is taken only when measured this much faster than the native one: on this AVX2 CPU the
# native 16-bit F.linear of the probe's shape ran 1.4-2.3 GFLOP/s (0.4 for a 1024 x 768 x 3072 a @ b, the
# layout of a backward product) against 9-14 for the emulation at load 6-8 and 30 quiet (one thread,
# 2026-12-03); one process whose probe was slowed by the load took the native path at a ratio of 3 and ran a
# gpt2 block 25x slower. Where a CPU has native 16-bit GEMMs (AVX512-BF16, AMX) the native one should be the
# faster (no such CPU measured here). A margin of 2,
# with the best of interleaved rounds, keeps the load from flipping the pick (the replay, its reference and
# every rank must take the same path to verify bit for bit; the commands pin one path for all, gemm16_forced)
_EMULATE_WHEN_FASTER = 2.0
_PROBE_ROUNDS = 4
_PROBE_SHAPE = (256, 768, 768)  # (m, n, k): a small layer's product, 0.3 GFLOP; ~150 ms native on the slow path


def tolerance(precision: str) -> float:
    """The relative tolerance of ``--verify`` for a replay in ``precision`` (module docstring)."""
    return _RTOL.get(precision, RTOL_FP32)


@dataclass(frozen=True)
class Precision:
    """How the runner computes a plan of precision ``name`` on ``device_type`` (``cpu`` or ``cuda``)."""

    name: str = "fp32"
    device_type: str = "cpu"

    def __post_init__(self) -> None:
        if self.name not in TORCH_DTYPES:
            raise ReplayError(f"plan precision {self.name!r}: the runner computes in "
                              f"{', '.join(TORCH_DTYPES)} only; plan with --precision bf16 (or fp16, fp32)")

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.name]

    @property
    def mixed(self) -> bool:
        return self.name != "fp32"

    @property
    def loss_scale(self) -> float:
        return FP16_LOSS_SCALE if self.name == "fp16" else 1.0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The region a layer computes in: autocast to the 16-bit dtype (nothing for fp32)."""
        if not self.mixed:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def wire_gradients(self, flat: Tensor, n: int) -> Tensor:
        """What a gradient collective over ``n`` ranks sends of the fp32 ``flat``: in mixed precision the
        gradients in the plan's 16-bit dtype (the 2 B per parameter the plans price, as DeepSpeed and Megatron
        reduce bf16 / fp16 gradients), each rank's divided by ``n`` first (DeepSpeed's pre-divide: the fp16 sum
        of loss-scaled gradients cannot overflow where one rank's does not); in fp32 ``flat`` itself (summed
        in place, divided after: :meth:`mean_from_wire`). In mixed precision ``flat`` is divided in place: its
        caller replaces it with the collective's result.

        Divided in fp32 in place, then rounded by a copy into the 16-bit buffer: the very numbers of
        ``flat.div(n).to(dtype)`` and of ``torch.div(flat, n, out=dtype_buffer)`` (checked equal for n = 2 and 3),
        without the fp32 temporary of the first or the second's mixed-dtype kernel, which ran at about 2 ns an
        element on large tensors here: a vocab-50257 x 512 table's 26 M gradients took 52-59 ms that way and 9.5
        ms this way (3.15 M: 1.80 -> 0.72 ms; one thread, 2026-12-05, 2-core AMD EPYC VM)."""
        if not self.mixed:
            return flat
        out = torch.empty(flat.shape, dtype=self.dtype, device=flat.device)
        return out.copy_(flat.div_(n) if n != 1 else flat)

    def wire_params(self, params: Tensor) -> Tensor:
        """What a parameter all-gather sends of fp32 ``params``: in mixed precision the plan's 16-bit copy (the
        2 B per parameter the plans price for a partitioned layer's gather, as DeepSpeed's ZeRO-3 gathers its
        fp16 / bf16 partitions), else ``params`` itself. The gathered layer computes with those values widened
        back to fp32 (:meth:`working_params`), so a partitioned layer's working parameters are always its master
        rounded to 16 bits, as a 16-bit model's are; ``replay.reference`` trains with the same rounding."""
        return params.to(self.dtype) if self.mixed else params

    def working_params(self, params: Tensor) -> Tensor:
        """The fp32 working parameters a partitioned layer computes with: ``params`` (fp32 masters, or what
        :meth:`wire_params` sent) rounded to the plan's 16-bit dtype and widened back (fp32 plans: themselves)."""
        if not self.mixed:
            return params
        return params.to(torch.float32) if params.dtype == self.dtype else params.to(self.dtype).to(torch.float32)

    def mean_from_wire(self, summed: Tensor, n: int) -> Tensor:
        """The ranks' mean gradient in fp32 from what :meth:`wire_gradients` sent, summed over the ranks."""
        if not self.mixed:
            return summed.div_(n)
        return summed.to(torch.float32)

    def mean_into(self, flat: Tensor, summed: Tensor, n: int) -> Tensor:
        """``flat`` (fp32) set to :meth:`mean_from_wire` of ``summed`` in one pass (a 16-bit sum widened as it is
        copied, with no fp32 temporary; the same numbers)."""
        if not self.mixed:
            mean = summed.div_(n)
            return flat if mean is flat else flat.copy_(mean)
        return flat.copy_(summed)

    def unscale(self, grads: dict[str, Tensor], what: str) -> None:
        """Divide loss-scaled gradients (in place) by the loss scale; ReplayError on a non-finite one.

        One fused pass per device over all the tensors, as ``torch.amp.GradScaler`` unscales (and DeepSpeed's CPU
        Adam folds the scale into its update): ``_amp_foreach_non_finite_check_and_unscale_`` multiplies by the
        inverse of the power-of-two scale (the same numbers as dividing) and flags a non-finite value. A check and
        a division per tensor cost 2.7 ms for a hidden-256 layer's 11 gradients here (one thread), the fused pass
        0.12 ms; the optimizer's price has neither."""
        if self.name != "fp16" or not grads:
            return
        by_device: dict[torch.device, list[Tensor]] = {}
        for g in grads.values():
            by_device.setdefault(g.device, []).append(g)
        overflow = False
        for device, ts in by_device.items():
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(ts, found, torch.full((1,), 1.0 / self.loss_scale,
                                                                                   device=device))
            overflow = overflow or bool(found.item())
        if overflow:
            bad = next(n for n, g in grads.items() if not bool(torch.isfinite(g).all()))
            raise ReplayError(f"{what}: fp16 gradient {bad!r} overflowed at the static loss scale "
                              f"{self.loss_scale:g} (replay.precision); replay the plan in bf16 or fp32")


def linear_rate_op(device: torch.device, precision: str, m: int, n: int, k: int) -> Callable[[], object]:
    """One (m x k) @ (k x n) product as the runner computes a linear layer in ``precision``: :func:`linear` of
    fp32 operands under :meth:`Precision.autocast` (the 16-bit casts of both operands included, on the 16-bit
    GEMM path :func:`gemm16_path` picks: the runner's)."""
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    p = Precision(precision, device.type)

    def run() -> Tensor:
        with p.autocast():
            return linear(x, w)

    return run



def linear_backward_rate_op(device: torch.device, precision: str, m: int, n: int, k: int) -> Callable[[], object]:
    """One (m x k) @ (k x n) linear layer's forward *and* backward as the runner computes it in ``precision``:
    :func:`linear_rate_op`'s forward with autograd recording, then the input- and weight-gradient products
    (``torch.autograd.grad`` into the fp32 input and the fp32 weight, as a layer's backward runs them). Its
    time minus the forward's is the backward's two products."""
    x = torch.randn(m, k, device=device, requires_grad=True)
    w = torch.randn(n, k, device=device, requires_grad=True)
    g = torch.randn(m, n, device=device)
    p = Precision(precision, device.type)

    def run() -> object:
        with torch.enable_grad():
            with p.autocast():
                y = linear(x, w)
            return torch.autograd.grad(y, (x, w), g.to(y.dtype))

    return run


def attention_rate_ops(device: torch.device, precision: str, batch: int, seq: int, heads: int,
                       head_dim: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """(forward, forward + backward) of the runner's attention kernel in ``precision``: causal
    ``F.scaled_dot_product_attention`` of (batch, heads, seq, head_dim) views of projection outputs (as
    ``replay.model.Block`` makes them: the 16-bit outputs of the Q, K, V linear layers under autocast, fp32 in
    fp32), under :meth:`Precision.autocast`, the backward into Q, K and V."""
    p = Precision(precision, device.type)
    dtype = p.dtype if p.mixed else torch.float32
    qkv = [torch.randn(batch, seq, heads * head_dim, device=device, dtype=dtype, requires_grad=True)
           for _ in range(3)]
    g = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)

    def fwd() -> Tensor:
        q, k, v = (t.view(batch, seq, heads, head_dim).transpose(1, 2) for t in qkv)
        with p.autocast():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both() -> object:
        with torch.enable_grad():
            y = fwd()
            return torch.autograd.grad(y, qkv, g.to(y.dtype))

    return fwd, both


def gemm16_override() -> str | None:
    """The path forced by ``TIERSIM_GEMM16`` (None: unset or ``auto``, the measured pick); ReplayError on any
    other value."""
    got = os.environ.get(GEMM16_ENV, "").strip().lower()
    if got in ("", "auto"):
        return None
    if got not in GEMM16_PATHS:
        raise ReplayError(f"{GEMM16_ENV}={got!r}: give one of {', '.join(GEMM16_PATHS)} (--gemm16)")
    return got


@functools.cache
def _measured_gemm16(device_type: str, dtype: torch.dtype) -> tuple[str, float, float]:
    """(path, native FLOP/s, emulated FLOP/s) of one (256 x 768) @ (768 x 768) 16-bit product on this CPU with
    the runner's one thread per op, the best of 4 interleaved rounds, measured once per process (a property
    of the machine)."""
    from replay.threads import cpu_op_threads

    m, n, k = _PROBE_SHAPE
    x = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k).to(dtype)
    flops = 2.0 * m * n * k
    with cpu_op_threads(torch.device(device_type)):  # as the runner computes (one thread per op on a CPU)
        runs: dict[str, Callable[[], object]] = {"native": lambda: F.linear(x, w),
                                                  "emulated": lambda: F.linear(x.float(), w.float()).to(dtype)}
        best = dict.fromkeys(runs, float("inf"))
        for fn in runs.values():
            fn()  # warm-up
        for _ in range(_PROBE_ROUNDS):  # interleaved, the best of each: load only ever slows one down
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        native, emulated = best["native"], best["emulated"]
    path = "emulated" if native > _EMULATE_WHEN_FASTER * emulated else "native"
    return path, flops / native, flops / emulated


def gemm16_path(device_type: str, dtype: torch.dtype) -> str:
    """``native`` or ``emulated``: how a ``dtype`` GEMM runs on ``device_type`` (module docstring). CUDA and fp32
    are always native; a CPU's 16-bit GEMM is emulated when measured :data:`_EMULATE_WHEN_FASTER` x slower than
    the emulation; ``TIERSIM_GEMM16`` overrides the pick."""
    if dtype == torch.float32:
        return "native"
    forced = gemm16_override()
    if forced is not None:
        return forced
    if device_type != "cpu":
        return "native"
    return _measured_gemm16(device_type, dtype)[0]


def gemm16_note(precision: str, device_type: str) -> str | None:
    """The line ``calibrate`` and ``replay`` print: which 16-bit GEMM path a ``precision`` run takes, and why
    (None in fp32)."""
    if precision not in TORCH_DTYPES or precision == "fp32":
        return None
    dtype = TORCH_DTYPES[precision]
    path = gemm16_path(device_type, dtype)
    forced = gemm16_override()
    if device_type != "cpu":
        why = f"{device_type}: native 16-bit GEMMs" if forced is None else f"forced by {GEMM16_ENV}={forced}"
    else:
        picked, native, emulated = _measured_gemm16(device_type, dtype)
        cap = torch.backends.cpu.get_cpu_capability()
        what = "has no native" if picked == "emulated" else "has a native"
        why = (f"this CPU ({cap}) {what} {precision} GEMM: measured {native / 1e9:.2g} GFLOP/s native vs "
               f"{emulated / 1e9:.3g} emulated; override with --gemm16")
        if forced is not None and forced != picked:  # --gemm16 against the measured pick
            why = f"forced by {GEMM16_ENV}={forced} (--gemm16); the measured pick: {picked}, {why.split('; ')[0]}"
    if path == "emulated":
        return f"16-bit GEMMs: fp32 products of {precision} operands, rounded to {precision} ({why})"
    return f"16-bit GEMMs: native {precision} ({why})"


class _Linear16(torch.autograd.Function):
    """``F.linear`` as a 16-bit GEMM with fp32 accumulation computes it, on fp32 GEMMs (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, dtype: torch.dtype) -> Tensor:
        x16, w16 = x.to(dtype), w.to(dtype)
        ctx.save_for_backward(x16, w16)
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype, dtype)
        with torch.autocast(x.device.type, enabled=False):
            bias = None if b is None else b.to(dtype).float()
            return F.linear(x16.float(), w16.float(), bias).to(dtype)

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x16, w16 = ctx.saved_tensors
        x_dt, w_dt, b_dt, dtype = ctx.dtypes
        gx = gw = gb = None
        with torch.autocast(gy.device.type, enabled=False):
            g = gy.to(dtype).float()
            if ctx.needs_input_grad[0]:
                gx = (g @ w16.float()).to(dtype).to(x_dt)
            g2 = g.reshape(-1, g.shape[-1])
            if ctx.needs_input_grad[1]:
                gw = (g2.t() @ x16.reshape(-1, x16.shape[-1]).float()).to(dtype).to(w_dt)
            if b_dt is not None and ctx.needs_input_grad[2]:
                gb = g2.sum(0).to(dtype).to(b_dt)
        return gx, gw, gb, None


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """The runner's linear layer ``x @ w.T + b``: ``F.linear`` under the ambient autocast, or, where autocast
    is on in a 16-bit dtype whose GEMM :func:`gemm16_path` emulates, the same roundings on fp32 GEMMs."""
    dev = x.device.type
    if torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
        if dtype != torch.float32 and gemm16_path(dev, dtype) == "emulated":
            out: Tensor = _Linear16.apply(x, w, b, dtype)
            return out
    return F.linear(x, w, b)


def spec_gemm16(sources: Mapping[str, str], precision: str) -> str | None:
    """The 16-bit GEMM path a calibrated spec's ``precision`` peak was measured on (``gemm16=PATH`` in its
    citation, written by ``tiersim calibrate``); None for presets and fp32."""
    m = re.search(r"gemm16=(native|emulated)\b", sources.get(f"gpu.peak_flops.{precision}", ""))
    return m.group(1) if m else None


@contextlib.contextmanager
def gemm16_forced(path: str | None, precision: str | None = None, device_type: str = "cpu") -> Iterator[None]:
    """``--gemm16 PATH`` for the duration of a command: sets ``TIERSIM_GEMM16`` (read by :func:`gemm16_path`
    here and in the rank processes the command starts), restored after. None or ``auto`` with a 16-bit
    ``precision``: the path picked here for it, so that every rank (and the ``--verify`` reference) takes the
    one path, whatever a rank's own measurement would say; otherwise nothing changes."""
    if path in (None, "auto"):
        if precision not in TORCH_DTYPES or precision == "fp32":
            yield
            return
        path = gemm16_path(device_type, TORCH_DTYPES[precision])
    if path not in GEMM16_PATHS:
        raise ReplayError(f"--gemm16 {path!r}: give one of {', '.join(GEMM16_PATHS)}")
    before = os.environ.get(GEMM16_ENV)
    os.environ[GEMM16_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(GEMM16_ENV, None)
        else:
            os.environ[GEMM16_ENV] = before


def replay_gemm16_lines(precision: str, device_type: str, sources: Mapping[str, str]) -> list[str]:
    """What ``replay`` prints about its 16-bit GEMMs: the path it takes, and a line when the plan's calibrated
    spec measured its rates on the other path (the timing comparison then prices what does not run)."""
    note = gemm16_note(precision, device_type)
    if note is None:
        return []
    lines = [note]
    priced = spec_gemm16(sources, precision)
    runs = gemm16_path(device_type, TORCH_DTYPES[precision])
    if priced is not None and priced != runs:
        lines.append(f"warning: the plan's hardware was calibrated on the {priced} {precision} GEMM path and this "
                     f"replay runs the {runs} one: the simulated time prices what does not run; replay with "
                     f"--gemm16 {priced} or recalibrate with --gemm16 {runs}")
    return lines
