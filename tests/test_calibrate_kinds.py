"""Per-kind compute pricing (issue 12): a calibrated spec may carry the rates of a backward's products and of the
attention kernel (forward and backward), measured in the runner's precision; a spec without them (every preset)
prices as before. Pricing rules and record formats only: no timings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from costs.compute import ComputePricer, KernelCurves, kernel_efficiency, matmul_seconds, ops_seconds
from hardware_models import Curve, HardwareSpec, load_hardware, spec_from_dict
from workloads import ModelSpec, WorkloadConfig
from workloads.ops import ATTENTION, CAST_BYTES, GEMM, layer_ops

LLAMA = ModelSpec(name="t", family="llama", n_layers=2, hidden=128, n_heads=4, n_kv_heads=4, ffn=352, vocab=512,
                  max_pos=256, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False)
GPT = ModelSpec(name="g", family="gpt", n_layers=2, hidden=128, n_heads=4, n_kv_heads=4, ffn=512, vocab=512,
                max_pos=256, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True, learned_pos=True)


def _spec(**gpu: Any) -> HardwareSpec:
    d = load_hardware("a100").to_dict()
    for fitted in ("attention_efficiency", "elementwise_efficiency"):  # the preset's own (tiersim.foundry_fit)
        d["gpu"].pop(fitted, None)
        d.get("sources", {}).pop(f"gpu.{fitted}", None)
    d["gpu"].update({"op_overhead": 1e-9, "elementwise_bw": 1e13, **gpu})  # matmuls dominate
    return spec_from_dict(d)


CURVES = {"gemm_backward_efficiency": [[1e6, 0.05], [1e9, 0.1]], "attention_efficiency": [[1e6, 0.2]],
          "attention_backward_efficiency": [[1e6, 0.02], [1e10, 0.04]]}


@pytest.mark.parametrize("model", [LLAMA, GPT])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_kinds_mark_every_kernel(model: ModelSpec, precision: str) -> None:
    cfg = WorkloadConfig(micro_batch=2, seq_len=64, precision=precision, checkpointing="selective")
    for layer in range(model.n_layers + 2):
        for phase in ("fwd", "bwd", "recompute"):
            ops = layer_ops(model, cfg, layer, phase)
            assert len(ops.kinds) == len(ops.matmul_flops), (layer, phase)
            assert set(ops.kinds) <= {GEMM, ATTENTION}
            if 1 <= layer <= model.n_layers and phase != "recompute":
                assert ops.kinds[-1] == ATTENTION and ops.kinds.count(ATTENTION) == 1
                assert all(k == GEMM for k in ops.kinds[:-1])
            if 1 <= layer <= model.n_layers and phase == "recompute":  # selective: the attention kernel only
                assert ops.kinds == (ATTENTION,)
            assert ops.scaled(0.5).kinds == ops.kinds


@pytest.mark.parametrize("model", [LLAMA, GPT])
def test_mixed_precision_counts_the_weight_casts(model: ModelSpec) -> None:
    """bf16 / fp16 under autocast cast each linear's fp32 weight once per forward and its gradient back once
    per backward: 6 B per weight element and one operator each; fp32 casts nothing."""
    c32 = WorkloadConfig(micro_batch=1, seq_len=32, precision="fp32")
    for precision in ("bf16", "fp16"):
        c16 = replace(c32, precision=precision)
        for layer, phase in ((1, "fwd"), (1, "bwd"), (model.n_layers + 1, "fwd"), (model.n_layers + 1, "bwd")):
            o32, o16 = layer_ops(model, c32, layer, phase), layer_ops(model, c16, layer, phase)
            fwd = layer_ops(model, c32, layer, "fwd")
            weights = sum(n * k for (_, n, k), kind in zip(fwd.matmul_shapes, fwd.kinds, strict=True) if kind == GEMM)
            linears = fwd.kinds.count(GEMM)
            # activation bytes halve in 16 bits (logits stay fp32); the casts come on top
            act16 = layer_ops(model, c16, layer, phase).elementwise_bytes - CAST_BYTES * weights
            assert act16 < o32.elementwise_bytes
            assert o16.n_ops == o32.n_ops + linears
            assert o16.matmul_flops == o32.matmul_flops
    emb = layer_ops(model, WorkloadConfig(micro_batch=1, seq_len=32, precision="bf16"), 0, "fwd")
    assert emb.matmul_flops == () and emb.kinds == ()


def test_kernel_efficiency_picks_the_kinds_curve() -> None:
    fwd, bwd, att, att_b = (Curve.constant(x) for x in (0.5, 0.25, 0.4, 0.1))
    full = KernelCurves(fwd, bwd, att, att_b)
    assert kernel_efficiency(full, GEMM, "fwd", 1e9) == 0.5
    assert kernel_efficiency(full, GEMM, "recompute", 1e9) == 0.5  # a recomputation runs forward kernels
    assert kernel_efficiency(full, GEMM, "bwd", 1e9) == 0.25
    assert kernel_efficiency(full, ATTENTION, "fwd", 1e9) == 0.4
    assert kernel_efficiency(full, ATTENTION, "recompute", 1e9) == 0.4
    assert kernel_efficiency(full, ATTENTION, "bwd", 1e9) == 0.1
    bare = KernelCurves(fwd)  # nothing measured beyond the forward curve: it prices every kernel
    assert {kernel_efficiency(bare, k, p, 1e9) for k in (GEMM, ATTENTION) for p in ("fwd", "bwd")} == {0.5}


def test_matmul_seconds_sums_each_kernel_on_its_curve() -> None:
    cfg = WorkloadConfig(micro_batch=1, seq_len=128, precision="bf16")
    ops = layer_ops(LLAMA, cfg, 1, "bwd")
    curves = KernelCurves(Curve.constant(0.5), Curve.constant(0.25), Curve.constant(0.4), Curve.constant(0.1))
    peak = 1e12
    gemm = sum(f for f, k in zip(ops.matmul_flops, ops.kinds, strict=True) if k == GEMM)
    att = sum(f for f, k in zip(ops.matmul_flops, ops.kinds, strict=True) if k == ATTENTION)
    assert matmul_seconds(ops, peak, curves, "bwd") == pytest.approx(gemm / (peak * 0.25) + att / (peak * 0.1))
    assert matmul_seconds(ops, peak, curves, None) == pytest.approx(gemm / (peak * 0.5) + att / (peak * 0.4))


def test_a_spec_with_kind_curves_prices_backward_and_attention_on_them() -> None:
    plain, kinds = _spec(), _spec(**CURVES)
    cfg = WorkloadConfig(micro_batch=2, seq_len=256, precision="bf16")
    work = (LLAMA, cfg)
    p0, p1 = ComputePricer(plain, "bf16", work), ComputePricer(kinds, "bf16", work)
    fwd_flops, bwd_flops = layer_ops(LLAMA, cfg, 1, "fwd").flops, layer_ops(LLAMA, cfg, 1, "bwd").flops
    # the forward's GEMMs are on the same curve; only its attention kernel moves (to 0.2 of the peak)
    fwd = layer_ops(LLAMA, cfg, 1, "fwd")
    att_f = fwd.matmul_flops[-1]
    peak = plain.peak_flops_for("bf16")
    want = (p0.seconds(fwd_flops, 0.0, 1, "fwd") - att_f / (peak * plain.gpu.gemm_efficiency(att_f))
            + att_f / (peak * 0.2))
    assert p1.seconds(fwd_flops, 0.0, 1, "fwd") == pytest.approx(want)
    # the backward's products are priced at most 0.1 of the peak: much slower than on the forward curve
    assert p1.seconds(bwd_flops, 0.0, 1, "bwd") > 2 * p0.seconds(bwd_flops, 0.0, 1, "bwd")
    bwd = layer_ops(LLAMA, cfg, 1, "bwd")
    assert p1.seconds(bwd_flops, 0.0, 1, "bwd") == pytest.approx(ops_seconds(kinds, bwd, "bf16", "bwd"))
    # a task of no known layer keeps the roofline on either spec
    assert p1.seconds(1e9, 0.0, None, None) == p0.seconds(1e9, 0.0, None, None)


def test_presets_carry_no_backward_curves_and_round_trip() -> None:
    """No preset measures a backward's own curves; the Ampere and Hopper ones carry their fitted attention curve
    (tiersim.foundry_fit), the others none."""
    from hardware_models import list_presets
    from hardware_models.gpu_arch import gpu_arch

    for name in list_presets():
        g = load_hardware(name).gpu
        assert g.gemm_backward_efficiency is None and g.attention_backward_efficiency is None
        arch = gpu_arch(g.model)
        fitted = arch is not None and arch.name in ("Ampere", "Hopper")
        assert (g.attention_efficiency is not None) == fitted == (g.elementwise_efficiency is not None), name
        assert "gemm_backward_efficiency" not in load_hardware(name).to_dict()["gpu"]
    spec = _spec(**CURVES)
    again = spec_from_dict(spec.to_dict())
    assert again.gpu.attention_backward_efficiency == spec.gpu.attention_backward_efficiency
    assert again.to_dict()["gpu"]["gemm_backward_efficiency"] == CURVES["gemm_backward_efficiency"]


@pytest.mark.parametrize("bad", [[[1e6, 1.5]], [], "fast"])
def test_a_bad_kind_curve_names_its_field(bad: Any) -> None:
    from hardware_models import HardwareInputError

    with pytest.raises(HardwareInputError, match="gpu.attention_efficiency"):
        _spec(attention_efficiency=bad)


def test_a_backward_is_never_priced_faster_than_twice_its_forward() -> None:
    """forward + backward minus forward, floored at one forward: timing noise cannot make a backward product
    look faster than 2x the forward's rate (it set the peak of every curve once)."""
    from replay.calibrate import backward_seconds

    assert backward_seconds(1.0, 3.0) == 2.0  # two products at the forward's rate
    assert backward_seconds(1.0, 1.02) == 1.0  # noise: floored
    assert backward_seconds(2.0, 1.5) == 2.0
