"""Which rank runs what: a multi-GPU plan seen from one of its ranks.

Rank ``K`` is the plan's ``K``-th GPU (``plan_gpus`` order: gpu0, gpu1, ...). It runs:

- every stream on its GPU (``gpuK.compute``, ``gpuK.h2d``, ...);
- every host stream (``cpu`` / ``nvme``) whose tasks all carry the tag ``rank: K`` (``cpu.adamK``: that rank's
  share of the host's optimizer work, run by that rank's process as DeepSpeed's per-rank CPU Adam is);
- every *shared* stream, one whose tasks are all collectives over several GPUs (``dp0.grad``,
  ``dp.param``): each rank of a collective runs its own copy of the task, in the stream's order, and that
  copy is its side of the real ``torch.distributed`` call. Each shared stream gets its own process group,
  so collectives issued concurrently from two streams can never pair up wrongly across ranks.

A dependency on a task another rank runs is a real wait: the other rank publishes the task's end in the
rendezvous store (``replay.dist_comm``). A collective does not wait so: the collective call itself is the
rendezvous of its ranks (a rank enters it when its own dependencies are done, and leaves it when every
rank has entered).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from replay.errors import ReplayError
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


def stream_owners(plan: Plan) -> dict[str, frozenset[int]]:
    """The ranks that run each stream (one rank, or every rank of a shared collective stream)."""
    gpus = plan_gpus(plan)
    index = {g: i for i, g in enumerate(gpus)}
    by_stream: dict[str, list[TaskSpec]] = defaultdict(list)
    for seg in plan.segments:
        for t in seg.tasks:
            by_stream[t.stream].append(t)
    owners: dict[str, frozenset[int]] = {}
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
        else:
            tagged = {t.tags.get("rank") for t in ts}
            rank = next(iter(tagged)) if len(tagged) == 1 else None
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
    streams: frozenset[str]
    shared: tuple[str, ...]  # the shared collective streams this rank takes part in, in plan order

    def runs(self, stream: str) -> bool:
        return stream in self.streams


def rank_view(plan: Plan, rank: int) -> RankView:
    gpus = plan_gpus(plan)
    if not gpus:
        raise ReplayError("plan computes on no GPU; nothing to replay")
    if not 0 <= rank < len(gpus):
        raise ReplayError(f"rank {rank} is not a rank of this plan (0..{len(gpus) - 1})")
    owners = stream_owners(plan)
    mine = frozenset(s for s, o in owners.items() if rank in o)
    shared = tuple(s.id for s in plan.streams if len(owners[s.id]) > 1 and rank in owners[s.id])
    return RankView(rank, len(gpus), gpus[rank], mine, shared)


def shared_groups(plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
    """Every shared stream with its ranks, in plan order: the process groups each rank creates (every rank
    creates every group, in this same order, as ``torch.distributed.new_group`` requires)."""
    owners = stream_owners(plan)
    return [(s.id, tuple(sorted(owners[s.id]))) for s in plan.streams if len(owners[s.id]) > 1]
