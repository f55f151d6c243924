"""Both FLOP conventions in every result (model FLOPs: tflops_per_gpu / mfu; hardware FLOPs incl. the
checkpointing recompute: hw_tflops_per_gpu / hfu), and flash attention's default by GPU architecture."""

from __future__ import annotations

import json

import pytest

from hardware_models.gpu_arch import flash_attention_default, gpu_arch
from planner.sweep.store import FIGURE_COLUMNS, figure_columns
from simulator import simulate_plan
from simulator.result import plan_hardware_flops
from tiersim.api import JobRequest, make_job, make_plan
from tiersim.cli import main


def _run(policy: str, ckpt: str, hw: str = "a100x8"):  # type: ignore[no-untyped-def]
    job, _ = make_job(hw, "gpt2", JobRequest(micro_batch=2, seq_len=256, global_batch=32, checkpointing=ckpt))
    plan = make_plan(job, policy)
    return job, plan, simulate_plan(plan, job.hw)


@pytest.mark.parametrize("policy", ["none", "zero-offload", "zero-infinity", "tinypipe", "synergyscale"])
@pytest.mark.parametrize("ckpt", ["none", "full", "selective"])
def test_hardware_flops_are_the_model_flops_plus_the_recompute(policy: str, ckpt: str) -> None:
    job, plan, res = _run(policy, ckpt)
    trace = job.trace
    assert plan_hardware_flops(plan) == pytest.approx(trace.hardware_flops_per_token() * job.tokens_per_step,
                                                      rel=1e-9)
    ratio = trace.hardware_flops_per_token() / trace.model_flops_per_token()
    assert res.hw_tflops_per_gpu == pytest.approx(res.tflops_per_gpu * ratio, rel=1e-9)
    assert res.hfu == pytest.approx(res.mfu * ratio, rel=1e-9)
    if ckpt == "none":
        assert res.hfu == pytest.approx(res.mfu, rel=1e-12)
    else:
        assert res.hfu > res.mfu


def test_a_policy_that_decides_recompute_itself_counts_what_it_runs() -> None:
    # LazyTrain's MILP keeps every activation of this small job: it recomputes nothing, whatever was asked
    _, plan, res = _run("lazytrain", "full")
    recompute = [t for s in plan.segments for t in s.tasks if t.tags.get("phase") == "recompute"]
    assert not recompute and res.hfu == pytest.approx(res.mfu, rel=1e-12)


def test_simulate_prints_and_emits_both_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--hw", "a100", "--model", "gpt2", "--micro-batch", "2", "--seq-len", "256",
            "--policy", "none"]
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"tflops_per_gpu", "mfu", "hw_tflops_per_gpu", "hfu"} <= set(d)
    assert d["hfu"] > d["mfu"] > 0  # full checkpointing by default: the recompute counts as hardware FLOPs
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s per GPU (model)" in out and "TFLOP/s per GPU (hardware)" in out
    assert f"{d['hfu'] * 100:.1f}%" in out and f"{d['mfu'] * 100:.1f}%" in out


def test_sweep_store_has_columns_for_both_conventions() -> None:
    names = [c for c, _ in FIGURE_COLUMNS]
    assert {"tflops_per_gpu", "mfu", "hw_tflops_per_gpu", "hfu"} <= set(names)
    cols = figure_columns({"feasible": True, "tflops_per_gpu": 1.0, "mfu": 0.1, "hw_tflops_per_gpu": 1.3,
                           "hfu": 0.13, "peak_bytes": {}})
    assert (cols["hw_tflops_per_gpu"], cols["hfu"]) == (1.3, 0.13)


@pytest.mark.parametrize(("model", "arch", "flash"), [
    ("V100-SXM2-32GB", "Volta", False), ("V100-SXM3-32GB", "Volta", False), ("Tesla T4", "Turing", False),
    ("A100-SXM4-80GB", "Ampere", True), ("RTX-4090-24GB", "Ada", True), ("H800-SXM5-80GB", "Hopper", True),
    ("H200-SXM-141GB", "Hopper", True), ("GB10 (Blackwell, 48 SMs)", "Blackwell", True),
])
def test_architecture_and_flash_default_of_a_gpu_name(model: str, arch: str, flash: bool) -> None:
    got = gpu_arch(model)
    assert got is not None and got.name == arch
    assert flash_attention_default(model)[0] is flash


def test_an_unknown_gpu_keeps_flash_on_and_says_why() -> None:
    assert gpu_arch("Mystery Accelerator 9000") is None
    on, why = flash_attention_default("Mystery Accelerator 9000")
    assert on and "not known" in why


def test_v100_picks_flash_off_and_says_so_and_the_user_can_override() -> None:
    job, assumed = make_job("v100", "gpt2", JobRequest(micro_batch=1, seq_len=256))
    assert job.config.flash_attention is False
    line = next(a for a in assumed if a.startswith("flash_attention="))
    assert "Volta" in line and "cannot run FlashAttention" in line and "--flash-attention" in line
    forced, assumed = make_job("v100", "gpt2", JobRequest(micro_batch=1, seq_len=256, flash_attention=True))
    assert forced.config.flash_attention is True and not any(a.startswith("flash_attention=") for a in assumed)
    ampere, _ = make_job("a100", "gpt2", JobRequest(micro_batch=1, seq_len=256))
    assert ampere.config.flash_attention is True


def test_flash_attention_flag_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--hw", "v100", "--model", "gpt2", "--seq-len", "256", "--precision", "fp16", "--json"]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["flash_attention"] is False
    assert main([*base, "--flash-attention"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["flash_attention"] is True
