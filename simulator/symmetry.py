"""Symmetry reduction: ranks that run the same tasks are simulated once.

Data-parallel plans repeat one rank's tasks on every GPU. Simulating all of them costs events in
proportion to the GPU count, yet by symmetry every rank's timeline is the same. This module *proves* that
a plan is symmetric (it never trusts names) and builds the quotient the engine then runs:

Verification (:func:`find_symmetry`). Every task is owned by a rank (its ``rank`` tag) or, without one,
by the GPU its stream runs on; collectives without a rank tag are *global* (they span the ranks). The
owners, sorted, must each hold the same number of tasks per segment, and the i-th task of owner k must
equal the i-th task of owner 0 once task ids, stream ids, tensor ids and locations are relabelled by
maps built from that very pairing; each map must be a bijection, stream devices and tensor specs must
agree under it, every rank's GPUs must be its own, and a rank task may depend only on its own rank's
tasks and on global ones. A global collective must depend on every rank's image of its rank-0
dependencies and on nothing else, carry no tensors, and span the same GPUs of each of its ranks (the images
of those rank 0's collective spans: all of a rank's GPUs, or, where a rank is a pipeline replica owning a
GPU per stage, the one of its stage).

Resources. Pairing every rank-0 flow's route with its image in rank k gives, position by position, a
map of resources (and of links); its orbits (union over k) are the resources that play the same role.
The load check then requires that every flow class (a rank-0 route over all its images; a global
collective) puts the same total usage on every member of an orbit. Under that condition the max-min
fair rates of the full run are constant over each rank's images (progressive filling raises them
together and saturates the members of an orbit together), and the full network's constraints reduce
exactly to one per orbit: a rank-0 flow uses its orbit's representative with weight
``(n / |orbit|) * (its usage of the orbit's members)``, a global flow with ``(its usage) / |orbit|``,
capacities unchanged. A shared PCIe uplink of two GPUs then carries twice the representative's flow,
CPU-Adam all ``n`` ranks' optimizer steps, and a GPU's SMs only its own work.

Memory. A rank-0 allocation in a pool that every rank shares (host DRAM, NVMe) counts ``n / |orbit|``
times; a GPU's own pool counts once, and the other ranks' pools are copies of the representative's.
Tensors no task touches (initial residents) stay as they are; those in per-rank pools must be the same
multiset on every member of the orbit.

Anything that fails a check is simulated in full; ``sim.method`` says which was done.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from costs import CPU_ADAM, HOST_CORES, Ring, RouteResources, ring, sm_resource, usage
from hardware_models import Topology
from simulator.plan import Placement, Plan, Ref, Segment, TaskSpec

GLOBAL = "<global>"
_NO_WAITS: frozenset[tuple] = frozenset()
_Owner = tuple[int, Any]


class NotSymmetric(Exception):
    """Why a plan cannot be reduced (the engine then simulates it in full)."""


def _rank_tag(t: TaskSpec) -> int | None:
    rank = t.tags.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _owner(t: TaskSpec, device: str, stream_rank: Mapping[str, int], rank: int | None) -> _Owner | str:
    """A task's rank: its tag (``rank``: ``_rank_tag(t)``), else that of the other tasks of its stream, else its
    stream's GPU (the grouping is only a guess at the pairing; the verification decides)."""
    if rank is None and t.op != "collective":
        rank = stream_rank.get(t.stream)
    if rank is not None:
        return (0, rank)
    if t.op == "collective":
        return GLOBAL
    if device.startswith("gpu"):
        return (1, device)
    raise NotSymmetric(f"task {t.id!r} has no rank and runs on {device!r}")


class _Bijection:
    """A partial map that must stay one-to-one."""

    def __init__(self, what: str):
        self.what = what
        self.fwd: dict[str, str] = {}
        self.back: dict[str, str] = {}

    def pair(self, a: str, b: str) -> None:
        got = self.fwd.get(a)
        if got is None:
            if self.back.get(b, a) != a:
                raise NotSymmetric(f"{self.what} {b!r} is the image of two names")
            self.fwd[a] = b
            self.back[b] = a
        elif got != b:
            raise NotSymmetric(f"{self.what} {a!r} maps to both {got!r} and {b!r}")


@dataclass
class _RankMaps:
    tasks: _Bijection = field(default_factory=lambda: _Bijection("task"))
    streams: _Bijection = field(default_factory=lambda: _Bijection("stream"))
    tensors: _Bijection = field(default_factory=lambda: _Bijection("tensor"))
    locs: _Bijection = field(default_factory=lambda: _Bijection("location"))
    resources: _Bijection = field(default_factory=lambda: _Bijection("resource"))
    links: _Bijection = field(default_factory=lambda: _Bijection("link"))
    colls: _Bijection = field(default_factory=lambda: _Bijection("collective"))


@dataclass
class Symmetry:
    """A verified symmetry: ``n`` ranks simulated as rank 0 (see the module docstring)."""

    n: int
    rank_tasks: frozenset[str]           # rank 0's task ids
    global_tasks: frozenset[str]         # the collectives kept: those rank 0 takes part in
    rank_streams: frozenset[str]
    rank_tensors: frozenset[str]         # tensors rank 0's tasks touch (their shared-pool bytes count n times)
    dropped_tensors: frozenset[str]      # the other ranks' tensors
    stream_maps: tuple[Mapping[str, str], ...]   # per rank: rank-0 stream -> its image
    task_maps: tuple[Mapping[str, str], ...]
    tensor_maps: tuple[Mapping[str, str], ...]
    link_maps: tuple[dict[str, str], ...]
    resource_maps: tuple[dict[str, str], ...]
    rep: dict[str, str]                  # resource -> its orbit's representative (rank 0's)
    orbit_size: dict[str, int]           # representative -> members
    pool_maps: tuple[dict[str, str], ...]
    pool_mult: dict[str, float]          # rank-0 pool -> how many ranks' allocations one of its own stands for
    gpus: frozenset[str]                 # rank 0's GPUs
    loc_maps: tuple[dict[str, str], ...] = ()
    coll_maps: tuple[Mapping[str, str], ...] = ()
    flow_mult: dict[str, float] = field(default_factory=dict)   # kept collective -> collectives it stands for
    coll_ranks: dict[str, tuple[str, ...]] = field(default_factory=dict)  # every collective's ranks
    coll_orbit: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kept collective -> it and its images
    coll_links: dict[str, tuple[str, ...]] = field(default_factory=dict)  # collective -> links its ring crosses
    # collective -> (link, share of per_rank) hop by hop (repeats kept)
    coll_hop_links: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    kept_streams: frozenset[str] = frozenset()
    # every task's list (each rank's segments, then the collectives): read for ``tags`` when records are expanded
    task_lists: tuple[Sequence[TaskSpec], ...] = ()
    # a rank template's (simulator.symmetry_template): rank k's names are images of rank 0's by rule, and so are
    # its tasks' tags (rank 0's with rank k)
    images_by_rule: bool = False
    _folded: dict[tuple, tuple[tuple[str, ...], tuple[float, ...]]] = field(default_factory=dict)
    # a tuple of the plan (a segment's tasks, the streams, the tensors; by identity, held so the identity stays its
    # own) -> what reduce keeps of it: the runs of one simulation reduce plans that differ only in repeat or step
    # counts, which share these tuples
    _reduced: dict[int, tuple[tuple, tuple]] = field(default_factory=dict)

    @cached_property
    def tags(self) -> dict[str, Mapping[str, Any]]:
        """Every task's tags, by id (built on first use: a 1024-GPU plan has a quarter of a million)."""
        return {t.id: t.tags for ts in self.task_lists for t in ts}

    def describe(self) -> str:
        return f"{self.n} ranks simulated as 1 class of {self.n}"

    def reduce(self, plan: Plan) -> Plan:
        """``plan`` (or a copy of it with other repeat counts) cut to rank 0 and the global tasks."""
        segs = tuple(Segment(seg.name, seg.repeat, self._kept(seg.tasks, self._reduce_tasks))
                     for seg in plan.segments)
        streams = self._kept(plan.streams, lambda ss: tuple(s for s in ss if s.id in self.kept_streams))
        tensors = self._kept(plan.tensors, lambda ts: tuple(x for x in ts if x.id not in self.dropped_tensors))
        return replace(plan, segments=segs, streams=streams, tensors=tensors)

    def _kept(self, items: tuple, keep: Callable[[tuple], tuple]) -> tuple:
        """``keep(items)``, worked out once per tuple (``_reduced``)."""
        got = self._reduced.get(id(items))
        if got is None or got[0] is not items:
            got = self._reduced[id(items)] = (items, keep(items))
        return got[1]

    def _reduce_tasks(self, seg_tasks: tuple[TaskSpec, ...]) -> tuple[TaskSpec, ...]:
        keep = self.rank_tasks
        tasks = []
        for t in seg_tasks:
            if t.id not in keep and t.id not in self.global_tasks:
                continue
            deps = tuple(d for d in t.deps if d.id in keep or d.id in self.global_tasks)
            if len(deps) != len(t.deps):
                t = replace(t, deps=deps)
            if t.id in self.global_tasks and (t.allocs or t.frees or t.reads):
                t = replace(t, allocs=self._mine(t.allocs), frees=self._mine(t.frees), reads=self._mine(t.reads))
            tasks.append(t)
        return tuple(tasks)

    def _mine(self, items: tuple[Placement, ...]) -> tuple[Placement, ...]:
        return tuple(p for p in items if p.tensor.id in self.rank_tensors)

    def multiplicity(self, task_id: str) -> float:
        """How many flows of the full run one flow of this kept task stands for (rank tasks: every rank's)."""
        return self.flow_mult.get(task_id, float(self.n))

    def expanded(self, task_id: str) -> bool:
        """Is the task one of several images (rank 0's, or a collective of one group of ranks)?"""
        return task_id in self.rank_tasks or self.flow_mult.get(task_id, 1.0) > 1.0

    def fold(self, resources: Sequence[str], weights: Sequence[float] | None,
             mult: float) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """A flow's (resources, weights) in the quotient network: each orbit's representative, used by the
        ``mult`` images of the flow spread evenly over the orbit's members."""
        key = (tuple(resources), None if weights is None else tuple(weights), mult)
        got = self._folded.get(key)
        if got is None:
            acc: dict[str, float] = {}
            for r, x in usage(resources, weights).items():
                rep = self.rep.get(r, r)
                acc[rep] = acc.get(rep, 0.0) + x
            out = {r: x * mult / self.orbit_size.get(r, 1) for r, x in acc.items()}
            got = self._folded[key] = (tuple(out), tuple(out.values()))
        return got

    def memory_multiplier(self, tensor_id: str, pool: str) -> float:
        if tensor_id not in self.rank_tensors:
            return 1.0
        return self.pool_mult.get(pool, 1.0)

    def expand_links(self, rank_bytes: Mapping[str, float], global_bytes: Mapping[str, float]) -> dict[str, float]:
        """Bytes per link of the full run from rank 0's and the global tasks' counts."""
        out: dict[str, float] = defaultdict(float)
        for m in self.link_maps:
            for ln, b in rank_bytes.items():
                out[m.get(ln, ln)] += b
        for ln, b in global_bytes.items():
            out[ln] += b
        return dict(out)

    def link_sources(self, links: Iterable[str]) -> dict[str, frozenset[str]]:
        """Full-run link -> the rank-0 links whose images land on it."""
        src: dict[str, set[str]] = defaultdict(set)
        for m in self.link_maps:
            for ln in links:
                src[m.get(ln, ln)].add(ln)
        return {k: frozenset(v) for k, v in src.items()}

    def expand_streams(self, busy: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for s, v in busy.items():
            for m in self.stream_maps:
                out[m.get(s, s)] = v
        return dict(sorted(out.items()))

    def expand_records(self, records: Sequence[Any]) -> list[Any]:
        """Every rank's records from rank 0's (each image ran exactly when rank 0's did); global ones once."""
        out: list[Any] = []
        rank = self.rank_tasks
        for r in records:
            is_coll = r.id not in rank
            if is_coll and self.flow_mult.get(r.id, 1.0) == 1.0:
                out.append(r)
                continue
            seen = {r.id}
            out.append(r)
            for k in range(1, self.n):
                tid = self.coll_maps[k][r.id] if is_coll else self.task_maps[k][r.id]
                if tid in seen:
                    continue
                seen.add(tid)
                locs, links = self.loc_maps[k], self.link_maps[k]
                out.append(r._replace(
                    uid=self.relabel_uid(r.uid, k), id=tid, stream=self.stream_maps[k][r.stream],
                    device=locs.get(r.device, r.device), tags=self._tags_of(tid, r.tags, k, is_coll),
                        gpus=self.coll_ranks[tid] if is_coll else tuple(locs.get(g, g) for g in r.gpus),
                    links=self.coll_links[tid] if is_coll else tuple(links.get(ln, ln) for ln in r.links)))
        return out

    def _tags_of(self, tid: str, tags: Mapping[str, Any], k: int, is_coll: bool) -> Mapping[str, Any]:
        """The tags of rank k's image ``tid`` of a task tagged ``tags``."""
        if self.images_by_rule:
            return {**tags, "rank": k} if not is_coll and "rank" in tags else tags
        return self.tags.get(tid, tags)

    def relabel_uid(self, uid: str, k: int) -> str:
        base, _, rest = uid.partition("[")
        new = self.task_maps[k].get(base) or self.coll_maps[k].get(base, base)
        return new + ("[" + rest if rest else "")

    def relabel_tensor(self, inst: str, k: int) -> str:
        base, _, rest = inst.partition("[")
        return self.tensor_maps[k].get(base, base) + ("[" + rest if rest else "")


# -- verification ------------------------------------------------------------------------------------------
def find_symmetry(plan: Plan, topo: Topology, route: Callable[[str, str], RouteResources],
                  capacity: Mapping[str, float], shared_host: bool) -> Symmetry | str:
    """The plan's symmetry, or a line saying why it has none that can be used."""
    try:
        return _find(plan, topo, route, capacity, shared_host)
    except NotSymmetric as e:
        return str(e)


def _find(plan: Plan, topo: Topology, route: Callable[[str, str], RouteResources],
          capacity: Mapping[str, float], shared_host: bool) -> Symmetry:
    streams = plan.stream_map()
    groups: dict[Any, list[list[TaskSpec]]] = {}
    globals_: list[TaskSpec] = []
    stream_owner: dict[str, Any] = {}
    nseg = len(plan.segments)
    stream_rank: dict[str, int] = {}
    rank_tags: list[int | None] = []  # every task's, in plan order (read again below)
    for seg in plan.segments:
        for t in seg.tasks:
            tag = _rank_tag(t)
            rank_tags.append(tag)
            if tag is not None and t.op != "collective" and stream_rank.setdefault(t.stream, tag) != tag:
                raise NotSymmetric(f"stream {t.stream!r} runs tasks of two ranks")
    device_rank: dict[str, int] = {}
    for sid, r in stream_rank.items():
        dev = streams[sid].device if sid in streams else ""
        if dev.startswith("gpu") and device_rank.setdefault(dev, r) != r:
            device_rank[dev] = -1  # two ranks on one GPU: no guess
    for sid, st in streams.items():
        if sid not in stream_rank and device_rank.get(st.device, -1) >= 0:
            stream_rank[sid] = device_rank[st.device]
    next_tag = iter(rank_tags).__next__
    for si, seg in enumerate(plan.segments):
        for t in seg.tasks:
            tag = next_tag()
            spec_st = streams.get(t.stream)
            if spec_st is None:
                raise NotSymmetric(f"task {t.id!r} runs on an unknown stream")
            own = _owner(t, spec_st.device, stream_rank, tag)
            if stream_owner.setdefault(t.stream, own) != own:
                raise NotSymmetric(f"stream {t.stream!r} holds tasks of two owners")
            if own == GLOBAL:
                globals_.append(t)
            else:
                groups.setdefault(own, [[] for _ in range(nseg)])[si].append(t)
    if len(groups) < 2:
        raise NotSymmetric("fewer than two ranks")
    owners = sorted(groups, key=lambda o: (o[0], str(o[1])))
    kinds = {o[0] for o in owners}
    if len(kinds) != 1:
        raise NotSymmetric("some tasks carry a rank tag and others do not")
    base = groups[owners[0]]
    n = len(owners)
    for o in owners[1:]:
        if [len(s) for s in groups[o]] != [len(s) for s in base]:
            raise NotSymmetric(f"rank {o[1]} runs a different number of tasks")
    tensors = plan.tensor_map()
    global_ids = frozenset(t.id for t in globals_)
    streams_of = {t.id: t.stream for t in globals_}
    owner_of_task: dict[str, int] = {}
    for k, o in enumerate(owners):
        for seg_tasks in groups[o]:
            for t in seg_tasks:
                owner_of_task[t.id] = k
    maps = [_RankMaps() for _ in owners]
    ids0 = [a.id for seg in base for a in seg]
    for k, o in enumerate(owners):  # the i-th task of rank k is the image of rank 0's i-th: built whole
        idsk = [b.id for seg in groups[o] for b in seg]
        fwd, bwd = dict(zip(ids0, idsk, strict=True)), dict(zip(idsk, ids0, strict=True))
        if len(fwd) != len(ids0) or len(bwd) != len(idsk):
            raise NotSymmetric("a task id repeats")
        maps[k].tasks.fwd, maps[k].tasks.back = fwd, bwd
    tensor_owner: dict[str, int] = {}
    back = [m.tasks.back for m in maps]
    # rank 0's side of every comparison, worked out once (not once per rank)
    base_side = {a.id: (_untagged(a), _dep_signature(a, {0}, owner_of_task, global_ids, back), _payload(a))
                 for seg in base for a in seg}
    for k, o in enumerate(owners):
        mk, own_k = maps[k], {k}
        for a_seg, b_seg in zip(base, groups[o], strict=True):
            for a, b in zip(a_seg, b_seg, strict=True):
                _match(a, b, mk, streams, owner_of_task, global_ids, own_k, back, base_side[a.id])
        for tid in maps[k].tensors.back:
            if tensor_owner.setdefault(tid, k) != k:
                raise NotSymmetric(f"tensor {tid!r} is used by two ranks")
    for k in range(n):
        for ida, idb in maps[k].tensors.fwd.items():
            ta, tb = tensors.get(ida), tensors.get(idb)
            if ta is None or tb is None:
                raise NotSymmetric(f"tensor {ida!r} is not declared")
            if (ta.bytes, ta.kind, ta.scope, ta.layer, ta.persistent) != (tb.bytes, tb.kind, tb.scope, tb.layer,
                                                                          tb.persistent):
                raise NotSymmetric(f"tensors {ida!r} and {idb!r} differ")
            if (ta.home is None) != (tb.home is None):
                raise NotSymmetric(f"tensors {ida!r} and {idb!r} differ in home")
            if ta.home is not None and tb.home is not None:
                maps[k].locs.pair(ta.home, tb.home)
    gpus0 = frozenset(loc for loc in maps[0].locs.fwd if loc in set(topo.gpu_locations()))
    all_gpus: set[str] = set()
    for k in range(n):
        img = {maps[k].locs.fwd[g] for g in gpus0}
        if k and img & gpus0:
            raise NotSymmetric("ranks share a GPU")
        all_gpus |= img
    for la, lb in maps[0].locs.fwd.items():
        if la != lb:
            raise NotSymmetric("rank 0's own map is not the identity")
    gpu_of = [frozenset(m.locs.fwd[g] for g in gpus0) for m in maps]
    colls = _Collectives(globals_, gpu_of, streams, owner_of_task, back)
    coll_sig0 = {a.id: colls.signature(a, {0}) for seg in base for a in seg}
    for k, m in enumerate(maps):
        for by_rank in colls.of_rank.values():
            c0, ck = by_rank[0], by_rank[k]
            m.colls.pair(c0, ck)
            if c0 != ck:
                m.streams.pair(streams_of[c0], streams_of[ck])
        for a_seg, b_seg in zip(base, groups[owners[k]], strict=True):
            for a, b in zip(a_seg, b_seg, strict=True):
                if coll_sig0[a.id] != colls.signature(b, {k}):
                    raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} wait for different collectives")
    orbits = _check_collectives(colls, plan, globals_, maps, owner_of_task, global_ids, gpu_of, tensor_owner)
    rings_of = ring_memo(route)
    rep, orbit_size = roles(plan, base, maps, route, capacity, orbits, shared_host, streams, rings_of)
    pool_maps, pool_mult = _pools(plan, topo, maps, n, tensors, tensor_owner)
    rank_tensors = frozenset(maps[0].tensors.fwd)
    dropped = frozenset(t for k in range(1, n) for t in maps[k].tensors.back)
    kept = frozenset(orbits)
    kept_streams = frozenset(maps[0].streams.fwd) | {streams_of[c] for c in kept}
    coll_links, coll_hop_links = orbit_links(orbits, rings_of)
    return Symmetry(
        n=n, rank_tasks=frozenset(maps[0].tasks.fwd), global_tasks=kept,
        rank_streams=frozenset(maps[0].streams.fwd), rank_tensors=rank_tensors, dropped_tensors=dropped,
        stream_maps=tuple(m.streams.fwd for m in maps), task_maps=tuple(m.tasks.fwd for m in maps),
        tensor_maps=tuple(m.tensors.fwd for m in maps), link_maps=tuple(m.links.fwd for m in maps),
        resource_maps=tuple(m.resources.fwd for m in maps), rep=rep, orbit_size=orbit_size,
        pool_maps=pool_maps, pool_mult=pool_mult, gpus=gpus0, loc_maps=tuple(m.locs.fwd for m in maps),
        task_lists=(*(seg for o in owners for seg in groups[o]), globals_),
        coll_maps=tuple(m.colls.fwd for m in maps), flow_mult={c: float(len(o)) for c, o in orbits.items()},
        coll_ranks={t.id: t.ranks for t in globals_}, kept_streams=kept_streams,
        coll_orbit={c: tuple(t.id for t in o) for c, o in orbits.items()},
        coll_links=coll_links, coll_hop_links=coll_hop_links)


RingOf = Callable[[tuple[str, ...], float, str], Ring]


def ring_memo(route: Callable[[str, str], RouteResources]) -> RingOf:
    """``ring`` on ``route``, each collective shape (ranks, bytes, kind) worked out once (each is O(ranks))."""
    cache: dict[tuple, Ring] = {}

    def rings_of(ranks: tuple[str, ...], nbytes: float, coll: str) -> Ring:
        got = cache.get((ranks, nbytes, coll))
        if got is None:
            got = cache[(ranks, nbytes, coll)] = ring(route, ranks, nbytes, coll)
        return got

    return rings_of


def roles(plan: Plan, base: list[list[TaskSpec]], maps: list[_RankMaps], route: Callable[[str, str], RouteResources],
          capacity: Mapping[str, float], orbits: Mapping[str, list[Any]], shared_host: bool,
          streams: Mapping[str, Any], rings_of: RingOf) -> tuple[dict[str, str], dict[str, int]]:
    """The resources' roles (``_resources``): a collective's alike hops as one role; failing the load check, each
    hop its own (the maps it pairs are the same either way)."""
    try:
        return _resources(plan, base, maps, route, capacity, orbits, shared_host, streams, True, rings_of)
    except NotSymmetric:
        return _resources(plan, base, maps, route, capacity, orbits, shared_host, streams, False, rings_of)


def orbit_links(orbits: Mapping[str, list[Any]], rings_of: RingOf
                ) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[tuple[str, float], ...]]]:
    """Per collective of an orbit of more than one (a group's and its copies): the links its ring crosses and its
    (link, share of per_rank) hop by hop (``Symmetry.coll_links``, ``coll_hop_links``)."""
    views: dict[int, tuple] = {}
    links: dict[str, tuple[str, ...]] = {}
    hops: dict[str, tuple[tuple[str, float], ...]] = {}
    for o in orbits.values():
        for t in o if len(o) > 1 else ():
            links[t.id], hops[t.id] = _ring_links(rings_of(t.ranks, max(t.bytes, 1.0), t.coll or ""), views)
    return links, hops


def _ring_links(rg: Ring, views: dict[int, tuple]) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """A ring's links, each once, and its (link, share of per_rank) hop by hop, worked out once per ring
    (``views`` by the ring's identity: rings are shared among the collectives of one shape)."""
    got = views.get(id(rg))
    if got is None:
        got = views[id(rg)] = (rg.links, tuple((ln, nbytes / rg.per_rank) for h, nbytes in rg.hop_bytes()
                                               for ln in h.links), rg)  # (rg kept: its id stays its own)
    return got[0], got[1]


def _ref(a: Ref, b: Ref, m: _Bijection) -> None:
    if (a.iters_back, a.steps_back) != (b.iters_back, b.steps_back):
        raise NotSymmetric(f"references {a} and {b} differ")
    m.pair(a.id, b.id)


def _places(a: tuple[Placement, ...], b: tuple[Placement, ...], m: _RankMaps) -> None:
    if len(a) != len(b):
        raise NotSymmetric("placements differ")
    tensors, locs = m.tensors, m.locs
    for x, y in zip(a, b, strict=True):
        tx, ty = x.tensor, y.tensor
        if tensors.fwd.get(tx.id) != ty.id or (tx.iters_back, tx.steps_back) != (ty.iters_back, ty.steps_back):
            _ref(tx, ty, tensors)
        if locs.fwd.get(x.loc) != y.loc:
            locs.pair(x.loc, y.loc)


def _untagged(t: TaskSpec) -> dict[str, Any]:
    """A task's tags but its rank."""
    out = dict(t.tags)
    out.pop("rank", None)
    return out


def _payload(t: TaskSpec) -> tuple:
    """What a task does, apart from names: equal for a task and its images."""
    return (t.op, t.flops, t.hbm_bytes, t.bytes, t.alloc_dst, t.free_src, t.params, t.coll)


def _match(a: TaskSpec, b: TaskSpec, m: _RankMaps, streams: Mapping[str, Any], owner_of_task: Mapping[str, int],
           global_ids: frozenset[str], own: set[int], back: Sequence[Mapping[str, str]],
           a_side: tuple[dict[str, Any], frozenset[tuple], tuple]) -> None:
    """Task ``b`` of rank k (``own``: {k}) is rank 0's ``a`` relabelled (``a_side``: a's tags but its rank, its
    dependency signature and its payload). Pairs already made (most: a rank's streams and locations recur in
    every task) are recognised by a look-up before the checking call."""
    ta, a_sig, same = a_side
    if same != (b.op, b.flops, b.hbm_bytes, b.bytes, b.alloc_dst, b.free_src, b.params, b.coll):
        raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} differ")
    if ta != _untagged(b):
        raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} differ in tags")
    if m.streams.fwd.get(a.stream) != b.stream:  # a new pair of streams: their devices and kinds checked once
        m.streams.pair(a.stream, b.stream)
        m.locs.pair(streams[a.stream].device, streams[b.stream].device)
        if streams[a.stream].kind != streams[b.stream].kind:
            raise NotSymmetric(f"streams {a.stream!r} and {b.stream!r} differ")
    locs = m.locs
    if a.src is not None or b.src is not None or a.dst is not None or b.dst is not None:
        for x, y, other in (("src", a.src, b.src), ("dst", a.dst, b.dst)):
            if (y is None) != (other is None):
                raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} differ in {x}")
            if y is not None and other is not None and locs.fwd.get(y) != other:
                locs.pair(y, other)
    at, bt = a.tensor, b.tensor
    if (at is None) != (bt is None):
        raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} differ in tensor")
    if at is not None and bt is not None and (m.tensors.fwd.get(at.id) != bt.id or at.iters_back != bt.iters_back
                                              or at.steps_back != bt.steps_back):
        _ref(at, bt, m.tensors)
    if a.ranks or b.ranks:
        if len(a.ranks) != len(b.ranks):
            raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} differ in ranks")
        for x, y in zip(a.ranks, b.ranks, strict=True):
            locs.pair(x, y)
    if a.allocs or b.allocs:
        _places(a.allocs, b.allocs, m)
    if a.frees or b.frees:
        _places(a.frees, b.frees, m)
    if a.reads or b.reads:
        _places(a.reads, b.reads, m)
    if a_sig != _dep_signature(b, own, owner_of_task, global_ids, back):
        raise NotSymmetric(f"tasks {a.id!r} and {b.id!r} differ in dependencies")


def _dep_signature(t: TaskSpec, own: set[int], owner_of_task: Mapping[str, int], global_ids: frozenset[str],
                   back: Sequence[Mapping[str, str]], coll_back: Mapping[str, str] | None = None) -> frozenset[tuple]:
    """A task's dependencies on rank tasks up to the rank relabelling: a task of its own rank (``own``: the
    ranks taking part in a collective); or the same task of *every* rank (a barrier: by symmetry they all
    end together, as its own rank's does). A wait for some other ranks only breaks the symmetry.
    Collectives count where ``coll_back`` (their rank-0 counterparts) is given."""
    if not t.deps:
        return _NO_WAITS
    n = len(back)
    ranks: dict[tuple[str, int, int], set[int]] = {}
    out: set[tuple] = set()
    for d in t.deps:
        did = d.id
        if did in global_ids:
            if coll_back is not None:
                if did not in coll_back:
                    raise NotSymmetric(f"collective {t.id!r} waits for a collective of other ranks")
                out.add(("coll", coll_back[did], d.iters_back, d.steps_back))
            continue
        j = owner_of_task.get(did)
        if j is None:
            raise NotSymmetric(f"task {t.id!r} waits for an unknown task")
        key = (back[j][did], d.iters_back, d.steps_back)
        js = ranks.get(key)
        if js is None:
            ranks[key] = {j}
        else:
            js.add(j)
    for key, js in ranks.items():
        if js == own:
            out.add(("own", *key))
        elif len(js) == n:
            out.add(("all", *key))
        else:
            raise NotSymmetric(f"task {t.id!r} waits for some other ranks' tasks")
    return frozenset(out)


class _Collectives:
    """Collectives grouped by what they do (payload, tags, stream kind, size): a class holds one collective
    per group of ranks, the groups covering every rank once."""

    def __init__(self, colls: list[TaskSpec], gpu_of: list[frozenset[str]], streams: Mapping[str, Any],
                 owner_of_task: Mapping[str, int], back: Sequence[Mapping[str, str]]):
        rank_of = {g: k for k, gs in enumerate(gpu_of) for g in gs}
        self.cls_of: dict[str, tuple] = {}
        self.members: dict[tuple, list[str]] = defaultdict(list)
        self.of_rank: dict[tuple, dict[int, str]] = defaultdict(dict)
        self.ranks_of: dict[str, set[int]] = {}
        n = len(gpu_of)
        for t in colls:
            key = (t.op, t.coll, t.bytes, t.flops, t.params, tuple(sorted((str(x), str(v)) for x, v in t.tags.items())),
                   streams[t.stream].kind, len(t.ranks),
                   # what it waits for, as rank 0's tasks: two collectives of one payload play two roles
                   frozenset((back[owner_of_task[d.id]][d.id], d.iters_back, d.steps_back)
                             for d in t.deps if d.id in owner_of_task))
            self.cls_of[t.id] = key
            self.members[key].append(t.id)
            try:
                mine = {rank_of[g] for g in t.ranks}
            except KeyError:
                raise NotSymmetric(f"collective {t.id!r} spans a GPU no rank owns") from None
            self.ranks_of[t.id] = mine
            for k in mine:
                if k in self.of_rank[key]:
                    raise NotSymmetric(f"rank {k} takes part in two collectives of one kind ({t.id!r})")
                self.of_rank[key][k] = t.id
        for key, by in self.of_rank.items():
            if len(by) != n:
                raise NotSymmetric(f"collective {self.members[key][0]!r} and its kind leave some ranks out")

    def member(self, k: int, cls: tuple) -> str:
        return self.of_rank[cls][k]

    def signature(self, t: TaskSpec, own: set[int]) -> frozenset[tuple]:
        """``t``'s waits for collectives, up to the rank relabelling: the collective of a kind its own ranks
        take part in, or every collective of the kind (a barrier)."""
        got: dict[tuple, set[str]] = {}
        cls_of = self.cls_of
        for d in t.deps:
            cls = cls_of.get(d.id)
            if cls is not None:
                got.setdefault((cls, d.iters_back, d.steps_back), set()).add(d.id)
        if not got:
            return _NO_WAITS
        out: set[tuple] = set()
        for (cls, ib, sb), ids in got.items():
            if ids == {self.of_rank[cls][k] for k in own}:
                out.add(("own", cls, ib, sb))
            elif len(ids) == len(self.members[cls]):
                out.add(("all", cls, ib, sb))
            else:
                raise NotSymmetric(f"task {t.id!r} waits for some collectives of a kind but not all")
        return frozenset(out)


def _check_collectives(colls_: _Collectives, plan: Plan, colls: list[TaskSpec],
                       maps: list[_RankMaps], owner_of_task: Mapping[str, int],
                       global_ids: frozenset[str], gpu_of: list[frozenset[str]],
                       tensor_owner: Mapping[str, int]) -> dict[str, list[TaskSpec]]:
    """Every collective is the image of one rank 0 takes part in, among the ranks whose GPUs it spans; the
    images agree with it (payload, order on their streams, dependencies, placements). Returns each kept
    collective's orbit (itself and its images in the other groups of ranks)."""
    n = len(maps)
    back = [m.tasks.back for m in maps]
    spec = {t.id: t for t in colls}
    base_of: dict[str, str] = {}
    for m in maps:
        for base_id, ck in m.colls.fwd.items():
            if base_of.setdefault(ck, base_id) != base_id:
                raise NotSymmetric(f"collective {ck!r} stands for two of rank 0's")
    members: dict[str, set[int]] = defaultdict(set)
    for k, m in enumerate(maps):
        for ck in m.colls.fwd.values():
            members[ck].add(k)
    orbits: dict[str, list[TaskSpec]] = defaultdict(list)
    want: dict[str, tuple] = {}
    for t in sorted(colls, key=lambda c: base_of.get(c.id, "") != c.id):  # rank 0's own first
        if t.id not in base_of:
            raise NotSymmetric(f"no rank waits for collective {t.id!r}")
        if t.tensor is not None:
            raise NotSymmetric(f"collective {t.id!r} copies a tensor")
        c0 = spec[base_of[t.id]]
        mine = members[t.id]
        # the same GPUs of every member rank: the images of those of rank 0's GPUs that rank 0's collective spans
        # (all of them, or one stage of every pipeline replica)
        own0 = set(c0.ranks) & gpu_of[0]
        gpus = frozenset(maps[k].locs.fwd[g] for k in mine for g in own0)
        if set(t.ranks) != gpus or len(t.ranks) != len(gpus):
            raise NotSymmetric(f"collective {t.id!r} does not span the same GPUs of each of its ranks")
        if (t.op, t.coll, t.bytes, t.flops, t.params, dict(t.tags)) != \
                (c0.op, c0.coll, c0.bytes, c0.flops, c0.params, dict(c0.tags)):
            raise NotSymmetric(f"collectives {c0.id!r} and {t.id!r} differ")
        sig = (_dep_signature(t, mine, owner_of_task, global_ids, back),
               colls_.signature(t, mine), _placement_signature(t, mine, maps, tensor_owner))
        if t.id == c0.id:
            if 0 not in mine:
                raise NotSymmetric(f"rank 0 waits for collective {t.id!r} but takes no part in it")
            want[t.id] = sig
        elif sig != want[c0.id]:
            raise NotSymmetric(f"collectives {c0.id!r} and {t.id!r} wait for or place different things")
        orbits[c0.id].append(t)
    sizes = {len(o) for o in orbits.values()}
    if any(n % s for s in sizes):
        raise NotSymmetric("collectives split the ranks unevenly")
    _check_collective_streams(plan, orbits, maps, spec)
    return orbits


def _placement_signature(t: TaskSpec, members: set[int], maps: list[_RankMaps],
                         tensor_owner: Mapping[str, int]) -> tuple[frozenset[tuple], ...]:
    out = []
    for items in (t.allocs, t.frees, t.reads):
        groups: dict[tuple, set[int]] = defaultdict(set)
        for p in items:
            j = tensor_owner.get(p.tensor.id)
            if j is None:
                raise NotSymmetric(f"collective {t.id!r} places a tensor no rank uses")
            m = maps[j]
            groups[(m.tensors.back[p.tensor.id], p.tensor.iters_back, p.tensor.steps_back,
                    m.locs.back.get(p.loc))].add(j)
        if any(js != members for js in groups.values()):
            raise NotSymmetric(f"collective {t.id!r} places tensors of other ranks than its own")
        out.append(frozenset(groups))
    return tuple(out)


def _check_collective_streams(plan: Plan, orbits: Mapping[str, list[TaskSpec]], maps: list[_RankMaps],
                              spec: Mapping[str, TaskSpec]) -> None:
    """The kept collectives' streams run them in the order their images' streams run the images."""
    on: dict[str, list[str]] = defaultdict(list)
    for seg in plan.segments:
        for t in seg.tasks:
            if t.id in spec:
                on[t.stream].append(t.id)
    for s0 in {spec[c0].stream for c0 in orbits}:
        for m in maps:
            img = [m.colls.fwd.get(c) for c in on[s0]]
            if img != on.get(m.streams.fwd.get(s0, s0), []):
                raise NotSymmetric(f"stream {s0!r} runs its collectives in another order than its images")


def _flow_routes(t: TaskSpec, device: str, route: Callable[[str, str], RouteResources],
                 capacity: Mapping[str, float], shared_host: bool) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(resources, links) of the flows the engine runs for a rank task (see ``Engine._execute``)."""
    host = (HOST_CORES,) if shared_host else ()
    if t.op == "compute":
        return [((sm_resource(device), *host), ())]
    if t.op == "optimizer":
        sm = sm_resource(device)
        return [((sm, *host), ())] if sm in capacity else [((CPU_ADAM, *host), ())]
    if t.op == "copy":
        assert t.src is not None and t.dst is not None
        rt = route(t.src, t.dst)
        return [((*rt.resources, *host), rt.links)]
    if t.op == "collective":
        assert t.coll is not None
        rg = ring(route, t.ranks, max(t.bytes, 1.0), t.coll)
        return [((*rg.resources, *host), rg.links)] if rg.resources else [(rg.resources, rg.links)]
    return []


def _resources(plan: Plan, base: list[list[TaskSpec]], maps: list[_RankMaps],
               route: Callable[[str, str], RouteResources], capacity: Mapping[str, float],
               orbits: Mapping[str, list[TaskSpec]], shared_host: bool, streams: Mapping[str, Any],
               merge_hops: bool, rings_of: Callable[[tuple[str, ...], float, str], Ring]
               ) -> tuple[dict[str, str], dict[str, int]]:
    # the distinct flow shapes of rank 0 and their images in every rank
    shapes: dict[tuple, TaskSpec] = {}
    for seg in base:
        for t in seg:
            key = (t.op, t.src, t.dst, t.ranks, t.coll, streams[t.stream].device)
            shapes.setdefault(key, t)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
            parent.setdefault(min(ra, rb), min(ra, rb))

    loads: list[dict[str, float]] = []
    rank0_res: set[str] = set()
    joined_pairs: list[dict[str, str]] = [{} for _ in maps]
    for t in shapes.values():
        dev0 = streams[t.stream].device
        flows0 = _flow_routes(t, dev0, route, capacity, shared_host)
        load: dict[str, float] = defaultdict(float)
        for k, m in enumerate(maps):
            loc = m.locs.fwd
            try:
                tk = replace(t, src=None if t.src is None else loc[t.src], dst=None if t.dst is None else loc[t.dst],
                             ranks=tuple(loc[r] for r in t.ranks))
                flows_k = _flow_routes(tk, loc[dev0], route, capacity, shared_host)
            except KeyError as e:
                raise NotSymmetric(f"location {e} has no image") from None
            for (r0, l0), (rk, lk) in zip(flows0, flows_k, strict=True):
                if len(r0) != len(rk) or len(l0) != len(lk):
                    raise NotSymmetric(f"rank {k}'s route differs from rank 0's")
                paired = joined_pairs[k]
                for a, b in zip(r0, rk, strict=True):
                    if paired.get(a) != b:  # (a pair seen before in this pass was checked and joined then)
                        if capacity.get(a) != capacity.get(b):
                            raise NotSymmetric(f"resources {a!r} and {b!r} differ in capacity")
                        m.resources.pair(a, b)
                        union(a, b)
                        paired[a] = b
                    load[b] += 1.0
                    if k == 0:
                        rank0_res.add(a)
                for a, b in zip(l0, lk, strict=True):
                    m.links.pair(a, b)
        loads.append(load)
    # a collective of one group of ranks and its images in the other groups: paired hop by hop
    joined: set[tuple] = set()  # rings (and pairs of rings) whose resources were joined already
    flat: dict[tuple, tuple[tuple[str, ...], tuple[float, ...]]] = {}  # ring -> its resources and weights

    def flat_of(rkey: tuple, rg: Ring) -> tuple[tuple[str, ...], tuple[float, ...]]:
        got = flat.get(rkey)
        if got is None:
            res = rg.resources
            got = flat[rkey] = (res, rg.weights or (1.0,) * len(res))
        return got

    seen_orbits: set[tuple] = set()  # orbits of one shape (every layer's) join and load the resources alike
    for orbit in orbits.values():
        rkeys = [(c.ranks, max(c.bytes, 1.0), c.coll or "") for c in orbit]
        shape = tuple(rkeys)
        if shape in seen_orbits:
            continue
        seen_orbits.add(shape)
        rings = [rings_of(*k) for k in rkeys]
        res0 = flat_of(rkeys[0], rings[0])[0]
        load = defaultdict(float)
        for rkey, rg in zip(rkeys, rings, strict=True):
            res, weights = flat_of(rkey, rg)
            for r, x in zip(res, weights, strict=True):
                load[r] += x  # what the engine's flow puts on it (a hierarchical ring's hops: their shares)
            if len(res) != len(res0):
                raise NotSymmetric(f"collective {orbit[0].id!r}'s images cross different routes")
            if (rkeys[0], rkey) in joined:
                continue
            joined.add((rkeys[0], rkey))
            for a, b in zip(res0, res, strict=True):
                if capacity.get(a) != capacity.get(b):
                    raise NotSymmetric(f"resources {a!r} and {b!r} differ in capacity")
                union(a, b)
            # a ring's hops play one role where they are alike (the load check decides); a hierarchical
            # ring's hops only where they carry the same share of the flow (costs.collective)
            if merge_hops and rkey not in joined:
                joined.add(rkey)
                _merge_alike_hops(rg, capacity, union)
        loads.append(load)
    members: dict[str, set[str]] = defaultdict(set)
    for r in list(parent):
        members[find(r)].add(r)
    for load in loads:
        # an orbit the load does not touch carries 0 on every member: only the orbits it touches can differ
        for root in {find(r) for r in load}:
            ms = members.get(root)
            if ms is None:
                continue
            vals = {load.get(r, 0.0) for r in ms}
            if len(vals) > 1:
                raise NotSymmetric(f"resources of one role carry different loads ({', '.join(sorted(ms)[:3])})")
    rep: dict[str, str] = {}
    size: dict[str, int] = {}
    for ms in members.values():
        own = sorted(ms & rank0_res) or sorted(ms)
        first = own[0]
        for r in ms:
            rep[r] = first
        size[first] = len(ms)
    return rep, size


def _merge_alike_hops(rg: Ring, capacity: Mapping[str, float], union: Callable[[str, str], None]) -> None:
    """Union, position by position, the resources of a ring's hops that carry the same share of its flow
    and cross as many resources of equal capacity (the first such hop stands for the others)."""
    first: dict[tuple[float, int], RouteResources] = {}
    for h, share in zip(rg.hops, rg.shares or (1.0,) * len(rg.hops), strict=True):
        h0 = first.setdefault((share, len(h.resources)), h)
        if h0 is h:
            continue
        for a, b in zip(h0.resources, h.resources, strict=True):
            if capacity.get(a) == capacity.get(b):
                union(a, b)


def _pools(plan: Plan, topo: Topology, maps: list[_RankMaps], n: int, tensors: Mapping[str, Any],
           tensor_owner: Mapping[str, int]) -> tuple[tuple[dict[str, str], ...], dict[str, float]]:
    pool_of = topo.pool_of
    pool_maps: list[dict[str, str]] = []
    for m in maps:
        pm: dict[str, str] = {}
        for a, b in m.locs.fwd.items():
            pa, pb = pool_of.get(a), pool_of.get(b)
            if pa is None or pb is None:
                raise NotSymmetric(f"location {a!r} has no pool")
            if pm.setdefault(pa, pb) != pb:
                raise NotSymmetric(f"pool {pa!r} maps to two pools")
            if topo.pools[pa].capacity_bytes != topo.pools[pb].capacity_bytes:
                raise NotSymmetric(f"pools {pa!r} and {pb!r} differ in capacity")
        pool_maps.append(pm)
    mult: dict[str, float] = {}
    for p in pool_maps[0]:
        hits: dict[str, int] = defaultdict(int)
        for pm in pool_maps:
            hits[pm[p]] += 1
        counts = set(hits.values())
        if len(counts) != 1:
            raise NotSymmetric(f"pool {p!r} is shared unevenly")
        mult[p] = float(counts.pop())
    # untouched tensors on per-rank pools must be alike on every member
    resident: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t in tensors.values():
        if t.home is not None and t.id not in tensor_owner:
            resident[pool_of[t.home]].append((t.bytes, t.kind))
    for p, m_ in mult.items():
        if m_ < n:
            images = {tuple(sorted(resident.get(pm[p], []))) for pm in pool_maps}
            if len(images) > 1:
                raise NotSymmetric(f"pools like {p!r} start with different tensors")
    return tuple(pool_maps), mult


class ExpandedRecords(Sequence[Any]):
    """Every rank's task records, made from the representative's on first use (a 1024-rank run's
    timeline is millions of records that most callers never read)."""

    def __init__(self, sym: Symmetry, records: Sequence[Any]):
        self._sym = sym
        self._base = records
        self._all: tuple[Any, ...] | None = None

    def _records(self) -> tuple[Any, ...]:
        if self._all is None:
            self._all = tuple(self._sym.expand_records(self._base))
        return self._all

    def __len__(self) -> int:
        return len(self._records())

    def __getitem__(self, i):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN204 - Sequence protocol
        return self._records()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._records())


def expand_pools(pools: dict[str, Any], ooms: list[Any], sym: Symmetry) -> None:
    """Each rank-0 per-rank pool's state is its images' (in place: the very same state, read-only from
    here on; capacities are equal, verified), and so are its OOM verdicts, relabelled."""
    private = {p for p, m in sym.pool_mult.items() if m < sym.n}
    mine = [o for o in ooms if o.pool in private]
    for k, pm in enumerate(sym.pool_maps):
        seen: set[str] = set()
        for p in private:
            q = pm[p]
            if q != p:
                pools[q] = pools[p]
        for o in mine:
            q = pm[o.pool]
            if q != o.pool and q not in seen:
                seen.add(q)
                ooms.append(replace(o, pool=q, task=sym.relabel_uid(o.task, k), tensor=sym.relabel_tensor(o.tensor, k)))
