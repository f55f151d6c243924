"""SynergyScale's placement decision: which tier (gpu, peer GPUs, cpu, nvme) holds each layer's model
states, filling the fastest tier first within every pool's capacity, and the memory bounds it uses."""

from __future__ import annotations

import itertools

from policies.base import PlanInfeasible
from policies.synergyscale.context import (
    BUCKETS_IN_FLIGHT,
    FETCHED,
    GRAD_STAGING_LAYERS,
    NVME_SWAP_BUFFERS,
    TIERS,
    Ctx,
    Fractions,
)

GPU_HEADROOM = 0.01  # fraction of a GPU's usable memory the placement leaves free


def gpu_fixed_bytes(ctx: Ctx, tiers: tuple[str, ...] | None, chunks: int, buffers: int,
                    offload_activations: bool, buckets_in_flight: int = 0) -> float:
    """Per-GPU bytes besides persistent model states: workspace, saved activations of one micro-step,
    the chunk buffers of fetched parameters, gradient buckets in flight, and a small headroom.
    With ``tiers`` None the bound assumes every layer may be fetched (used before placement)."""
    L = ctx.layers
    fetched = [i for i in range(len(L)) if tiers is None or tiers[i] in FETCHED]
    ws = max(ly.peak_transient_bytes for ly in L)
    acts = sum(ly.activation_bytes for i, ly in enumerate(L)
               if not (offload_activations and (tiers is None or tiers[i] in FETCHED)))
    if offload_activations:
        acts += 2 * max(ly.activation_bytes for ly in L)  # in flight to / from the host
    buf = buffers * max((L[i].param_bytes / chunks for i in fetched), default=0.0)
    bucket_layers = [i for i in range(len(L)) if ctx.n > 1 or (tiers is None or tiers[i] != "gpu")]
    nb = min(buckets_in_flight or BUCKETS_IN_FLIGHT, len(bucket_layers))
    buckets: float = sum(sorted((L[i].grad_bytes for i in bucket_layers), reverse=True)[:nb])
    if ctx.n == 1 and tiers is not None and not fetched:
        buckets = 0.0
    return ws + acts + buf + buckets + GPU_HEADROOM * ctx.gpu_cap


def host_fixed_bytes(ctx: Ctx, tiers: tuple[str, ...], chunks: int, buffers: int,
                     offload_activations: bool) -> float:
    """Host-pool bytes besides model states: the NVMe tier's pinned buffers (parameter chunk staging, the
    optimizer swap's ``NVME_SWAP_BUFFERS`` sets of one layer's fp32 states and gradient, and with
    ``grads_to_nvme`` the fp32 gradients of ``GRAD_STAGING_LAYERS`` layers on their way to NVMe), every rank's
    offloaded activations."""
    L = ctx.layers
    nv = [i for i, t in enumerate(tiers) if t == "nvme"]
    out = 0.0
    if nv:
        out += buffers * max(L[i].param_bytes / chunks for i in nv)
        out += NVME_SWAP_BUFFERS * max(ctx.swap_in_bytes(i) for i in nv)
        out += GRAD_STAGING_LAYERS * max(ctx.grad32_bytes(i) for i in nv)
    if offload_activations:
        out += ctx.n * sum(L[i].activation_bytes for i, t in enumerate(tiers) if t in FETCHED)
    return out


def _resident_need(ctx: Ctx, chunks: int, buffers: int, offload_activations: bool, buckets: int = 0) -> float:
    """GPU bytes of an all-resident placement."""
    nl = len(ctx.layers)
    return gpu_fixed_bytes(ctx, ("gpu",) * nl, chunks, buffers, offload_activations, buckets) + sum(
        ctx.gpu_cost(i, "gpu") for i in range(nl))


def resident_buckets(ctx: Ctx) -> int:
    """Gradient buckets in flight when all is resident: every layer's when that fits (as plain data parallelism)."""
    nl = len(ctx.layers)
    return nl if _resident_need(ctx, 1, 1, False, nl) <= ctx.gpu_cap else BUCKETS_IN_FLIGHT


def priority(ctx: Ctx, order: str) -> list[int]:
    """Layers in the order they claim the fastest tiers: 'tail' in layer order, 'spread' in a van der
    Corput order (offloaded layers interleave with resident ones); the embedding always first."""
    L = len(ctx.layers)
    if order == "tail":
        return list(range(L))
    return [0, *sorted(range(1, L), key=lambda i: (int(f"{i:b}"[::-1], 2) / 2 ** i.bit_length(), i))]  # bits mirrored


class _Fill:
    """Fastest-tier-first filling: layers in priority order take the current tier while it has room
    (or until its explicit fraction is reached); the last tier takes whatever is left."""

    def __init__(self, ctx: Ctx, policy: str, order: str, fixed: float, host_cap: float, last: str):
        self.ctx, self.policy, self.fixed, self.host_cap, self.last = ctx, policy, fixed, host_cap, last
        self.used = {"gpu": 0.0, "host": 0.0, "nvme": 0.0}
        self.tiers: dict[int, str] = {}
        self.todo = priority(ctx, order)
        self.left = self.total = float(sum(ly.params for ly in ctx.layers))
        # what the layers still unplaced need at least in the host pool (in the slowest tier): an auto tier
        # that draws on the host pool (cpu; gpu and peer on a unified machine) leaves that much free
        self.suffix = [*itertools.accumulate((ctx.host_cost(i, last) for i in reversed(self.todo)), initial=0.0)][::-1]
        self.pos = {i: j for j, i in enumerate(self.todo)}

    def over(self, tier: str, rest: list[int]) -> PlanInfeasible:
        ctx, used, L = self.ctx, self.used, self.ctx.layers
        what = (f"the model states left for the {tier} tier ({len(rest)} layer(s), "
                f"{sum(L[j].params for j in rest) / 1e9:.2f}B parameters) after filling the faster tiers")
        if tier in ("gpu", "peer"):
            need = self.fixed + used["gpu"] + sum(ctx.gpu_cost(j, tier) for j in rest)
            return PlanInfeasible(self.policy, ctx.topo.pool_of["gpu0"], need, ctx.gpu_cap, what)
        nv = used["nvme"] + sum(ctx.nvme_cost(j, tier) for j in rest)
        if tier == "nvme" and nv > ctx.nvme_cap:
            return PlanInfeasible(self.policy, "nvme", nv, ctx.nvme_cap, what)
        # what the host pool holds besides model states: the NVMe tier's pinned buffers (and, on a unified
        # machine, the GPU's working set): the fill's capacity is what is left after them
        fixed = ctx.cpu_cap - self.host_cap
        if fixed > 0:
            what += f", plus {fixed / 1e9:,.1f} GB of host buffers (NVMe staging and swap)"
        return PlanInfeasible(self.policy, ctx.topo.pool_of["cpu"],
                              fixed + used["host"] + sum(ctx.host_cost(j, tier) for j in rest), ctx.cpu_cap, what)

    def _fits(self, i: int, tier: str, keep: float, cap_gpu: float) -> bool:
        ctx, used = self.ctx, self.used
        g = ctx.gpu_cost(i, tier)
        if tier in ("gpu", "peer"):
            return used["gpu"] + g <= cap_gpu and (not ctx.unified or used["host"] + g + keep <= self.host_cap)
        return (used["host"] + ctx.host_cost(i, tier) + keep <= self.host_cap
                and used["nvme"] + ctx.nvme_cost(i, tier) <= ctx.nvme_cap)

    def fill(self, tier: str, want: float | None, reserve: float, cap_gpu: float) -> None:
        """Give ``tier`` the next layers in priority order: up to ``want`` of the parameters when explicit,
        else while it has room and the tiers after it keep ``reserve`` parameters."""
        ctx, taken, last = self.ctx, 0.0, tier == self.last
        while self.todo:
            i = self.todo[0]
            p = float(ctx.layers[i].params)
            pinned = tier == "gpu" and i == 0 and bool(ctx.job.model.tied_embeddings)  # the head reads it
            if not pinned and not last:  # the last tier takes whatever is left
                if want is not None and taken + p / 2 > want * self.total + 1e-9:
                    break
                if want is None and self.left - p < reserve - p / 2:
                    break
            keep = self.suffix[self.pos[i] + 1] if want is None and not last else 0.0
            if not self._fits(i, tier, keep, cap_gpu):
                if want is None and not last and not pinned:
                    break
                raise self.over(tier, list(self.todo) if want is None or last else [i])
            g = ctx.gpu_cost(i, tier)
            self.used["gpu"] += g
            self.used["host"] += ctx.host_cost(i, tier) + (g if ctx.unified else 0.0)
            self.used["nvme"] += ctx.nvme_cost(i, tier)
            self.tiers[i] = tier
            self.left -= p
            self.todo.pop(0)
            taken += p


def place(ctx: Ctx, policy: str, order: str, gpu_share: float, chunks: int, buffers: int,
          offload_activations: bool, fr: Fractions) -> tuple[str, ...]:
    """Assign a tier to every layer: layers in ``priority`` order fill the fastest tier with room left
    (gpu up to ``gpu_share`` of the GPU's spare memory, then peer, cpu, nvme); a tier with an explicit
    fraction takes that share of the parameters instead. Raises PlanInfeasible naming the pool that
    overflows and by how much."""
    nl = len(ctx.layers)
    no_share = (fr.peer is None and fr.cpu is None and fr.nvme is None) or sum(fr.get(t) or 0.0 for t in FETCHED) == 0
    if no_share and _resident_need(ctx, chunks, buffers, offload_activations) <= ctx.gpu_cap:
        return ("gpu",) * nl
    gpool = ctx.topo.pool_of["gpu0"]
    fixed = gpu_fixed_bytes(ctx, None, chunks, buffers, offload_activations)
    spare = ctx.gpu_cap - fixed
    if spare < 0:
        raise PlanInfeasible(policy, gpool, fixed, ctx.gpu_cap, "workspace, activations, parameter chunk buffers "
                             "and gradient buckets with every layer offloaded")
    host_cap = ctx.cpu_cap - (fixed if ctx.unified else 0.0)  # unified: one pool for both sides
    # host buffers are only known after placement: reserve them as if any layer might land on NVMe
    worst = tuple("nvme" if ctx.has_nvme else "cpu" for _ in ctx.layers)
    host_cap -= host_fixed_bytes(ctx, worst, chunks, buffers, offload_activations)
    # the tiers this machine offers, fastest first (an auto cpu tier is never used on a unified machine)
    usable = [t for t in TIERS if t == "gpu" or (t == "peer" and ctx.peer_ok)
              or (t == "cpu" and not (ctx.unified and fr.cpu is None)) or (t == "nvme" and ctx.has_nvme)]
    target = {t: fr.get(t) for t in usable}
    if all(target[t] is not None for t in usable if t != "gpu"):
        target["gpu"] = max(0.0, 1.0 - sum(target[t] or 0.0 for t in usable if t != "gpu"))
    fill = _Fill(ctx, policy, order, fixed, host_cap, usable[-1])
    for k, tier in enumerate(usable):
        reserve = sum(target[t] or 0.0 for t in usable[k + 1:]) * fill.total
        fill.fill(tier, target[tier], reserve, spare * gpu_share if tier == "gpu" and ctx.peer_ok else spare)
    if fill.todo:
        raise fill.over(usable[-1], fill.todo)
    out = tuple(fill.tiers[i] for i in range(nl))
    # the exact working set now that the placement is known (the bound above assumed every layer fetched)
    need = gpu_fixed_bytes(ctx, out, chunks, buffers, offload_activations) + fill.used["gpu"]
    if need > ctx.gpu_cap + 1:
        raise PlanInfeasible(policy, gpool, need, ctx.gpu_cap, "the placed layers and their working set")
    hx = host_fixed_bytes(ctx, out, chunks, buffers, offload_activations)
    if fill.used["host"] + hx > ctx.cpu_cap - (fixed if ctx.unified else 0.0) + 1:
        raise PlanInfeasible(policy, ctx.topo.pool_of["cpu"], fill.used["host"] + hx, ctx.cpu_cap,
                             "host-side model states and buffers")
    return out
