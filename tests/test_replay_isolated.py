"""replay.isolated: the validation matrix replays a one-GPU plan in a process of its own, as tiersim replay
does (a long process that replayed case after case ran some slower than alone)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from replay.errors import ReplayError, ReplayTimeout  # noqa: E402
from replay.isolated import replay_alone  # noqa: E402
from replay.runner import Runner  # noqa: E402
from tests.test_replay_run import GPT, tiny_plan  # noqa: E402


def test_a_plan_replays_in_a_fresh_process_and_measures_what_it_measures_here(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = tiny_plan("zero-offload")
    alone = replay_alone(plan, plan.hardware, str(tmp_path), timeout_s=120)
    here = Runner(plan, plan.hardware, device="cpu", nvme_dir=str(tmp_path)).run()
    assert alone.weights == []  # left out: the matrix compares times and peaks
    assert alone.losses == here.losses  # the same training, bit for bit
    assert len(alone.step_times()) == plan.steps and {r.uid for r in alone.records} == {r.uid for r in here.records}
    assert alone.memory.pools["gpu0"].peak == here.memory.pools["gpu0"].peak


def test_the_childs_replay_error_is_raised_here(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = tiny_plan("none", model=dict(GPT, n_experts=4, experts_per_token=2))
    with pytest.raises(ReplayError, match="mixture-of-experts models are not supported by replay yet"):
        replay_alone(plan, plan.hardware, str(tmp_path), timeout_s=120)


def test_a_replay_past_its_deadline_is_stopped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = tiny_plan("zero-offload")
    with pytest.raises(ReplayTimeout, match="no result within 0 s; it was stopped"):
        replay_alone(plan, plan.hardware, str(tmp_path), timeout_s=0.001)
