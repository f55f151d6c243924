"""Symmetric plans simulate one representative rank (``simulator.symmetry``) with the figures of the full run.

The full simulation (``symmetric=False``) is the reference: step time, per-pool peaks, bytes and busy
time per link, busy time per stream, compute and exposed-transfer times and the OOM verdicts must agree
(to 1e-9 relative: only the order of floating-point sums differs). A plan that is not symmetric (one rank
perturbed, a pipeline) is simulated in full, and the verification never trusts names.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import simulate_plan
from simulator.engine import plan_symmetry
from simulator.plan import Plan, Segment
from simulator.symmetry import Symmetry
from tiersim.api import make_job, make_plan

POLICIES = ("none", "zero-offload", "zero-infinity", "lazytrain", "synergyscale", "tinypipe")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _mapping_diff(name: str, a: dict, b: dict) -> list[str]:
    return [f"{name}[{k}]: {a.get(k)} != {b.get(k)}" for k in sorted(set(a) | set(b))
            if not _close(a.get(k, 0.0), b.get(k, 0.0))]


def _disagreements(full, red) -> list[str]:
    bad = []
    if sorted((r.uid, r.stream, r.device, r.start, r.end, r.gpus, r.links, r.bytes) for r in full.records) != \
            sorted((r.uid, r.stream, r.device, r.start, r.end, r.gpus, r.links, r.bytes) for r in red.records):
        fr = {r.uid: r for r in full.records}
        rr = {r.uid: r for r in red.records}
        if set(fr) != set(rr):
            bad.append(f"records differ: {sorted(set(fr) ^ set(rr))[:3]}")
        else:
            for u, a in fr.items():
                b = rr[u]
                if (a.stream, a.device, a.gpus, a.links) != (b.stream, b.device, b.gpus, b.links) or \
                        not (_close(a.start, b.start) and _close(a.end, b.end) and _close(a.bytes, b.bytes)):
                    bad.append(f"record {u}: {a} != {b}")
                    break
    for attr in ("step_time_s", "compute_busy_s", "exposed_transfer_s", "tokens_per_s"):
        if not _close(getattr(full, attr), getattr(red, attr)):
            bad.append(f"{attr}: {getattr(full, attr)} != {getattr(red, attr)}")
    for attr in ("peak_bytes", "link_bytes", "link_busy_s", "stream_busy_s", "min_used_bytes"):
        bad += _mapping_diff(attr, dict(getattr(full, attr)), dict(getattr(red, attr)))
    for pool in full.peak_by_kind:
        bad += _mapping_diff(f"peak_by_kind[{pool}]", dict(full.peak_by_kind[pool]), dict(red.peak_by_kind[pool]))
    if full.feasible != red.feasible:
        bad.append("feasible differs")
    fo = sorted((o.pool, round(o.time_s, 12), o.requested_bytes, o.free_bytes) for o in full.ooms)
    ro = sorted((o.pool, round(o.time_s, 12), o.requested_bytes, o.free_bytes) for o in red.ooms)
    if fo != ro:
        bad.append(f"ooms: {fo} != {ro}")
    return bad


def _plan(policy: str, n: int, model: str = "gpt2", overrides: tuple[str, ...] = (),
          knobs: tuple[str, ...] = ()) -> tuple[Plan, object]:
    job, _ = make_job("a100x8", model, hw_overrides=[f"gpu.count={n}", *overrides])
    return make_plan(job, policy, knobs), job.hw


CASES = [(p, 2, ()) for p in POLICIES] + [
    ("zero-offload", 8, ()), ("lazytrain", 4, ()), ("synergyscale", 4, ()), ("none", 8, ()),
    # tensor parallelism: collectives of one group of ranks (each group's images in the others)
    ("zero-offload", 4, ("tp=2",)), ("none", 4, ("tp=2",))]


@pytest.mark.parametrize(("policy", "n", "knobs"), CASES)
def test_symmetric_and_full_simulations_agree(policy: str, n: int, knobs: tuple[str, ...]) -> None:
    plan, hw = _plan(policy, n, knobs=knobs)
    sym = plan_symmetry(plan, hw)
    assert isinstance(sym, Symmetry), sym
    assert sym.n == n
    full = simulate_plan(plan, hw, symmetric=False)
    red = simulate_plan(plan, hw)
    assert red.sim.reduction == f"{n} ranks simulated as 1 class of {n}"
    assert full.sim.reduction == ""
    assert red.sim.method == full.sim.method
    assert red.sim.events < full.sim.events
    assert _disagreements(full, red) == []


@pytest.mark.parametrize("policy", ["zero-offload", "zero-infinity"])
def test_across_nodes_symmetric_and_full_simulations_agree(policy: str) -> None:
    """Two nodes of two GPUs: the data-parallel collectives are hierarchical rings (NVLink inside a node, the
    NICs between them, each hop its share of the bytes: costs.collective); the reduction still agrees."""
    plan, hw = _plan(policy, 2, overrides=("nodes=2",))
    full = simulate_plan(plan, hw, symmetric=False)
    red = simulate_plan(plan, hw)
    assert red.sim.reduction == "4 ranks simulated as 1 class of 4"
    assert any("nic" in ln.lower() or "net" in ln.lower() for ln in full.link_bytes), sorted(full.link_bytes)
    assert _disagreements(full, red) == []


def test_an_oom_verdict_agrees() -> None:
    """A host too small for every rank's optimizer state: the shared pool's OOM is found at the same
    instant with the same bytes asked and free (the first rank's allocation that does not fit)."""
    plan, hw = _plan("zero-offload", 4, "13b", ("host.dram=120GB",))
    full = simulate_plan(plan, hw, symmetric=False)
    red = simulate_plan(plan, hw)
    assert not full.feasible
    assert red.sim.reduction == "4 ranks simulated as 1 class of 4"
    assert _disagreements(full, red) == []


def test_the_representative_carries_the_others_load() -> None:
    """A shared PCIe uplink carries every rank behind it; the host's CPU-Adam all ranks; a GPU's SMs one."""
    plan, hw = _plan("zero-offload", 8)
    sym = plan_symmetry(plan, hw)
    assert isinstance(sym, Symmetry)
    adam = next(t for t in sym.rank_tasks if t.startswith("adam"))
    assert sym.multiplicity(adam) == 8.0
    res, w = sym.fold(("cpu.adam",), None, 8.0)
    assert dict(zip(res, w, strict=True)) == {"cpu.adam": 8.0}
    res, w = sym.fold(("gpu0.sm",), None, 8.0)
    assert dict(zip(res, w, strict=True)) == {"gpu0.sm": 1.0}
    # a collective is one flow of the full run: its weight on a role is its own usage of one member
    ranks = tuple(f"gpu{i}" for i in range(8))
    from costs import RouteTable, ring
    from hardware_models import build_topology

    rg = ring(RouteTable(build_topology(hw)), ranks, 1e6, "all_gather")
    coll = next(iter(sym.global_tasks))
    assert sym.multiplicity(coll) == 1.0
    folded, w = sym.fold(rg.resources, None, 1.0)
    assert all(x > 0 for x in w)
    assert len(folded) < len(set(rg.resources))  # its hops play few roles


def test_a_pipeline_is_simulated_in_full() -> None:
    """tinypipe's stages run different layers: one pipeline has no symmetry (the full simulation, the reason on
    hand); its data-parallel replicas do (a rank of 4 GPUs, one per stage; each stage's all-reduce spans that
    stage's GPU of every replica), and simulate as the full run does."""
    plan, hw = _plan("tinypipe", 8, "13b", knobs=("stages=8",))
    sym = plan_symmetry(plan, hw)
    assert sym == "fewer than two ranks"
    assert simulate_plan(plan, hw).sim.reduction == ""
    plan, hw = _plan("tinypipe", 8, "13b")
    assert (plan.info["stages"], plan.info["dp"]) == (4, 2)
    sym = plan_symmetry(plan, hw)
    assert isinstance(sym, Symmetry) and sym.gpus == {"gpu0", "gpu1", "gpu2", "gpu3"}
    a, b = simulate_plan(plan, hw), simulate_plan(plan, hw, symmetric=False)
    assert a.sim.reduction == "2 ranks simulated as 1 class of 2" and b.sim.reduction == ""
    assert a.step_time_s == b.step_time_s and a.peak_bytes == b.peak_bytes and a.link_bytes == b.link_bytes


_BASE: dict[str, tuple[Plan, object]] = {}


def _base() -> tuple[Plan, object]:
    if "p" not in _BASE:
        _BASE["p"] = _plan("zero-offload", 4)
    return _BASE["p"]


PERTURB = ("flops", "bytes", "params", "drop_dep", "stream", "tag")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.integers(min_value=0, max_value=10_000), how=st.sampled_from(PERTURB))
def test_one_perturbed_rank_is_not_symmetric(pick: int, how: str) -> None:
    """Change one task of one rank other than the first: the verification refuses (it compares structure,
    never names), and a perturbation that changes nothing keeps the symmetry."""
    plan, hw = _base()
    sym = plan_symmetry(plan, hw)
    assert isinstance(sym, Symmetry)
    others = [(si, ti) for si, seg in enumerate(plan.segments) for ti, t in enumerate(seg.tasks)
              if t.id not in sym.rank_tasks and t.id not in sym.global_tasks]
    si, ti = others[pick % len(others)]
    t = plan.segments[si].tasks[ti]
    if how == "flops":
        new = replace(t, flops=t.flops * 1.5 + 1.0)
    elif how == "bytes":
        new = replace(t, bytes=t.bytes * 2 + 1.0)
    elif how == "params":
        new = replace(t, params=t.params + 1.0)
    elif how == "drop_dep":
        new = replace(t, deps=t.deps[:-1]) if t.deps else replace(t, flops=t.flops + 1.0)
    elif how == "stream":
        other = next(s.id for s in plan.streams if s.id != t.stream)
        new = replace(t, stream=other)
    else:
        new = replace(t, tags={**t.tags, "layer": -7})
    tasks = list(plan.segments[si].tasks)
    tasks[ti] = new
    segs = list(plan.segments)
    segs[si] = Segment(segs[si].name, segs[si].repeat, tuple(tasks))
    bad = replace(plan, segments=tuple(segs))
    got = plan_symmetry(bad, hw)
    assert isinstance(got, str), f"{how} of {t.id} went unnoticed"


def test_renaming_does_not_matter() -> None:
    """Symmetry is structural: the same plan with rank 1's tasks renamed arbitrarily is still symmetric,
    and a plan whose names look alike but whose rank 1 computes more is not."""
    plan, hw = _plan("zero-offload", 2)
    sym = plan_symmetry(plan, hw)
    assert isinstance(sym, Symmetry)
    rename = {t: f"x{i}" for i, t in enumerate(sorted(sym.task_maps[1].values()))}

    def ren(t):
        deps = tuple(replace(d, id=rename.get(d.id, d.id)) for d in t.deps)
        return replace(t, id=rename.get(t.id, t.id), deps=deps)

    segs = tuple(Segment(s.name, s.repeat, tuple(ren(t) for t in s.tasks)) for s in plan.segments)
    renamed = replace(plan, segments=segs)
    assert isinstance(plan_symmetry(renamed, hw), Symmetry)
    a = simulate_plan(renamed, hw)
    b = simulate_plan(renamed, hw, symmetric=False)
    assert a.sim.reduction and not b.sim.reduction
    assert _disagreements(b, a) == []
