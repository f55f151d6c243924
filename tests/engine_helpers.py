"""Small hand-made topologies and plans for exact engine tests (round numbers, no latency unless asked).

Every size given to these helpers is in GB (1e9 bytes) and every bandwidth in GB/s, so the expected
event times of a test can be worked out by hand; the helpers convert to bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hardware_models import HardwareSpec, Hop, Link, Pool, Topology, load_hardware
from simulator import Placement, Plan, Ref, Result, Segment, StreamSpec, TaskSpec, TensorSpec
from simulator.invariants import check_invariants
from simulator.plan_workload import PlanWorkload
from simulator.simulate import simulate_plan
from workloads import ModelSpec, WorkloadConfig

GB = 1e9
#: the workload of a hand-made plan (a small GPT; the tasks of such a plan carry no layer tags, so the
#: engine prices them by their own flops and bytes: the model only names what the plan is for)
WORKLOAD = PlanWorkload(ModelSpec("test-gpt", "custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256,
                                  vocab=128, max_pos=64, tied_embeddings=True, mlp="gelu", norm="layernorm",
                                  bias=True, learned_pos=True),
                        WorkloadConfig(micro_batch=1, seq_len=32, precision="bf16"), "test: hand-made plan")


def hw(name: str = "a100", **host: float) -> HardwareSpec:
    """A preset with the kernel launch overhead zeroed, tensors charged their exact bytes (the caching
    allocator's rounding is tested in test_memory_accounting.py), and host fields overridden, e.g. the Adam rate."""
    spec = load_hardware(name)
    spec = replace(spec, gpu=replace(spec.gpu, launch_overhead_s=0.0, allocator="exact"))
    if host:
        spec = replace(spec, host=replace(spec.host, **host))
    return spec


def topology(pools: Mapping[str, float], links: Sequence[Link],
             routes: Mapping[tuple[str, str], Sequence[tuple[str, bool]]]) -> Topology:
    """Locations = pools (capacity in GB); ``routes`` maps (src, dst) to [(link, forward), ...]."""
    table = {k: tuple(Hop(n, f) for n, f in v) for k, v in routes.items()}
    return Topology(
        locations=tuple(pools), pool_of={p: p for p in pools},
        pools={p: Pool(p, "hbm" if p.startswith("gpu") else "dram", c * GB, {}, c * GB) for p, c in pools.items()},
        links={ln.name: ln for ln in links}, routes=table)


def link(name: str, fwd: float, rev: float | None = None, duplex: float | None = None,
         latency: float = 0.0, kind: str = "pcie") -> Link:
    """A link of ``fwd``/``rev`` GB/s (rev defaults to fwd), an optional duplex cap in GB/s."""
    return Link(name, kind, fwd * GB, (rev if rev is not None else fwd) * GB,
                duplex * GB if duplex is not None else None, latency)


def both_ways(routes: Mapping[tuple[str, str], Sequence[tuple[str, bool]]]
              ) -> dict[tuple[str, str], tuple[tuple[str, bool], ...]]:
    """``routes`` plus every route reversed (hops in reverse order, each crossed the other way)."""
    out = {k: tuple(v) for k, v in routes.items()}
    for (a, b), hops in routes.items():
        out.setdefault((b, a), tuple((n, not f) for n, f in reversed(hops)))
    return out


def one_link(bw: float = 10.0, duplex: float | None = None, latency: float = 0.0,
             gpu_gb: float = 80.0) -> Topology:
    """gpu0 <-> cpu over one link ``l`` (forward = cpu -> gpu0)."""
    return topology({"gpu0": gpu_gb, "cpu": 1000.0}, [link("l", bw, duplex=duplex, latency=latency)],
                    both_ways({("cpu", "gpu0"): [("l", True)]}))


def switched(gpu_bw: Sequence[float] = (10.0, 10.0), uplink_bw: float = 10.0) -> Topology:
    """gpu0, gpu1 behind one switch: gpu{i} -> cpu = [g{i} rev, up rev]; gpu0 -> gpu1 = [g0 rev, g1 fwd]."""
    links = [link(f"g{i}", bw) for i, bw in enumerate(gpu_bw)] + [link("up", uplink_bw)]
    routes = {("cpu", "gpu0"): [("up", True), ("g0", True)], ("cpu", "gpu1"): [("up", True), ("g1", True)],
              ("gpu0", "gpu1"): [("g0", False), ("g1", True)]}
    return topology({"gpu0": 80.0, "gpu1": 80.0, "cpu": 1000.0}, links, both_ways(routes))


def ring(n: int = 4, bw: float = 100.0, latency: float = 0.0) -> Topology:
    """n GPUs on an NVSwitch-like fabric: gpu_i -> gpu_j = [nv{i} rev, nv{j} fwd], full duplex."""
    gpus = [f"gpu{i}" for i in range(n)]
    links = [link(f"nv{i}", bw, latency=latency, kind="nvlink") for i in range(n)]
    routes = {(a, b): [(f"nv{i}", False), (f"nv{j}", True)]
              for i, a in enumerate(gpus) for j, b in enumerate(gpus) if i != j}
    return topology({**{g: 80.0 for g in gpus}, "cpu": 1000.0}, links, routes)


def plan(tasks: Sequence[TaskSpec], streams: Sequence[tuple[str, str, str]],
         tensors: Sequence[TensorSpec] = (), steps: int = 1,
         segments: Sequence[tuple[str, int, Sequence[TaskSpec]]] | None = None) -> Plan:
    """A plan of one segment ``main`` (repeated once) holding ``tasks``, or of the given ``segments``."""
    segs = (tuple(Segment(n, r, tuple(ts)) for n, r, ts in segments) if segments is not None
            else (Segment("main", 1, tuple(tasks)),))
    return Plan(policy="test", knobs={}, hardware=hw(), workload=WORKLOAD, tensors=tuple(tensors),
                streams=tuple(StreamSpec(*s) for s in streams), segments=segs,
                steps=steps, metrics={"n_gpus": 1.0})


def refs(deps: Sequence[str]) -> tuple[Ref, ...]:
    return tuple(Ref.parse(d, "test") for d in deps)


def copy(tid: str, stream: str, src: str, dst: str, gbytes: float, deps: Sequence[str] = (),
         **fields: object) -> TaskSpec:
    return TaskSpec(tid, "copy", stream, refs(deps), bytes=gbytes * GB, src=src, dst=dst, **fields)  # type: ignore[arg-type]


def compute(tid: str, stream: str, flops: float = 0.0, deps: Sequence[str] = (), hbm_gb: float = 0.0,
            **fields: object) -> TaskSpec:
    return TaskSpec(tid, "compute", stream, refs(deps), flops=flops, hbm_bytes=hbm_gb * GB,
                    **fields)  # type: ignore[arg-type]


def noop(tid: str, stream: str, deps: Sequence[str] = (), **fields: object) -> TaskSpec:
    return TaskSpec(tid, "noop", stream, refs(deps), **fields)  # type: ignore[arg-type]


def place(tensor: str, loc: str) -> Placement:
    return Placement(Ref.parse(tensor, "test"), loc)


def tensor(tid: str, gbytes: float, kind: str = "activation", **fields: object) -> TensorSpec:
    return TensorSpec(tid, gbytes * GB, kind, **fields)  # type: ignore[arg-type]


def run(p: Plan, topo: Topology, spec: HardwareSpec | None = None, **kw: object) -> Result:
    """Simulate and assert the run's invariants hold (design.md: invariants on every simulated run)."""
    result = simulate_plan(p, spec if spec is not None else hw(), topology=topo, **kw)  # type: ignore[arg-type]
    assert check_invariants(result) == []
    return result


def log(result: Result, uid: bool = False) -> list[tuple[str, float, float]]:
    """(task, start, end) of every record, rounded to 1e-9 s, ordered by end, start, name."""
    return sorted(((r.uid if uid else r.id, round(r.start, 9), round(r.end, 9)) for r in result.records),
                  key=lambda x: (x[2], x[1], x[0]))


def rates(result: Result, resource: str) -> list[tuple[float, float]]:
    """A resource's total rate as a step function: (time, GB/s) from that time on, one entry per time
    (several flows starting at one instant may log intermediate totals at that instant)."""
    out: list[tuple[float, float]] = []
    for t, r in result.link_rate_log.get(resource, ()):
        point = (round(t, 9), round(r / GB, 9))
        if out and out[-1][0] == point[0]:
            out[-1] = point
        elif not out or out[-1][1] != point[1]:
            out.append(point)
    return out
