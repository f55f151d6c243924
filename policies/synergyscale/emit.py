"""SynergyScale's plan emission: the tasks and tensors that carry out a ``Choice`` (which decides the tier
of every layer, the chunking, streams, prefetch window and gradient buckets), and what ``plan.info`` says."""

from __future__ import annotations

import functools
import itertools
from typing import Any

from policies import kit
from policies.builder import PlanBuilder
from policies.synergyscale.context import (
    FETCHED,
    GRAD_STAGING_LAYERS,
    HOST,
    NAME,
    NVME_SWAP_BUFFERS,
    TIERS,
    Choice,
    Ctx,
    Knobs,
    chunk_hbm,
)
from policies.synergyscale.placement import gpu_fixed_bytes
from simulator import Plan
from simulator.phase import Phase

Unit = tuple[str, int, int]   # a fetch unit: (pass "f" | "b", layer, chunk)
_STATES = (("p16", "param16", "param_bytes"), ("m32", "param32", "master_bytes"), ("opt", "optim", "optimizer_bytes"))


class _Emitter:
    """Emits one Choice's plan into a PlanBuilder, section by section."""

    def __init__(self, ctx: Ctx, knobs: Knobs, ch: Choice):
        self.ctx, self.ch, self.n, self.L, self.tiers = ctx, ch, ctx.n, ctx.layers, ch.tiers
        # the ranks' GPUs whose tasks the plan holds (a rank template: rank 0's, ``templated``); every
        # collective spans all of them (``all_gpus``)
        self.lay = kit.Layout(self.n, 1, flat_comm=True, template=templated(ctx, ch))
        self.gpus, self.all_gpus = self.lay.gpus(), [kit.gpu(r) for r in range(self.n)]
        self.c, self.S, self.D = ch.chunks, max(1, min(ch.streams, ch.chunks)), ch.buffers
        self.fetched = [t in FETCHED for t in ch.tiers]
        self.host_layers = [i for i, t in enumerate(ch.tiers) if t in HOST]
        self.nvme_layers = [i for i, t in enumerate(ch.tiers) if t == "nvme"]
        self.b = PlanBuilder(NAME, knobs, ctx.job, template=self.lay.rank_template)
        self.prev: dict[str, tuple[str, str]] = {}  # gpu -> (task that completes the previous layer, its stream)
        self.units: list[Unit] = ch.units()
        self.unit_index = {u: ui for ui, u in enumerate(self.units)}
        self.held = bool(self.host_layers)  # buckets held until released on the compute stream (``release``)
        self.ready: dict[Unit, dict[str, str]] = {}  # fetch unit -> gpu -> task after which the chunk is there
        self.blay = [i for i in reversed(range(len(self.L))) if self.bucket(i)]
        self.last_red: str | None = None

    def cs(self, g: str, k: int) -> str:
        """Compute stream of chunk k on GPU g."""
        j = k % self.S
        return f"{g}.compute" if j == 0 else f"{g}.compute{j}"

    def bucket(self, i: int) -> bool:
        """Layer i's gradients go through a bucket (reduced or offloaded), not straight to a local Adam."""
        return self.n > 1 or self.tiers[i] != "gpu"

    def after(self, g: str, stream: str) -> list[str]:
        """The previous layer's last task on GPU g when it ran on another stream."""
        pv = self.prev.get(g)
        return [pv[0]] if pv and pv[1] != stream else []

    def declare(self) -> None:
        """Streams; persistent model states (gpu tier: replicated weights + partitioned rest, peer tier
        partitioned, host and NVMe tiers in their pools, host gradients for both); per micro-step
        activations, gradient buckets, fetched chunks, NVMe staging and swap buffers."""
        b, n, c = self.b, self.n, self.c
        kit.gpu_streams(b, self.gpus, [(f"compute{j}", "compute") for j in range(1, self.S)])
        if self.host_layers:
            kit.cpu_streams(b, self.lay.ranks(), [("adam", "optim")])
        kit.comm_streams(b, self.lay, ("param", "grad"))
        if self.nvme_layers:
            b.stream("nvme.rd", "nvme", "io")
            b.stream("nvme.wr", "nvme", "io")
        tsum = functools.partial(self.ctx.tier_sum, self.tiers)
        div = n if n > 1 else 1
        per_gpu = {("p16", "param16"): tsum("gpu", "param_bytes") + tsum("peer", "param_bytes") / n}
        for name, kind, attr in (("grad", "grad", "grad_bytes"), *_STATES[1:]):
            per_gpu[(name, kind)] = (tsum("gpu", attr) + tsum("peer", attr)) / div
        for g in self.gpus:
            for (name, kind), nbytes in per_gpu.items():
                if nbytes > 0:
                    self.b.tensor(f"{name}.{g}", nbytes, kind, home=g, persistent=True)
        host_grad_params = tsum("cpu", "params") + (0.0 if self.ctx.grads_to_nvme else tsum("nvme", "params"))
        grads = {"cpu": self.ctx.host_grad_bytes * host_grad_params,
                 "nvme": sum(self.ctx.grad32_bytes(i) for i in self.nvme_layers)}
        for home in ("cpu", "nvme"):
            tensors = [(name, kind, tsum(home, attr)) for name, kind, attr in _STATES]
            for name, kind, nbytes in [*tensors, ("g32", "grad32", grads[home])]:
                if nbytes > 0:
                    self.b.tensor(f"{name}.{home}", nbytes, kind, home=home, persistent=True)
        kit.workspace(self.b, self.ctx.job, self.lay)
        for g in self.gpus:
            for i, ly in enumerate(self.L):
                b.tensor(f"act{i}.{g}", ly.activation_bytes, "activation", scope="iteration", layer=i)
                if self.bucket(i):
                    b.tensor(f"gb{i}.{g}", ly.grad_bytes, "grad", scope="iteration", layer=i)
                for k, p in itertools.product(range(c if self.fetched[i] else 0), "fb"):
                    b.tensor(f"p{p}{i}_{k}.{g}", ly.param_bytes / c, "param16", scope="iteration", layer=i)
        for i in self.nvme_layers:
            for k, p in itertools.product(range(c), "fb"):
                b.tensor(f"s{p}{i}_{k}", self.L[i].param_bytes / c, "buffer", scope="iteration", layer=i)
            b.tensor(f"sw{i}", self.ctx.swap_in_bytes(i), "buffer", scope="step", layer=i)
            for r in range(n if self.ctx.grads_to_nvme else 0):  # a rank's fp32 gradient slice on its way to NVMe
                b.tensor(f"gst{i}.r{r}", self.ctx.grad32_bytes(i) / n, "buffer", scope="iteration", layer=i)

    # -- fetches -------------------------------------------------------------------------------------
    def window(self, ui: int, g: str) -> list[str]:
        """Prefetch window: unit ui's fetch waits for the consumer D units back (the last micro-step's)."""
        U, D = len(self.units), self.D
        j, suffix = (ui - D, "") if ui >= D else (U - D + ui, "@1")
        if j < 0:
            return []
        p, i, k = self.units[j]
        return [f"{'fw' if p == 'f' else 'bw'}{i}_{k}.{g}{suffix}"]

    def fetch(self, ui: int, u: Unit) -> None:
        """One chunk to every GPU: an NVLink all-gather from the peers, or (NVMe read into a staging
        buffer, then) an upload per GPU, sliced 1/n and all-gathered when the GPUs have NVLink."""
        b, gpus = self.b, self.gpus
        p, i, k = u
        tier = self.tiers[i]
        cb = self.L[i].param_bytes / self.c
        use, where, name = kit.use_of(p), {"chunk": k, "tier": tier}, f"{p}{i}_{k}"
        # no delayed update: a layer's first forward chunk waits for its update of the previous step
        first = p == "f" and k == 0
        pre_all = {"peer": [f"gopt.{g}^1" for g in gpus], "nvme": [f"swo{i}^1"]}.get(tier, []) if first else []
        pre_rank = {g: [f"adam{i}.r{q}^1" for q in ([r] if self.ctx.sliced else range(self.n))]
                    if first and tier == "cpu" else [] for r, g in enumerate(gpus)}
        if self.ch.offload_activations and p == "b" and k == 0:
            for g in gpus:
                kit.move_activation(b, f"ai{i}.{g}", f"{g}.h2d", f"act{i}.{g}", "cpu", g, [f"ao{i}.{g}"],
                                    phase=Phase.ACTIVATION_RELOAD, layer=i)
        gates_all = [d for g in gpus for d in self.window(ui, g)]
        rd, ups = None, {}
        if tier == "nvme":  # into a host staging buffer first
            rd = kit.swap(b, f"rd{name}", "nvme.rd", Phase.PARAM_SWAP_IN, "nvme", "cpu", cb,
                          gates_all + pre_all + [f"rsv{name}.{gpus[0]}"], layer=i, use=use, extra=where)
        if tier != "peer":  # into the chunk buffer reserved on the compute stream (``reserve``)
            self.ready[u] = ups = {g: kit.upload(b, f"up{name}.{g}", g, cb / self.n if self.ctx.sliced else cb,
                                                 ([rd] if rd else self.window(ui, g) + pre_rank[g])
                                                 + [f"rsv{name}.{g}"], layer=i, rank=None, use=use, extra=where)
                                   for g in gpus}
        if tier == "peer" or self.ctx.sliced:  # peers: an all-gather of the chunk's shards
            t = kit.all_gather(b, f"ag{name}", "dp.param", self.all_gpus, cb, list(ups.values()) or gates_all + pre_all,
                               layer=i, use=use, allocs=[(f"p{name}.{g}", g) for g in gpus if tier == "peer"],
                               phase=Phase.PARAM_UPLOAD, extra=where)
            self.ready[u] = dict.fromkeys(gpus, t)

    def reserve(self, uis: range | list[int], g: str, stream: str) -> None:
        """On ``stream`` here: the chunk buffers on GPU g of the uploads of units ``uis`` (``kit``: peaks that do
        not depend on timing; an upload waits for its buffer, reserved once its prefetch window opened)."""
        for ui in uis:
            if 0 <= ui < len(self.units) and self.tiers[self.units[ui][1]] != "peer":
                p, i, k = self.units[ui]
                staged = [(f"s{p}{i}_{k}", "cpu")] if self.tiers[i] == "nvme" and g == self.gpus[0] else []
                kit.reserve(self.b, f"rsv{p}{i}_{k}.{g}", g, [(f"p{p}{i}_{k}.{g}", g), *staged], layer=i, rank=None,
                            use=kit.use_of(p), stream=stream, extra={"chunk": k, "tier": self.tiers[i]})

    def unstage(self, p: str, i: int, k: int, g: str, stream: str) -> None:
        """Before the compute of NVMe unit (p, i, k) on the first GPU: its host staging buffer (reserved with the
        first GPU's chunk buffer) released once every GPU's upload has read it."""
        if self.tiers[i] == "nvme" and g == self.gpus[0]:
            name = f"{p}{i}_{k}"
            kit.release(self.b, f"fs{name}", g, [(f"s{name}", "cpu")], layer=i, rank=None, stream=stream,
                        deps=[f"up{name}.{x}" for x in self.gpus], phase=Phase.BUFFER_RELEASE,
                        use=kit.use_of(p), extra={"chunk": k, "tier": "nvme"})

    def consumed(self, p: str, i: int, k: int, g: str, stream: str) -> None:
        """Unit (p, i, k) computed on ``stream``: the buffer ``buffers`` units later is reserved after it."""
        self.reserve([self.unit_index[(p, i, k)] + self.D], g, stream)

    def drained(self, o: int, g: str) -> str:
        """The task after which layer o's bucket on GPU g has been copied to the host or reduced."""
        return f"gd{o}.{g}" if self.tiers[o] in HOST else f"red{o}"

    def release(self, i: int | None, g: str, stream: str) -> list[str]:
        """Held buckets (some layer's gradients go to the host): on ``stream`` here, the gradient buckets
        ``kit.bucket_release`` releases before layer i's backward (None: after the last), each once drained.
        Otherwise (every layer on the GPUs: data parallelism as ``none`` at ZeRO-2, whose reductions free
        their buckets and whose next micro-step does not wait for them) returns the gate of layer i's
        backward, ``kit.bucket_gate``."""
        if not self.held:
            return [] if i is None else kit.bucket_gate(self.blay, i, self.ch.buckets, lambda o: self.drained(o, g))
        for o in kit.bucket_release(self.blay, i, self.ch.buckets):
            kit.release(self.b, f"gfree{o}.{g}", g, [(f"gb{o}.{g}", g)], layer=o, rank=None, stream=stream,
                        deps=[self.drained(o, g)])
        return []

    # -- forward and backward ------------------------------------------------------------------------
    def forward_chunks(self, i: int, r: int, g: str) -> None:
        ly, c = self.L[i], self.c
        for k in range(c):
            st = self.cs(g, k)
            deps = [self.ready[("f", i, k)][g]] + self.after(g, st)
            if k == c - 1:
                deps += [f"fw{i}_{j}.{g}" for j in range(k) if self.cs(g, j) != st]
            self.unstage("f", i, k, g, st)
            kit.forward(self.b, i, ly, g, r, deps, share=c, hbm_bytes=chunk_hbm(ly.fwd_hbm_bytes, ly.output_bytes, c),
                        tid=f"fw{i}_{k}.{g}", stream=st, allocs=[(f"act{i}.{g}", g)] if k == 0 else [],
                        frees=[(f"pf{i}_{k}.{g}", g)], extra={"chunk": k, "chunks": c})
            self.consumed("f", i, k, g, st)
        self.prev[g] = (f"fw{i}_{c - 1}.{g}", self.cs(g, c - 1))
        if self.ch.offload_activations:
            kit.move_activation(self.b, f"ao{i}.{g}", f"{g}.d2h", f"act{i}.{g}", g, "cpu", [self.prev[g][0]],
                                phase=Phase.ACTIVATION_OFFLOAD, layer=i, rank=r)

    def forward(self) -> None:
        first_gpu = next((i for i, t in enumerate(self.tiers) if t == "gpu"), None)
        gpu_ready = {g: (["agg^1"] if self.n > 1 else [f"gopt.{g}^1"]) for g in self.gpus}
        for g in self.gpus:  # the buffers whose window opened in the previous micro-step: at this one's start
            self.reserve(range(self.D), g, self.cs(g, 0))
        for i, ly in enumerate(self.L):
            for r, g in enumerate(self.gpus):
                if self.fetched[i]:
                    self.forward_chunks(i, r, g)
                    continue
                st = self.cs(g, 0)
                deps = (gpu_ready[g] if i == first_gpu else []) + self.after(g, st)
                self.prev[g] = (kit.forward(self.b, i, ly, g, r, deps, tid=f"fw{i}.{g}", stream=st,
                                            allocs=[(f"act{i}.{g}", g)]), st)

    def backward_resident(self, i: int, r: int, g: str) -> None:
        ly, st = self.L[i], self.cs(g, 0)
        deps = self.after(g, st)
        if ly.recompute_flops > 0:
            kit.recompute(self.b, i, ly, g, r, deps, tid=f"rc{i}.{g}", stream=st)
            deps = []
        if self.bucket(i):  # the bucket B layers back, released (its gate)
            deps += self.release(i, g, st)
        self.prev[g] = (kit.backward(self.b, i, ly, g, r, deps, tid=f"bw{i}.{g}", stream=st,
                                     allocs=[(f"gb{i}.{g}", g)] if self.bucket(i) else [],
                                     frees=[(f"act{i}.{g}", g)]), st)

    def backward_chunks(self, i: int, r: int, g: str) -> None:
        ly, c, b = self.L[i], self.c, self.b
        for k in range(c):
            st = self.cs(g, k)
            deps = [self.ready[("b", i, k)][g]] + self.after(g, st) + ([f"ai{i}.{g}"] if self.ch.offload_activations
                                                                      else [])
            self.unstage("b", i, k, g, st)
            if ly.recompute_flops > 0:
                kit.recompute(b, i, ly, g, r, deps, share=c, hbm_bytes=chunk_hbm(ly.fwd_hbm_bytes, ly.output_bytes, c),
                              tid=f"rc{i}_{k}.{g}", stream=st, extra={"chunk": k, "chunks": c})
                deps = []
            if k == c - 1:
                deps += [f"bw{i}_{j}.{g}" for j in range(k) if self.cs(g, j) != st]
            if k == 0 and self.bucket(i):  # the bucket B layers back, released (its gate)
                deps += self.release(i, g, st)
            kit.backward(b, i, ly, g, r, deps, share=c, hbm_bytes=chunk_hbm(ly.bwd_hbm_bytes, ly.output_bytes, c),
                         tid=f"bw{i}_{k}.{g}", stream=st, allocs=[(f"gb{i}.{g}", g)] if k == 0 else [],
                         frees=[(f"pb{i}_{k}.{g}", g)] + ([(f"act{i}.{g}", g)] if k == c - 1 else []),
                         extra={"chunk": k, "chunks": c})
            self.consumed("b", i, k, g, st)
        self.prev[g] = (f"bw{i}_{c - 1}.{g}", self.cs(g, c - 1))

    def staging_gate(self, i: int) -> list[str]:
        """The NVMe write that must end before NVMe-tier layer i's gradients may be staged in pinned DRAM: the
        one ``GRAD_STAGING_LAYERS`` NVMe layers back in backward order (DeepSpeed's gradient swapper waits for a
        write when its pinned buffers are full, ``swap_tensor/async_swapper.py``)."""
        order = self.nvme_layers[::-1]
        j = order.index(i)
        return [f"gw{order[j - GRAD_STAGING_LAYERS]}"] if j >= GRAD_STAGING_LAYERS else []

    def backward(self) -> None:
        """Per layer in reverse order its backward on every GPU, then its gradients reduce-scattered over the
        ranks and (host tiers) each rank's partition copied to the host; with ``grads_to_nvme`` an NVMe-tier
        layer's partitions land in pinned staging buffers, converted to fp32, and are written to NVMe."""
        n = self.n
        for i in reversed(range(len(self.L))):
            for r, g in enumerate(self.gpus):
                (self.backward_chunks if self.fetched[i] else self.backward_resident)(i, r, g)
            ly, host = self.L[i], self.tiers[i] in HOST
            done = {g: self.prev[g][0] for g in self.gpus}
            red = None
            if self.n > 1:  # held buckets are released on the compute stream (``release``)
                red = self.last_red = kit.reduce(self.b, f"red{i}", "dp.grad", self.all_gpus, ly.grad_bytes,
                                                 list(done.values()), layer=i,
                                                 frees=[] if host or self.held else [(f"gb{i}.{g}", g) for g in
                                                                                     self.gpus])
            swap = self.tiers[i] == "nvme" and self.ctx.grads_to_nvme
            wait = self.staging_gate(i) if swap else []
            for r, g in enumerate(self.gpus if host else []):
                kit.offload(self.b, f"gd{i}.{g}", g, self.ctx.grad_part(i), [red or done[g], *wait], layer=i, rank=r,
                            reads=[(f"gb{i}.{g}", g)], allocs=[(f"gst{i}.r{r}", "cpu")] if swap else [])
            if swap:  # every rank's fp32 slice, converted on the host, written to NVMe as one flow
                kit.swap(self.b, f"gw{i}", "nvme.wr", Phase.GRAD_SWAP_OUT, "cpu", "nvme", self.ctx.grad32_bytes(i),
                         [f"gd{i}.{g}" for g in self.gpus], layer=i, frees=[(f"gst{i}.r{r}", "cpu") for r in range(n)])
        for g in self.gpus:  # the last buckets, after the last backward
            self.release(None, g, self.cs(g, 0))

    # -- optimizer -----------------------------------------------------------------------------------
    def gpu_optimizer(self) -> None:
        """GPU Adam over each rank's gpu + peer states, then the all-gather of the gpu tier's weights."""
        b, gpus = self.b, self.gpus
        gpu_params = self.ctx.gpu_adam_params(self.tiers)
        if gpu_params <= 0:
            return
        on_gpu = [i for i, t in enumerate(self.tiers) if t in ("gpu", "peer")]
        for r, g in enumerate(gpus):  # ``layers``: the layers it updates (the host tiers' are CPU Adam's)
            kit.gpu_step(b, f"gopt.{g}", self.cs(g, 0), [self.last_red] if self.last_red else [self.prev[g][0]],
                         gpu_params, rank=r, extra={"tier": "gpu+peer", "layers": on_gpu})
        if self.n > 1 and self.ctx.tier_sum(self.tiers, "gpu") > 0:
            kit.all_gather(b, "agg", "dp.param", self.all_gpus, self.ctx.tier_sum(self.tiers, "gpu", "param_bytes"),
                           [f"gopt.{g}" for g in gpus])

    def host_optimizer(self) -> None:
        """CPU Adam per host-tier layer in backward order, NVMe layers' states (and fp32 gradients when they went
        to NVMe) swapped in before it (two buffer sets: a swap-in waits for the swap-out two layers back) and
        master, m, v and the 16-bit weights written back after it."""
        b, n = self.b, self.n
        nv_order = self.nvme_layers[::-1]
        for i in reversed(self.host_layers):
            ly = self.L[i]
            nvme = self.tiers[i] == "nvme"
            if nvme:
                j = nv_order.index(i)
                back = [f"swo{nv_order[j - NVME_SWAP_BUFFERS]}"] if j >= NVME_SWAP_BUFFERS else []
                grads = [f"gw{i}"] if self.ctx.grads_to_nvme else []  # its fp32 gradient, read back with the states
                kit.swap(b, f"swi{i}", "nvme.rd", Phase.OPTIMIZER_SWAP_IN, "nvme", "cpu", self.ctx.swap_in_bytes(i),
                         back + grads, layer=i, allocs=[(f"sw{i}", "cpu")])
            for r, g in enumerate(self.gpus):
                kit.cpu_adam(b, f"adam{i}.r{r}", r, [f"gd{i}.{g}"] + ([f"swi{i}"] if nvme else []), ly.params / n,
                             layer=i)
            if nvme:
                kit.swap(b, f"swo{i}", "nvme.wr", Phase.OPTIMIZER_SWAP_OUT, "cpu", "nvme",
                         ly.master_bytes + ly.optimizer_bytes + ly.param_bytes, [f"adam{i}.r{r}" for r in range(n)],
                         layer=i, frees=[(f"sw{i}", "cpu")])


def templated(ctx: Ctx, ch: Choice) -> bool:
    """Is ``ch``'s plan emitted as a rank template (``simulator.rank_template``: rank 0's tasks), where the job
    asks (``kit.templated``)? Not with an NVMe tier: its reads and writes are the whole machine's, on machine-wide
    streams, and the first GPU stages them, so no one rank's tasks stand for the others' (the full plan is not
    symmetric either). A wait for every rank's copy of a task (whole fetches of a cpu tier wait for every rank's
    CPU Adam) is a barrier: rank 0's copy stands for it (``kit.Layout``)."""
    return kit.templated(ctx.job) and ctx.n > 1 and "nvme" not in ch.tiers


def summary(ctx: Ctx, ch: Choice) -> dict[str, Any]:
    """The tiers of ``ch`` and their sizes."""
    tp = {t: ctx.tier_sum(ch.tiers, t) for t in TIERS}
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
        "params": float(sum(ly.params for ly in ctx.layers)),
    }


def notes(ctx: Ctx, ch: Choice, s: dict[str, Any]) -> list[str]:
    by_tier = ", ".join(f"{k} {v['fraction']:.0%} ({v['layers']} layers)" for k, v in s["tiers"].items() if v["layers"])
    out = [f"data parallel over {ctx.n} GPU(s), {ctx.job.accumulation(ctx.n)} micro-step(s) per step; parameters "
           f"by tier: {by_tier}; {ch.chunks} chunk(s) per fetched layer on {max(1, min(ch.streams, ch.chunks))} "
           f"stream(s), {ch.buffers} chunk buffer(s), order {ch.order}"]
    if ctx.unified:
        out.append("unified memory: GPU and CPU share one pool, so CPU placement frees nothing (never chosen "
                   "by auto; reported as no saving); only NVMe is a real extra tier")
    if ctx.job.model.tied_embeddings and ch.tiers[0] == "gpu" and ch.fetches:
        out.append("tied embeddings: the embedding stays on the GPU (the head's matmul reads it)")
    return out


def build(ctx: Ctx, knobs: Knobs, ch: Choice, info: dict[str, Any]) -> Plan:
    """The plan of ``ch``; ``info`` (what the search did) goes into ``plan.info`` beside the summary."""
    e = _Emitter(ctx, knobs, ch)
    e.declare()
    accum = ctx.job.accumulation(ctx.n)
    e.b.segment("micro-steps", accum)
    for ui, u in enumerate(e.units):
        e.fetch(ui, u)
    e.forward()
    e.backward()
    e.b.segment("optimizer", 1)
    e.gpu_optimizer()
    e.host_optimizer()
    s = summary(ctx, ch)
    return e.b.build(steps=2, notes=notes(ctx, ch, s), info={"accumulation": accum, **s, "chosen": ch.params(), **info})
