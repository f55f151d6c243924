"""The symmetry of a rank template (``simulator.rank_template``), built without a task-by-task proof.

``simulator.symmetry`` proves that a full plan's ranks run the same tasks by pairing every rank's tasks with rank
0's, then works out what the quotient simulation needs: the shared resources' orbits and the load check, the pools
and how many ranks' allocations one of rank 0's stands for. A template holds only rank 0's tasks, so the pairing
is given (rank r's copy of a rank-0 name is its image, ``rank_template.image``) and only its structure is checked
here: every task is rank 0's (its streams on rank 0's GPUs or the host, no other GPU), every collective spans
rank 0's tensor-parallel or data-parallel group (all the ranks when tp is 1 or n; of pipeline replicas, the same
stages of every replica) or, tagged with rank 0, rank 0's own GPUs (a rank task, as the proof takes it), and its
copies in the other groups (the collective's orbit: ids by the same rule, ``group_copies``) stand beside it. The
resources, the load check and the pools are the proof's own (``symmetry._resources``, ``symmetry._pools``) on those
maps, so a machine whose GPUs do not play one role (an uneven switch, a pool shared unevenly) refuses the template
as it refuses the full plan.

Memory: a rank-0 tensor (one the rank's tasks place, or one named for rank 0: ``param32.r0``, resident from the
start) counts once per rank in a pool the ranks share (host DRAM, NVMe) and once in its GPU's pool, as in the
proof; a tensor named for no rank is one tensor of the whole machine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from costs import RouteResources
from hardware_models import Topology
from simulator.plan import Plan, TaskSpec
from simulator.rank_template import DP_TOKENS, TP_TOKENS, Images, RankTemplate, canonical, group_copies, names_a_rank
from simulator.symmetry import NotSymmetric, Symmetry, _pools, _rank_tag, _RankMaps, orbit_links, ring_memo, roles


def template_symmetry(plan: Plan, topo: Topology, route: Callable[[str, str], RouteResources],
                      capacity: Mapping[str, float], shared_host: bool) -> Symmetry:
    """The symmetry of ``plan`` (a rank template); NotSymmetric names what does not fit one."""
    tpl = plan.template
    if tpl is None:
        raise NotSymmetric("the plan is not a rank template")
    n, tp, w = tpl.ranks, tpl.tp, tpl.width
    gpus = [g for r in range(n) for g in tpl.gpus_of(r)]
    if not set(gpus) <= set(topo.gpu_locations()):
        raise NotSymmetric(f"a template of {n} ranks needs GPUs gpu0..gpu{n * w - 1}")
    groups = _groups(tpl)
    streams = plan.stream_map()
    base: list[list[TaskSpec]] = [[] for _ in plan.segments]
    globals_: list[TaskSpec] = []
    orbits: dict[str, list[Any]] = {}
    for si, seg in enumerate(plan.segments):
        for t in seg.tasks:
            if t.op != "collective" or _rank_tag(t) is not None:  # a rank-tagged collective is its rank's task
                base[si].append(t)
                continue
            kind = groups.get(tuple(sorted(t.ranks))) if w == 1 else _replicas_kind(t.ranks, tpl)
            if kind is None:
                raise NotSymmetric(f"collective {t.id!r} of a template spans neither rank 0's tensor-parallel nor "
                                   "its data-parallel group")
            globals_.append(t)
            orbits[t.id] = _orbit(t, tpl, kind)
    gpus0 = tpl.gpus_of(0)
    locs: set[str] = set()
    rank_streams: set[str] = set()
    touched: set[str] = set()
    for ts in base:
        for t in ts:
            rank_streams.add(t.stream)
            locs.add(streams[t.stream].device)
            locs.update(x for x in (t.src, t.dst) if x is not None)
            locs.update(t.ranks)  # (a rank's own collective: its GPUs)
            for ps in (t.allocs, t.frees, t.reads):
                for p in ps:
                    locs.add(p.loc)
                    touched.add(p.tensor.id)
            if t.tensor is not None:
                touched.add(t.tensor.id)
    tensors = plan.tensor_map()
    rank_tensors = frozenset(touched | {tid for tid in tensors
                                        if names_a_rank(tid) and canonical(tid, width=w) == tid})
    for tid in rank_tensors:
        home = tensors[tid].home if tid in tensors else None
        if home is not None:
            locs.add(home)
    others = sorted(loc for loc in locs if loc in set(gpus) and loc not in gpus0)
    if others:
        raise NotSymmetric(f"rank 0's tasks of a template use {others[0]!r}")
    maps: list[_RankMaps] = []
    for k in range(n):
        m = _RankMaps()
        mine = dict(zip(gpus0, tpl.gpus_of(k), strict=True))
        m.locs.fwd = {loc: mine.get(loc, loc) for loc in locs}
        m.locs.back = {v: k_ for k_, v in m.locs.fwd.items()}
        maps.append(m)
    rings_of = ring_memo(route)
    rep, orbit_size = roles(plan, base, maps, route, capacity, orbits, shared_host, streams, rings_of)
    pool_maps, pool_mult = _pools(plan, topo, maps, n, tensors, dict.fromkeys(rank_tensors, 0))
    rank_task_ids = frozenset(t.id for ts in base for t in ts)
    streams0 = frozenset(rank_streams) | {c.stream for c in globals_}
    coll_ids = frozenset(c.id for c in globals_)
    images = [t for o in orbits.values() for t in o]
    coll_links, coll_hop_links = orbit_links(orbits, rings_of)
    return Symmetry(
        n=n, rank_tasks=rank_task_ids, global_tasks=frozenset(c.id for c in globals_),
        rank_streams=frozenset(rank_streams), rank_tensors=rank_tensors, dropped_tensors=frozenset(),
        stream_maps=tuple(Images(streams0, k, tp=tp, stream=True, width=w) for k in range(n)),
        task_maps=tuple(Images(rank_task_ids, k, tp=tp, width=w) for k in range(n)),
        tensor_maps=tuple(Images(rank_tensors, k, tp=tp, width=w) for k in range(n)),
        link_maps=tuple(m.links.fwd for m in maps), resource_maps=tuple(m.resources.fwd for m in maps),
        rep=rep, orbit_size=orbit_size, pool_maps=pool_maps, pool_mult=pool_mult, gpus=frozenset(gpus0),
        loc_maps=tuple(m.locs.fwd for m in maps),
        coll_maps=tuple(Images(coll_ids, k, tp=tp, width=w) for k in range(n)),
        flow_mult={c: float(len(o)) for c, o in orbits.items()}, coll_ranks={t.id: t.ranks for t in images},
        kept_streams=frozenset(streams), coll_orbit={c: tuple(t.id for t in o) for c, o in orbits.items()},
        coll_links=coll_links, coll_hop_links=coll_hop_links, task_lists=(*base, globals_), images_by_rule=True)


def _groups(tpl: RankTemplate) -> dict[tuple[str, ...], str]:
    """Rank 0's groups, sorted: its tensor-parallel group ``"tp"`` and its data-parallel group ``"dp"`` (both all
    the ranks when one of them is 1: then ``"all"``)."""
    tpg, dpg = tuple(sorted(tpl.tp_group(0))), tuple(sorted(tpl.dp_group(0)))
    if tpl.tp == 1 or tpl.tp == tpl.ranks:
        return {tuple(sorted(tpl.gpu(r) for r in range(tpl.ranks))): "all"}
    return {tpg: "tp", dpg: "dp"}


def _replicas_kind(ranks: tuple[str, ...], tpl: RankTemplate) -> str | None:
    """``"all"`` when a collective of a template of pipeline replicas spans the same stages of every replica (a
    stage's data-parallel group), else None."""
    w, stages = tpl.width, defaultdict(set)
    for g in ranks:
        if not (g.startswith("gpu") and g[3:].isdigit()):
            return None
        k, s = divmod(int(g[3:]), w)
        stages[k].add(s)
    kinds = {frozenset(v) for v in stages.values()}
    return "all" if len(stages) == tpl.ranks and len(kinds) == 1 and len(ranks) == sum(map(len, stages.values())) \
        else None


class _Copy(NamedTuple):
    """What the resources' check reads of a collective's copy in another group (``symmetry._resources``)."""

    id: str
    ranks: tuple[str, ...]
    bytes: float
    coll: str | None


def _orbit(c: TaskSpec, tpl: RankTemplate, kind: str) -> list[Any]:
    """Collective ``c`` of rank 0's group and its copies in the other groups of its kind (their ids and ranks:
    the images of rank 0's in the first rank of each group)."""
    if kind == "all":
        return [c]
    if kind == "tp":  # the collective of tensor-parallel group k (ranks k*tp ...), k = 1 .. dp-1
        groups = range(1, tpl.ranks // tpl.tp)
        ids, ranks = group_copies(c.id, TP_TOKENS, groups), [tpl.tp_group(k) for k in groups]
    else:  # of data-parallel group j (position j of every tensor-parallel group), j = 1 .. tp-1
        groups = range(1, tpl.tp)
        ids, ranks = group_copies(c.id, DP_TOKENS, groups), [tpl.dp_group(j) for j in groups]
    return [c, *(_Copy(i, rs, c.bytes, c.coll) for i, rs in zip(ids, ranks, strict=True))]
