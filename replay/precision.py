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

``tiersim calibrate`` measures its GEMM rates through :func:`linear_rate_op` (the same autocast
``F.linear`` over fp32 operands the runner's layers call), so the rate a plan is priced at is the rate the
runner gets (on a CPU without native bf16 that rate is far below fp32's: priced as it runs).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from replay.errors import ReplayError

__all__ = ["FP16_LOSS_SCALE", "Precision", "TORCH_DTYPES", "attention_rate_ops", "linear_backward_rate_op",
           "linear_rate_op", "tolerance"]

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP16_LOSS_SCALE = 2.0**10  # static; within the 8..32K range of Micikevicius et al. 2018
RTOL_FP32 = 1e-5
_RTOL = {"fp32": RTOL_FP32, "bf16": 1e-2, "fp16": 4e-3}


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

    def unscale(self, grads: dict[str, Tensor], what: str) -> None:
        """Divide loss-scaled gradients (in place) by the loss scale; ReplayError on a non-finite one."""
        if self.name != "fp16":
            return
        for n, g in grads.items():
            if not bool(torch.isfinite(g).all()):
                raise ReplayError(f"{what}: fp16 gradient {n!r} overflowed at the static loss scale "
                                  f"{self.loss_scale:g} (replay.precision); replay the plan in bf16 or fp32")
            g.div_(self.loss_scale)


def linear_rate_op(device: torch.device, precision: str, m: int, n: int, k: int) -> Callable[[], object]:
    """One (m x k) @ (k x n) product as the runner computes a linear layer in ``precision``: ``F.linear`` of
    fp32 operands under :meth:`Precision.autocast` (the 16-bit casts of both operands included)."""
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    p = Precision(precision, device.type)

    def run() -> Tensor:
        with p.autocast():
            return F.linear(x, w)

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
                y = F.linear(x, w)
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
