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
from torch import Tensor, nn
from torch.func import functional_call

from replay.data import batch
from replay.model import Dims, build_layers
from replay.precision import RTOL_FP32, Precision, tolerance
from replay.runner import task_layers
from replay.store import ADAM, Batching
from replay.threads import cpu_op_threads
from simulator.phase import Phase
from simulator.plan import Plan

RTOL = RTOL_FP32  # fp32; bf16 / fp16 replays: replay.precision.tolerance
# Beyond two ranks a collective sums the ranks' gradients in an order of its own (gloo's ring and halving
# algorithms, NCCL's trees), which the one-process reference cannot follow: a few ulps per sum, which Adam
# amplifies where a gradient is small against its own noise. Measured with zero-offload at 4 ranks on the
# tiny LLaMA of tests/test_replay_ranks.py: 1.5e-5 (one micro-step per rank) and 1.9e-6 (two); at 8 ranks
# (a100x8, a 4-layer GPT-style model, 2 micro-steps per rank; synergyscale, lazytrain and zero-infinity alike,
# docs/replay_tp.md): 8.2e-5 (the key bias, whose gradient is pure noise, left out: not_compared). 3e-4 keeps
# 3.6x margin over that; a missed or doubled micro-batch or a stale weight is still 1e-3 to 5e-2 (above), and
# two ranks, whose sum is exact in any order, are held to RTOL (they match to the last bit).
RTOL_MANY_RANKS = 3e-4
# Tensor parallelism splits every matrix product of a block over its ranks and sums the parts (a row-parallel
# product adds tp partial sums of the inner dimension; its all-reduce adds them in the collective's order), so
# activations differ from the reference by a few ulps from the first layer on, which Adam amplifies where a
# gradient is small against its own rounding noise. Measured (fp32, tp=2, 2 steps of 4 micro-steps, the tiny
# models of tests/test_replay_tp.py): losses within 2e-7, weights within 9e-5 (none, LLaMA-style, 2 ranks) and
# 3.2e-4 (none, 4-layer GPT-style, tp=2 x dp=4 on 8 ranks, whose data-parallel sums add their own reordering).
# 1e-3 keeps 3x to 10x margin; a skipped or doubled all-reduce changes the losses by O(1) and a stale weight
# is 5e-2 (above).
RTOL_TP = 1e-3


def rtol_for(world: int, precision: str = "fp32", tp: int = 1) -> float:
    """The verify tolerance of a replay of ``world`` data-parallel ranks of ``tp`` tensor-parallel ranks in
    ``precision`` (the loosest of the causes)."""
    return max(tolerance(precision), RTOL if world <= 2 else RTOL_MANY_RANKS, RTOL_TP if tp > 1 else 0.0)


def weights_gated(precision: str, tp: int, world: int = 1) -> bool:
    """Does ``--verify`` hold the final weights to its tolerance? Not for a tensor-parallel replay in bf16 /
    fp16: its split sums round at 16-bit precision where the reference's whole sums round once, and Adam turns
    those differences into steps of ``lr`` on small gradients (measured, tp=2 on the tiny models of
    tests/test_replay_tp.py: 5e-2 of a weight's scale, 1.0 of a zero-initialised bias). Its losses are held to
    the precision's tolerance (measured within 7e-5) and its weights reported; verify in fp32 for the weights.
    Nor for more than two data-parallel ranks in bf16 / fp16: their gradients are reduced in 16 bits
    (``Precision.wire_gradients``), and a collective's ring adds the ranks' parts in an order of its own, each
    partial sum rounded to 16 bits, which one process cannot follow (two ranks' one sum it can, bit for bit;
    measured, zero-offload on 4 ranks, the tiny LLaMA of tests/test_replay_ranks.py: losses within 4.9e-5,
    weights 5.4e-2 of a weight's scale)."""
    return precision == "fp32" or (tp <= 1 and world <= 2)


def noise_only(dims: Dims) -> frozenset[str]:
    """Parameters whose gradient is zero in exact arithmetic, so Adam moves them by rounding noise alone: a
    key bias without rotary positions (softmax is invariant to adding ``q . b_k`` to every score of a query).
    Two computations that round differently (tensor-parallel sums, a collective's sum over more than two ranks)
    cannot agree on them; their comparison leaves them out and says so."""
    return frozenset({"k.bias"}) if dims.bias and dims.learned_pos else frozenset()


def not_compared(dims: Dims, world: int, tp: int) -> frozenset[str]:
    """What ``--verify`` leaves out of a replay of ``world`` data-parallel and ``tp`` tensor-parallel ranks:
    nothing where it matches one process bit for bit (two replicas, no tensor parallelism), else
    ``noise_only``. Measured: the key bias of the 4-layer GPT-style model on 8 ranks (synergyscale, 8
    replicas) differs by 0.52 of its own scale, every other weight within 8.2e-5."""
    return noise_only(dims) if tp > 1 or world > 2 else frozenset()


def tied_sync_split(plan: Plan) -> bool:
    """Does ``plan`` keep the tied table's two uses apart (a pipeline whose last stage holds its own copy of
    the table, summed by a tied-grad-sync collective once per step)? Its replay then sums the embedding's
    gradients over the step's micro-steps, and the head's, and adds the two sums (``Store.sync_tied``), where
    one process adds the two uses micro-step by micro-step: the reference follows the plan's order."""
    return any(t.tags.get("phase") == Phase.TIED_GRAD_SYNC for seg in plan.segments for t in seg.tasks)


def _tie_sum(prec: Precision, emb: Tensor, head: Tensor) -> Tensor:
    """The tied table's gradient as ``Store.sync_tied`` makes it from the two stages' step sums: each sent in
    the plan's gradient dtype, added in it (two operands: one rounding, in any order), back in fp32."""
    return prec.mean_from_wire(prec.wire_gradients(emb, 1) + prec.wire_gradients(head, 1), 1)


def partitioned_layers(plan: Plan, n_layers: int) -> frozenset[int]:
    """The layers whose gradients ``plan`` reduce-scatters over more than one rank (ZeRO partitions: the
    runner's ``Sharding.layers``, found by the same rule in ``replay.runner``); in mixed precision their
    parameters are gathered, and computed with, in 16 bits (``Precision.wire_params``)."""
    out: set[int] = set()
    for t in (t for seg in plan.segments for t in seg.tasks):
        if t.op == "collective" and len(t.ranks) > 1 and t.coll == "reduce_scatter" \
                and t.tags.get("phase") == Phase.GRAD_REDUCE:
            layers = task_layers(t.tags)
            out |= set(layers if layers is not None else range(n_layers))
    return frozenset(out)


def host_updated_layers(plan: Plan, n_layers: int) -> frozenset[int]:
    """The layers (of ``n_layers`` modules: the embedding, the blocks, the head) whose optimizer tasks run on a
    host pool (a CPU Adam over host masters), from the plan's optimizer tasks and their streams' devices (an
    untagged optimizer task updates every layer)."""
    streams = plan.stream_map()
    out: set[int] = set()
    for t in (t for seg in plan.segments for t in seg.tasks):
        if t.op == "optimizer" and not streams[t.stream].device.startswith("gpu"):
            layers = task_layers(t.tags)
            out |= set(layers if layers is not None else range(n_layers))
    return frozenset(out)


class ReferenceAdam:
    """The reference's Adam, stepping each layer where the replay does: on the compute device, or, for a layer
    in ``host_layers`` of a CUDA run, over fp32 masters in host memory that are copied back after each step (a
    CPU's fused Adam and a GPU's round differently in the last bit, and 16-bit compute turns that bit into a
    different rounding of a weight, which Adam's normalisation amplifies on gradients of pure noise: measured
    on an H200, a 4-layer bf16 model, 3 steps: 4.6% of a tensor's largest weight with the reference on the
    GPU, for every policy with a CPU Adam). Fused Adam is elementwise, so one Adam per layer computes what one
    over all of them does."""

    def __init__(self, layers: list[nn.Module], device: torch.device, host_layers: frozenset[int]):
        self.steps: list[tuple[list[Tensor], list[nn.Parameter], torch.optim.Adam]] = []
        cpu = torch.device("cpu")
        for i, m in enumerate(layers):
            params = list(m.parameters())
            if not params:
                continue
            masters = ([nn.Parameter(p.detach().to(cpu, copy=True)) for p in params]
                       if i in host_layers and device != cpu else params)
            self.steps.append((params, masters, torch.optim.Adam(masters, **ADAM)))  # type: ignore[arg-type]

    def step(self) -> None:
        with torch.no_grad():
            for params, masters, opt in self.steps:
                if masters is not params:
                    for p, mp in zip(params, masters, strict=True):
                        mp.grad = None if p.grad is None else p.grad.to(mp.device)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if masters is not params:
                    for p, mp in zip(params, masters, strict=True):
                        p.copy_(mp)
                        p.grad = None


def train_reference(dims: Dims, batching: Batching, steps: int, accum: dict[int, int], *, delayed: bool,
                    device: torch.device, world: int = 1, host_layers: frozenset[int] = frozenset(),
                    tied_split: bool = False, partitioned: frozenset[int] = frozenset()
                    ) -> tuple[dict[tuple[int, int], float], list[dict[str, Tensor]]]:
    """Train the plain way, with the replay's thread setting (``replay.threads``): the same float summation
    order, so a parameter whose gradient is rounding noise (a key bias under softmax) gets the same Adam step.

    ``world`` > 1: the same training as one process, for a data-parallel replay of ``world`` ranks of
    ``accum`` micro-steps each: a step's ``world * accum`` micro-batches are the waves of ``replay.store``
    (micro-step m of rank r is batch ``m * world + r``); each wave's gradients are summed over the ranks
    and divided by their number (the replay's all-reduce or reduce-scatter; in bf16 / fp16 each rank's
    gradient divided first and rounded to the 16-bit dtype, the sum taken in it: what the replay's collective
    sends, ``Precision.wire_gradients``), then summed over the waves.
    With two ranks the sum is exact in any order, so the replay must match to the last bit; beyond two, a
    collective may associate the sum differently (a few ulps, see RTOL). ``host_layers``: the layers the
    replay updates with a CPU Adam (``host_updated_layers``), stepped on the CPU here too (``ReferenceAdam``).
    ``tied_split``: the head's use of a tied table gets its own gradient, summed over the step apart from the
    embedding's and added to it at the step's end (``tied_sync_split``). ``partitioned``: the layers a
    data-parallel replay partitions (``partitioned_layers``), computed with their parameters rounded to the
    plan's 16-bit dtype in mixed precision, as the replay gathers them (``Precision.working_params``)."""
    if tied_split and not dims.tied:
        tied_split = False
    with cpu_op_threads(device):
        if world > 1:
            return _train_reference_dp(dims, batching, steps, accum, delayed=delayed, device=device, world=world,
                                       host_layers=host_layers, tied_split=tied_split, partitioned=partitioned)
        return _train_reference(dims, batching, steps, accum, delayed=delayed, device=device,
                                host_layers=host_layers, tied_split=tied_split)


def _train_reference_dp(dims: Dims, batching: Batching, steps: int, accum: dict[int, int], *, delayed: bool,
                        device: torch.device, world: int, host_layers: frozenset[int] = frozenset(),
                        tied_split: bool = False, partitioned: frozenset[int] = frozenset()
                        ) -> tuple[dict[tuple[int, int], float], list[dict[str, Tensor]]]:
    layers = [m.to(device) for m in build_layers(dims, batching.seed)]
    prec = Precision(batching.precision, device.type)
    params = [p for m in layers for p in m.parameters()]
    rounded = [i in partitioned for i, m in enumerate(layers) for _ in m.parameters()]
    opt = ReferenceAdam(layers, device, host_layers)
    losses: dict[tuple[int, int], float] = {}
    prev: list[Tensor] = [p.detach().clone() for p in params]  # M_{s-1} for a delayed update
    wte = [n for n, _ in layers[0].named_parameters()].index("wte") if tied_split else -1
    for s in range(steps):
        n_micro = accum.get(s, 1)
        now = [p.detach().clone() for p in params]
        used = [prec.working_params(t) if r and prec.mixed else t.clone()
                for t, r in zip(prev if delayed else now, rounded, strict=True)]
        total: list[Tensor] | None = None
        for mi in range(n_micro):
            wave: list[Tensor] | None = None
            sent: list[Tensor] | None = None  # 16 bits: what each rank's gradient collective sends, summed
            for r in range(world):
                leaves = [t.detach().requires_grad_(True) for t in used]
                k = 0
                per_layer = []
                for m in layers:
                    names = [n for n, _ in m.named_parameters()]
                    per_layer.append(dict(zip(names, leaves[k:k + len(names)], strict=True)))
                    k += len(names)
                head_wte = per_layer[0]["wte"] if dims.tied else None
                if tied_split:  # the last stage's own copy of the table: a leaf of its own, last in the list
                    head_wte = used[wte].detach().requires_grad_(True)
                    leaves.append(head_wte)
                tokens, targets = batch(batching.seed, s, mi * world + r, batching.micro_batch, batching.seq_len,
                                        dims.vocab)
                tokens, targets = tokens.to(device), targets.to(device)
                with prec.autocast():
                    x = functional_call(layers[0], per_layer[0], (tokens,))
                    for i in range(1, len(layers) - 1):
                        x = functional_call(layers[i], per_layer[i], (x,))
                    loss = functional_call(layers[-1], per_layer[-1], (x, targets, head_wte))
                losses[(s, mi * world + r)] = float(loss.detach())
                grads = torch.autograd.grad(loss * prec.loss_scale / n_micro, leaves)
                wave = list(grads) if wave is None else [a + b for a, b in zip(wave, grads, strict=True)]
                if prec.mixed:  # the replay reduces in the plan's 16-bit dtype (Precision.wire_gradients)
                    wire = [prec.wire_gradients(g.clone(), world) for g in grads]  # it divides in place
                    sent = wire if sent is None else [a + b for a, b in zip(sent, wire, strict=True)]
            assert wave is not None
            wave = [prec.mean_from_wire(g, world) for g in sent] if sent is not None else [g / world for g in wave]
            total = wave if total is None else [a + b for a, b in zip(total, wave, strict=True)]
        assert total is not None
        if tied_split:  # the two stages' step sums of the table's gradient, added (Store.sync_tied)
            head = total.pop()
            total[wte] = _tie_sum(prec, total[wte], head)
        k = 0
        for i, m in enumerate(layers):  # the loss scale comes off per layer, as the replay's optimizer tasks do
            names = [n for n, _ in m.named_parameters()]
            prec.unscale(dict(zip(names, total[k:k + len(names)], strict=True)), f"reference: layer {i}, step {s}")
            k += len(names)
        for p, g in zip(params, total, strict=True):
            p.grad = g
        opt.step()
        prev = now
    return losses, [{n: p.detach().cpu().clone() for n, p in m.named_parameters()} for m in layers]


def _train_reference(dims: Dims, batching: Batching, steps: int, accum: dict[int, int], *, delayed: bool,
                     device: torch.device, host_layers: frozenset[int] = frozenset(), tied_split: bool = False
                     ) -> tuple[dict[tuple[int, int], float], list[dict[str, Tensor]]]:
    layers = [m.to(device) for m in build_layers(dims, batching.seed)]
    prec = Precision(batching.precision, device.type)
    opt = ReferenceAdam(layers, device, host_layers)
    losses: dict[tuple[int, int], float] = {}
    snaps: dict[int, list[dict[str, Tensor]]] = {0: [{n: p.detach().clone() for n, p in m.named_parameters()}
                                                      for m in layers]}  # k -> M_k
    for s in range(steps):
        n_micro = accum.get(s, 1)
        if delayed:
            used = [{n: t.detach().clone().requires_grad_(True) for n, t in d.items()}
                    for d in snaps[max(s - 1, 0)]]
        table: Tensor | None = None
        if dims.tied:
            table = used[0]["wte"] if delayed else dict(layers[0].named_parameters())["wte"]
        # the head's use of the table: the table itself, or (tied_split) a leaf of its own for the step
        head_wte = table.detach().requires_grad_(True) if tied_split and table is not None else table
        for mi in range(n_micro):
            tokens, targets = batch(batching.seed, s, mi, batching.micro_batch, batching.seq_len, dims.vocab)
            tokens, targets = tokens.to(device), targets.to(device)
            with prec.autocast():
                if delayed:
                    x = functional_call(layers[0], used[0], (tokens,))
                    for i in range(1, len(layers) - 1):
                        x = functional_call(layers[i], used[i], (x,))
                    loss = functional_call(layers[-1], used[-1], (x, targets, head_wte))
                else:
                    x = layers[0](tokens)
                    for m in layers[1:-1]:
                        x = m(x)
                    loss = layers[-1](x, targets, head_wte)
            losses[(s, mi)] = float(loss.detach())
            (loss * prec.loss_scale / n_micro).backward()
        if delayed:
            for m, d in zip(layers, used, strict=True):
                for n, p in m.named_parameters():
                    p.grad = d[n].grad
        if tied_split and head_wte is not None:  # the two stages' step sums, added (Store.sync_tied)
            emb = dict(layers[0].named_parameters())["wte"]
            assert emb.grad is not None and head_wte.grad is not None
            emb.grad = _tie_sum(prec, emb.grad, head_wte.grad)
        for i, m in enumerate(layers):
            grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
            prec.unscale(grads, f"reference: layer {i}, step {s}")
        opt.step()
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
            reference: str, rtol: float = RTOL, skip: frozenset[str] = frozenset(), gate_weights: bool = True
            ) -> Verdict:
    """Largest relative error of any loss (per micro-step) and of any final weight tensor (max abs diff
    over the tensor's max abs value); ``worst`` names the figure with the largest error of all; ``skip``:
    parameter names left out (``noise_only``); ``gate_weights`` False: the weights' error is reported but
    the verdict rests on the losses (``weights_gated``)."""
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
            if n in skip:
                continue
            scale = max(float(r.abs().max()), 1e-12)
            errs.append((float((mine[n] - r).abs().max()) / scale, "weight", f"layer {i} {n}"))
    lerr = max((e for e, kind, _ in errs if kind == "loss"), default=0.0)
    werr = max((e for e, kind, _ in errs if kind == "weight"), default=0.0)
    top = max(errs, default=(0.0, "", ""))
    ok = lerr <= rtol and (werr <= rtol or not gate_weights)
    return Verdict(ok, reference, lerr, werr, top[2] if top[0] > 0 else "", rtol)
