"""Which rank runs what: a multi-GPU plan seen from one of its ranks.

Rank ``K`` is the plan's ``K``-th GPU (``plan_gpus`` order: gpu0, gpu1, ...). It runs:

- every stream on its GPU (``gpuK.compute``, ``gpuK.h2d``, ...);
- every host stream (``cpu`` / ``nvme``) whose tasks all carry the tag ``rank: K`` (``cpu.adamK``: that rank's
  share of the host's optimizer work, run by that rank's process as DeepSpeed's per-rank CPU Adam is);
- every *shared* stream, one whose tasks are all collectives over several GPUs (``dp0.grad``,
  ``dp.param``): each rank of a collective runs its own copy of the task, in the stream's order, and that
  copy is its side of the real ``torch.distributed`` call. Each shared stream gets its own process group,
  so collectives issued concurrently from two streams can never pair up wrongly across ranks.

A tensor-parallel group's stream (``tp{k}``: every all-reduce of its layers' forward, recomputation and backward,
in Megatron's order: ``policies.kit.tp_steps``) is such a shared stream (``replay.tensor_parallel``).

A copy from one GPU to another (a pipeline stage's activations or input gradients) is run by both ends:
a real ``send`` on the sender, a real ``recv`` on the receiver, each in its stream's order.

A dependency on a task another rank runs is a real wait: the other rank publishes the task's end in the
rendezvous store (``replay.dist_comm``). A collective does not wait so: the collective call itself is the
rendezvous of its ranks (a rank enters it when its own dependencies are done, and leaves it when every
rank has entered).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from replay.errors import ReplayError
from replay.model import Dims
from replay.tensor_parallel import check_dims
from simulator.phase import Phase
from simulator.plan import Plan, TaskSpec


def plan_gpus(plan: Plan) -> list[str]:
    """Every GPU location a plan touches, in index order (rank K is the K-th)."""
    locs: set[str] = {s.device for s in plan.streams} | {t.home for t in plan.tensors if t.home}
    for seg in plan.segments:
        for t in seg.tasks:
            locs |= {p.loc for p in (*t.allocs, *t.frees, *t.reads)} | set(t.ranks)
            locs |= {x for x in (t.src, t.dst) if x}
    return sorted((x for x in locs if x.startswith("gpu")), key=lambda g: int(g[3:]) if g[3:].isdigit() else 0)


def _is_shared(tasks: list[TaskSpec]) -> bool:
    return bool(tasks) and all(t.op == "collective" and len(t.ranks) > 1 for t in tasks)


def is_p2p(t: TaskSpec) -> bool:
    """A copy from one GPU to another (a pipeline send): its sender and its receiver both run it."""
    return t.op == "copy" and bool(t.src) and bool(t.dst) and t.src != t.dst \
        and str(t.src).startswith("gpu") and str(t.dst).startswith("gpu")


def task_ranks(t: TaskSpec, owners: dict[str, frozenset[int]], index: dict[str, int]) -> frozenset[int]:
    """The ranks that run a task: a collective's ranks, a GPU-to-GPU copy's two ends, else its stream's."""
    if t.op == "collective" and len(t.ranks) > 1:
        return frozenset(index[r] for r in t.ranks)
    if is_p2p(t):
        return frozenset((index[str(t.src)], index[str(t.dst)]))
    return owners[t.stream]


def _host_neighbours(plan: Plan, by_stream: dict[str, list[TaskSpec]]) -> dict[str, set[str]]:
    """For each host stream (not on a GPU), the GPUs its tasks work with: the GPUs its copies move from or to,
    and the GPUs of the streams of its tasks' dependencies and dependants (collectives and GPU-to-GPU sends,
    which several ranks run, left out). A stream that works with one GPU only is that GPU's rank's, whatever
    its ``rank`` tags say (tinypipe tags a stage's host Adam with its data-parallel rank within the stage)."""
    device = {s.id: s.device for s in plan.streams}
    stream_of = {t.id: t.stream for ts in by_stream.values() for t in ts
                 if not (t.op == "collective" and len(t.ranks) > 1) and not is_p2p(t)}
    host = {sid for sid, dev in device.items() if not dev.startswith("gpu")}
    near: dict[str, set[str]] = defaultdict(set)

    def gpu_of(tid: str) -> str | None:
        dev = device.get(stream_of.get(tid, ""), "")
        return dev if dev.startswith("gpu") else None

    for sid, ts in by_stream.items():
        for t in ts:
            if t.id not in stream_of:
                continue
            for d in t.deps:
                g = gpu_of(d.id)
                if sid in host and g is not None:
                    near[sid].add(g)
                other = stream_of.get(d.id)
                if other in host and gpu_of(t.id) is not None:
                    near[other].add(str(gpu_of(t.id)))
            if sid in host:
                near[sid] |= {str(x) for x in (t.src, t.dst) if x and str(x).startswith("gpu")}
    return near


def stream_owners(plan: Plan) -> dict[str, frozenset[int]]:
    """The ranks that run each stream (one rank, or every rank of a shared collective stream)."""
    gpus = plan_gpus(plan)
    index = {g: i for i, g in enumerate(gpus)}
    by_stream: dict[str, list[TaskSpec]] = defaultdict(list)
    for seg in plan.segments:
        for t in seg.tasks:
            by_stream[t.stream].append(t)
    owners: dict[str, frozenset[int]] = {}
    neighbours = _host_neighbours(plan, by_stream)
    for s in plan.streams:
        ts = by_stream.get(s.id, [])
        if _is_shared(ts):
            owners[s.id] = frozenset(index[r] for t in ts for r in t.ranks)
        elif s.device in index:
            owners[s.id] = frozenset((index[s.device],))
        elif len(gpus) == 1:
            owners[s.id] = frozenset((0,))
        elif not ts:
            owners[s.id] = frozenset()
        elif len(near := neighbours.get(s.id, set())) == 1:  # a host stream serving one GPU's work only
            owners[s.id] = frozenset((index[next(iter(near))],))
        else:
            tagged = {t.tags.get("rank") for t in ts}
            rank = next(iter(tagged)) if len(tagged) == 1 else None
            if tagged == {None}:
                raise ReplayError(f"stream {s.id!r} on {s.device!r} serves every rank at once (e.g. task "
                                  f"{ts[0].id!r}: one {ts[0].op} for all ranks' shares, no 'rank' tag); replay runs "
                                  "each rank's host work in that rank's process, so it needs a plan with per-rank "
                                  "host tasks (each host stream one rank's, as zero-infinity's), or one GPU")
            if not isinstance(rank, int) or not 0 <= rank < len(gpus):
                raise ReplayError(f"stream {s.id!r} on {s.device!r}: its tasks carry no single 'rank' tag "
                                  f"(found {sorted(map(str, tagged))}); replay cannot tell which rank runs it")
            owners[s.id] = frozenset((rank,))
    for ts in by_stream.values():
        for t in ts:
            if t.op == "collective" and len(t.ranks) > 1:
                missing = [r for r in t.ranks if index[r] not in owners[t.stream]]
                if missing:
                    raise ReplayError(f"task {t.id!r}: a collective over {', '.join(t.ranks)} on stream "
                                      f"{t.stream!r}, which {missing[0]} does not run; put collectives on a "
                                      "stream of their own")
    return owners


@dataclass(frozen=True)
class RankView:
    """What one rank of a plan runs: its GPU and its streams; ``world`` ranks in all."""

    rank: int
    world: int
    gpu: str
    gpus: tuple[str, ...]
    streams: frozenset[str]
    tasks: frozenset[str]  # the ids of the tasks this rank runs

    def runs(self, t: TaskSpec) -> bool:
        return t.id in self.tasks


REPLAYED_COLLECTIVES = (Phase.GRAD_REDUCE, Phase.PARAM_GATHER, Phase.PARAM_UPLOAD, Phase.TP_FWD, Phase.TP_RECOMPUTE,
                        Phase.TP_BWD, Phase.TIED_GRAD_SYNC)
TP_COLLECTIVES = (Phase.TP_FWD, Phase.TP_RECOMPUTE, Phase.TP_BWD)
REPLAYED_SENDS = (Phase.SEND_ACT, Phase.SEND_GRAD)


def check_multi_rank(plan: Plan) -> None:
    """Refuse, before any process starts, what a multi-rank replay does not run: collectives of other
    phases, other GPU-to-GPU copies, a tied head on another stage than its embedding without the plan's
    sum of the two gradient copies on their GPUs."""
    tied_sums: list[TaskSpec] = []
    for seg in plan.segments:
        for t in seg.tasks:
            phase = t.tags.get("phase")
            if phase == Phase.TIED_GRAD_SYNC:
                tied_sums.append(t)
            if t.op == "collective" and len(t.ranks) > 1 and phase not in REPLAYED_COLLECTIVES:
                raise ReplayError(f"task {t.id!r}: {phase} collectives are not replayed (gradient reductions, "
                                  "parameter gathers and uploads' all-gathers, tensor-parallel all-reduces, "
                                  "tied-gradient sums and pipeline sends are)")
            if is_p2p(t) and phase not in REPLAYED_SENDS:
                raise ReplayError(f"task {t.id!r}: a GPU-to-GPU copy in phase {phase!r} is not replayed "
                                  "(pipeline activations and gradients are)")
    tp = {len(t.ranks) for seg in plan.segments for t in seg.tasks if t.tags.get("phase") in TP_COLLECTIVES}
    for n in sorted(tp):
        check_dims(Dims.from_model(plan.workload.model), n)
    if plan.workload.model.tied_embeddings:
        computes: dict[int, set[str]] = defaultdict(set)
        devices = {s.id: s.device for s in plan.streams}
        for seg in plan.segments:
            for t in seg.tasks:
                if t.op == "compute" and isinstance(t.tags.get("layer"), int):
                    computes[t.tags["layer"]].add(devices[t.stream])
        head = plan.workload.model.n_layers + 1
        if computes.get(head, set()) - computes.get(0, set()):
            on_host = [t for t in tied_sums if t.op != "collective"]
            if on_host:
                raise ReplayError(f"task {on_host[0].id!r}: the tied table's two gradient copies are summed on the "
                                  "host (a stage swaps), but each copy lives in its own rank's process; replay a "
                                  "plan whose stages keep their gradients on the GPU, or an untied model")
            if not tied_sums:
                raise ReplayError("the tied head runs on another pipeline stage than the embedding whose matrix it "
                                  "shares, and the plan never sums the two copies' gradients (a tied-grad-sync "
                                  "task); replay a model without tied embeddings, or one stage")


def rank_view(plan: Plan, rank: int) -> RankView:
    gpus = plan_gpus(plan)
    if not gpus:
        raise ReplayError("plan computes on no GPU; nothing to replay")
    if len(gpus) > 1:
        check_multi_rank(plan)
    if not 0 <= rank < len(gpus):
        raise ReplayError(f"rank {rank} is not a rank of this plan (0..{len(gpus) - 1})")
    owners = stream_owners(plan)
    index = {g: i for i, g in enumerate(gpus)}
    tasks = frozenset(t.id for seg in plan.segments for t in seg.tasks if rank in task_ranks(t, owners, index))
    streams = frozenset(t.stream for seg in plan.segments for t in seg.tasks if t.id in tasks)
    return RankView(rank, len(gpus), gpus[rank], tuple(gpus), streams, tasks)


def shared_groups(plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
    """Every stream whose tasks several ranks run (collectives, GPU-to-GPU sends) with those ranks, in plan
    order: the process groups each rank creates (every rank creates every group, in this same order, as
    ``torch.distributed.new_group`` requires), one per stream so two streams' calls never pair up wrongly."""
    gpus = plan_gpus(plan)
    owners = stream_owners(plan)
    index = {g: i for i, g in enumerate(gpus)}
    ranks: dict[str, set[int]] = defaultdict(set)
    for seg in plan.segments:
        for t in seg.tasks:
            ranks[t.stream] |= task_ranks(t, owners, index)
    return [(s.id, tuple(sorted(ranks[s.id]))) for s in plan.streams if len(ranks[s.id]) > 1]
