"""The plain-training reference a replay is verified against, and the comparison.

Plain: the same layers from the same seed, everything in memory, one ``torch.optim.Adam`` over all
parameters, the same micro-batches (``(loss / accum).backward()`` per micro-step, one step per step).
Delayed parameter update (DPU, ZeRO-Offload's ``delayed_update``): step ``s`` computes its gradients
with the master weights after update ``s-2`` (``M_{max(s-1, 0)}``, where ``M_{k+1} = Adam(M_k, g_k)``),
which is what a plan whose forward of step ``s`` waits for the upload of step ``s-2`` computes.

Precision: the reference computes in the replay's (``batching.precision``, ``replay.precision``): the
same autocast and the same fp16 loss scale; its tolerance is ``replay.precision.tolerance``.

Tolerance (``RTOL``, fp32): both sides run the same fp32 kernels on the same inputs; they differ at most in
how a few sums are ordered (a layer-by-layer autograd versus one graph), a few ulps (fp32 eps 1.2e-7)
per operation, which Adam's normalisation can amplify over a few steps. 1e-5 relative leaves ~100x
margin above that, while every real mistake is orders of magnitude larger: a missed or doubled
micro-batch changes the loss and gradients by O(1/accum), stale weights differ by about ``lr`` = 1e-3
per step on weights of ~0.02 (5% relative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from replay.data import batch
from replay.model import Dims, build_layers
from replay.precision import RTOL_FP32, Precision
from replay.store import ADAM, Batching
from replay.threads import cpu_op_threads

RTOL = RTOL_FP32  # fp32; bf16 / fp16 replays: replay.precision.tolerance


def train_reference(dims: Dims, batching: Batching, steps: int, accum: dict[int, int], *, delayed: bool,
                    device: torch.device) -> tuple[dict[tuple[int, int], float], list[dict[str, Tensor]]]:
    """Train the plain way, with the replay's thread setting (``replay.threads``): the same float summation
    order, so a parameter whose gradient is rounding noise (a key bias under softmax) gets the same Adam step."""
    with cpu_op_threads(device):
        return _train_reference(dims, batching, steps, accum, delayed=delayed, device=device)


def _train_reference(dims: Dims, batching: Batching, steps: int, accum: dict[int, int], *, delayed: bool,
                     device: torch.device) -> tuple[dict[tuple[int, int], float], list[dict[str, Tensor]]]:
    layers = [m.to(device) for m in build_layers(dims, batching.seed)]
    prec = Precision(batching.precision, device.type)
    params = [p for m in layers for p in m.parameters()]
    opt = torch.optim.Adam(params, **ADAM)  # type: ignore[arg-type]
    losses: dict[tuple[int, int], float] = {}
    snaps: dict[int, list[dict[str, Tensor]]] = {0: [{n: p.detach().clone() for n, p in m.named_parameters()}
                                                      for m in layers]}  # k -> M_k
    for s in range(steps):
        n_micro = accum.get(s, 1)
        if delayed:
            used = [{n: t.detach().clone().requires_grad_(True) for n, t in d.items()}
                    for d in snaps[max(s - 1, 0)]]
        for mi in range(n_micro):
            tokens, targets = batch(batching.seed, s, mi, batching.micro_batch, batching.seq_len, dims.vocab)
            tokens, targets = tokens.to(device), targets.to(device)
            with prec.autocast():
                if delayed:
                    x = functional_call(layers[0], used[0], (tokens,))
                    for i in range(1, len(layers) - 1):
                        x = functional_call(layers[i], used[i], (x,))
                    loss = functional_call(layers[-1], used[-1], (x, targets, used[0]["wte"] if dims.tied else None))
                else:
                    x = layers[0](tokens)
                    for m in layers[1:-1]:
                        x = m(x)
                    loss = layers[-1](x, targets, layers[0].wte if dims.tied else None)
            losses[(s, mi)] = float(loss.detach())
            (loss * prec.loss_scale / n_micro).backward()
        if delayed:
            for m, d in zip(layers, used, strict=True):
                for n, p in m.named_parameters():
                    p.grad = d[n].grad
        for i, m in enumerate(layers):
            grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
            prec.unscale(grads, f"reference: layer {i}, step {s}")
        opt.step()
        opt.zero_grad(set_to_none=True)
        if delayed:
            snaps[s + 1] = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in layers]
            snaps.pop(s - 1, None)  # M_{s-1} was last used by step s
    return losses, [{n: p.detach().cpu().clone() for n, p in m.named_parameters()} for m in layers]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reference: str
    max_loss_rel_err: float
    max_weight_rel_err: float
    worst: str
    rtol: float

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reference": self.reference, "max_loss_rel_err": self.max_loss_rel_err,
                "max_weight_rel_err": self.max_weight_rel_err, "worst": self.worst, "rtol": self.rtol}


def compare(losses: dict[tuple[int, int], float], weights: list[dict[str, Tensor]],
            ref_losses: dict[tuple[int, int], float], ref_weights: list[dict[str, Tensor]],
            reference: str, rtol: float = RTOL) -> Verdict:
    """Largest relative error of any loss (per micro-step) and of any final weight tensor (max abs diff
    over the tensor's max abs value); ``worst`` names the figure with the largest error of all."""
    missing = sorted(set(losses) ^ set(ref_losses))
    if missing:
        s, m = missing[0]
        return Verdict(False, reference, float("inf"), float("inf"),
                       f"loss of step {s} micro-step {m} missing on one side", rtol)
    errs: list[tuple[float, str, str]] = []
    for (s, m), ref in sorted(ref_losses.items()):
        errs.append((abs(losses[(s, m)] - ref) / max(abs(ref), 1e-12), "loss", f"loss of step {s} micro-step {m}"))
    for i, (mine, ref_w) in enumerate(zip(weights, ref_weights, strict=True)):
        for n, r in ref_w.items():
            scale = max(float(r.abs().max()), 1e-12)
            errs.append((float((mine[n] - r).abs().max()) / scale, "weight", f"layer {i} {n}"))
    lerr = max((e for e, kind, _ in errs if kind == "loss"), default=0.0)
    werr = max((e for e, kind, _ in errs if kind == "weight"), default=0.0)
    top = max(errs, default=(0.0, "", ""))
    return Verdict(lerr <= rtol and werr <= rtol, reference, lerr, werr, top[2] if top[0] > 0 else "", rtol)
