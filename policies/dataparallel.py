"""Data- and tensor-parallel forward/backward emission shared by ``none`` and ``zero-offload``.

The machine's GPUs form ``tp``-wide tensor-parallel groups of neighbouring GPUs (Megatron-LM, Shoeybi et
al. 2019, arXiv 1909.08053), and GPUs at the same position of every group form a data-parallel group of
``dp = n_gpus / tp`` ranks. Per GPU and micro-step: the forward of every layer on a 1/tp slice of its
weights (saving its activations, or only its input under full checkpointing), then in reverse the
recomputation (when checkpointing) and the backward of every layer. With tp > 1 every block ends its
forward, its recomputation and its backward with the two all-reduces of Megatron's tensor parallelism
(of the ``s*b*h`` layer output, merged into one collective task), which the next layer waits for. Each
layer's gradients are reduced across the data-parallel group as soon as that layer's backward ends,
overlapping the next layer's backward (DeepSpeed ``overlap_comm``): an all-reduce for ZeRO 0/1, a
reduce-scatter for ZeRO 2/3 and ZeRO-Offload. ZeRO-3 all-gathers each layer's parameters before its
forward and again before its backward and frees them after use. Collectives are single tasks over the
ranks of their group on that group's communication stream; groups of one rank have none.

Activations with tensor parallelism (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, no sequence
parallelism): of the ``34 sbh`` a GPT block saves, ``10 sbh`` (layer norms, dropout masks, inputs of the
column-parallel GEMMs) stay replicated and ``24 sbh`` are split; we apply that 10/34 : 24/34 ratio to
whatever the workload trace saves per block. Full checkpointing keeps only the (replicated) layer input.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Job
from policies.builder import PlanBuilder
from simulator.phase import Phase

REPLICATED_ACT_FRACTION = 10 / 34  # Korthikanti Table 2: 10sbh of 34sbh are not split by TP
TP_ALLREDUCES = {"block": 2, "embedding": 1, "head": 0}  # Megatron: attention + MLP per block
TP_PHASE = {"f": Phase.TP_FWD, "r": Phase.TP_RECOMPUTE, "b": Phase.TP_BWD}


@dataclass(frozen=True)
class Grads:
    """How a layer's gradients leave the backward."""

    reduce: str          # "all_reduce" | "reduce_scatter"
    bucket: bool         # gradients land in a transient per-layer bucket (else in a persistent buffer)
    offload: bool        # the rank's partition is copied to the CPU (ZeRO-Offload)
    offload_bytes_per_param: float = 2.0


@dataclass(frozen=True)
class Layout:
    """n GPUs as dp data-parallel groups x tp tensor-parallel groups."""

    n: int
    tp: int

    @property
    def dp(self) -> int:
        return self.n // self.tp

    def gpus(self) -> list[str]:
        return [gpu(r) for r in range(self.n)]

    def tp_group(self, k: int) -> list[str]:
        return [gpu(k * self.tp + j) for j in range(self.tp)]

    def dp_group(self, j: int) -> list[str]:
        return [gpu(k * self.tp + j) for k in range(self.dp)]

    def tp_index(self, r: int) -> tuple[int, int]:
        """(tensor-parallel group k, position j) of GPU r."""
        return r // self.tp, r % self.tp


def dtype_bytes(job: Job) -> int:
    return {"bf16": 2, "fp16": 2, "fp32": 4}[job.config.precision]


def gpu(r: int) -> str:
    return f"gpu{r}"


def check_tp(job: Job, tp: int, policy: str) -> None:
    from policies.base import KnobError

    n = job.n_gpus
    if tp < 1 or n % tp:
        raise KnobError(f"{policy}: knob 'tp' must divide the GPU count {n}, got {tp}")
    m = job.model
    if m.n_heads % tp or m.n_kv_heads % tp and tp % m.n_kv_heads:
        raise KnobError(f"{policy}: knob 'tp' = {tp} does not divide the model's {m.n_heads} attention heads")


def declare_streams(b: PlanBuilder, lay: Layout, *, cpu_adam: bool) -> None:
    for r in range(lay.n):
        b.stream(f"{gpu(r)}.compute", gpu(r), "compute")
        b.stream(f"{gpu(r)}.h2d", gpu(r), "h2d")
        b.stream(f"{gpu(r)}.d2h", gpu(r), "d2h")
        if cpu_adam:
            b.stream(f"cpu.adam{r}", "cpu", "optim")
    if lay.dp > 1:
        for j in range(lay.tp):
            b.stream(f"dp{j}.grad", lay.dp_group(j)[0], "comm")
            b.stream(f"dp{j}.param", lay.dp_group(j)[0], "comm")
    if lay.tp > 1:
        for k in range(lay.dp):
            b.stream(f"tp{k}", lay.tp_group(k)[0], "comm")


def workspace(b: PlanBuilder, job: Job, lay: Layout) -> None:
    """A persistent per-GPU buffer sized to the largest transient working set of any layer (split by TP).

    A caching allocator keeps such a block once it has served the largest layer, so it is modelled as
    resident for the whole run rather than allocated and freed per kernel.
    """
    ws = max(layer.peak_transient_bytes for layer in job.trace.layers) / lay.tp
    for r in range(lay.n):
        b.tensor(f"ws.{gpu(r)}", ws, "buffer", home=gpu(r), persistent=True)


def saved_activation_bytes(job: Job, layer_bytes: float, kind: str, tp: int) -> float:
    if tp == 1 or kind != "block" or job.config.checkpointing == "full":
        return layer_bytes
    return layer_bytes * (REPLICATED_ACT_FRACTION + (1 - REPLICATED_ACT_FRACTION) / tp)


OFFLOAD_BUCKETS = 2  # gradient buckets in flight to the CPU per GPU (DeepSpeed's double-buffered ipg bucket)


def emit_microstep(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, *, gather_params: bool,
                   param_ready: dict[int, list[str]]) -> None:
    """Tasks of one micro-step for all GPUs, in the current segment (which the caller declared).

    ``param_ready[i]`` are the dependencies that make layer i's parameters usable (e.g. the previous
    step's all-gather or upload); with ``gather_params`` (ZeRO-3) layer i is all-gathered in each
    data-parallel group into a transient full copy before its forward and before its backward.
    """
    layers = job.trace.layers
    db = dtype_bytes(job)
    t = lay.tp
    L = len(layers)
    if gather_params and lay.dp == 1:
        raise ValueError("gathering parameters needs more than one data-parallel rank")
    for r in range(lay.n):
        for i, layer in enumerate(layers):
            b.tensor(f"act{i}.{gpu(r)}", saved_activation_bytes(job, layer.activation_bytes, layer.kind, t),
                     "activation", scope="iteration", layer=i)
            if grads.bucket:
                b.tensor(f"gb{i}.{gpu(r)}", layer.params / t * db, "grad", scope="iteration", layer=i)
            if gather_params:
                b.tensor(f"pg{i}.{gpu(r)}", layer.params / t * db, "param16", scope="iteration", layer=i)

    def gather(i: int, phase: str, deps_of: dict[int, list[str]]) -> dict[int, str]:
        out = {}
        for j in range(t):
            grp = lay.dp_group(j)
            out[j] = b.task(f"ag{phase}{i}.d{j}", "collective", f"dp{j}.param", deps_of.get(j, []),
                            coll="all_gather", bytes=layers[i].params / t * db, ranks=tuple(grp),
                            allocs=[(f"pg{i}.{g}", g) for g in grp],
                            tags={"layer": i, "phase": Phase.PARAM_GATHER, "use": "fwd" if phase == "f" else "bwd"})
        return out

    def tp_sync(i: int, phase: str, prefix: str) -> dict[int, str]:
        """Tensor-parallel all-reduces closing layer i's ``phase`` in every TP group: group -> task."""
        n_ar = TP_ALLREDUCES[layers[i].kind]
        if t == 1 or n_ar == 0:
            return {}
        out = {}
        for k in range(lay.dp):
            grp = lay.tp_group(k)
            out[k] = b.task(f"tp{phase}{i}.k{k}", "collective", f"tp{k}", [f"{prefix}{i}.{g}" for g in grp],
                            coll="all_reduce", bytes=n_ar * layers[i].output_bytes, ranks=tuple(grp),
                            tags={"layer": i, "phase": TP_PHASE[phase]})
        return out

    # forward
    prev_sync: dict[int, str] = {}
    for i, layer in enumerate(layers):
        # prefetch one layer ahead: layer i is gathered while layer i-1 computes, not earlier, so at most
        # two gathered layers are live (DeepSpeed's prefetch; without the bound every gather runs ahead)
        pre = gather(i, "f", {j: list(param_ready.get(i, [])) + ([f"fwd{i - 2}.{g}" for g in lay.dp_group(j)]
                                                                  if i >= 2 else []) for j in range(t)}) \
            if gather_params else {}
        for r, g in enumerate(lay.gpus()):
            k, j = lay.tp_index(r)
            deps = ([pre[j]] if pre else list(param_ready.get(i, []))) + ([prev_sync[k]] if k in prev_sync else [])
            b.task(f"fwd{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.fwd_flops / t,
                   hbm_bytes=layer.fwd_hbm_bytes / t, allocs=[(f"act{i}.{g}", g)],
                   frees=[(f"pg{i}.{g}", g)] if gather_params else [],
                   tags={"layer": i, "phase": Phase.FWD, "rank": r})
        prev_sync = tp_sync(i, "f", "fwd")
    # backward, last layer first
    for i in reversed(range(L)):
        layer = layers[i]
        after = f"fwd{L - 1}" if i >= L - 2 else f"bwd{i + 2}"  # backward prefetch: also one layer ahead
        pre = gather(i, "b", {j: [f"{after}.{g}" for g in lay.dp_group(j)] for j in range(t)}) \
            if gather_params else {}
        rc_sync: dict[int, str] = {}
        if layer.recompute_flops > 0:
            for r, g in enumerate(lay.gpus()):
                k, j = lay.tp_index(r)
                deps = ([pre[j]] if pre else []) + ([prev_sync[k]] if k in prev_sync else [])
                b.task(f"rc{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.recompute_flops / t,
                       hbm_bytes=layer.fwd_hbm_bytes / t, tags={"layer": i, "phase": Phase.RECOMPUTE, "rank": r})
            rc_sync = tp_sync(i, "r", "rc")
        for r, g in enumerate(lay.gpus()):
            k, j = lay.tp_index(r)
            deps = [] if layer.recompute_flops > 0 else ([pre[j]] if pre else [])
            deps += [s[k] for s in (rc_sync, prev_sync) if k in s][:1]
            if grads.offload:
                # double-buffered offload (DeepSpeed overlap_comm): a layer's gradients are not produced
                # before the copy of the bucket two layers back (in backward order, across micro-steps) has
                # drained, so a slow link stalls the backward instead of piling gradients up on the GPU
                back = i + OFFLOAD_BUCKETS
                deps.append(f"d2h{back}.{g}" if back < L else f"d2h{back - L}.{g}@1")
            b.task(f"bwd{i}.{g}", "compute", f"{g}.compute", deps, flops=layer.bwd_flops / t,
                   hbm_bytes=layer.bwd_hbm_bytes / t, allocs=[(f"gb{i}.{g}", g)] if grads.bucket else [],
                   frees=[(f"act{i}.{g}", g)] + ([(f"pg{i}.{g}", g)] if gather_params else []),
                   tags={"layer": i, "phase": Phase.BWD, "rank": r})
        prev_sync = tp_sync(i, "b", "bwd")
        emit_grad_reduce(b, job, lay, grads, i)


def emit_grad_reduce(b: PlanBuilder, job: Job, lay: Layout, grads: Grads, i: int) -> None:
    """Reduce layer i's gradients across each data-parallel group, then (ZeRO-Offload) copy them down."""
    layer = job.trace.layers[i]
    t = lay.tp
    for j in range(t):
        grp = lay.dp_group(j)
        red = None
        if lay.dp > 1:
            red = b.task(f"red{i}.d{j}", "collective", f"dp{j}.grad", [f"bwd{i}.{g}" for g in grp],
                         coll=grads.reduce, bytes=layer.params / t * dtype_bytes(job), ranks=tuple(grp),
                         frees=[(f"gb{i}.{g}", g) for g in grp] if grads.bucket and not grads.offload else [],
                         tags={"layer": i, "phase": Phase.GRAD_REDUCE})
        for g in grp:
            r = int(g[3:])
            if grads.offload:
                b.task(f"d2h{i}.{g}", "copy", f"{g}.d2h", [red or f"bwd{i}.{g}"], src=g, dst="cpu",
                       bytes=layer.params / lay.n * grads.offload_bytes_per_param, frees=[(f"gb{i}.{g}", g)],
                       tags={"layer": i, "phase": Phase.GRAD_OFFLOAD, "rank": r})
            elif grads.bucket and red is None:
                b.task(f"acc{i}.{g}", "free", f"{g}.compute", [], frees=[(f"gb{i}.{g}", g)],
                       tags={"layer": i, "phase": Phase.GRAD_ACCUMULATE, "rank": r})
