"""The runner computes in the plan's precision (replay.precision): bf16/fp16 autocast over fp32 masters,
a static loss scale for fp16, verified against plain training in the same precision."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from policies import get_policy, parse_knobs  # noqa: E402
from replay.errors import ReplayError  # noqa: E402
from replay.precision import FP16_LOSS_SCALE, Precision, linear_rate_op, tolerance  # noqa: E402
from replay.reference import compare, train_reference  # noqa: E402
from replay.runner import Runner  # noqa: E402
from simulator import Plan  # noqa: E402
from tiersim.api import JobRequest, make_job  # noqa: E402
from workloads import ModelSpec  # noqa: E402

GPT = dict(name="tiny-gpt", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256, vocab=256,
           max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True, learned_pos=True)
LLAMA = dict(name="tiny-llama", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=192,
             vocab=256, max_pos=128, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False,
             learned_pos=False)


def tiny_plan(policy: str, model: dict, knobs: dict, global_batch: int, checkpointing: str) -> Plan:
    job, _ = make_job("a100", ModelSpec(**model),
                      JobRequest(micro_batch=1, seq_len=32, global_batch=global_batch, precision="bf16",
                                 checkpointing=checkpointing, flash_attention=True))
    info = get_policy(policy)
    return info.plan(job, parse_knobs(info, knobs))


def _in(plan: Plan, precision: str) -> Plan:
    cfg = dataclasses.replace(plan.workload.config, precision=precision)
    return dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, config=cfg))


def _replay(plan: Plan, device: str = "cpu", ref_precision: str | None = None):
    runner = Runner(plan, plan.hardware, device=device)
    meas = runner.run()
    batching = runner.batching if ref_precision is None else dataclasses.replace(runner.batching,
                                                                                 precision=ref_precision)
    delayed = bool(plan.knobs.get("delayed_update"))
    ref_l, ref_w = train_reference(runner.dims, batching, plan.steps, dict(runner.accum), delayed=delayed,
                                   device=runner.device)
    return runner, meas, compare(meas.losses, meas.weights, ref_l, ref_w, "plain",
                                 rtol=tolerance(runner.batching.precision))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("policy,model,knobs,batch,ckpt", [
    ("none", GPT, {}, 2, "full"),
    ("zero-offload", LLAMA, {}, 3, "none"),
    ("zero-offload", GPT, {"delayed_update": True}, 2, "full"),
], ids=["none-gpt", "zoff-llama", "zoff-dpu-gpt"])
def test_mixed_precision_replay_trains_like_its_reference(precision: str, policy: str, model: dict, knobs: dict,
                                                          batch: int, ckpt: str) -> None:
    plan = _in(tiny_plan(policy, model, knobs, batch, ckpt), precision)
    runner, meas, verdict = _replay(plan)
    assert runner.batching.precision == precision
    assert verdict.ok, verdict
    assert verdict.rtol == tolerance(precision) < 0.05
    assert not meas.leaked


def test_a_bf16_replay_is_not_fp32_training() -> None:
    """The precision really changes what is computed: checked against fp32 plain training, a bf16 replay fails
    the bf16 tolerance (its weights differ by several percent), and its losses differ from an fp32 replay's."""
    plan = tiny_plan("zero-offload", LLAMA, {}, 3, "none")
    _, meas16, verdict = _replay(_in(plan, "bf16"), ref_precision="fp32")
    assert not verdict.ok
    assert verdict.max_weight_rel_err > tolerance("bf16")
    meas32 = Runner(_in(plan, "fp32"), plan.hardware, device="cpu").run()
    assert meas16.losses != meas32.losses


def test_layers_run_their_matmuls_in_the_plan_dtype() -> None:
    """Under the runner's autocast a linear layer over fp32 weights computes (and returns) the 16-bit dtype."""
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with Precision(name, "cpu").autocast():
            assert torch.nn.functional.linear(x, w).dtype == dtype
        assert linear_rate_op(torch.device("cpu"), name, 4, 16, 8)().dtype == dtype  # type: ignore[union-attr]


def test_fp16_loss_scale_is_undone_and_overflow_is_refused() -> None:
    p = Precision("fp16", "cpu")
    assert p.loss_scale == FP16_LOSS_SCALE and Precision("bf16").loss_scale == 1.0
    g = {"w": torch.full((3,), FP16_LOSS_SCALE * 0.5)}
    p.unscale(g, "layer 1")
    assert torch.equal(g["w"], torch.full((3,), 0.5))
    with pytest.raises(ReplayError, match="overflowed at the static loss scale"):
        p.unscale({"w": torch.tensor([1.0, float("inf")])}, "layer 1")


def test_a_precision_the_runner_cannot_compute_is_refused() -> None:
    with pytest.raises(ReplayError, match="plan precision 'fp8'"):
        Precision("fp8", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the CPU cases above cover the same path")
def test_bf16_replay_on_cuda_trains_like_its_reference() -> None:
    plan = _in(tiny_plan("zero-offload", LLAMA, {}, 3, "none"), "bf16")
    _, _, verdict = _replay(plan, device="cuda")
    assert verdict.ok, verdict
