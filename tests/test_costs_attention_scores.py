"""Attention without FlashAttention: the materialised s x s scores cost HBM traffic (workloads.ops, costs.compute).

Without flash attention the scores are written by Q.K^T, read and written by the fused scale-mask-softmax,
by the dropout (when the model trains with it), and read by P.V (Megatron-LM's ``ParallelAttention``); the
backward runs the dropout's and the softmax's backwards. The non-matmul operators' bytes are priced by
their bytes on top of the matmul kernels, and the two score matmuls are GEMMs of their own shape. With
flash attention nothing changes: one fused attention kernel, no score bytes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import costs
from costs.compute import elementwise_apart, elementwise_bandwidth, gemm_kernels_seconds, kernel_level_seconds
from hardware_models import load_hardware
from workloads import ModelSpec, WorkloadConfig, load_model
from workloads.activations import block_activations
from workloads.ops import ATTENTION, GEMM, LayerOps, layer_ops


def _cfg(flash: bool, micro_batch: int = 2, seq_len: int = 256, checkpointing: str = "full") -> WorkloadConfig:
    return WorkloadConfig(micro_batch=micro_batch, seq_len=seq_len, precision="fp16", checkpointing=checkpointing,
                          flash_attention=flash)


def _scores(m: ModelSpec, c: WorkloadConfig) -> float:
    return float(m.n_heads * c.seq_len * c.seq_len * c.micro_batch)


@pytest.mark.parametrize("dropout", [True, False])
def test_score_bytes_are_korthikantis_attention_activations_written_plus_what_the_ops_read(dropout: bool) -> None:
    m = replace(load_model("gpt2"), dropout=dropout)
    c = _cfg(False)
    e, s_el = c.dtype_bytes, _scores(m, c)
    fwd, bwd = layer_ops(m, c, 1, "fwd"), layer_ops(m, c, 1, "bwd")
    # forward: the softmax writes its output, the dropout its mask and output -- exactly the a*s^2*b tensors
    # Korthikanti 2022 Sec. 4 counts as saved (5as^2b at e = 2 with dropout) -- and each op reads its input once
    written = block_activations(m, c.micro_batch, c.seq_len, e, False, 0).attention_core
    assert fwd.score_bytes == pytest.approx(written + e * s_el * (2 if dropout else 1))
    assert fwd.score_bytes == pytest.approx((9 if dropout else 4) * s_el)  # e = 2
    # backward: softmax backward reads the gradient and its output and writes a gradient (3e); dropout backward
    # reads the gradient and the mask and writes a gradient (2e + 1)
    assert bwd.score_bytes == pytest.approx((3 * e + (2 * e + 1 if dropout else 0)) * s_el)
    flash_fwd = layer_ops(m, _cfg(True), 1, "fwd")
    assert fwd.elementwise_bytes - flash_fwd.elementwise_bytes == pytest.approx(fwd.score_bytes)
    # the score operators run as 1 or 2 operators, and the core is 2 GEMMs instead of one fused kernel
    assert fwd.n_ops - flash_fwd.n_ops == 1 + (2 if dropout else 1)


def test_without_flash_the_core_is_two_batched_gemms_of_the_same_flops() -> None:
    m, c = load_model("gpt2"), _cfg(False)
    flash_fwd, fwd = layer_ops(m, _cfg(True), 1, "fwd"), layer_ops(m, c, 1, "fwd")
    assert flash_fwd.kinds[-1] == ATTENTION and flash_fwd.score_bytes == 0
    assert fwd.kinds[-2:] == (GEMM, GEMM) and ATTENTION not in fwd.kinds
    assert fwd.flops == pytest.approx(flash_fwd.flops)
    d = m.hidden // m.n_heads
    rows = c.micro_batch * m.n_heads * c.seq_len
    assert fwd.matmul_shapes[-2:] == ((rows, c.seq_len, d), (rows, d, c.seq_len))
    for f, (mm, n, k) in zip(fwd.matmul_flops[-2:], fwd.matmul_shapes[-2:], strict=True):
        assert f == pytest.approx(2 * mm * n * k)  # non-causal convention: every pair
    bwd = layer_ops(m, c, 1, "bwd")
    assert bwd.flops == pytest.approx(layer_ops(m, _cfg(True), 1, "bwd").flops)
    assert bwd.kinds[-4:] == (GEMM,) * 4


def test_selective_recomputation_repeats_the_forward_core_and_its_score_operators() -> None:
    m = load_model("gpt2")
    sel = layer_ops(m, _cfg(False, checkpointing="selective"), 1, "recompute")
    fwd = layer_ops(m, _cfg(False), 1, "fwd")
    assert sel.matmul_flops == fwd.matmul_flops[-2:] and sel.score_bytes == fwd.score_bytes > 0
    assert sel.elementwise_bytes == sel.score_bytes
    full = _cfg(False, checkpointing="full")
    assert layer_ops(m, full, 1, "recompute") == layer_ops(m, full, 1, "fwd")
    assert layer_ops(m, _cfg(False, checkpointing="none"), 1, "recompute").n_ops == 0  # nothing recomputed


@settings(max_examples=12, deadline=None)
@given(b=st.sampled_from([1, 2, 8]), s=st.sampled_from([128, 512, 2048]), hw=st.sampled_from(["a100", "v100"]),
       phase=st.sampled_from(["fwd", "bwd"]))
def test_kernel_level_prices_the_score_bytes_over_hbm(b: int, s: int, hw: str, phase: str) -> None:
    """V100 (a folded curve): the score operators' bytes over HBM on top of the kernels; A100 (element-wise work
    priced apart, gpu.elementwise_efficiency): every element-wise byte, the scores' among them."""
    spec = load_hardware(hw)
    m = load_model("gpt2")
    on = layer_ops(m, _cfg(True, micro_batch=b, seq_len=s), 1, phase)
    off = layer_ops(m, _cfg(False, micro_batch=b, seq_len=s), 1, phase)
    hbm, bw = spec.gpu.hbm_bw, elementwise_bandwidth(spec.gpu)
    assert elementwise_apart(spec.gpu) == (hw == "a100")
    assert off.elementwise_bytes - on.elementwise_bytes == pytest.approx(off.score_bytes)

    def ew(o: LayerOps) -> float:
        return (o.elementwise_bytes if elementwise_apart(spec.gpu) else o.score_bytes) / bw

    assert kernel_level_seconds(spec, on, "fp16") == pytest.approx(gemm_kernels_seconds(spec, on, "fp16") + ew(on))
    assert kernel_level_seconds(spec, off, "fp16") == pytest.approx(
        gemm_kernels_seconds(spec, off, "fp16") + ew(off))
    # split in two, the core's kernels are smaller (no more efficient) and held to the scores they move: the
    # difference is the score operators' bytes plus the score GEMMs' time less the fused kernel's
    extra = kernel_level_seconds(spec, off, "fp16") - kernel_level_seconds(spec, on, "fp16")
    if spec.gpu.attention_efficiency is None:  # one curve: the split kernels are no faster than the fused one
        assert extra >= off.score_bytes / bw * (1 - 1e-9)
    n_core = 2 if phase == "fwd" else 4
    peak, curve = spec.peak_flops_for("fp16"), spec.gpu.gemm_efficiency
    split = sum(max(f / (peak * curve(f)), 2 * (mm * k + k * n + mm * n) / hbm)
                for f, (mm, n, k) in zip(off.matmul_flops[-n_core:], off.matmul_shapes[-n_core:], strict=True))
    fused_curve = spec.gpu.attention_efficiency or curve  # the fused kernel on its own curve where the preset has one
    fused = on.matmul_flops[-1] / (peak * fused_curve(on.matmul_flops[-1]))
    assert extra == pytest.approx(off.score_bytes / bw + split - fused, rel=1e-9)

def test_the_pricer_charges_the_scores_at_kernel_level_and_at_operator_level() -> None:
    m, c = load_model("gpt2"), _cfg(False)
    ops = layer_ops(m, c, 1, "bwd")
    a100 = load_hardware("a100")
    plain = costs.ComputePricer(a100, "fp16", (m, c))
    assert plain.seconds(ops.flops, 0.0, 1, "bwd") == pytest.approx(
        kernel_level_seconds(a100, ops, "fp16") + a100.gpu.launch_overhead_s)
    calibrated = load_hardware("a100", ["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s"])
    op_level = costs.ComputePricer(calibrated, "fp16", (m, c))
    got = op_level.seconds(ops.flops, 0.0, 1, "bwd")
    assert got == costs.ops_seconds(calibrated, ops, "fp16", "bwd")
    without = replace(ops, elementwise_bytes=ops.elementwise_bytes - ops.score_bytes)
    assert got - costs.ops_seconds(calibrated, without, "fp16", "bwd") == pytest.approx(ops.score_bytes / 500e9)


def test_a_tensor_parallel_share_scales_the_score_bytes() -> None:
    ops = layer_ops(load_model("gpt2"), _cfg(False), 1, "fwd")
    half = ops.scaled(0.5)
    assert half.score_bytes == pytest.approx(ops.score_bytes / 2) and half.kinds == ops.kinds


def test_a_tiled_plan_prices_each_tile_as_its_block() -> None:
    """ZeRO-Infinity's memory-centric tiling renumbers the plan's layers (tags count tiles): a tile is priced as
    its block at the tile's share, not as whichever model layer carries the tile's index (the head, or none)."""
    m = replace(load_model("gpt2"), n_layers=2)
    c = _cfg(False)
    a100 = load_hardware("a100")
    tiled = costs.ComputePricer(a100, "fp16", (m, c), tile_factor=4)
    assert [tiled.model_layer(i) for i in range(11)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, None]
    plain = costs.ComputePricer(a100, "fp16", (m, c))
    quarter = layer_ops(m, c, 2, "fwd").flops / 4
    assert tiled.seconds(quarter, 0.0, 7, "fwd") == plain.seconds(quarter, 0.0, 2, "fwd")
    head = layer_ops(m, c, 3, "fwd").flops
    assert tiled.seconds(head, 0.0, 9, "fwd") == plain.seconds(head, 0.0, 3, "fwd")
