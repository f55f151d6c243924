"""The runner computes in the plan's precision (replay.precision): bf16/fp16 autocast over fp32 masters,
a static loss scale for fp16, verified against plain training in the same precision."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from policies import get_policy, parse_knobs  # noqa: E402
from replay.errors import ReplayError  # noqa: E402
from replay.precision import (  # noqa: E402
    FP16_LOSS_SCALE,
    GEMM16_ENV,
    Precision,
    gemm16_note,
    gemm16_path,
    linear,
    linear_rate_op,
    tolerance,
)
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


@pytest.mark.parametrize("path", ["native", "emulated"])
def test_either_16bit_gemm_path_trains_like_its_reference(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both GEMM paths replay and verify, whichever one this machine would pick (CI may pick either)."""
    monkeypatch.setenv(GEMM16_ENV, path)
    assert gemm16_path("cpu", torch.bfloat16) == path
    _, meas, verdict = _replay(_in(tiny_plan("none", GPT, {}, 2, "full"), "bf16"))
    assert verdict.ok, verdict
    assert not meas.leaked


def _ulps(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest distance between two tensors of ``dtype`` in units of ``dtype``'s spacing at ``want``."""
    got, want = got.detach().double(), want.detach().double()
    info = torch.finfo(dtype)
    _, exp = torch.frexp(want)  # |want| in [2^(exp-1), 2^exp): the spacing there is eps * 2^(exp-1)
    spacing = torch.maximum(torch.ldexp(torch.full_like(want, info.eps), exp - 1), torch.full_like(want, info.tiny))
    return float(((got - want).abs() / spacing).max())


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_emulated_16bit_gemm_is_a_16bit_gemm_with_fp32_accumulation(name: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulated linear (forward, input, weight and bias gradients) equals the exact product of the
    16-bit-rounded operands (float64) rounded to 16 bits, within one rounding of the fp32 accumulation (<= 1
    ulp of the 16-bit result), and the native 16-bit GEMM within the same; without the operand rounding
    (fp32 products of fp32 operands) it would not be."""
    monkeypatch.setenv(GEMM16_ENV, "emulated")
    dtype = Precision(name).dtype
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 33, 96, generator=g, requires_grad=True)
    w = torch.randn(80, 96, generator=g, requires_grad=True)
    b = torch.randn(80, generator=g, requires_grad=True)
    gy = torch.randn(2, 33, 80, generator=g).to(dtype)
    with Precision(name).autocast():
        y = linear(x, w, b)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), gy)
    assert y.dtype == dtype and gx.dtype == gw.dtype == gb.dtype == torch.float32

    x16, w16, b16, g64 = (t.detach().to(dtype).double() for t in (x, w, b, gy))
    want_y = (x16 @ w16.t() + b16).to(dtype)
    want_gx = (g64 @ w16).to(dtype)
    want_gw = (g64.reshape(-1, 80).t() @ x16.reshape(-1, 96)).to(dtype)
    want_gb = g64.reshape(-1, 80).sum(0).to(dtype)
    for got, want in ((y, want_y), (gx, want_gx), (gw, want_gw), (gb, want_gb)):
        assert _ulps(got, want, dtype) <= 1.0
    assert _ulps(torch.nn.functional.linear(x, w, b).detach().to(dtype), want_y, dtype) > 1.0  # unrounded operands

    monkeypatch.setenv(GEMM16_ENV, "native")
    with Precision(name).autocast():
        y_native = linear(x, w, b)
    assert y_native.dtype == dtype
    assert _ulps(y, y_native.detach(), dtype) <= 1.0


def test_the_gemm_path_is_picked_by_measurement_and_overridable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GEMM16_ENV, raising=False)
    assert gemm16_path("cpu", torch.float32) == gemm16_path("cuda", torch.bfloat16) == "native"
    picked = gemm16_path("cpu", torch.bfloat16)
    assert picked in ("native", "emulated")
    note = gemm16_note("bf16", "cpu")
    assert note is not None and "GFLOP/s native" in note
    assert ("fp32 products of bf16 operands" in note) == (picked == "emulated")
    assert gemm16_note("fp32", "cpu") is None
    monkeypatch.setenv(GEMM16_ENV, "emulated")
    assert gemm16_note("fp16", "cuda") == ("16-bit GEMMs: fp32 products of fp16 operands, rounded to fp16 (forced "
                                           f"by {GEMM16_ENV}=emulated)")
    other = "native" if picked == "emulated" else "emulated"
    monkeypatch.setenv(GEMM16_ENV, other)
    forced = gemm16_note("bf16", "cpu")
    assert forced is not None and f"forced by {GEMM16_ENV}={other} (--gemm16); the measured pick: {picked}" in forced
    monkeypatch.setenv(GEMM16_ENV, picked)  # what a command pins its measured pick to: said as measured
    assert gemm16_note("bf16", "cpu") == note
    monkeypatch.setenv(GEMM16_ENV, "fast")
    with pytest.raises(ReplayError, match=f"{GEMM16_ENV}='fast': give one of auto, native, emulated"):
        gemm16_path("cpu", torch.bfloat16)


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
    with pytest.raises(ReplayError, match="gradient 'b' overflowed"):  # the one named is the non-finite one
        p.unscale({"a": torch.ones(4), "b": torch.tensor([float("nan")]), "c": torch.ones(2)}, "layer 1")


def test_fp16_unscale_is_exactly_the_division_by_the_scale() -> None:
    """The fused unscale (one pass over a layer's gradients) gives bit for bit what dividing each by the
    power-of-two loss scale gives, over values from subnormal to near the fp32 maximum, several tensors at once."""
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(n, generator=gen) * 10.0 ** torch.randint(-40, 38, (n,), generator=gen) for n in (7, 300, 1)]
    want = [v / FP16_LOSS_SCALE for v in values]
    got = {f"g{i}": v.clone() for i, v in enumerate(values)}
    Precision("fp16", "cpu").unscale(got, "layer 1")
    assert all(torch.equal(g, w) for g, w in zip(got.values(), want, strict=True))
    same = {"w": torch.ones(3)}
    Precision("bf16", "cpu").unscale(same, "layer 1")  # nothing to undo outside fp16
    assert torch.equal(same["w"], torch.ones(3))


def test_a_precision_the_runner_cannot_compute_is_refused() -> None:
    with pytest.raises(ReplayError, match="plan precision 'fp8'"):
        Precision("fp8", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the CPU cases above cover the same path")
def test_bf16_replay_on_cuda_trains_like_its_reference() -> None:
    plan = _in(tiny_plan("zero-offload", LLAMA, {}, 3, "none"), "bf16")
    _, _, verdict = _replay(plan, device="cuda")
    assert verdict.ok, verdict


def test_host_updated_layers_are_where_the_plan_steps_the_optimizer() -> None:
    from replay.reference import host_updated_layers

    n = GPT["n_layers"] + 2  # the embedding, the blocks, the head
    assert host_updated_layers(tiny_plan("none", GPT, {}, 2, "none"), n) == frozenset()
    assert host_updated_layers(tiny_plan("zero-offload", GPT, {}, 2, "none"), n) == frozenset(range(n))


def test_reference_adam_per_layer_is_one_adam_over_every_parameter() -> None:
    """Fused Adam is elementwise: one optimizer per layer (ReferenceAdam) updates to the last bit what one over
    all parameters does, so the reference can step each layer where the replay does."""
    from replay.model import Dims, build_layers
    from replay.reference import ReferenceAdam
    from replay.store import ADAM

    dims = Dims.from_model(ModelSpec(**LLAMA))
    a, b = build_layers(dims, 3), build_layers(dims, 3)
    opt_a = ReferenceAdam(a, torch.device("cpu"), frozenset(range(len(a))))
    opt_b = torch.optim.Adam([p for m in b for p in m.parameters()], **ADAM)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        for pa, pb in zip((p for m in a for p in m.parameters()), (p for m in b for p in m.parameters()),
                          strict=True):
            g = torch.randn(pa.shape, generator=gen) * 1e-3
            pa.grad, pb.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
        opt_b.zero_grad(set_to_none=True)
    for pa, pb in zip((p for m in a for p in m.parameters()), (p for m in b for p in m.parameters()), strict=True):
        assert torch.equal(pa, pb) and pa.grad is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a CPU Adam against a GPU one")
def test_cuda_offloaded_replay_matches_a_reference_with_the_same_adam_placement() -> None:
    """On CUDA a CPU Adam and the GPU's round differently; the reference steps host-updated layers on the CPU
    (replay.reference.ReferenceAdam), so the bf16 zero-offload replay matches it (measured before: 4.6%)."""
    from replay.reference import host_updated_layers

    plan = tiny_plan("zero-offload", LLAMA, {}, 2, "none")
    runner = Runner(plan, plan.hardware, device="cuda")
    meas = runner.run()
    ref_l, ref_w = train_reference(runner.dims, runner.batching, plan.steps, dict(runner.accum), delayed=False,
                                   device=runner.device,
                                   host_layers=host_updated_layers(plan, runner.dims.n_layers + 2))
    assert compare(meas.losses, meas.weights, ref_l, ref_w, "plain", rtol=tolerance("bf16")).ok
