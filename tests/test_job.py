"""Jobs and plans: ``policies.job`` builds them without the planner; ``planner.job.make_plan`` (and so the
CLI and the public API) hands a policy's ``refine`` hook the simulator's step seconds."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import planner.job
import policies.job
from policies import POLICIES, Job
from simulator import Plan, simulate_plan
from simulator.simulate import step_seconds
from tiersim.cli import simulate_main

SMALL = policies.job.JobRequest(global_batch=1, seq_len=128)


@pytest.fixture()
def refined(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Job, Any, Plan, float]]:
    """A policy "toy-refine": none's plans, refined by a hook that notes the step seconds it was handed
    for the first plan and returns that plan with the figure in its metrics."""
    calls: list[tuple[Job, Any, Plan, float]] = []

    def refine(job: Job, knobs: Any, plan: Plan, seconds: Any) -> Plan:
        s = seconds(plan)
        calls.append((job, knobs, plan, s))
        return dataclasses.replace(plan, metrics={**plan.metrics, "refined_step_s": s})

    monkeypatch.setitem(POLICIES, "toy-refine",
                        dataclasses.replace(POLICIES["none"], name="toy-refine", refine=refine))
    return calls


def test_planner_job_reexports_policies_job() -> None:
    for name in ("JobRequest", "make_job", "resolve_hardware", "load_hardware_from_spec", "DEFAULT_SEQ_CAP",
                 "DEFAULT_SEQS_PER_GPU"):
        assert getattr(planner.job, name) is getattr(policies.job, name)


def test_without_step_seconds_the_hook_is_not_run(refined: list) -> None:
    job, _ = policies.job.make_job("a100", "gpt2", SMALL)
    plan = policies.job.make_plan(job, "toy-refine", {"stage": 0})
    assert refined == [] and "refined_step_s" not in plan.metrics
    assert plan == POLICIES["none"].plan(job, POLICIES["none"].knobs_type(stage=0))


def test_step_seconds_given_runs_the_hook(refined: list) -> None:
    job, _ = policies.job.make_job("a100", "gpt2", SMALL)
    plan = policies.job.make_plan(job, "toy-refine", ["stage=0"], lambda p: 1.5)
    ((j, knobs, first, s),) = refined
    assert j is job and knobs.stage == 0 and s == 1.5 and plan.metrics["refined_step_s"] == 1.5
    assert dataclasses.replace(plan, metrics=first.metrics) == first


def test_planner_hands_the_hook_the_simulators_seconds(refined: list) -> None:
    job, _ = planner.job.make_job("a100", "gpt2", SMALL)
    plan = planner.job.make_plan(job, "toy-refine")
    ((_, _, first, s),) = refined
    assert s == simulate_plan(first, job.hw).step_time_s == step_seconds(first, job.hw)
    assert plan.metrics["refined_step_s"] == s


def test_step_seconds_of_a_plan_that_does_not_fit_is_inf() -> None:
    job, _ = planner.job.make_job("a100", "gpt2", SMALL)
    plan = planner.job.make_plan(job, "none")
    small = policies.job.resolve_hardware("a100", ["gpu.memory=2GB"])  # the same machine, too little HBM
    assert simulate_plan(plan, job.hw).feasible and not simulate_plan(plan, small).feasible
    assert step_seconds(plan, job.hw) == simulate_plan(plan, job.hw).step_time_s
    assert step_seconds(plan, small) == math.inf


def test_simulate_command_plans_through_the_hook(refined: list, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    rc = simulate_main(["--hw", "a100", "--model", "gpt2", "--policy", "toy-refine", "--global-batch", "1",
                        "--seq-len", "128", "--plan-out", str(out), "--json"])
    capsys.readouterr()
    assert rc == 0 and len(refined) == 1
    assert json.loads(out.read_text())["metrics"]["refined_step_s"] == refined[0][3]
