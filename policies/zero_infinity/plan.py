"""``zero-infinity``'s plan: streams, tensors at their homes, the micro-steps (per use of a layer its fetch,
checkpoint reload, compute and gradients) and the optimizer step per sub-group."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from policies import kit
from policies.base import Job, unified
from policies.builder import PlanBuilder
from policies.zero_infinity.states import (
    DS_OPTIMIZER_BUFFERS,
    DS_PARAM_BUFFER_SIZE,
    DS_PARAM_BUFFERS,
    NAME,
    Knobs,
    check_fit,
    grad_buckets_in_flight,
    model_state_bytes,
    nvme_bytes_per_step,
    offloads_ckpt,
    param_pinned_window,
    per_param_bytes,
    state_homes,
    sub_groups,
)
from policies.zero_infinity.tiling import tile_factor, tiled_job
from simulator import Plan
from simulator.phase import Phase
from workloads.trace import LayerTrace


@dataclass
class MicroStep:
    """One micro-step in the current segment: ``sfx`` suffixes its ids, ``prev`` as ``kit.UseOrder``'s,
    ``boundary``: the accumulation boundary; ``last_opt[r]``: rank r's last optimizer task."""

    b: PlanBuilder
    job: Job
    knobs: Knobs
    n: int
    sfx: str
    prev: Callable[[str], str | None]
    boundary: bool
    last_opt: list[str]
    grad_window: int = 0  # staged fp32 gradient slices in flight per rank (0: unbounded; grad_staging_window)
    grad_buckets: int = 1  # 16-bit gradient buckets per GPU before a backward waits (grad_buckets_in_flight)
    template: bool = False  # rank 0's tasks only (kit.Layout(template=True)); collectives still span every rank

    def __post_init__(self) -> None:
        self.gpus = [kit.gpu(r) for r in range(self.n)]
        self.mine = self.gpus[:1] if self.template else self.gpus  # the GPUs whose tasks the plan holds
        self.db = kit.dtype_bytes(self.job)
        self.order = kit.UseOrder(len(self.job.trace.layers), self.sfx, self.prev)

    def emit(self) -> None:
        """Per use of a layer its fetch, checkpoint reload, compute and gradients; the GPU buffers of the fetches
        and gradient copies are reserved and released on the compute stream (``kit``: peaks that do not depend
        on timing)."""
        d = self.knobs.cpu_prefetch
        self.reserve(range(d + 1))  # the fetches that may start before this micro-step's first compute
        first_fetch = True
        for u, (i, ph) in enumerate(self.order.uses):
            layer = self.job.trace.layers[i]
            if layer.params > 0:
                self.fetch(u, i, ph, first_fetch)
                first_fetch = False
            if ph == "f":
                self.forward(i, layer)
                self.reserve([u + d + 1])
                continue
            if offloads_ckpt(self.job, self.knobs, i):  # the checkpoint back from CPU memory (cpu_prefetch)
                for g in self.mine:
                    kit.move_activation(self.b, f"cki{i}{self.sfx}.{g}", f"{g}.h2d", f"act{i}.{g}", "cpu", g,
                                        [f"cko{i}{self.sfx}.{g}"] + self.order.window(u, self.knobs.cpu_prefetch, [g]),
                                        phase=Phase.ACTIVATION_RELOAD, layer=i)
            self.backward(i, layer)
            self.gradients(i, layer)
            self.reserve([u + d + 1])
        self.release(None)

    def reserve(self, uses: Iterable[int]) -> None:
        """On every GPU's compute stream here: the buffers of the fetches for ``uses`` (those with parameters)."""
        for u in uses:
            if u >= len(self.order.uses):
                continue
            i, ph = self.order.uses[u]
            if self.job.trace.layers[i].params <= 0:
                continue
            for r, g in enumerate(self.mine):
                kit.reserve(self.b, f"rsv{ph}{i}{self.sfx}.{g}", g, [(kit.fetch_buffer(i, ph, g, self.n), g)],
                            layer=i, rank=r, use=kit.use_of(ph))

    def bucket(self, i: int, g: str) -> str:
        """The GPU buffer layer i's gradient copy reads: the reduced slice (n > 1 ranks), else the bucket."""
        return f"gs{i}.{g}" if self.n > 1 else f"gb{i}.{g}"

    def release(self, i: int | None) -> None:
        """On every GPU's compute stream here: the buckets ``kit.bucket_release`` releases before layer i's
        backward (None: after the micro-step's last), each once its copy has ended."""
        for o in kit.bucket_release(self.grad_order(), i, self.buckets_in_flight()):
            for r, g in enumerate(self.mine):
                kit.release(self.b, f"gfree{o}{self.sfx}.{g}", g, [(self.bucket(o, g), g)], layer=o, rank=r,
                            deps=[f"gd{o}{self.sfx}.{g}"])

    def fetch(self, u: int, i: int, ph: str, first_fetch: bool) -> None:
        """NVMe -> pinned CPU -> GPU slice -> all-gather, each with its prefetch distance."""
        b, n, k, sfx, window = self.b, self.n, self.knobs, self.sfx, self.order.window
        s = self.job.trace.layers[i].params / n
        opt_dep = [f"{self.last_opt[r]}^1" for r in range(len(self.mine))] if first_fetch else []
        if k.param_nvme and n == 1:
            kit.swap(b, f"nr{ph}{i}{sfx}", "cpu.pread", Phase.PARAM_SWAP_IN, "nvme", "cpu", s * self.db,
                     window(u, k.nvme_prefetch, self.gpus) + opt_dep, layer=i, use=kit.use_of(ph),
                     allocs=[(f"pin{ph}{i}.r0", "cpu")], reads=[("param16.r0", "nvme")])
        elif k.param_nvme:  # each rank's swapper reads its own slice (DeepSpeed): n flows over the shared drives
            for r, g in enumerate(self.mine):
                kit.swap(b, f"nr{ph}{i}{sfx}.r{r}", f"cpu.pread{r}", Phase.PARAM_SWAP_IN, "nvme", "cpu", s * self.db,
                         window(u, k.nvme_prefetch, [g]) + opt_dep[r:r + 1], layer=i, rank=r, use=kit.use_of(ph),
                         allocs=[(f"pin{ph}{i}.r{r}", "cpu")], reads=[(f"param16.r{r}", "nvme")])
        kit.sliced_fetch(b, self.gpus, i, ph, s * self.db, self.job.trace.layers[i].params * self.db,
                         lambda r, g: window(u, k.cpu_prefetch, [g]) + ([rank_io(f"nr{ph}{i}{sfx}", r, n)]
                                                                        if k.param_nvme else opt_dep[r:r + 1])
                         + [f"rsv{ph}{i}{sfx}.{g}"],
                         sfx=sfx, gather_deps=window(u, k.gather_prefetch, self.mine),  # (every GPU's: a barrier)
                         frees_of=lambda r: [(f"pin{ph}{i}.r{r}", "cpu")] if k.param_nvme else [],
                         reads_of=lambda r: [] if k.param_nvme else [(f"param16.r{r}", "cpu")], reserved=True,
                         mine=self.mine)

    def ready(self, i: int, ph: str, g: str, layer: LayerTrace) -> list[str]:
        return [] if layer.params <= 0 else [f"ag{ph}{i}{self.sfx}" if self.n > 1 else f"up{ph}{i}{self.sfx}.{g}"]

    def forward(self, i: int, layer: LayerTrace) -> None:
        sfx = self.sfx
        for r, g in enumerate(self.mine):
            kit.forward(self.b, i, layer, g, r, self.ready(i, "f", g, layer), tid=f"fwd{i}{sfx}.{g}",
                        allocs=[(f"act{i}.{g}", g)], frees=[(f"pgf{i}.{g}", g)] if layer.params > 0 else [])
            if offloads_ckpt(self.job, self.knobs, i):
                kit.move_activation(self.b, f"cko{i}{sfx}.{g}", f"{g}.d2h", f"act{i}.{g}", g, "cpu",
                                    [f"fwd{i}{sfx}.{g}"], phase=Phase.ACTIVATION_OFFLOAD, layer=i, rank=r)

    def throttled(self) -> bool:
        """Whether gradients stream straight to NVMe through the swapper's bounded pinned buffers: then a
        layer's backward also waits until the previous layer's gradient slice has left the GPU (DeepSpeed's
        gradient hook blocks on a full swapper)."""
        return self.boundary and self.knobs.optimizer_nvme and self.grad_window > 0 \
            and per_param_bytes(self.job, self.knobs)["grad"] <= 0

    def grad_order(self) -> list[int]:
        """Layers with parameters in backward order."""
        return [j for j in reversed(range(len(self.job.trace.layers))) if self.job.trace.layers[j].params > 0]

    def buckets_in_flight(self) -> int:
        """The gradient buckets a GPU may hold before a backward waits (``grad_buckets_in_flight``; one while
        gradients are throttled by the NVMe swapper)."""
        return 1 if self.throttled() else self.grad_buckets

    def backward(self, i: int, layer: LayerTrace) -> None:
        """Layer i's recomputation and backward, after the release of the bucket B back (its gate)."""
        sfx, ckpt = self.sfx, offloads_ckpt(self.job, self.knobs, i)
        if layer.params > 0:
            self.release(i)
        for r, g in enumerate(self.mine):
            deps = self.ready(i, "b", g, layer) + ([f"cki{i}{sfx}.{g}"] if ckpt else [])
            if layer.recompute_flops > 0:
                kit.recompute(self.b, i, layer, g, r, deps, tid=f"rc{i}{sfx}.{g}")
                deps = []
            kit.backward(self.b, i, layer, g, r, deps, tid=f"bwd{i}{sfx}.{g}", allocs=[(f"gb{i}.{g}", g)],
                         frees=[(f"act{i}.{g}", g)] + ([(f"pgb{i}.{g}", g)] if layer.params > 0 else []))

    def gradients(self, i: int, layer: LayerTrace) -> None:
        """Reduce-scatter, the slice to the CPU accumulation buffer (and at the boundary the fp32 one to NVMe)."""
        b, n, sfx, gpus = self.b, self.n, self.sfx, self.gpus
        if layer.params <= 0:
            for r, g in enumerate(self.mine):
                kit.release(b, f"gfree{i}{sfx}.{g}", g, [(f"gb{i}.{g}", g)], layer=i, rank=r)
            return
        s = layer.params / n
        if n > 1:
            mine = self.mine  # (a template: the deps and placements of rank 0's)
            kit.reduce(b, f"rs{i}{sfx}", "dp.grad", gpus, layer.params * self.db, [f"bwd{i}{sfx}.{g}" for g in mine],
                       layer=i, allocs=[(f"gs{i}.{g}", g) for g in mine], frees=[(f"gb{i}.{g}", g) for g in mine])
        pp = per_param_bytes(self.job, self.knobs)
        buffered = pp["grad"] > 0  # else the fp32 slice goes straight to the optimizer's gradient (states.py)
        stage = self.boundary and self.knobs.optimizer_nvme
        back = self.grad_order() if self.throttled() else []
        p = back.index(i) if back else 0
        waits = [f"gw{back[p - self.grad_window]}{sfx}"] if back and self.grad_window <= p \
            else []  # the swapper's pinned buffers are full until that write ends
        for r, g in enumerate(self.mine):
            wait = [rank_io(w, r, n) for w in waits]
            if buffered:
                size, reads, allocs = s * self.knobs.grad_bytes_per_param, [(f"grad.r{r}", "cpu")], []
            else:
                size = s * pp["grad32"]
                reads = [] if stage else [(f"grad32.r{r}", self.knobs.optimizer_device)]
                allocs = [(f"gst{i}.r{r}", "cpu")] if stage else []
            kit.offload(b, f"gd{i}{sfx}.{g}", g, size, [f"rs{i}{sfx}" if n > 1 else f"bwd{i}{sfx}.{g}", *wait], layer=i,
                        rank=r, reads=[*reads, (self.bucket(i, g), g)], allocs=allocs)  # released by release()
        if stage and n == 1:
            kit.swap(b, f"gw{i}{sfx}", "cpu.gwrite", Phase.GRAD_SWAP_OUT, "cpu", "nvme", s * pp["grad32"],
                     [f"gd{i}{sfx}.{gpus[0]}"], layer=i, allocs=[(f"gst{i}.r0", "cpu")] if buffered else [],
                     frees=[(f"gst{i}.r0", "cpu")])
        elif stage:  # each rank's swapper writes its own fp32 gradient slice: n flows to the shared drives
            for r, g in enumerate(self.mine):
                kit.swap(b, f"gw{i}{sfx}.r{r}", f"cpu.gwrite{r}", Phase.GRAD_SWAP_OUT, "cpu", "nvme", s * pp["grad32"],
                         [f"gd{i}{sfx}.{g}"], layer=i, rank=r, allocs=[(f"gst{i}.r{r}", "cpu")] if buffered else [],
                         frees=[(f"gst{i}.r{r}", "cpu")])


def rank_io(tid: str, r: int, n: int) -> str:
    """Rank r's task of a per-rank NVMe read or write ``tid`` (its ``.r{r}`` copy; one rank: ``tid`` itself)."""
    return f"{tid}.r{r}" if n > 1 else tid


def grad_staging_window(job: Job, n: int, groups: list[list[int]]) -> int:
    """How many layers' fp32 gradient slices a rank may have staged in pinned memory before the NVMe write of
    the oldest must end: DeepSpeed's gradient swapper takes the optimizer swapper's free pinned buffers
    (``offload_optimizer.buffer_count`` = 4, each of the largest sub-group's elements;
    ``deepspeed/runtime/swap_tensor/optimizer_utils.py`` ``_swap_out_gradients`` -> ``AsyncTensorSwapper``, which
    waits for a write to finish when its buffers are full)."""
    layers = job.trace.layers
    largest_group = max(sum(layers[i].params for i in grp) for grp in groups) / n
    largest_layer = max(layer.params for layer in layers) / n
    return max(1, int(DS_OPTIMIZER_BUFFERS * largest_group // max(largest_layer, 1.0)))


def emit_optimizer(b: PlanBuilder, job: Job, knobs: Knobs, n: int, groups: list[list[int]], ranks: range) -> None:
    """Per sub-group and rank: CPU Adam in place, or the states read from NVMe, Adam and written back
    (``pipeline_io``: read k+1 when Adam k starts, Adam k+1 after the write of k-1); with param_device=nvme
    the updated 16-bit slice written to its NVMe home. ``ranks``: those whose tasks the plan holds
    (``kit.Layout.ranks``); the first sub-group waits for every rank's last gradient (a barrier)."""
    layers = job.trace.layers
    pp = per_param_bytes(job, knobs)
    last = next(i for i in range(len(layers)) if layers[i].params > 0)  # the last gradient to arrive
    all_grads = [f"gd{last}.last.{kit.gpu(r)}" for r in range(n)] \
        + [rank_io(f"gw{last}.last", r, n) for r in range(n)] * knobs.optimizer_nvme
    states = pp["param32"] + pp["optim"]
    for k, grp in enumerate(groups):
        q = sum(layers[i].params for i in grp) / n
        extra = {"sub_group": k, "layers": f"{grp[0]}-{grp[-1]}"}
        for r in ranks:
            adam_deps = all_grads if k == 0 else []
            if knobs.optimizer_nvme:
                rd, after = (kit.read_ahead(k, 2, f"adam{{}}.r{r}") + kit.read_ahead(k, 3, f"ow{{}}.r{r}"),
                             kit.read_ahead(k, 2, f"ow{{}}.r{r}")) if knobs.pipeline_io else \
                    (kit.read_ahead(k, 1, f"ow{{}}.r{r}"), [])
                kit.swap(b, f"or{k}.r{r}", f"cpu.oread{r}", Phase.OPTIMIZER_SWAP_IN, "nvme", "cpu",
                         q * (states + pp["grad32"]), (all_grads if k == 0 else []) + rd, rank=r,
                         allocs=[(f"osb{k}.r{r}", "cpu")], reads=[(f"param32.r{r}", "nvme")] if pp["param32"] else [],
                         extra=extra)
                adam_deps = adam_deps + after + [f"or{k}.r{r}"]
            kit.cpu_adam(b, f"adam{k}.r{r}", r, adam_deps, q, extra=extra)
            if knobs.param_nvme:
                kit.swap(b, f"pw{k}.r{r}", f"cpu.owrite{r}", Phase.PARAM_SWAP_OUT, "cpu", "nvme",
                         q * kit.dtype_bytes(job), [f"adam{k}.r{r}"], rank=r, allocs=[(f"pst{k}.r{r}", "cpu")],
                         frees=[(f"pst{k}.r{r}", "cpu")], extra=extra)
            if knobs.optimizer_nvme:
                kit.swap(b, f"ow{k}.r{r}", f"cpu.owrite{r}", Phase.OPTIMIZER_SWAP_OUT, "cpu", "nvme", q * states,
                         [f"adam{k}.r{r}"], rank=r, frees=[(f"osb{k}.r{r}", "cpu")], extra=extra)


def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    knobs.check_devices(job)
    n = job.n_gpus
    kept = [layer.activation_bytes for i, layer in enumerate(job.trace.layers) if not offloads_ckpt(job, knobs, i)]
    moved = [layer.activation_bytes for i, layer in enumerate(job.trace.layers) if offloads_ckpt(job, knobs, i)]
    tiles = tile_factor(job, knobs.tile_factor, knobs.gather_prefetch, sum(kept) + max(moved, default=0))
    job = tiled_job(job, tiles)
    accum = job.accumulation(n)
    groups = sub_groups(job, n, knobs.sub_group_size)
    need = check_fit(job, knobs, n, groups)
    lay = kit.Layout(n, flat_comm=True, template=kit.templated(job))
    b = PlanBuilder(NAME, knobs, job, template=lay.rank_template)
    kit.declare_streams(b, lay, cpu_adam=True,
                        cpu_per_rank=[("owrite", "io")] * (knobs.param_nvme or knobs.optimizer_nvme)  # fp16 + states
                        + [("oread", "io")] * knobs.optimizer_nvme                                    # swapper reads
                        + ([("pread", "io")] * knobs.param_nvme + [("gwrite", "io")] * knobs.optimizer_nvme
                           if n > 1 else []),  # parameter reads, fp32 gradient writes: each rank its own
                        shared=[("cpu.pread", "cpu", "io")] * (knobs.param_nvme and n == 1)  # one rank: as before
                        + [("cpu.gwrite", "cpu", "io")] * (knobs.optimizer_nvme and n == 1),
                        comm_order=("param", "grad"))
    declare_tensors(b, job, knobs, lay, groups)
    k = len(groups) - 1  # per rank, the task ending its optimizer step (what the next step's first fetch waits for)
    last_opt = [f"ow{k}.r{r}" if knobs.optimizer_nvme else f"pw{k}.r{r}" if knobs.param_nvme else f"adam{k}.r{r}"
                for r in range(n)]
    segs: list[tuple[str, int, bool]] = [("micro-steps", accum - 1, False)] if accum > 1 else []
    for name, rep, boundary in [*segs, ("last-micro-step", 1, True)]:
        b.segment(name, rep)
        prev: Callable[[str], str | None] = (lambda x: f"{x}@1") if not boundary else \
            (lambda x: x) if accum > 1 else (lambda x: None)
        MicroStep(b, job, knobs, n, ".last" if boundary else "", prev, boundary, last_opt,
                  grad_staging_window(job, n, groups), grad_buckets_in_flight(job), lay.template).emit()
    b.segment("optimizer", 1)
    emit_optimizer(b, job, knobs, n, groups, lay.ranks())
    homes = state_homes(knobs)
    return b.build(steps=2, notes=notes(job, knobs, n, accum, len(groups), tiles), info={
        "dp": n, "accumulation": accum, "tile_factor": tiles, "sub_groups": [len(grp) for grp in groups],
        "sub_group_params_per_rank": [sum(job.trace.layers[i].params for i in grp) / n for grp in groups],
        "bytes_per_param": {k: {"bytes": v, "home": homes[k]} for k, v in per_param_bytes(job, knobs).items() if v > 0},
        "model_state_bytes": model_state_bytes(job, knobs),
        "nvme_bytes_per_step": nvme_bytes_per_step(job, knobs, accum), "min_need_bytes_by_pool": need,
        "param_pinned_window_elements_per_rank": param_pinned_window(job, knobs, n),
        "grad_buckets_in_flight": grad_buckets_in_flight(job)})


def declare_tensors(b: PlanBuilder, job: Job, knobs: Knobs, lay: kit.Layout, groups: list[list[int]]) -> None:
    """The model states per rank partition at their homes, the workspace, then per rank each layer's micro-step
    tensors (activations, gradient bucket, slice and fp32 staging) and each sub-group's optimizer buffers."""
    homes, pp, db = state_homes(knobs), per_param_bytes(job, knobs), kit.dtype_bytes(job)
    n = lay.n
    for r in lay.ranks():
        for kind, nb in pp.items():
            if nb > 0:
                b.tensor(f"{kind}.r{r}", nb * job.trace.params / n, kind, home=homes[kind], persistent=True)
    kit.workspace(b, job, lay)
    ckpt_kind = "checkpoint" if job.config.checkpointing == "full" else "activation"
    for r, g in enumerate(lay.gpus()):
        for i, layer in enumerate(job.trace.layers):  # per use: the gathered layer, its GPU and pinned CPU slices
            s = layer.params / n
            b.tensor(f"act{i}.{g}", layer.activation_bytes, ckpt_kind if offloads_ckpt(job, knobs, i) else "activation",
                     scope="iteration", layer=i)
            b.tensor(f"gb{i}.{g}", layer.params * db, "grad", scope="iteration", layer=i)
            if n > 1:
                b.tensor(f"gs{i}.{g}", s * knobs.grad_bytes_per_param, "grad", scope="iteration", layer=i)
            if knobs.optimizer_nvme:
                b.tensor(f"gst{i}.r{r}", s * pp["grad32"], "buffer", scope="iteration", layer=i)
            for ph in "fb":
                b.tensor(f"pg{ph}{i}.{g}", layer.params * db, "param16", scope="iteration", layer=i)
                if n > 1:
                    b.tensor(f"ps{ph}{i}.{g}", s * db, "param16", scope="iteration", layer=i)
                if knobs.param_nvme:
                    b.tensor(f"pin{ph}{i}.r{r}", s * db, "buffer", scope="iteration", layer=i)
        for k, grp in enumerate(groups):
            q = sum(job.trace.layers[i].params for i in grp) / n
            if knobs.optimizer_nvme:
                b.tensor(f"osb{k}.r{r}", q * (pp["param32"] + pp["optim"] + pp["grad32"]), "buffer", scope="step")
            if knobs.param_nvme:
                b.tensor(f"pst{k}.r{r}", q * db, "buffer", scope="step")


def notes(job: Job, knobs: Knobs, n: int, accum: int, n_groups: int, tiles: int = 1) -> list[str]:
    nv = nvme_bytes_per_step(job, knobs, accum)
    out = [f"ZeRO-Infinity: ZeRO-3 over {n} rank(s), {accum} micro-step(s) per step; parameters on "
           f"{knobs.param_device}, optimizer states on {knobs.optimizer_device}; prefetch NVMe "
           f"{knobs.nvme_prefetch} / CPU {knobs.cpu_prefetch} / gather {knobs.gather_prefetch} uses ahead; "
           f"{n_groups} optimizer sub-group(s)"]
    if tiles > 1:
        out.append(f"memory-centric tiling: every block in {tiles} tiles, fetched, gathered and computed one after "
                   f"another (tile_factor={knobs.tile_factor}; layer tags count tiles)")
    if nv["read"] or nv["write"]:
        out.append(f"NVMe per step: read {nv['read'] / 1e9:.1f} GB, write {nv['write'] / 1e9:.1f} GB")
    if unified(job):
        out.append("unified memory: GPU and CPU share one pool, so CPU placements free nothing; only NVMe "
                   "is a real extra tier, and CPU<->GPU copies still cost DRAM bandwidth")
    pinned_window = param_pinned_window(job, knobs, n)
    if knobs.param_nvme and pinned_window > DS_PARAM_BUFFERS * DS_PARAM_BUFFER_SIZE:
        out.append(f"the NVMe prefetch window ({pinned_window:.3g} elements per rank) exceeds DeepSpeed's "
                   f"default offload_param pool ({DS_PARAM_BUFFERS} x {DS_PARAM_BUFFER_SIZE:.0e}); raise "
                   f"buffer_count or lower nvme_prefetch")
    return out
