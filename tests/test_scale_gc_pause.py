"""simulator.gc_pause: the collector is paused inside, restored after (also on an exception, and nested)."""

from __future__ import annotations

import gc

import pytest

from simulator.gc_pause import no_cyclic_gc


def test_pause_restores_the_collector() -> None:
    assert gc.isenabled()
    with no_cyclic_gc():
        assert not gc.isenabled()
        with no_cyclic_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_pause_restores_the_collector_after_an_error() -> None:
    with pytest.raises(ValueError), no_cyclic_gc():
        raise ValueError("boom")
    assert gc.isenabled()


def test_pause_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with no_cyclic_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_plan_construction_and_the_symmetry_proof_leave_the_collector_on() -> None:
    from policies.job import make_job, make_plan
    from simulator.engine import plan_symmetry

    job, _ = make_job("a100x8", "gpt2")
    plan = make_plan(job, "zero-offload")
    assert gc.isenabled()
    assert not isinstance(plan_symmetry(plan, job.hw), str)
    assert gc.isenabled()
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the policy raises, the collector is back on
        make_plan(job, "zero-offload", {"tp": 3})
    assert gc.isenabled()
