"""Small hand-made topologies and plans for exact engine tests (round numbers, no latency)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hardware_models import Hop, Link, Pool, Topology, load_hardware
from simulator import Placement, Plan, Ref, Segment, StreamSpec, TaskSpec, TensorSpec

GB = 1e9


def hw(name: str = "a100"):  # noqa: ANN201
    spec = load_hardware(name)
    return replace(spec, gpu=replace(spec.gpu, launch_overhead_s=0.0))


def topology(pools: Mapping[str, float], links: Sequence[Link],
             routes: Mapping[tuple[str, str], Sequence[tuple[str, bool]]]) -> Topology:
    table = {k: tuple(Hop(n, f) for n, f in v) for k, v in routes.items()}
    return Topology(
        locations=tuple(pools), pool_of={p: p for p in pools},
        pools={p: Pool(p, "hbm" if p.startswith("gpu") else "dram", c * GB, {}, c * GB) for p, c in pools.items()},
        links={ln.name: ln for ln in links}, routes=table)


def link(name: str, fwd: float, rev: float | None = None, duplex: float | None = None) -> Link:
    return Link(name, "pcie", fwd * GB, (rev if rev is not None else fwd) * GB,
                duplex * GB if duplex is not None else None, 0.0)


def plan(tasks: Sequence[TaskSpec], streams: Sequence[tuple[str, str, str]],
         tensors: Sequence[TensorSpec] = (), steps: int = 1) -> Plan:
    return Plan(policy="test", knobs={}, hardware={}, workload={"precision": "bf16"}, tensors=tuple(tensors),
                streams=tuple(StreamSpec(*s) for s in streams), segments=(Segment("main", 1, tuple(tasks)),),
                steps=steps, metrics={"n_gpus": 1.0})


def copy(tid: str, stream: str, src: str, dst: str, gbytes: float, deps: Sequence[str] = ()) -> TaskSpec:
    return TaskSpec(tid, "copy", stream, tuple(Ref(d) for d in deps), bytes=gbytes * GB, src=src, dst=dst)


def place(tensor: str, loc: str) -> Placement:
    return Placement(Ref(tensor), loc)


def log(result) -> list[tuple[str, float, float]]:  # noqa: ANN001
    return sorted(((r.id, round(r.start, 9), round(r.end, 9)) for r in result.records),
                  key=lambda x: (x[2], x[1], x[0]))
