"""A plan without rank tags: each task belongs to the GPU its stream runs on, and the proof still finds the
ranks (it once read the device of the wrong stream and saw one owner)."""

from __future__ import annotations

from dataclasses import replace

from simulator import simulate_plan
from simulator.engine import plan_symmetry
from simulator.plan import Segment
from simulator.symmetry import Symmetry
from tests.test_symmetry import _disagreements, _plan


def test_untagged_plan_is_owned_by_its_gpus() -> None:
    plan, hw = _plan("none", 2)

    def untag(t):  # noqa: ANN001, ANN202
        return replace(t, tags={k: v for k, v in t.tags.items() if k != "rank"})

    segs = tuple(Segment(s.name, s.repeat, tuple(untag(t) for t in s.tasks)) for s in plan.segments)
    bare = replace(plan, segments=segs)
    assert not any("rank" in t.tags for s in bare.segments for t in s.tasks)
    sym = plan_symmetry(bare, hw)
    assert isinstance(sym, Symmetry), sym
    assert sym.n == 2
    a = simulate_plan(bare, hw)
    b = simulate_plan(bare, hw, symmetric=False)
    assert a.sim.reduction and not b.sim.reduction
    assert _disagreements(b, a) == []
