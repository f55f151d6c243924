"""A new policy is one file plus one registry line: the toy ``toy-dp`` (tests/toy_policy.py, written on the
policy kit) registered here runs through simulate (API and CLI), plan (the planner's search, API and CLI)
and replay (the torch runner on the CPU, checked against plain training)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.job import JobRequest
from planner.search import search
from policies import POLICIES, REGISTRY, load_policy, register, unregister
from simulator import Plan
from simulator.invariants import check_invariants
from tiersim.api import simulate
from tiersim.cli import main


@pytest.fixture
def toy() -> Iterator[str]:
    info = register(load_policy("toy_policy"))  # the one registry line
    try:
        yield info.name
    finally:
        unregister(info.name)


def test_the_registry_is_one_line_per_policy_and_names_no_policy_twice() -> None:
    assert [load_policy(m).name for m in REGISTRY] == list(POLICIES)
    with pytest.raises(ValueError, match="already registered"):
        register(POLICIES["none"])
    with pytest.raises(TypeError, match="POLICY = PolicyInfo"):
        load_policy("engine_helpers")


def test_the_authoring_guide_shows_the_toy_as_it_is() -> None:
    root = Path(__file__).resolve().parent.parent
    guide = (root / "docs" / "policy-authoring.md").read_text()
    assert "```python\n" + (root / "tests" / "toy_policy.py").read_text() + "```" in guide


def test_the_toy_simulates_through_the_api_and_the_cli(toy: str, capsys: pytest.CaptureFixture[str]) -> None:
    req = JobRequest(global_batch=16, seq_len=512)
    gpu, cpu = (simulate("a100x8", "gpt2", toy, {"optimizer": o}, req) for o in ("gpu", "cpu"))
    for r in (gpu, cpu):
        assert r.feasible and r.policy == toy and check_invariants(r) == []
    assert cpu.peak_bytes["gpu0"] < gpu.peak_bytes["gpu0"]  # the optimizer states moved to the host
    assert cpu.peak_bytes["cpu"] > gpu.peak_bytes["cpu"]
    rc = main(["simulate", "--hw", "a100x8", "--model", "gpt2", "--policy", toy, "--knob", "optimizer=cpu",
               "--knob", "tp=2", "--global-batch", "16", "--seq-len", "512", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["policy"] == toy and d["knobs"] == {"optimizer": "cpu", "tp": 2}
    assert main(["simulate", "--policy", toy, "--knob", "optimizer=disk"]) == 2
    assert "optimizer" in capsys.readouterr().err


def test_the_planner_searches_the_toys_own_knobs(toy: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = search("a100", "gpt2", request=JobRequest(seq_len=512, global_batch=8), policies=[toy], prune=False)
    tried = {e.knobs["optimizer"] for e in out.evaluated}
    assert tried == {"gpu", "cpu"} and out.best is not None and out.best.policy == toy
    # gpt2 fits one A100 with its states, so the GPU optimizer (no PCIe traffic) wins
    assert out.best.knobs["optimizer"] == "gpu"
    plan_out = tmp_path / "best.json"
    rc = main(["plan", "--hw", "a100", "--model", "gpt2", "--seq-len", "512", "--global-batch", "8",
               "--policies", toy, "--no-cache", "--workers", "1", "--json", "--plan-out", str(plan_out)])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["best"]["policy"] == toy and d["best"]["knobs"] == out.best.knobs
    assert Plan.load(plan_out).policy == toy


@pytest.mark.parametrize("optimizer", ["gpu", "cpu"])
def test_the_toy_replays_like_plain_training(toy: str, optimizer: str) -> None:
    pytest.importorskip("torch")  # replay is the optional extra
    from test_replay_run import GPT, replay_and_verify, tiny_plan

    plan = tiny_plan(toy, GPT, {"optimizer": optimizer}, global_batch=2)
    meas, verdict = replay_and_verify(plan)
    assert verdict.ok, verdict
    assert len(meas.losses) == plan.steps * 2 and not meas.leaked


def test_the_toy_replays_from_the_cli(toy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from test_replay_run import GPT, tiny_plan

    tiny_plan(toy, GPT, {"optimizer": "cpu"}).save(tmp_path / "toy.json")
    rc = main(["replay", str(tmp_path / "toy.json"), "--verify", "--json", "--nvme-dir", str(tmp_path)])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["verify"]["ok"] and d["policy"] == toy
