"""The SimPy engine: executes any Plan on a HardwareSpec and returns a RawRun.

One SimPy process per stream runs its tasks in order; a task waits for its dependencies (events of tasks
on other streams), applies its allocations, runs, then applies its frees. Time is spent in flows on a
FlowNetwork (see ``flows.py``):

- compute: a roofline, ``max(flops / (peak * eff(flops)), hbm_bytes / hbm_bw) + launch overhead``, or,
  where the hardware gives per-operator figures, the layer's operators priced one by one (``costs.compute``),
  pushed as "seconds of work" through the GPU's ``<gpu>.sm`` resource (capacity 1), so concurrent
  kernels of several streams share the GPU (processor sharing);
- copy: bytes through every hop of the route (each link direction, and the link's duplex budget where
  the hardware has one; a resource the route crosses twice is used twice), after the route's latency;
- optimizer: parameters through the host's ``cpu.adam`` resource (capacity = CPU-Adam params/s, shared by
  every rank's optimizer), or, on a GPU, seconds of HBM-bound work through its ``.sm`` resource;
- collective: a ring over the ranks, each rank sending ``(n-1)/n`` of the bytes (twice for all-reduce)
  to the next one over its route.

Where the "GPU" is the host's own cores (``gpu.shares_host``: a CPU-only machine), compute, optimizer
steps and copies all run on the same cores: every such flow is then expressed in seconds of work at its
solo speed (one thread's, at most one core) and also crosses one ``host.cores`` resource (capacity: the
host's cores), so that more flows than cores at once share them (three on two cores: each at 2/3 speed)
instead of running side by side for free, while as many as there are cores run at their solo speed.

Every figure comes from the pure pricing layer ``costs`` (route resources, capacities, shared rates,
copy/collective/compute/optimizer seconds); the engine adds only time: who runs when, and what shares.
The engine knows no policy. A fresh ``simpy.Environment`` is built for every run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import simpy

from costs import (
    CPU_ADAM,
    HOST_CORES,
    Ring,
    RouteResources,
    RouteTable,
    gpu_optimizer_seconds,
    machine_capacities,
    ring,
    sm_resource,
    solo_rate,
    usage,
)
from hardware_models import HardwareSpec, Topology, build_topology
from simulator.errors import PlanError
from simulator.flows import FlowNetwork
from simulator.gc_pause import no_cyclic_gc
from simulator.memory import MemoryTracker
from simulator.opcost import plan_pricer, task_seconds
from simulator.plan import Plan, TaskSpec, validate_plan
from simulator.symmetry import NotSymmetric, Symmetry, expand_pools, find_symmetry
from simulator.symmetry_template import template_symmetry
from simulator.unroll import ConcreteTask, Unroller


class TaskRecord(NamedTuple):
    """When one task of the unrolled plan ran (a NamedTuple: cheap to create by the ten thousand)."""

    uid: str
    id: str
    op: str
    stream: str
    device: str
    start: float
    end: float
    step: int
    segment: int
    iteration: int
    bytes: float
    tags: Mapping[str, Any]
    gpus: tuple[str, ...] = ()   # GPUs the task involves (its device; a copy's ends; a collective's ranks)
    links: tuple[str, ...] = ()  # links its bytes crossed


@dataclass
class RawRun:
    """What one simulation observed; ``simulator.result`` turns it into a Result."""

    records: list[TaskRecord]
    memory: MemoryTracker
    net: FlowNetwork
    link_bytes: dict[str, float]
    link_bytes_by_step: dict[int, dict[str, float]]
    step_end: dict[int, float]
    events: int
    wall_s: float
    topology: Topology
    leaked: list[str] = field(default_factory=list)
    warmup_repeat: int | None = None
    symmetry: Symmetry | None = None          # set when the ranks were simulated as one class
    simulated_plan: Plan | None = None        # the plan the engine ran (the reduced one under symmetry)
    rank_link_bytes_by_step: dict[int, dict[str, float]] = field(default_factory=dict)  # rank 0's, symmetry


def task_gpus(t: ConcreteTask, device: str) -> tuple[str, ...]:
    """The GPUs a task involves: its device; a copy's GPU ends; a collective's ranks."""
    s = t.spec
    if s.op == "collective":
        return tuple(s.ranks)
    if s.op == "copy":
        return tuple(x for x in (s.src, s.dst) if x is not None and x.startswith("gpu"))
    return (device,) if device.startswith("gpu") else ()


def copy_ends(s: TaskSpec) -> tuple[str, str]:
    """A copy's (src, dst); ``validate_plan`` refuses a copy without both."""
    assert s.src is not None and s.dst is not None
    return s.src, s.dst


def collective_kind(s: TaskSpec) -> str:
    """A collective's ``coll``; ``validate_plan`` refuses a collective without one."""
    assert s.coll is not None
    return s.coll


class Engine:
    def __init__(self, plan: Plan, hw: HardwareSpec, topology: Topology | None = None,
                 warmup_repeat: int | None = None, symmetry: Symmetry | None = None):
        self.warmup_repeat = warmup_repeat
        self.hw = hw
        self.topo = topology if topology is not None else build_topology(hw)
        self.sym = symmetry
        if plan.template is not None and symmetry is None:
            raise PlanError(f"a rank template ({plan.template.ranks} ranks) is simulated only as rank 0 standing for "
                            "every rank (simulator.symmetry_template); build the full plan to simulate each rank")
        if symmetry is not None:  # a verified symmetry: rank 0 and the global tasks stand for every rank
            plan = symmetry.reduce(plan)  # (the full plan was validated when its symmetry was found)
        validate_plan(plan, "plan", self.topo.locations)
        self.plan = plan
        self.dtype = plan.workload.config.precision
        self.env = simpy.Environment()
        self.shared_host = hw.gpu.shares_host
        self.net = FlowNetwork(self.env, machine_capacities(hw, self.topo))
        # GPUs whose SMs only one stream ever uses: their kernels never share, so they are plain timeouts
        sm_users: dict[str, set[str]] = defaultdict(set)
        streams = plan.stream_map()
        for seg in plan.segments:
            for t in seg.tasks:
                dev = streams[t.stream].device if t.stream in streams else ""
                if t.op in ("compute", "optimizer") and dev.startswith("gpu"):
                    sm_users[dev].add(t.stream)
        self._exclusive_sm = {g for g, users in sm_users.items() if len(users) == 1 and not self.shared_host}
        capacities = {p.name: p.capacity_bytes for p in self.topo.pools.values()}
        allocators = {p.name: hw.gpu.allocator for p in self.topo.pools.values() if p.kind == "hbm"}
        self.mem = MemoryTracker(capacities, self.topo.pool_of, allocators)
        self.tensors = plan.tensor_map()
        self.streams = plan.stream_map()
        self.link_bytes: dict[str, float] = defaultdict(float)
        self.link_bytes_by_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.rank_bytes_by_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.records: list[TaskRecord] = []
        self.step_end: dict[int, float] = defaultdict(float)
        self.route: RouteTable = RouteTable(self.topo)  # route(src, dst) -> RouteResources, memoised
        self.pricer = plan_pricer(plan, hw, self.dtype)
        self._rings: dict[tuple, _RingCache] = {}
        self._folded_rings: dict[tuple, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        self._ring_runs_by_step: dict[int, dict[tuple, int]] = defaultdict(dict)  # step -> ring -> runs
        # step -> kept collective standing for several -> its per-rank bytes summed (expanded at the end)
        self._coll_bytes_by_step: dict[int, dict[str, float]] = defaultdict(dict)

    # -- execution ------------------------------------------------------------------------------------
    def run(self) -> RawRun:
        wall0 = time.perf_counter()
        tasks = Unroller(self.plan, self.warmup_repeat).unroll()
        done: dict[str, simpy.Event] = {t.uid: self.env.event() for t in tasks}
        self._awaited: set[str] = set()
        for t in tasks:
            for d in t.deps:
                if d not in done:
                    raise PlanError(f"task {t.uid!r}: depends on {d!r}, which the plan never runs")
                self._awaited.add(d)
        self._finished: set[str] = set()
        per_stream: dict[str, list[ConcreteTask]] = defaultdict(list)
        for t in tasks:
            per_stream[t.spec.stream].append(t)
        # initial residency: global tensors with a home
        for ts in self.plan.tensors:
            if ts.home is not None:
                self.mem.alloc(0.0, ts.id, ts.home, ts.bytes, ts.kind, "<initial>", self._mult(ts.id, ts.home))
        for sid in self.streams:
            if per_stream.get(sid):
                self.env.process(self._stream(sid, per_stream[sid], done))
        events = 0
        env = self.env
        # the run allocates ~10 objects per event and frees them itself; the cyclic collector only slows
        # it down (10-30% measured), so it is paused for the run and restored after
        with no_cyclic_gc():
            while True:
                try:
                    env.step()
                except simpy.core.EmptySchedule:
                    break
                events += 1
        unfinished = [t for t in tasks if t.uid not in self._finished]
        if unfinished:
            t = unfinished[0]
            waits = [d for d in t.deps if d not in self._finished]
            raise PlanError(f"deadlock: task {t.uid!r} on stream {t.spec.stream!r} never ran"
                            + (f" (it waits for {waits[0]!r})" if waits else
                               " (an earlier task of its stream never finished)"))
        self._expand_collective_bytes()
        keep = {t.id for t in self.plan.tensors if t.persistent or t.home is not None}
        leaked = [f"{inst}@{loc}" for inst, loc in self.mem.resident if inst.split("[", 1)[0] not in keep]
        by_step = {k: dict(v) for k, v in self.link_bytes_by_step.items()}
        link_bytes = dict(self.link_bytes)
        rank_by_step: dict[int, dict[str, float]] = {}
        sym = self.sym
        if sym is not None:  # the other ranks' figures are images of rank 0's
            rank_by_step = {k: dict(v) for k, v in self.rank_bytes_by_step.items()}
            rank_total: dict[str, float] = defaultdict(float)
            for v in rank_by_step.values():
                for ln, b in v.items():
                    rank_total[ln] += b
            link_bytes = sym.expand_links(rank_total, link_bytes)
            by_step = {k: sym.expand_links(rank_by_step.get(k, {}), by_step.get(k, {}))
                       for k in sorted(set(by_step) | set(rank_by_step))}
            expand_pools(self.mem.pools, self.mem.ooms, sym)
            self._expand_stats()
        return RawRun(self.records, self.mem, self.net, link_bytes, by_step, dict(self.step_end),
                      events, time.perf_counter() - wall0, self.topo, leaked, self.warmup_repeat,
                      sym, self.plan, rank_by_step)

    def _expand_collective_bytes(self) -> None:
        """The global collectives' bytes on their rings' links, and each kept collective's on the links of its
        images' rings (``Symmetry.coll_hop_links``): once per ring and step instead of once per run."""
        for step, runs in self._ring_runs_by_step.items():
            for key, n_runs in runs.items():
                for links, hop_bytes in self._rings[key].hop_bytes:
                    self._count(step, links, hop_bytes * n_runs)
        sym = self.sym
        shape_of: dict[str, int] = {}        # kept collective -> index of its links' shares (alike ones share one)
        shapes: dict[tuple, int] = {}
        for step, by in self._coll_bytes_by_step.items():
            total: dict[int, float] = defaultdict(float)
            for cid, per_rank in by.items():
                if cid not in shape_of:
                    assert sym is not None
                    acc: dict[str, float] = defaultdict(float)
                    for img in sym.coll_orbit[cid]:
                        for ln, share in sym.coll_hop_links[img]:
                            acc[ln] += share
                    shape_of[cid] = shapes.setdefault(tuple(sorted(acc.items())), len(shapes))
                total[shape_of[cid]] += per_rank
            links_of = {i: shape for shape, i in shapes.items()}
            step_bytes = self.link_bytes_by_step[step]
            for i, per_rank in total.items():
                for ln, share in links_of[i]:
                    self.link_bytes[ln] += per_rank * share
                    step_bytes[ln] += per_rank * share

    def _expand_stats(self) -> None:
        """Every member of a resource orbit saw what its representative saw."""
        assert self.sym is not None
        stats = self.net.stats
        for r, rep in self.sym.rep.items():
            if r != rep and rep in stats and r in stats:
                stats[r] = stats[rep]

    def _mult(self, tensor: str, loc: str) -> float:
        if self.sym is None:
            return 1.0
        return self.sym.memory_multiplier(tensor, self.mem.pool(loc))

    def _stream(self, sid: str, tasks: list[ConcreteTask],
                done: dict[str, simpy.Event]) -> Generator[simpy.Event, Any, None]:
        device = self.streams[sid].device
        for t in tasks:
            pending = [done[d] for d in t.deps if d not in self._finished]
            if len(pending) == 1:
                yield pending[0]
            elif pending:
                yield self.env.all_of(pending)
            start = self.env.now
            self._begin(t)
            moved, links = yield from self._execute(t, device)
            self._finish(t)
            end = self.env.now
            self.records.append(TaskRecord(t.uid, t.spec.id, t.spec.op, sid, device, start, end, t.step,
                                           t.segment, t.iteration, moved, t.spec.tags,
                                           task_gpus(t, device), links))
            self.step_end[t.step] = max(self.step_end[t.step], end)
            self._finished.add(t.uid)
            if t.uid in self._awaited:
                done[t.uid].succeed()

    def _kind(self, inst: str) -> tuple[float, str]:
        spec = self.tensors[inst.split("[", 1)[0]]
        return spec.bytes, spec.kind

    def _begin(self, t: ConcreteTask) -> None:
        now = self.env.now
        for inst, loc in t.reads:
            if not self.mem.is_resident(inst, loc):
                raise PlanError(f"task {t.uid!r}: reads tensor {inst!r} on {loc!r}, but it is not there")
        for inst, loc in t.allocs:
            nbytes, kind = self._kind(inst)
            self.mem.alloc(now, inst, loc, nbytes, kind, t.uid, self._mult(inst.split("[", 1)[0], loc))
        if t.spec.op == "copy" and t.tensor is not None:
            src, dst = copy_ends(t.spec)
            if not self.mem.is_resident(t.tensor, src):
                raise PlanError(f"task {t.uid!r}: copies tensor {t.tensor!r} from {src!r}, but it is not there")
            if t.spec.alloc_dst:
                nbytes, kind = self._kind(t.tensor)
                self.mem.alloc(now, t.tensor, dst, nbytes, kind, t.uid, self._mult(t.tensor.split("[", 1)[0], dst))

    def _finish(self, t: ConcreteTask) -> None:
        now = self.env.now
        if t.spec.op == "copy" and t.tensor is not None and t.spec.free_src:
            self.mem.free(now, t.tensor, copy_ends(t.spec)[0], t.uid)
        for inst, loc in t.frees:
            self.mem.free(now, inst, loc, t.uid)

    def _execute(self, t: ConcreteTask, device: str) -> Generator[simpy.Event, Any, tuple[float, tuple[str, ...]]]:
        """Run one task; returns (bytes moved, links crossed)."""
        s = t.spec
        env = self.env
        if s.op == "compute":
            if sm_resource(device) not in self.net.capacity:
                raise PlanError(f"task {t.uid!r}: compute on {device!r}, which is not a GPU")
            yield self._sm(device, task_seconds(self.pricer, s), s.id)
            return 0.0, ()
        if s.op == "optimizer":
            if sm_resource(device) in self.net.capacity:
                yield self._sm(device, gpu_optimizer_seconds(self.hw, s.params), s.id)
            else:
                yield self._host_flow(s.params, (CPU_ADAM,), s.id)
            return 0.0, ()
        if s.op == "copy":
            nbytes = s.bytes if s.bytes > 0 else self._kind(t.tensor)[0] if t.tensor else 0.0
            rt: RouteResources = self.route(*copy_ends(s))
            self._count(t.step, rt.links, nbytes, self._is_rank(s))
            if rt.latency_s > 0:
                yield env.timeout(rt.latency_s)
            yield self._host_flow(nbytes, rt.resources, s.id)
            return nbytes, rt.links
        if s.op == "collective":
            key = (s.ranks, s.bytes, s.coll)
            rc = self._rings.get(key)
            if rc is None:  # a ring over many ranks is worked out once per shape, not per layer and step
                rc = self._rings[key] = _RingCache.of(ring(self.route, s.ranks, s.bytes, collective_kind(s)),
                                                      self.net.capacity if self.shared_host else None)
            if not rc.ring.hops:
                return 0.0, ()
            is_rank = self._is_rank(s)
            sym = self.sym
            if sym is not None and not is_rank and sym.flow_mult.get(s.id, 1.0) > 1.0:
                # this group's collective and its images in the others: counted here, expanded once at the end
                by = self._coll_bytes_by_step[t.step]
                by[s.id] = by.get(s.id, 0.0) + rc.ring.per_rank
            elif is_rank:
                for links, hop_bytes in rc.hop_bytes:  # across nodes, each hop its share (costs.collective)
                    self._count(t.step, links, hop_bytes, True)
            else:  # runs of one ring counted here, its hops' bytes added once at the end
                runs = self._ring_runs_by_step[t.step]
                runs[key] = runs.get(key, 0) + 1
            lat = rc.ring.latency_s
            if lat > 0:
                yield env.timeout(lat)
            # the ring's n transfers move in lockstep: one flow using each resource once per ring hop on it
            # (across nodes, each hop its share of it: costs.collective)
            yield self._start_ring(key, rc, s.id)
            return rc.moved_bytes, rc.links
        return 0.0, ()  # alloc / free / noop: instantaneous

    def _sm(self, device: str, seconds: float, task: str) -> simpy.Event:
        """Seconds of work on a GPU's SMs: shared with concurrent kernels of other streams, if any."""
        if device in self._exclusive_sm:
            return self.env.timeout(seconds)
        return self._host_flow(seconds, (sm_resource(device),), task)

    def _host_flow(self, amount: float, resources: tuple[str, ...], task: str = "") -> simpy.Event:
        """A flow of ``amount`` over ``resources``; on a shared host, as seconds of work at its solo rate
        (the narrowest resource) that also occupy the host's cores."""
        if not self.shared_host:
            return self._start(amount, resources, None, task)
        solo = solo_rate(usage(resources), self.net.capacity)
        return self._start(amount / solo, (*resources, HOST_CORES), [solo] * len(resources) + [1.0], task)

    def _start(self, amount: float, resources: tuple[str, ...], weights: list[float] | None,
               task: str) -> simpy.Event:
        """Start a flow of ``task``; under symmetry, on the quotient network (``Symmetry.fold``), standing
        for every image of the task."""
        if self.sym is None or amount <= 0 or not resources:
            return self.net.start(amount, resources, weights)
        res, w = self.sym.fold(resources, weights, self.sym.multiplicity(task))
        return self.net.start(amount, res, w)

    def _start_ring(self, key: tuple, rc: _RingCache, task: str) -> simpy.Event:
        """A collective's flow (``_start``), its quotient form worked out once per ring and multiplicity."""
        amount = rc.amount
        if self.sym is None or amount <= 0 or not rc.resources:
            return self.net.start(amount, rc.resources, rc.weights)
        mult = self.sym.multiplicity(task)
        got = self._folded_rings.get((key, mult))
        if got is None:
            got = self._folded_rings[(key, mult)] = self.sym.fold(rc.resources, rc.weights, mult)
        return self.net.start(amount, *got)

    def _is_rank(self, s: TaskSpec) -> bool:
        return self.sym is not None and s.id in self.sym.rank_tasks

    def _count(self, step: int, links: tuple[str, ...], nbytes: float, is_rank: bool = False) -> None:
        if is_rank:  # rank 0's bytes: expanded to every rank's links at the end of the run
            by = self.rank_bytes_by_step[step]
            for ln in links:
                by[ln] += nbytes
            return
        for ln in links:
            self.link_bytes[ln] += nbytes
            self.link_bytes_by_step[step][ln] += nbytes


class _RingCache(NamedTuple):
    """A ring and what the engine reads of it on every run of a collective (each O(ranks) to derive): its
    flow's amount, resources and weights (on a shared host: seconds of work at its solo rate that also occupy
    one of the host's cores per rank, ``shared_host_ring``)."""

    ring: Ring
    amount: float
    resources: tuple[str, ...]
    weights: tuple[float, ...] | None
    links: tuple[str, ...]
    moved_bytes: float
    hop_bytes: tuple[tuple[tuple[str, ...], float], ...]

    @classmethod
    def of(cls, rg: Ring, shared_host: Mapping[str, float] | None = None) -> _RingCache:
        """``shared_host``: the network's capacities where the ranks are the host's own cores, else None."""
        amount, res, w = rg.per_rank, rg.resources, rg.weights
        if shared_host is not None and res:
            amount, res, w = shared_host_ring(rg, shared_host)
        return cls(rg, amount, res, w, rg.links, rg.moved_bytes,
                   tuple((h.links, b) for h, b in rg.hop_bytes()))


def shared_host_ring(rg: Ring, capacity: Mapping[str, float]) -> tuple[float, tuple[str, ...], tuple[float, ...]]:
    """A collective between ranks that are one host's cores (a CPU-only machine, ``gpu.shares_host``) as a flow:
    seconds of work at the ring's solo rate over its links, each rank's side of it (one per hop of the ring)
    one thread's work (gloo copies, sums and sends on the host's cores), so the flow also holds one core per
    rank and shares the cores with the ranks' compute, copies and optimizer steps (``Engine._host_flow``).
    ``calibrate --ranks`` times the collective alone, its ranks' threads on as many cores: the solo rate."""
    solo = solo_rate(usage(rg.resources, rg.weights), capacity)
    w = rg.weights if rg.weights is not None else (1.0,) * len(rg.resources)
    return (rg.per_rank / solo, (*rg.resources, HOST_CORES),
            (*(x * solo for x in w), float(len(rg.hops))))


def plan_symmetry(plan: Plan, hw: HardwareSpec, topology: Topology | None = None) -> Symmetry | str:
    """The verified symmetry of ``plan`` on ``hw`` (``simulator.symmetry``), or why it has none."""
    topo = topology if topology is not None else build_topology(hw)
    with no_cyclic_gc():  # the proof's maps are millions of acyclic entries at 1024 GPUs (simulator.gc_pause)
        validate_plan(plan, "plan", topo.locations)
        if plan.template is not None:  # rank 0's tasks only: its symmetry is built, not proved
            try:
                return template_symmetry(plan, topo, RouteTable(topo), machine_capacities(hw, topo),
                                         hw.gpu.shares_host)
            except NotSymmetric as e:
                return str(e)
        return find_symmetry(plan, topo, RouteTable(topo), machine_capacities(hw, topo), hw.gpu.shares_host)


def run_plan(plan: Plan, hw: HardwareSpec, topology: Topology | None = None,
             warmup_repeat: int | None = None, symmetry: Symmetry | None = None) -> RawRun:
    """Simulate the plan's tasks (no extrapolation); ``topology`` overrides the derived one;
    ``warmup_repeat`` caps every segment's repeat count in the warm-up steps; ``symmetry`` (from
    :func:`plan_symmetry` of this plan or of one that differs only in repeat or step counts) simulates
    the ranks as one class."""
    return Engine(plan, hw, topology, warmup_repeat, symmetry).run()
