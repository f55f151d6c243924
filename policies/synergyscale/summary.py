"""What SynergyScale's ``plan.info`` and notes say about a Choice: the tiers and their sizes."""

from __future__ import annotations

from typing import Any

from policies.synergyscale.context import Choice, Ctx
from policies.synergyscale.knobs import FETCHED, TIERS
from policies.synergyscale.placement import gpu_fixed_bytes, tier_params


def summary(ctx: Ctx, ch: Choice) -> dict[str, Any]:
    L = ctx.layers
    tp = tier_params(ctx, ch.tiers)
    total = sum(tp.values())
    tiers = {t: {"layers": sum(1 for x in ch.tiers if x == t), "params": tp[t], "fraction": tp[t] / total}
             for t in TIERS}
    gpu_states = sum(ctx.gpu_cost(i, t) for i, t in enumerate(ch.tiers) if t == "gpu")
    peer = sum(ctx.gpu_cost(i, t) for i, t in enumerate(ch.tiers) if t == "peer")
    fixed = gpu_fixed_bytes(ctx, ch.tiers, ch.chunks, ch.buffers, ch.offload_activations, ch.buckets)
    saved = 0.0  # net bytes per GPU taken out of the GPU's pool (unified: host-side states stay in it)
    for i, t in enumerate(ch.tiers):
        saved += ctx.gpu_cost(i, "gpu") - ctx.gpu_cost(i, t) - (ctx.host_cost(i, t) if ctx.unified else 0.0)
    return {
        "dp": ctx.n, "tiers": tiers, "layer_tiers": "".join(t[0] for t in ch.tiers),
        "gpu_state_bytes_per_gpu": gpu_states, "peer_bytes_per_gpu": peer,
        "gpu_spare_bytes_per_gpu": ctx.gpu_cap - fixed - gpu_states, "gpu_working_set_bytes": fixed,
        "host_state_bytes": sum(ctx.host_cost(i, t) for i, t in enumerate(ch.tiers)),
        "nvme_state_bytes": sum(ctx.nvme_cost(i, t) for i, t in enumerate(ch.tiers)),
        "gpu_bytes_saved_per_gpu": saved, "fetch": "sliced + NVLink all-gather" if ctx.sliced else "whole per GPU",
        "params": float(sum(ly.params for ly in L)),
    }


def notes(ctx: Ctx, ch: Choice, s: dict[str, Any]) -> list[str]:
    by_tier = ", ".join(f"{k} {v['fraction']:.0%} ({v['layers']} layers)" for k, v in s["tiers"].items() if v["layers"])
    out = [f"data parallel over {ctx.n} GPU(s), {ctx.job.accumulation(ctx.n)} micro-step(s) per step; parameters "
           f"by tier: {by_tier}; {ch.chunks} chunk(s) per fetched layer on {max(1, min(ch.streams, ch.chunks))} "
           f"stream(s), {ch.buffers} chunk buffer(s), order {ch.order}"]
    if ctx.unified:
        out.append("unified memory: GPU and CPU share one pool, so CPU placement frees nothing (never chosen "
                   "by auto; reported as no saving); only NVMe is a real extra tier")
    if ctx.job.model.tied_embeddings and ch.tiers[0] == "gpu" and any(t in FETCHED for t in ch.tiers):
        out.append("tied embeddings: the embedding stays on the GPU (the head's matmul reads it)")
    return out
