"""The torch runner trains what plain training trains: tiny replays checked against their references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from policies import get_policy, parse_knobs  # noqa: E402
from replay.model import Dims, build_layers, param_count  # noqa: E402
from replay.reference import compare, train_reference  # noqa: E402
from replay.runner import Runner  # noqa: E402
from simulator import Plan  # noqa: E402
from tiersim.api import JobRequest, make_job  # noqa: E402
from tiersim.cli import main  # noqa: E402
from workloads import ModelSpec  # noqa: E402

GPT = dict(name="tiny-gpt", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256, vocab=256,
           max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True, learned_pos=True)
LLAMA = dict(name="tiny-llama", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=192,
             vocab=256, max_pos=128, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False,
             learned_pos=False)


def tiny_plan(policy: str = "zero-offload", model: dict | None = None, knobs: dict | None = None,
              global_batch: int = 2, checkpointing: str = "full", early_stop: bool | None = None) -> Plan:
    job, _ = make_job("a100", ModelSpec(**(model or GPT)),
                      JobRequest(micro_batch=1, seq_len=32, global_batch=global_batch, precision="bf16",
                                 checkpointing=checkpointing, flash_attention=True, checkpoint_early_stop=early_stop))
    info = get_policy(policy)
    return info.plan(job, parse_knobs(info, knobs or {}))


def replay_and_verify(plan: Plan, delayed: bool | None = None):
    runner = Runner(plan, _hw(plan))
    meas = runner.run()
    delayed = bool(plan.knobs.get("delayed_update")) if delayed is None else delayed
    ref_losses, ref_weights = train_reference(runner.dims, runner.batching, plan.steps, dict(runner.accum),
                                              delayed=delayed, device=runner.device)
    return meas, compare(meas.losses, meas.weights, ref_losses, ref_weights, "dpu" if delayed else "plain")


def _hw(plan: Plan):
    return plan.hardware


@pytest.mark.parametrize("model", [GPT, LLAMA], ids=["gpt", "llama"])
def test_model_has_the_workloads_parameter_count(model: dict) -> None:
    spec = ModelSpec(**model)
    dims = Dims.from_model(spec)
    assert param_count(build_layers(dims, 0)) == spec.params()


@pytest.mark.parametrize("policy,model,knobs,batch,ckpt", [
    ("none", GPT, {}, 2, "full"),
    ("zero-offload", GPT, {}, 2, "full"),
    ("zero-offload", GPT, {"delayed_update": True}, 2, "full"),
    ("zero-offload", LLAMA, {}, 3, "none"),
    ("none", LLAMA, {}, 1, "selective"),
], ids=["none", "zero-offload", "zero-offload-dpu", "zero-offload-llama-nockpt", "none-llama"])
def test_replay_trains_like_its_reference(policy: str, model: dict, knobs: dict, batch: int, ckpt: str) -> None:
    plan = tiny_plan(policy, model, knobs, batch, ckpt)
    meas, verdict = replay_and_verify(plan)
    assert verdict.ok, verdict
    assert len(meas.losses) == plan.steps * batch
    assert not meas.leaked
    # every task of every step ran, none started before its dependencies ended
    ends = {r.uid: r.end for r in meas.records}
    from simulator.unroll import Unroller

    tasks = Unroller(plan).unroll()
    assert set(ends) == {t.uid for t in tasks}
    start = {r.uid: r.start for r in meas.records}
    assert all(ends[d] <= start[t.uid] for t in tasks for d in t.deps)


def test_delayed_update_is_not_plain_training() -> None:
    """The DPU plan matches its own reference only: verify tells the two semantics apart."""
    _, verdict = replay_and_verify(tiny_plan("zero-offload", GPT, {"delayed_update": True}), delayed=False)
    assert not verdict.ok and verdict.max_weight_rel_err > 1e-3


def test_cli_replay_json_trace_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny_plan().save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--verify", "--json", "--steps", "3",
               "--trace", str(tmp_path / "t.json"), "--nvme-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    assert {"simulated", "measured", "error"} <= set(d)
    assert d["verify"]["ok"] and d["measured"]["steps"] == 3 and len(d["measured"]["step_times_s"]) == 3
    assert set(d["error"]["stream_busy"]) == {"gpu0.compute", "gpu0.d2h", "gpu0.h2d", "cpu.adam0"}
    assert d["measured"]["peak_bytes"]["cpu"] == d["simulated"]["peak_bytes"]["cpu"]  # persistent states only
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e["ph"] == "X" and e["name"] == "fwd1.gpu0" for e in trace["traceEvents"])
    rc = main(["replay", str(tmp_path / "p.json")])
    text = capsys.readouterr().out
    assert rc == 0 and "step time" in text and "peak gpu0" in text


def test_an_early_stop_plan_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The runner recomputes whole blocks: a plan that prices torch's early stop is refused, not replayed
    against a simulation of less work."""
    tiny_plan(model=LLAMA, early_stop=True).save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--steps", "1"])
    err = capsys.readouterr().err
    assert rc != 0 and "checkpoint_early_stop" in err and "--checkpoint-early-stop" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_tinypipe_swapping_packs_replays_like_plain_training() -> None:
    """At half the no-offload GPU peak tinypipe swaps packs of layers (param-upload for fwd and bwd, a pack's
    gradient offload and Adam tagged with its ``layers``): the runner moves each layer of the pack."""
    from simulator import simulate_plan

    req = JobRequest(micro_batch=1, seq_len=32, global_batch=2, precision="fp32", checkpointing="full",
                     flash_attention=True)
    job, _ = make_job("a100", ModelSpec(**LLAMA), req)
    full = simulate_plan(get_policy("none").plan(job, parse_knobs(get_policy("none"), {})), job.hw).peak_bytes["gpu0"]
    small, _ = make_job("a100", ModelSpec(**LLAMA), req,
                        hw_overrides=[f"gpu.memory={0.5 * full:.0f}", "gpu.reserved={}", "gpu.fragmentation=0"])
    plan = get_policy("tinypipe").plan(small, parse_knobs(get_policy("tinypipe"), {}))
    uses = {t.tags.get("use") for seg in plan.segments for t in seg.tasks if t.tags.get("phase") == "param-upload"}
    assert {"fwd", "bwd"} <= uses  # it swaps
    meas, verdict = replay_and_verify(plan)
    assert verdict.ok, verdict
    assert meas.memory.pools["gpu0"].peak <= small.hw.gpu.memory_bytes
