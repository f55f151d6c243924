"""Laws of the engine (design.md, "Testing habits"), checked with Hypothesis on random small plans.

A random plan is a random DAG of compute, copy, optimizer and collective tasks over the streams of a
hand-made 2-GPU machine, repeated 1-3 times per step over 1-2 steps, with random sizes, random ``@1`` and
``^1`` dependencies, iteration-scoped activations and tensor moves. The *shared* machine puts both GPUs
behind one switch uplink, with optional duplex budgets and a second compute stream on gpu0; the
*private* machine gives every stream its own link direction and every resource a single stream, so no
two flows ever share anything.

The laws:
(a) scaling every bandwidth and FLOP rate by k and every latency and launch overhead by 1/k divides every
    time by k;
(b) without sharing, raising any one link's bandwidth never lengthens the run (with sharing it can: see
    ``test_more_bandwidth_can_slow_a_plan_when_links_are_shared``);
(c) no task is faster than it would be alone, and the run is at least as long as the critical path of
    those alone-durations and as the busiest resource's work / capacity;
(d) bytes are conserved: copy records carry the planned bytes, the bytes counted per link are the bytes
    routed over it, and the integral of each link direction's rate is the bytes that crossed it;
(e) check_invariants finds nothing; and each of its checks can fire on a doctored result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from engine_helpers import GB, both_ways, copy, hw, link, noop, place, plan, refs, tensor, topology
from hypothesis import given, settings
from hypothesis import strategies as st

from costs import compute_seconds
from hardware_models import HardwareSpec, Link, Topology
from simulator import Plan, Result, TaskSpec
from simulator.invariants import check_invariants
from simulator.simulate import simulate_plan
from simulator.unroll import ConcreteTask, Unroller

LAWS = settings(max_examples=30, deadline=None)
REL = 1e-9

# stream id -> (device, kind, op, (src, dst) of a copy)
SHARED_STREAMS: dict[str, tuple[str, str, str, tuple[str, str] | None]] = {
    "gpu0.compute": ("gpu0", "compute", "compute", None),
    "gpu0.side": ("gpu0", "compute", "compute", None),
    "gpu1.compute": ("gpu1", "compute", "compute", None),
    "gpu0.h2d": ("gpu0", "h2d", "copy", ("cpu", "gpu0")),
    "gpu0.d2h": ("gpu0", "d2h", "copy", ("gpu0", "cpu")),
    "gpu1.h2d": ("gpu1", "h2d", "copy", ("cpu", "gpu1")),
    "gpu1.d2h": ("gpu1", "d2h", "copy", ("gpu1", "cpu")),
    "gpu0.p2p": ("gpu0", "copy", "copy", ("gpu0", "gpu1")),
    "cpu.optim": ("cpu", "optim", "optimizer", None),
    "gpu0.comm": ("gpu0", "comm", "collective", None),
}
PRIVATE_STREAMS = {k: v for k, v in SHARED_STREAMS.items() if k not in ("gpu0.side", "gpu0.comm")}


@dataclass(frozen=True)
class Machine:
    """A hand-made topology's parameters (GB/s, seconds), so that a law can rebuild it changed."""

    shared: bool
    bw: tuple[tuple[float, float], ...]       # (fwd, rev) per link, in names() order
    duplex: tuple[float | None, ...]
    latency: tuple[float, ...]
    gpu_gb: float

    def names(self) -> tuple[str, ...]:
        return ("g0", "g1", "up") if self.shared else ("g0", "g1", "p")

    def links(self) -> list[Link]:
        return [link(n, f, r, d, lat) for n, (f, r), d, lat in zip(self.names(), self.bw, self.duplex,
                                                                    self.latency, strict=True)]

    def topology(self) -> Topology:
        if self.shared:  # both GPUs behind one switch (uplink "up"); p2p through the switch
            routes = {("cpu", "gpu0"): [("up", True), ("g0", True)], ("cpu", "gpu1"): [("up", True), ("g1", True)],
                      ("gpu0", "gpu1"): [("g0", False), ("g1", True)]}
        else:  # every (src, dst) pair a stream uses has a link direction of its own
            routes = {("cpu", "gpu0"): [("g0", True)], ("cpu", "gpu1"): [("g1", True)],
                      ("gpu0", "gpu1"): [("p", True)]}
        return topology({"gpu0": self.gpu_gb, "gpu1": self.gpu_gb, "cpu": 1000.0}, self.links(), both_ways(routes))

    def scaled(self, k: float) -> Machine:
        return replace(self, bw=tuple((f * k, r * k) for f, r in self.bw),
                       duplex=tuple(d * k if d is not None else None for d in self.duplex),
                       latency=tuple(lat / k for lat in self.latency))


@dataclass(frozen=True)
class Case:
    plan: Plan
    machine: Machine

    @property
    def topo(self) -> Topology:
        return self.machine.topology()


def scaled_hw(spec: HardwareSpec, k: float) -> HardwareSpec:
    gpu = replace(spec.gpu, peak_flops={d: v * k for d, v in spec.gpu.peak_flops.items()},
                  hbm_bw=spec.gpu.hbm_bw * k, launch_overhead_s=spec.gpu.launch_overhead_s / k)
    return replace(spec, gpu=gpu, host=replace(spec.host, optimizer_params_per_s=spec.host.optimizer_params_per_s * k))


HW = hw("a100")                       # no launch overhead: round numbers
HW_LAUNCH = replace(HW, gpu=replace(HW.gpu, launch_overhead_s=2e-5))  # a visible one, for scaling


# -- random plans ----------------------------------------------------------------------------------------------------
def _log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(0.0, 1.0).map(lambda u: lo * (hi / lo) ** u)


@st.composite
def machines(draw: st.DrawFn, shared: bool) -> Machine:
    bw = tuple((draw(st.floats(1.0, 50.0)), draw(st.floats(1.0, 50.0))) for _ in range(3))
    duplex = tuple((max(f, r) + draw(st.floats(0.0, 0.9)) * min(f, r)) if shared and draw(st.booleans()) else None
                   for f, r in bw)
    latency = tuple(draw(st.sampled_from([0.0, 1e-5, 3e-4])) for _ in range(3))
    return Machine(shared, bw, duplex, latency, draw(st.sampled_from([2.0, 1000.0])))


@st.composite
def cases(draw: st.DrawFn, shared: bool = True, max_steps: int = 2) -> Case:
    streams = SHARED_STREAMS if shared else PRIVATE_STREAMS
    names = sorted(streams)
    n = draw(st.integers(1, 9))
    repeat = draw(st.integers(1, 3))
    steps = draw(st.integers(1, max_steps))
    tasks: list[TaskSpec] = []
    tensors = []
    on: list[str] = [draw(st.sampled_from(names)) for _ in range(n)]
    frees_at: dict[int, list[str]] = defaultdict(list)  # task index -> activations it frees
    for i, sid in enumerate(on):
        device, _kind, op, route = streams[sid]
        tid = f"t{i}"
        deps = sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=2)))) if i else []
        dep_names = [f"t{j}" for j in deps]
        if repeat > 1 and draw(st.booleans()):
            dep_names.append(f"t{draw(st.integers(0, n - 1))}@1")
        if steps > 1 and draw(st.booleans()):
            dep_names.append(f"t{draw(st.integers(0, n - 1))}^1")
        fields: dict[str, object] = {}
        if op == "compute":
            if draw(st.booleans()):
                fields["flops"] = draw(_log_uniform(1e9, 1e14))
            else:
                fields["hbm_bytes"] = draw(_log_uniform(0.01, 20.0)) * GB
            if draw(st.booleans()):  # an activation, freed by this task or a later one of its stream
                act = f"act{i}"
                tensors.append(tensor(act, draw(st.floats(0.1, 1.5)), scope="iteration"))
                fields["allocs"] = (place(act, device),)
                later = [j for j in range(i, n) if on[j] == sid]
                frees_at[draw(st.sampled_from(later))].append(act)
            tasks.append(TaskSpec(tid, "compute", sid, refs(dep_names), **fields))  # type: ignore[arg-type]
        elif op == "copy":
            assert route is not None
            src, dst = route
            if src == "cpu" and draw(st.booleans()):  # move a parameter in, drop it when done
                w = f"w{i}"
                tensors.append(tensor(w, draw(st.floats(0.05, 5.0)), "param16", home="cpu", persistent=True))
                tasks.append(TaskSpec(tid, "copy", sid, refs(dep_names), tensor=refs([w])[0], src=src, dst=dst,
                                      alloc_dst=True, frees=(place(w, dst),)))
            else:
                tasks.append(copy(tid, sid, src, dst, draw(_log_uniform(0.05, 20.0)), dep_names))
        elif op == "optimizer":
            tasks.append(TaskSpec(tid, "optimizer", sid, refs(dep_names), params=draw(_log_uniform(1e8, 1e10))))
        else:
            tasks.append(TaskSpec(tid, "collective", sid, refs(dep_names), bytes=draw(_log_uniform(0.1, 10.0)) * GB,
                                  coll=draw(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"])),
                                  ranks=("gpu0", "gpu1")))
    for i, acts in frees_at.items():
        tasks[i] = replace(tasks[i], frees=tasks[i].frees + tuple(place(a, on[i].split(".")[0]) for a in acts))
    if draw(st.booleans()):  # a final barrier
        tasks.append(noop("end", names[0], deps=[t.id for t in tasks]))
    used = {t.stream for t in tasks}
    stream_specs = [(s, streams[s][0], streams[s][1]) for s in names if s in used]
    p = plan([], stream_specs, tensors=tensors, steps=steps, segments=[("main", repeat, tasks)])
    return Case(p, draw(machines(shared)))


def sim(case: Case, spec: HardwareSpec = HW, machine: Machine | None = None, **kw: object) -> Result:
    topo = (machine or case.machine).topology()
    return simulate_plan(case.plan, spec, topology=topo, **kw)  # type: ignore[arg-type]


# -- what a task costs when it is alone ------------------------------------------------------------------------------
Flow = list[tuple[str, float]]  # (resource, amount of the resource's unit)


def _route(topo: Topology, src: str, dst: str) -> tuple[list[tuple[str, float]], float]:
    """(resource, capacity) of every resource a src -> dst copy crosses, and the route's latency."""
    out: list[tuple[str, float]] = []
    lat = 0.0
    for h in topo.route(src, dst):
        ln = topo.links[h.link]
        out.append((f"{h.link}:{'fwd' if h.forward else 'rev'}", ln.bw(h.forward)))
        if ln.duplex_bw is not None:
            out.append((f"{h.link}:duplex", ln.duplex_bw))
        lat += ln.latency_s
    return out, lat


def alone(t: ConcreteTask, plan_: Plan, topo: Topology, spec: HardwareSpec) -> tuple[float, Flow]:
    """(duration of ``t`` with the machine to itself, the work it puts on each resource)."""
    s = t.spec
    if s.op == "compute":
        work = compute_seconds(spec, s.flops, s.hbm_bytes, "bf16") + spec.gpu.launch_overhead_s
        return work, [(f"{s.stream.split('.')[0]}.sm", work)]
    if s.op == "optimizer":
        return s.params / spec.host.optimizer_params_per_s, [("cpu.adam", s.params)]
    if s.op == "copy":
        nbytes = s.bytes if s.bytes > 0 else plan_.tensor_map()[s.tensor.id].bytes  # type: ignore[union-attr]
        res, lat = _route(topo, s.src, s.dst)  # type: ignore[arg-type]
        return lat + nbytes / min(c for _, c in res), [(r, nbytes) for r, _ in res]
    if s.op == "collective":
        n = len(s.ranks)
        factor = 2 if s.coll == "all_reduce" else 1
        per_rank = s.bytes * (n - 1) / n * factor
        hops = [_route(topo, r, s.ranks[(i + 1) % n]) for i, r in enumerate(s.ranks)]
        lat = max(h[1] for h in hops) * (n - 1) * factor
        use: dict[str, float] = defaultdict(float)
        caps: dict[str, float] = {}
        for res, _ in hops:
            for r, c in res:
                use[r] += per_rank
                caps[r] = c
        return lat + max(use[r] / caps[r] for r in use), list(use.items())
    return 0.0, []


def capacities(topo: Topology, spec: HardwareSpec) -> dict[str, float]:
    caps = {"gpu0.sm": 1.0, "gpu1.sm": 1.0, "cpu.adam": spec.host.optimizer_params_per_s}
    for name, ln in topo.links.items():
        caps[f"{name}:fwd"], caps[f"{name}:rev"] = ln.bw_fwd, ln.bw_rev
        if ln.duplex_bw is not None:
            caps[f"{name}:duplex"] = ln.duplex_bw
    return caps


def critical_path(tasks: list[ConcreteTask], durations: dict[str, float]) -> float:
    """Longest path through deps and stream order (the unrolled order is a topological order)."""
    finish: dict[str, float] = {}
    last_on: dict[str, str] = {}
    for t in tasks:
        before = [finish[d] for d in t.deps]
        if t.spec.stream in last_on:
            before.append(finish[last_on[t.spec.stream]])
        finish[t.uid] = max(before, default=0.0) + durations[t.uid]
        last_on[t.spec.stream] = t.uid
    return max(finish.values(), default=0.0)


def approx(x: float) -> object:
    return pytest.approx(x, rel=REL, abs=1e-12)


# -- (a) scaling -----------------------------------------------------------------------------------------------------
@LAWS
@given(case=cases(), k=st.sampled_from([2.0, 0.5, 3.0, 10.0, 0.37]))
def test_scaling_every_rate_by_k_divides_every_time_by_k(case: Case, k: float) -> None:
    base = sim(case, HW_LAUNCH)
    fast = sim(case, scaled_hw(HW_LAUNCH, k), case.machine.scaled(k))
    assert fast.step_time_s * k == approx(base.step_time_s)
    times = {r.uid: (r.start, r.end) for r in base.records}
    assert {r.uid: (r.start * k, r.end * k) for r in fast.records} == {
        u: (approx(a), approx(b)) for u, (a, b) in times.items()}
    assert fast.link_bytes == {ln: approx(b) for ln, b in base.link_bytes.items()}


# -- (b) more bandwidth never slows a plan without sharing -----------------------------------------------------------
@LAWS
@given(case=cases(shared=False), which=st.integers(0, 2), direction=st.sampled_from(["fwd", "rev", "both"]),
       factor=st.floats(1.0, 8.0))
def test_without_shared_links_more_bandwidth_never_slows_a_plan(case: Case, which: int, direction: str,
                                                                 factor: float) -> None:
    bw = list(case.machine.bw)
    f, r = bw[which]
    bw[which] = (f * factor if direction != "rev" else f, r * factor if direction != "fwd" else r)
    faster = replace(case.machine, bw=tuple(bw))
    for kw in ({"extrapolate": False}, {}):
        before, after = sim(case, **kw), sim(case, machine=faster, **kw)  # type: ignore[arg-type]
        assert before.simulated_plan is not None and after.simulated_plan is not None
        # the whole-run length is only comparable when both simulated the same unrolled plan (the
        # steady-state shortcuts pick repeat counts, warm-up length and extra steps from the timings)
        same_run = (before.simulated_plan.steps == after.simulated_plan.steps
                    and before.warmup_repeat == after.warmup_repeat
                    and [x.repeat for x in before.simulated_plan.segments]
                    == [x.repeat for x in after.simulated_plan.segments])
        if same_run:
            end_before = max(r.end for r in before.records)
            end_after = max(r.end for r in after.records)
            assert end_after <= end_before * (1 + REL) + 1e-12
        if case.plan.steps == 1:
            assert after.step_time_s <= before.step_time_s * (1 + REL) + 1e-12


def test_more_bandwidth_can_slow_a_plan_when_links_are_shared() -> None:
    # a (10 GB on the shared link L) feeds a 10 s kernel; b1 (10 GB on M) then b2 (10 GB on L). With M slow,
    # b2 starts after a is done; with M fast, b2 joins L while a is still on it and delays the kernel.
    def run_with(m_bw: float) -> float:
        topo = topology({"gpu0": 80.0, "gpu1": 80.0, "cpu": 1000.0}, [link("L", 10), link("M", m_bw)],
                        both_ways({("cpu", "gpu0"): [("L", True)], ("cpu", "gpu1"): [("M", True)],
                                   ("gpu1", "gpu0"): [("L", True)]}))
        p = plan([copy("a", "gpu0.h2d", "cpu", "gpu0", 10),
                  TaskSpec("k", "compute", "gpu0.compute", refs(["a"]), hbm_bytes=10 * HW.gpu.hbm_bw),
                  copy("b1", "gpu1.h2d", "cpu", "gpu1", 10), copy("b2", "gpu1.h2d", "gpu1", "gpu0", 10)],
                 [("gpu0.h2d", "gpu0", "h2d"), ("gpu0.compute", "gpu0", "compute"), ("gpu1.h2d", "gpu1", "h2d")])
        res = simulate_plan(p, HW, topology=topo)
        assert check_invariants(res) == []
        return res.step_time_s

    assert run_with(5.0) == pytest.approx(11.0, rel=1e-12)   # a alone on L: 1 s, then the kernel
    assert run_with(20.0) == pytest.approx(11.5, rel=1e-12)  # b2 from 0.5 s halves a's rate: a ends at 1.5


# -- (c) lower bounds ------------------------------------------------------------------------------------------------
@LAWS
@given(case=cases())
def test_no_task_beats_its_alone_time_and_the_run_beats_no_bound(case: Case) -> None:
    res = sim(case, HW_LAUNCH, extrapolate=False)
    topo = case.topo
    tasks = Unroller(case.plan).unroll()
    rec = {r.uid: r for r in res.records}
    durations: dict[str, float] = {}
    work: dict[str, float] = defaultdict(float)
    for t in tasks:
        d, flows = alone(t, case.plan, topo, HW_LAUNCH)
        durations[t.uid] = d
        for r, amount in flows:
            work[r] += amount
        assert rec[t.uid].end - rec[t.uid].start >= d * (1 - REL) - 1e-12, t.uid
    makespan = max(r.end for r in res.records)
    assert makespan >= critical_path(tasks, durations) * (1 - REL) - 1e-12
    caps = capacities(topo, HW_LAUNCH)
    busiest = max((w / caps[r] for r, w in work.items()), default=0.0)
    assert makespan >= busiest * (1 - REL) - 1e-12
    if case.plan.steps == 1:  # the measured step is the whole run (with 2 steps, tasks of the measured step
        # may run before the previous step ends, so its busy times are not bounded by the period)
        assert res.step_time_s == pytest.approx(makespan, rel=REL)
        assert res.compute_busy_s <= res.step_time_s * (1 + REL) + 1e-12
        for name, busy in (*res.link_busy_s.items(), *res.stream_busy_s.items()):
            assert busy <= res.step_time_s * (1 + REL) + 1e-12, name


# -- (d) bytes are conserved -----------------------------------------------------------------------------------------
def planned_link_bytes(case: Case, tasks: list[ConcreteTask], step: int | None) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    topo = case.topo
    for t in tasks:
        if step is not None and t.step != step:
            continue
        s = t.spec
        if s.op == "copy":
            nbytes = s.bytes if s.bytes > 0 else case.plan.tensor_map()[s.tensor.id].bytes  # type: ignore[union-attr]
            for h in topo.route(s.src, s.dst):  # type: ignore[arg-type]
                out[h.link] += nbytes
        elif s.op == "collective":
            per_rank = s.bytes / 2 * (2 if s.coll == "all_reduce" else 1)
            for i, r in enumerate(s.ranks):
                for h in topo.route(r, s.ranks[(i + 1) % len(s.ranks)]):
                    out[h.link] += per_rank
    return dict(out)


def integrated_bytes(res: Result) -> dict[str, float]:
    """Bytes through every link direction: the integral of its logged rate."""
    out: dict[str, float] = {}
    for r, log in res.link_rate_log.items():
        if not (r.endswith(":fwd") or r.endswith(":rev")):
            continue
        total = 0.0
        for (t0, rate), (t1, _) in zip(log, log[1:], strict=False):
            total += rate * (t1 - t0)
        assert not log or log[-1][1] == pytest.approx(0.0, abs=1e-3), r  # every flow ended
        out[r] = total
    return out


@LAWS
@given(case=cases())
def test_bytes_are_conserved(case: Case) -> None:
    res = sim(case, extrapolate=False)
    simulated = res.simulated_plan  # may hold more steps than the case (see simulate_plan)
    assert simulated is not None
    tasks = Unroller(simulated, res.warmup_repeat).unroll()
    tensors = case.plan.tensor_map()
    planned = 0.0
    for t in tasks:
        if t.spec.op == "copy":
            planned += t.spec.bytes if t.spec.bytes > 0 else tensors[t.spec.tensor.id].bytes  # type: ignore[union-attr]
    assert sum(r.bytes for r in res.records if r.op == "copy") == approx(planned)
    assert res.link_bytes == {ln: approx(b) for ln, b in planned_link_bytes(case, tasks, res.measured_step).items()}
    # every byte routed over a link direction went through it at the logged rates
    per_direction: dict[str, float] = defaultdict(float)
    topo = case.topo
    for t in tasks:
        s = t.spec
        if s.op == "copy":
            nbytes = s.bytes if s.bytes > 0 else tensors[s.tensor.id].bytes  # type: ignore[union-attr]
            for h in topo.route(s.src, s.dst):  # type: ignore[arg-type]
                per_direction[f"{h.link}:{'fwd' if h.forward else 'rev'}"] += nbytes
        elif s.op == "collective":
            per_rank = s.bytes / 2 * (2 if s.coll == "all_reduce" else 1)
            for i, r in enumerate(s.ranks):
                for h in topo.route(r, s.ranks[(i + 1) % 2]):
                    per_direction[f"{h.link}:{'fwd' if h.forward else 'rev'}"] += per_rank
    integrated = integrated_bytes(res)
    for r, b in integrated.items():
        assert b == pytest.approx(per_direction.get(r, 0.0), rel=1e-6, abs=1.0), r


# -- (e) invariants --------------------------------------------------------------------------------------------------
@LAWS
@given(case=cases())
def test_every_random_plan_satisfies_the_invariants(case: Case) -> None:
    for kw in ({}, {"extrapolate": False}):
        res = sim(case, HW_LAUNCH, **kw)  # type: ignore[arg-type]
        assert check_invariants(res) == []
        fits = all(peak <= res.capacity_bytes[pool] + 1e-3 for pool, peak in res.peak_bytes.items())
        assert res.feasible == fits


@LAWS
@given(case=cases(shared=False))
def test_the_private_machine_shares_nothing(case: Case) -> None:
    # the premise of law (b): every task of the private machine runs exactly as long as it would alone
    res = sim(case, extrapolate=False)
    rec = {r.uid: r for r in res.records}
    for t in Unroller(case.plan).unroll():
        d, _ = alone(t, case.plan, case.topo, HW)
        assert rec[t.uid].end - rec[t.uid].start == pytest.approx(d, rel=REL, abs=1e-12), t.uid


# -- every invariant check can fire ----------------------------------------------------------------------------------
def _sound() -> Result:
    p = plan([copy("h", "gpu0.h2d", "cpu", "gpu0", 10),
              TaskSpec("c", "compute", "gpu0.compute", refs(["h"]), hbm_bytes=HW.gpu.hbm_bw,
                       allocs=(place("a", "gpu0"),), frees=(place("a", "gpu0"),)),
              copy("d", "gpu0.h2d", "gpu0", "cpu", 5, deps=["c"])],
             [("gpu0.h2d", "gpu0", "h2d"), ("gpu0.compute", "gpu0", "compute")], tensors=[tensor("a", 1)])
    topo = topology({"gpu0": 80.0, "cpu": 1000.0}, [link("l", 10)], both_ways({("cpu", "gpu0"): [("l", True)]}))
    res = simulate_plan(p, HW, topology=topo)
    assert check_invariants(res) == []
    assert [(r.id, r.start, r.end) for r in res.records] == [("h", 0, 1.0), ("c", 1.0, 2.0), ("d", 2.0, 2.5)]
    return res


def _records(res: Result, **changes: dict[str, float]) -> Result:
    """``res`` with some task records changed (by task id: field -> value)."""
    return replace(res, records=tuple(r._replace(**changes[r.id]) if r.id in changes else r  # type: ignore[arg-type]
                                      for r in res.records))


@pytest.mark.parametrize(("doctor", "needle"), [
    (lambda r: replace(r, min_used_bytes={**r.min_used_bytes, "gpu0": -5e9}), "pool gpu0: usage went negative"),
    (lambda r: replace(r, peak_bytes={**r.peak_bytes, "gpu0": 2 * r.capacity_bytes["gpu0"]}),
     "pool gpu0: peak"),
    (lambda r: replace(r, feasible=False), "feasible flag disagrees"),
    (lambda r: replace(r, leaked=("a[s0]@gpu0",)), "tensor a[s0]@gpu0 is still allocated"),
    (lambda r: replace(r, records=r.records[:-1]), "task d[s0.0] never ran"),
    (lambda r: replace(r, records=r.records[:-1]), "3 tasks planned, 2 ran"),
    (lambda r: _records(r, d={"end": 1.0}), "task d[s0.0] ends before it starts"),
    (lambda r: _records(r, c={"start": 0.5}), "task c[s0.0] starts at 0.5 before its dependency h[s0.0] ends at 1"),
    (lambda r: _records(r, d={"bytes": 1.0}), "bytes copied 10000000001 != bytes planned 15000000000"),
    (lambda r: _records(r, d={"start": 0.5, "end": 1.0}), "stream gpu0.h2d: d[s0.0] starts before h[s0.0] ends"),
    (lambda r: replace(r, stream_busy_s={**r.stream_busy_s, "gpu0.compute": 9.0}), "stream gpu0.compute: busy 9 s"),
    # a link that moved more than it can in a step (by its busy time or by its bytes)
    (lambda r: replace(r, link_busy_s={"l": 9.0}, link_bytes={"l": 1e12}), "link l: "),
])
def test_each_invariant_check_can_fire(doctor: Callable[[Result], Result], needle: str) -> None:
    bad = check_invariants(doctor(_sound()))
    assert any(needle in v for v in bad), bad


def test_a_real_oom_is_not_an_invariant_violation_but_a_hidden_one_is() -> None:
    res = _sound()
    over = replace(res, peak_bytes={**res.peak_bytes, "gpu0": 90e9})
    assert any("above capacity without an OOM verdict" in v for v in check_invariants(over))
    from simulator import Oom

    oom = Oom("gpu0", 1.0, "c[s0.0]", "a", 1e9, 0.0, 80e9, 90e9)
    assert check_invariants(replace(over, ooms=(oom,), oom=oom, feasible=False)) == []
