"""``zero-infinity``: ZeRO-3 with parameters and optimizer states on CPU or NVMe (Rajbhandari et al. 2021,
arXiv 2104.07857; DeepSpeed stage 3 with ``offload_param`` and ``offload_optimizer``).

Idea: partition every model state over all data-parallel ranks (ZeRO-3) and keep it off the GPU. Each
layer's fp16/bf16 parameters are fetched just before use, every rank fetching only its ``1/dp`` slice
from its home (NVMe -> pinned CPU buffer -> GPU, or CPU -> GPU), all ranks in parallel, then an
all-gather over the ranks (NVLink on a DGX, PCIe on commodity boxes) assembles the full layer on every
GPU ("bandwidth-centric partitioning": the aggregate PCIe/NVMe bandwidth of all ranks is used, not one
link). A prefetcher overlaps these fetches with compute; gradients are reduce-scattered and offloaded
during the backward; the optimizer step runs on the CPU per sub-group, streaming fp32 states from NVMe.

Our reading and assumptions (see ../shared/reference/policies.md):
- dp = the GPU count, no tensor parallelism; ``accumulation`` micro-steps per step. One layer of the
  workload trace (embedding, each block, head) is one unit of fetch, gather, release and gradient
  reduction (DeepSpeed works per parameter tensor and bucket; we do not model its
  ``prefetch_bucket_size`` or ``param_persistence_threshold``: every layer is partitioned).
- Use order per micro-step: forward of layers 0..L-1, then recompute+backward of L-1..0; every use
  (forward and backward, the last layer included) fetches and gathers the layer again and frees it
  after use. DeepSpeed's ``max_reuse_distance`` would keep the last layer between its forward and
  backward; we re-fetch it (a small overestimate of traffic).
- Prefetch as dependencies: the fetch for use ``u`` may start once use ``u - d`` has started, i.e. it
  depends on the end of the compute of use ``u - d - 1`` (on every rank, for a collective), plus the
  in-order streams: NVMe->CPU reads with ``d = nvme_prefetch``, CPU->GPU copies with ``cpu_prefetch``,
  all-gathers with ``gather_prefetch``; d = 0 is fetch-on-demand. Uses of the next micro-step are
  prefetched during the end of the current one (distances reach back at most one micro-step).
  Staging memory is allocated when a fetch starts and freed when its consumer ends: the pinned CPU
  slice (NVMe path) at the NVMe read until its CPU->GPU copy ends, the GPU slice until the all-gather
  ends, the gathered layer until its compute ends. DeepSpeed pins ``offload_param`` buffer_count x
  buffer_size (5 x 1e8 elements) per rank up front; we allocate only the window actually in flight and
  report in ``info`` whether it fits that pool. The ranks' NVMe reads of one layer (and their fp32
  gradient writes) start together and share the drive set max-min fairly, so each is one flow of
  ``dp`` slices (same timing as ``dp`` equal flows, ``1/dp`` of the simulator's events); the
  optimizer's NVMe traffic stays per rank.
- Gradients: each layer's full gradient bucket lives on the GPU from its backward until the
  reduce-scatter ends; each rank then copies its slice (``grad_bytes_per_param``) into a CPU
  accumulation buffer (DeepSpeed stage 3 keeps this 16-bit partition buffer on the CPU with any
  optimizer offload). DeepSpeed adds non-first micro-steps' gradients on the GPU (an extra H2D of the
  buffer per micro-step); we model the accumulation as free on the CPU. With
  ``optimizer_device=nvme``, on the last micro-step (the accumulation boundary) every rank writes its
  fp32 gradient slice (4 B/param) to NVMe as its layer's gradients arrive, where the optimizer reads it
  back; DeepSpeed converts to fp32 on the GPU and copies 4 B/param more down at the boundary, we
  convert on the CPU.
- Optimizer step, after every rank's last gradient (the global gradient norm needs them all) and
  before the next step's first fetch (DeepSpeed's ``step()`` is synchronous: no overlap across steps).
  Layers are grouped in order into sub-groups holding at most ``sub_group_size`` parameters of one
  rank's partition (DeepSpeed counts partition elements per rank; a layer larger than that is a group
  alone). Per rank and sub-group: with ``optimizer_device=cpu`` CPU Adam in place (the shared
  ``cpu.adam`` rate); with ``nvme``: read fp32 master, m, v and the fp32 gradient (16 B/param) from NVMe
  into pinned buffers, CPU Adam, write master, m, v back (12 B/param). With ``pipeline_io``
  (DeepSpeed's pipeline_read + pipeline_write) the read of sub-group k+1 is issued when Adam of k
  starts, the write of k waits only for the write of k-1, and Adam of k+1 waits for the write of k-1:
  at most three sub-groups' buffers live (DeepSpeed's pipelined swapper then needs buffer_count 12,
  not the default 4; we allocate 16 B/param of the sub-group per set). Without it read, Adam and
  write of each sub-group run one after another. The updated 16-bit slice goes back to the parameter
  home: in place on the CPU (no transfer) or written to NVMe (``db`` B/param) from a pinned staging
  buffer.
- Where the 20 B/param of ZeRO-Infinity's count live (bf16/fp16; fp32 runs have no separate master):
  fp16 parameters (2) at ``param_device``; the 16-bit gradient accumulation buffer
  (``grad_bytes_per_param``) on the CPU always; fp32 master (4), m and v (8) and the fp32 gradient (4)
  at ``optimizer_device``. With ``optimizer_device=cpu`` and ``param_device=cpu`` the CPU holds all
  20 B/param.
- Per step over ``nvme.io``: param_device=nvme reads ``2 * db`` B/param per micro-step (forward and
  backward fetch) and writes ``db`` per step; optimizer_device=nvme writes 4 (fp32 gradients) and
  reads 16 (master, m, v, gradient) and writes 12 (master, m, v) per step: 32 B/param per step,
  whatever the accumulation count. ``plan.info['nvme_bytes_per_step']`` states the figures.
- Activation checkpoints (``offload_checkpoints``, DeepSpeed ``cpu_checkpointing``): each block's saved
  activations are moved to CPU memory right after its forward (on the D2H stream) and back before its
  recompute (on the H2D stream, with the ``cpu_prefetch`` distance). Embedding and head keep theirs.
- Unified memory (DGX Spark): GPU and CPU are one pool; "cpu" placements save nothing (the pool's
  peak shows it) and every CPU<->GPU copy still costs DRAM bandwidth; only NVMe is a real extra tier.
- Not modelled: memory-centric tiling of huge linear layers, GPUDirect Storage, the aio block size
  and queue depth (NVMe runs at the preset's sustained rate), CPU-side fp16<->fp32 conversions and
  gradient clipping, ``max_in_cpu``, tied-embedding re-gathers.

Where our reading is weakest:
- the paper gives no schedule at the granularity we simulate: the prefetch distances (3/2/1) come from
  the paper's prose, and DeepSpeed's real prefetcher is driven by ``prefetch_bucket_size`` (5e7
  elements) over a recorded trace of parameter uses, not by a layer distance;
- DeepSpeed's optimizer swapper buffer use with pipelining (we assume three sub-groups in flight) and
  whether pipelined reads/writes of one drive overlap (the topology caps read + write together at the
  faster of the two);
- NVMe throughput under eight concurrent ranks' small requests (we assume the RAID's sustained figure
  shared max-min fairly); the paper's own ``eff = ait*bw/(ait*bw + peak)`` model is not used;
- gradient accumulation across micro-steps: DeepSpeed's GPU round trip and fp32 conversion at the
  boundary are simplified away (above).

Knobs:
- ``param_device`` (cpu | nvme, default cpu): home of the 16-bit parameter partitions.
- ``optimizer_device`` (cpu | nvme, default cpu): home of fp32 master weights, Adam m, v and the fp32
  gradients; nvme needs a machine with NVMe (else a KnobError naming the knob).
- ``nvme_prefetch`` (int, default 3): NVMe->CPU read of the use ``d`` ahead of the one computing.
- ``cpu_prefetch`` (int, default 2): CPU->GPU copy ``d`` uses ahead (also checkpoint reloads).
- ``gather_prefetch`` (int, default 1): all-gather ``d`` uses ahead.
- ``sub_group_size`` (int, default 1e9 as DeepSpeed): parameters of one rank's partition per optimizer
  sub-group.
- ``pipeline_io`` (bool, default True): overlap the NVMe read of sub-group k+1 and the write of k-1
  with Adam of k.
- ``offload_checkpoints`` (bool, default False): activation checkpoints to CPU memory in the forward,
  back before the backward.
- ``grad_bytes_per_param`` (float, default 2): bytes per parameter each rank copies GPU->CPU per
  micro-step (4: fp32 gradient communication), also the size of the CPU accumulation buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hardware_models import build_topology
from policies.base import Job, KnobError, PlanInfeasible, PolicyInfo, unified
from policies.builder import PlanBuilder
from policies.dataparallel import dtype_bytes
from simulator import Plan
from simulator.phase import Phase

NAME = "zero-infinity"
DS_PARAM_BUFFERS = 5          # DeepSpeed offload_param.buffer_count
DS_PARAM_BUFFER_SIZE = 1e8    # DeepSpeed offload_param.buffer_size (elements)
DS_OPTIMIZER_BUFFERS = 4      # DeepSpeed offload_optimizer.buffer_count (p32, g32, m, v of one sub-group)


@dataclass(frozen=True)
class Knobs:
    param_device: Literal["cpu", "nvme"] = "cpu"
    optimizer_device: Literal["cpu", "nvme"] = "cpu"
    nvme_prefetch: int = 3
    cpu_prefetch: int = 2
    gather_prefetch: int = 1
    sub_group_size: int = 1_000_000_000
    pipeline_io: bool = True
    offload_checkpoints: bool = False
    grad_bytes_per_param: float = 2.0

    def validate(self) -> None:
        for name in ("param_device", "optimizer_device"):
            if getattr(self, name) not in ("cpu", "nvme"):
                raise KnobError(f"{NAME}: knob '{name}' must be cpu or nvme, got {getattr(self, name)!r}")
        for name in ("nvme_prefetch", "cpu_prefetch", "gather_prefetch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise KnobError(f"{NAME}: knob '{name}' must be an integer >= 0 (0 = fetch on demand), got {v!r}")
        if isinstance(self.sub_group_size, bool) or not isinstance(self.sub_group_size, int) \
                or self.sub_group_size < 1:
            raise KnobError(f"{NAME}: knob 'sub_group_size' must be a positive number of parameters, "
                            f"got {self.sub_group_size!r}")
        if self.grad_bytes_per_param not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'grad_bytes_per_param' must be 2 (fp16/bf16) or 4 (fp32), "
                            f"got {self.grad_bytes_per_param!r}")


# -- sizes --------------------------------------------------------------------------------------------
def per_param_bytes(job: Job, knobs: Knobs) -> dict[str, float]:
    """Bytes per parameter of each model state (ZeRO-Infinity's 20 B/param with bf16/fp16)."""
    db = dtype_bytes(job)
    mixed = db < 4
    return {"param16": float(db), "grad": knobs.grad_bytes_per_param, "param32": 4.0 if mixed else 0.0,
            "optim": 8.0, "grad32": 4.0}


def state_homes(knobs: Knobs) -> dict[str, str]:
    return {"param16": knobs.param_device, "grad": "cpu", "param32": knobs.optimizer_device,
            "optim": knobs.optimizer_device, "grad32": knobs.optimizer_device}


def model_state_bytes(job: Job, knobs: Knobs) -> dict[str, dict[str, float]]:
    """Whole-machine model-state bytes by location and kind."""
    p = float(job.trace.params)
    out: dict[str, dict[str, float]] = {}
    for kind, nb in per_param_bytes(job, knobs).items():
        if nb > 0:
            out.setdefault(state_homes(knobs)[kind], {})[kind] = nb * p
    return out


def sub_groups(job: Job, n: int, size: int) -> list[list[int]]:
    """Consecutive layers whose per-rank partition holds at most ``size`` parameters (a bigger layer alone)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    acc = 0.0
    for i, layer in enumerate(job.trace.layers):
        s = layer.params / n
        if cur and acc + s > size:
            groups.append(cur)
            cur, acc = [], 0.0
        cur.append(i)
        acc += s
    if cur:
        groups.append(cur)
    return groups


def nvme_bytes_per_step(job: Job, knobs: Knobs, accumulation: int) -> dict[str, float]:
    """Bytes read and written over nvme.io per step (module docstring)."""
    p = float(job.trace.params)
    db = dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    read = write = 0.0
    if knobs.param_device == "nvme":
        read += 2 * db * p * accumulation
        write += db * p
    if knobs.optimizer_device == "nvme":
        states = pp["param32"] + pp["optim"]
        read += (states + pp["grad32"]) * p
        write += (states + pp["grad32"]) * p
    return {"read": read, "write": write}


def _offloads_ckpt(job: Job, knobs: Knobs, i: int) -> bool:
    layer = job.trace.layers[i]
    return knobs.offload_checkpoints and layer.kind == "block" and layer.activation_bytes > 0


# -- feasibility --------------------------------------------------------------------------------------
def check_fit(job: Job, knobs: Knobs, n: int, groups: list[list[int]]) -> dict[str, float]:
    """Lower bounds of what each pool must hold at once; PlanInfeasible when one is over capacity."""
    topo = build_topology(job.hw)
    layers = job.trace.layers
    db = dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    full = max(layer.params for layer in layers) * db
    ws = max(layer.peak_transient_bytes for layer in layers)
    kept = [layer.activation_bytes for i, layer in enumerate(layers) if not _offloads_ckpt(job, knobs, i)]
    moved = [layer.activation_bytes for i, layer in enumerate(layers) if _offloads_ckpt(job, knobs, i)]
    gpu_need = n * (ws + sum(kept) + max(moved, default=0) + 2 * full)  # backward of the largest layer
    need: dict[str, float] = {}
    what: dict[str, list[str]] = {}

    def add(loc: str, nbytes: float, label: str) -> None:
        pool = topo.pool_of[loc]
        need[pool] = need.get(pool, 0.0) + nbytes
        what.setdefault(pool, []).append(label)

    for g in range(n):
        add(f"gpu{g}", gpu_need / n, "")
    what = {k: ["the GPU working set (workspace, activations, a gathered layer and its gradient bucket)"]
            for k in what}
    for loc, kinds in model_state_bytes(job, knobs).items():
        add(loc, sum(kinds.values()), f"model states ({', '.join(f'{k} {v / 1e9:.0f} GB' for k, v in kinds.items())})")
    if moved:
        add("cpu", n * sum(moved), "offloaded activation checkpoints")
    if knobs.optimizer_device == "nvme":
        q = max(sum(layers[i].params for i in grp) / n for grp in groups)
        add("cpu", n * q * (pp["param32"] + pp["optim"] + pp["grad32"]), "one sub-group's optimizer swap buffers")
    for pool, nbytes in need.items():
        cap = topo.pools[pool].capacity_bytes
        if nbytes > cap:
            raise PlanInfeasible(NAME, pool, nbytes, cap, " + ".join(dict.fromkeys(what[pool])))
    return need


# -- plan ---------------------------------------------------------------------------------------------
def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    hw = job.hw
    for name in ("param_device", "optimizer_device"):
        if getattr(knobs, name) == "nvme" and hw.nvme is None:
            raise KnobError(f"{NAME}: knob '{name}' = nvme but {hw.name} has no NVMe drive; use cpu")
    n = job.n_gpus
    gpus = [f"gpu{r}" for r in range(n)]
    accum = job.accumulation(n)
    layers = job.trace.layers
    db = dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    gbp = knobs.grad_bytes_per_param
    pnv = knobs.param_device == "nvme"
    onv = knobs.optimizer_device == "nvme"
    groups = sub_groups(job, n, knobs.sub_group_size)
    need = check_fit(job, knobs, n, groups)

    b = PlanBuilder(NAME, knobs, job)
    for r, g in enumerate(gpus):
        b.stream(f"{g}.compute", g, "compute")
        b.stream(f"{g}.h2d", g, "h2d")
        b.stream(f"{g}.d2h", g, "d2h")
        b.stream(f"cpu.adam{r}", "cpu", "optim")
        if pnv or onv:
            b.stream(f"cpu.owrite{r}", "cpu", "io")     # fp16 and optimizer-state writes of rank r
        if onv:
            b.stream(f"cpu.oread{r}", "cpu", "io")      # optimizer swapper reads
    if pnv:
        b.stream("cpu.pread", "cpu", "io")              # parameter swapper reads, all ranks
    if onv:
        b.stream("cpu.gwrite", "cpu", "io")             # fp32 gradient writes at the boundary, all ranks
    if n > 1:
        b.stream("dp.param", gpus[0], "comm")
        b.stream("dp.grad", gpus[0], "comm")

    # persistent model states, per rank partition, at their homes
    homes = state_homes(knobs)
    for r in range(n):
        for kind, nb in pp.items():
            if nb > 0:
                b.tensor(f"{kind}.r{r}", nb * job.trace.params / n, kind, home=homes[kind], persistent=True)
    ws = max(layer.peak_transient_bytes for layer in layers)
    for g in gpus:
        b.tensor(f"ws.{g}", ws, "buffer", home=g, persistent=True)
    # per-micro-step tensors
    ckpt_kind = "checkpoint" if job.config.checkpointing == "full" else "activation"
    for r, g in enumerate(gpus):
        for i, layer in enumerate(layers):
            s = layer.params / n
            b.tensor(f"act{i}.{g}", layer.activation_bytes, ckpt_kind if _offloads_ckpt(job, knobs, i)
                     else "activation", scope="iteration", layer=i)
            b.tensor(f"gb{i}.{g}", layer.params * db, "grad", scope="iteration", layer=i)
            if n > 1:
                b.tensor(f"gs{i}.{g}", s * gbp, "grad", scope="iteration", layer=i)
            if onv:
                b.tensor(f"gst{i}.r{r}", s * pp["grad32"], "buffer", scope="iteration", layer=i)
            for ph in "fb":
                b.tensor(f"pg{ph}{i}.{g}", layer.params * db, "param16", scope="iteration", layer=i)
                if n > 1:
                    b.tensor(f"ps{ph}{i}.{g}", s * db, "param16", scope="iteration", layer=i)
                if pnv:
                    b.tensor(f"pin{ph}{i}.r{r}", s * db, "buffer", scope="iteration", layer=i)
        for k, grp in enumerate(groups):
            q = sum(layers[i].params for i in grp) / n
            if onv:
                b.tensor(f"osb{k}.r{r}", q * (pp["param32"] + pp["optim"] + pp["grad32"]), "buffer",
                         scope="step")
            if pnv:
                b.tensor(f"pst{k}.r{r}", q * db, "buffer", scope="step")

    K = len(groups)
    last_opt = [f"ow{K - 1}.r{r}" if onv else f"pw{K - 1}.r{r}" if pnv else f"adam{K - 1}.r{r}"
                for r in range(n)]
    segs: list[tuple[str, int, bool]] = []
    if accum > 1:
        segs.append(("micro-steps", accum - 1, False))
    segs.append(("last-micro-step", 1, True))
    for name, rep, boundary in segs:
        b.segment(name, rep)
        if boundary:
            sfx = ".last"
            prev: Callable[[str], str | None] = (lambda x: x) if accum > 1 else (lambda x: None)
        else:
            sfx = ""
            prev = lambda x: f"{x}@1"  # noqa: E731
        _emit_microstep(b, job, knobs, n, sfx, prev, boundary, last_opt)

    b.segment("optimizer", 1)
    _emit_optimizer(b, job, knobs, n, groups)

    nv = nvme_bytes_per_step(job, knobs, accum)
    notes = [f"ZeRO-Infinity: ZeRO-3 over {n} rank(s), {accum} micro-step(s) per step; parameters on "
             f"{knobs.param_device}, optimizer states on {knobs.optimizer_device}; prefetch NVMe "
             f"{knobs.nvme_prefetch} / CPU {knobs.cpu_prefetch} / gather {knobs.gather_prefetch} uses ahead; "
             f"{K} optimizer sub-group(s)"]
    if nv["read"] or nv["write"]:
        notes.append(f"NVMe per step: read {nv['read'] / 1e9:.1f} GB, write {nv['write'] / 1e9:.1f} GB")
    if unified(job):
        notes.append("unified memory: GPU and CPU share one pool, so CPU placements free nothing; only NVMe "
                     "is a real extra tier, and CPU<->GPU copies still cost DRAM bandwidth")
    pinned_window = _param_pinned_window(job, knobs, n)
    if pnv and pinned_window > DS_PARAM_BUFFERS * DS_PARAM_BUFFER_SIZE:
        notes.append(f"the NVMe prefetch window ({pinned_window:.3g} elements per rank) exceeds DeepSpeed's "
                     f"default offload_param pool ({DS_PARAM_BUFFERS} x {DS_PARAM_BUFFER_SIZE:.0e}); raise "
                     f"buffer_count or lower nvme_prefetch")
    info = {"dp": n, "accumulation": accum, "sub_groups": [len(grp) for grp in groups],
            "sub_group_params_per_rank": [sum(layers[i].params for i in grp) / n for grp in groups],
            "bytes_per_param": {k: {"bytes": v, "home": homes[k]} for k, v in pp.items() if v > 0},
            "model_state_bytes": model_state_bytes(job, knobs), "nvme_bytes_per_step": nv,
            "min_need_bytes_by_pool": need, "param_pinned_window_elements_per_rank": pinned_window}
    return b.build(steps=2, notes=notes, info=info)


def _param_pinned_window(job: Job, knobs: Knobs, n: int) -> float:
    """Elements per rank staged in pinned CPU memory at once on the NVMe path (an upper estimate)."""
    if knobs.param_device != "nvme":
        return 0.0
    depth = max(knobs.nvme_prefetch - min(knobs.cpu_prefetch, knobs.nvme_prefetch), 0) + 1
    return depth * max(layer.params for layer in job.trace.layers) / n


def _emit_microstep(b: PlanBuilder, job: Job, knobs: Knobs, n: int, sfx: str,
                    prev: Callable[[str], str | None], boundary: bool, last_opt: list[str]) -> None:
    """One micro-step (forward, backward, gradient offload) for all ranks in the current segment.

    ``prev(task_id)`` names a task of the previous micro-step (None when there is none in this step);
    ``boundary``: the accumulation boundary (fp32 gradients go to NVMe with optimizer_device=nvme).
    """
    layers = job.trace.layers
    L = len(layers)
    db = dtype_bytes(job)
    gbp = knobs.grad_bytes_per_param
    pnv = knobs.param_device == "nvme"
    onv = knobs.optimizer_device == "nvme"
    gpus = [f"gpu{r}" for r in range(n)]
    uses = [(i, "f") for i in range(L)] + [(i, "b") for i in reversed(range(L))]
    U = len(uses)

    def start_id(u: int) -> str:
        i, ph = uses[u]
        return f"fwd{i}" if ph == "f" else f"rc{i}" if layers[i].recompute_flops > 0 else f"bwd{i}"

    def end_id(u: int) -> str:
        i, ph = uses[u]
        return f"fwd{i}" if ph == "f" else f"bwd{i}"

    def ended(u: int, g: str) -> list[str]:
        """The end of use u on GPU g (u < 0: a use of the previous micro-step)."""
        if u >= 0:
            return [f"{end_id(u)}{sfx}.{g}"]
        ref = prev(f"{end_id(max(u + U, 0))}.{g}")  # ids of the previous micro-step carry no suffix
        return [ref] if ref else []

    first_fetch = True
    for u, (i, ph) in enumerate(uses):
        layer = layers[i]
        s = layer.params / n
        has_params = layer.params > 0
        # -- fetch: NVMe -> pinned CPU -> GPU slice -> all-gather ------------------------------------
        if has_params:
            opt_dep = [f"{last_opt[r]}^1" for r in range(n)] if first_fetch else []
            if pnv:  # every rank reads its slice at once: one flow of n slices over the shared drives
                nr_deps = [d for g in gpus for d in ended(u - knobs.nvme_prefetch - 1, g)] + opt_dep
                b.task(f"nr{ph}{i}{sfx}", "copy", "cpu.pread", nr_deps, src="nvme", dst="cpu", bytes=n * s * db,
                       allocs=[(f"pin{ph}{i}.r{r}", "cpu") for r in range(n)],
                       reads=[(f"param16.r{r}", "nvme") for r in range(n)],
                       tags={"layer": i, "phase": Phase.PARAM_SWAP_IN, "use": "fwd" if ph == "f" else "bwd"})
            for r, g in enumerate(gpus):
                up_deps = ended(u - knobs.cpu_prefetch - 1, g) + ([f"nr{ph}{i}{sfx}"] if pnv else opt_dep[r:r + 1])
                b.task(f"up{ph}{i}{sfx}.{g}", "copy", f"{g}.h2d", up_deps, src="cpu", dst=g, bytes=s * db,
                       allocs=[(f"ps{ph}{i}.{g}" if n > 1 else f"pg{ph}{i}.{g}", g)],
                       frees=[(f"pin{ph}{i}.r{r}", "cpu")] if pnv else [],
                       reads=[] if pnv else [(f"param16.r{r}", "cpu")],
                       tags={"layer": i, "phase": Phase.PARAM_UPLOAD, "use": "fwd" if ph == "f" else "bwd", "rank": r})
            first_fetch = False
            if n > 1:
                ag_deps = [f"up{ph}{i}{sfx}.{g}" for g in gpus]
                for g in gpus:
                    ag_deps += ended(u - knobs.gather_prefetch - 1, g)
                b.task(f"ag{ph}{i}{sfx}", "collective", "dp.param", ag_deps, coll="all_gather",
                       bytes=layer.params * db, ranks=tuple(gpus),
                       allocs=[(f"pg{ph}{i}.{g}", g) for g in gpus], frees=[(f"ps{ph}{i}.{g}", g) for g in gpus],
                       tags={"layer": i, "phase": Phase.PARAM_GATHER, "use": "fwd" if ph == "f" else "bwd"})
        if ph == "b" and _offloads_ckpt(job, knobs, i):
            for g in gpus:
                b.task(f"cki{i}{sfx}.{g}", "copy", f"{g}.h2d",
                       [f"cko{i}{sfx}.{g}"] + ended(u - knobs.cpu_prefetch - 1, g), tensor=f"act{i}.{g}",
                       src="cpu", dst=g, alloc_dst=True, free_src=True,
                       tags={"layer": i, "phase": Phase.ACTIVATION_RELOAD})

        # -- compute -------------------------------------------------------------------------------------
        for r, g in enumerate(gpus):
            ready = ([f"ag{ph}{i}{sfx}"] if n > 1 else [f"up{ph}{i}{sfx}.{g}"]) if has_params else []
            if ph == "f":
                b.task(f"fwd{i}{sfx}.{g}", "compute", f"{g}.compute", ready, flops=layer.fwd_flops,
                       hbm_bytes=layer.fwd_hbm_bytes, allocs=[(f"act{i}.{g}", g)],
                       frees=[(f"pg{ph}{i}.{g}", g)] if has_params else [],
                       tags={"layer": i, "phase": Phase.FWD, "rank": r})
                if _offloads_ckpt(job, knobs, i):
                    b.task(f"cko{i}{sfx}.{g}", "copy", f"{g}.d2h", [f"fwd{i}{sfx}.{g}"], tensor=f"act{i}.{g}",
                           src=g, dst="cpu", alloc_dst=True, free_src=True,
                           tags={"layer": i, "phase": Phase.ACTIVATION_OFFLOAD, "rank": r})
                continue
            deps = ready + ([f"cki{i}{sfx}.{g}"] if _offloads_ckpt(job, knobs, i) else [])
            if layer.recompute_flops > 0:
                b.task(f"rc{i}{sfx}.{g}", "compute", f"{g}.compute", deps, flops=layer.recompute_flops,
                       hbm_bytes=layer.fwd_hbm_bytes, tags={"layer": i, "phase": Phase.RECOMPUTE, "rank": r})
                deps = []
            b.task(f"bwd{i}{sfx}.{g}", "compute", f"{g}.compute", deps, flops=layer.bwd_flops,
                   hbm_bytes=layer.bwd_hbm_bytes, allocs=[(f"gb{i}.{g}", g)],
                   frees=[(f"act{i}.{g}", g)] + ([(f"pg{ph}{i}.{g}", g)] if has_params else []),
                   tags={"layer": i, "phase": Phase.BWD, "rank": r})
        # -- gradients: reduce-scatter, slice to the CPU accumulation buffer (and NVMe at the boundary) --
        if ph == "f":
            continue
        if not has_params:
            for r, g in enumerate(gpus):
                b.task(f"gfree{i}{sfx}.{g}", "free", f"{g}.compute", [], frees=[(f"gb{i}.{g}", g)],
                       tags={"layer": i, "phase": Phase.GRAD_RELEASE, "rank": r})
            continue
        if n > 1:
            b.task(f"rs{i}{sfx}", "collective", "dp.grad", [f"bwd{i}{sfx}.{g}" for g in gpus],
                   coll="reduce_scatter", bytes=layer.params * db, ranks=tuple(gpus),
                   allocs=[(f"gs{i}.{g}", g) for g in gpus], frees=[(f"gb{i}.{g}", g) for g in gpus],
                   tags={"layer": i, "phase": Phase.GRAD_REDUCE})
        for r, g in enumerate(gpus):
            b.task(f"gd{i}{sfx}.{g}", "copy", f"{g}.d2h", [f"rs{i}{sfx}" if n > 1 else f"bwd{i}{sfx}.{g}"],
                   src=g, dst="cpu", bytes=s * gbp, frees=[(f"gs{i}.{g}" if n > 1 else f"gb{i}.{g}", g)],
                   reads=[(f"grad.r{r}", "cpu")], tags={"layer": i, "phase": Phase.GRAD_OFFLOAD, "rank": r})
        if boundary and onv:  # all ranks' fp32 gradient slices of layer i: one flow to the drives
            b.task(f"gw{i}{sfx}", "copy", "cpu.gwrite", [f"gd{i}{sfx}.{g}" for g in gpus], src="cpu", dst="nvme",
                   bytes=n * s * per_param_bytes(job, knobs)["grad32"],
                   allocs=[(f"gst{i}.r{r}", "cpu") for r in range(n)],
                   frees=[(f"gst{i}.r{r}", "cpu") for r in range(n)],
                   tags={"layer": i, "phase": Phase.GRAD_SWAP_OUT})


def _emit_optimizer(b: PlanBuilder, job: Job, knobs: Knobs, n: int, groups: list[list[int]]) -> None:
    layers = job.trace.layers
    db = dtype_bytes(job)
    pp = per_param_bytes(job, knobs)
    pnv = knobs.param_device == "nvme"
    onv = knobs.optimizer_device == "nvme"
    gpus = [f"gpu{r}" for r in range(n)]
    last_layer = next(i for i in range(len(layers)) if layers[i].params > 0)  # the last gradient to arrive
    all_grads = [f"gd{last_layer}.last.{g}" for g in gpus]
    if onv:
        all_grads.append(f"gw{last_layer}.last")
    states = pp["param32"] + pp["optim"]
    for k, grp in enumerate(groups):
        q = sum(layers[i].params for i in grp) / n
        tags = {"sub_group": k, "layers": f"{grp[0]}-{grp[-1]}"}
        for r in range(n):
            adam_deps = all_grads if k == 0 else []
            if onv:
                if knobs.pipeline_io:
                    rd = ([f"adam{k - 2}.r{r}"] if k >= 2 else []) + ([f"ow{k - 3}.r{r}"] if k >= 3 else [])
                    adam_deps = adam_deps + ([f"ow{k - 2}.r{r}"] if k >= 2 else [])
                else:
                    rd = [f"ow{k - 1}.r{r}"] if k >= 1 else []
                b.task(f"or{k}.r{r}", "copy", f"cpu.oread{r}", (all_grads if k == 0 else []) + rd, src="nvme",
                       dst="cpu", bytes=q * (states + pp["grad32"]), allocs=[(f"osb{k}.r{r}", "cpu")],
                       reads=[(f"param32.r{r}", "nvme")] if pp["param32"] else [],
                       tags={**tags, "phase": Phase.OPTIMIZER_SWAP_IN, "rank": r})
                adam_deps = adam_deps + [f"or{k}.r{r}"]
            b.task(f"adam{k}.r{r}", "optimizer", f"cpu.adam{r}", adam_deps, params=q,
                   tags={**tags, "phase": Phase.OPTIMIZER, "rank": r})
            if pnv:
                b.task(f"pw{k}.r{r}", "copy", f"cpu.owrite{r}", [f"adam{k}.r{r}"], src="cpu", dst="nvme",
                       bytes=q * db, allocs=[(f"pst{k}.r{r}", "cpu")], frees=[(f"pst{k}.r{r}", "cpu")],
                       tags={**tags, "phase": Phase.PARAM_SWAP_OUT, "rank": r})
            if onv:
                b.task(f"ow{k}.r{r}", "copy", f"cpu.owrite{r}", [f"adam{k}.r{r}"], src="cpu", dst="nvme",
                       bytes=q * states, frees=[(f"osb{k}.r{r}", "cpu")],
                       tags={**tags, "phase": Phase.OPTIMIZER_SWAP_OUT, "rank": r})


POLICY = PolicyInfo(NAME, "ZeRO-3 with parameters and optimizer states offloaded to CPU or NVMe (ZeRO-Infinity)",
                    Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"param_device": ("cpu", "nvme"), "optimizer_device": ("cpu", "nvme"),
                                 "offload_checkpoints": (False, True)})
