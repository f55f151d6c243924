"""``tiersim workload check``: the workload formulas against the replay model on torch's meta device."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402  (after importorskip on purpose)

from replay.meta_check import (  # noqa: E402
    block_flops_by_kind,
    build_meta_layers,
    meta_check,
    param_bytes,
    saved_activation_bytes,
)
from tiersim.cli import main  # noqa: E402
from workloads import ModelSpec, WorkloadConfig, build_trace, load_model  # noqa: E402
from workloads import activations as act  # noqa: E402
from workloads import flops as wflops  # noqa: E402

GPT2_STYLE = ModelSpec(name="tiny-gpt2", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4,
                       ffn=256, vocab=97, max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm",
                       bias=True, learned_pos=True, dropout=True)
LLAMA_STYLE = ModelSpec(name="tiny-llama", family="custom", n_layers=3, hidden=128, n_heads=8, n_kv_heads=2,
                        ffn=352, vocab=101, max_pos=256, tied_embeddings=False, mlp="swiglu", norm="rmsnorm",
                        bias=False, learned_pos=False)
B, S = 2, 64
MATMUL_REL_TOL = 1e-9  # both sides are exact integer sums of 2*m*n*k; only float rounding can differ


def _rows(model: ModelSpec, b: int = B, s: int = S) -> dict[tuple[str, str], dict]:
    return {(r["layer"], r["item"].strip()): r for r in meta_check(model, b, s).to_dict()["rows"]}


@pytest.mark.parametrize("model", [GPT2_STYLE, LLAMA_STYLE], ids=lambda m: m.name)
def test_param_bytes_match_exactly_small(model: ModelSpec) -> None:
    trace = build_trace(model, WorkloadConfig(micro_batch=B, seq_len=S, precision="bf16"))
    emb, blk, head = build_meta_layers(model, torch.bfloat16)
    assert param_bytes(emb) == trace.layers[0].param_bytes
    assert param_bytes(blk) == trace.layers[1].param_bytes
    assert param_bytes(head) == trace.layers[-1].param_bytes
    total = param_bytes(emb) + model.n_layers * param_bytes(blk) + param_bytes(head)
    assert total == 2 * model.params() == sum(lt.param_bytes for lt in trace.layers)


def test_param_bytes_match_exactly_70b() -> None:
    model = load_model("70b")
    rows = _rows(model, 1, 128)
    for layer in ("embedding", "block", "head", "model"):
        row = rows[(layer, "param bytes")]
        assert row["torch"] == row["formula"], layer
    assert rows[("model", "param bytes")]["torch"] == 2 * model.params()


@pytest.mark.parametrize("model", [GPT2_STYLE, LLAMA_STYLE], ids=lambda m: m.name)
def test_block_matmul_flops_match(model: ModelSpec) -> None:
    """Projections and MLP (aten.mm): forward and backward (= 2 x forward) equal the trace."""
    bf = wflops.block_forward_flops(model, B, S)
    non_attention = bf.qkv + bf.output_projection + bf.mlp
    rows = _rows(model)
    fwd, bwd = rows[("block", "fwd FLOPs matmuls")], rows[("block", "bwd FLOPs matmuls")]
    assert fwd["formula"] == non_attention
    assert fwd["torch"] == pytest.approx(non_attention, rel=MATMUL_REL_TOL)
    assert bwd["torch"] == pytest.approx(2 * non_attention, rel=MATMUL_REL_TOL)


@pytest.mark.parametrize("model", [GPT2_STYLE, LLAMA_STYLE], ids=lambda m: m.name)
def test_block_attention_flops_counted_full(model: ModelSpec) -> None:
    """Expectation: the replay block's SDPA runs the math path on meta (two bmm per head) and counts the
    full s x s products even with is_causal (masking skips nothing): 4*b*s^2*h forward, 2x that
    backward -- the trace's Narayanan convention (causal_attention_factor 1.0), and twice what the
    trace counts with the causal factor 0.5."""
    expected = 4 * B * S * S * model.hidden
    rows = _rows(model)
    assert rows[("block", "fwd FLOPs attention")]["torch"] == expected
    assert rows[("block", "bwd FLOPs attention")]["torch"] == 2 * expected
    assert wflops.block_forward_flops(model, B, S).attention_core == expected
    causal = wflops.block_forward_flops(model, B, S, wflops.CAUSAL_ATTENTION_FACTOR)
    assert causal.attention_core == expected / 2


def test_block_flops_split_by_op() -> None:
    counts = {"aten.mm": 10, "aten.addmm": 5, "aten.bmm": 7, "aten._scaled_dot_product_flash_attention": 3}
    assert block_flops_by_kind(counts) == (15, 10)


def test_head_and_embedding_flops() -> None:
    rows = _rows(LLAMA_STYLE)
    assert rows[("embedding", "fwd FLOPs")]["torch"] == 0 == rows[("embedding", "bwd FLOPs")]["torch"]
    head = 2 * B * S * LLAMA_STYLE.hidden * LLAMA_STYLE.vocab
    assert rows[("head", "fwd FLOPs")]["torch"] == head
    assert rows[("head", "bwd FLOPs")]["torch"] == 2 * head


def test_saved_activations_swiglu_mlp_and_flash_lse_match() -> None:
    """The unfused SwiGLU graph keeps exactly the formula's e*sb*(h+4f); the flash kernel's logsumexp is
    4*a*s*b; parameters (weights saved by the linears) are not counted as activations."""
    model = LLAMA_STYLE
    _, blk, _ = build_meta_layers(model, torch.bfloat16)
    x = torch.empty(B, S, model.hidden, device="meta", dtype=torch.bfloat16, requires_grad=True)
    math, _ = saved_activation_bytes(blk, lambda: blk(x), S)
    assert math.by_component["mlp"] == act.block_activations(model, B, S, 2, False).mlp
    assert math.total == sum(math.by_component.values())
    flash, _ = saved_activation_bytes(blk, lambda: blk(x), S, flash=True)
    assert flash.by_component["attention_core"] == 4 * model.n_heads * S * B
    assert flash.total < math.total


def test_cli_json_7b(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "check", "--model", "7b", "--seq-len", "512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"model", "config", "blocks", "rows", "params_match", "flops_match", "verdict", "notes",
            "block_saved_math", "block_saved_flash"} <= set(out)
    assert out["model"] == "llama2-7b" and out["config"]["seq_len"] == 512
    assert out["blocks"] == {"count": 32, "checked": 1, "identical": True}
    assert out["params_match"] and out["flops_match"] and out["verdict"].startswith("OK")
    assert {"layer", "item", "formula", "torch", "rel_diff", "note"} <= set(out["rows"][0])


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "check", "--model", "gpt2", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "verdict: OK" in out and "param bytes" in out and "saved act. (math SDPA)" in out


def test_cli_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "check", "--model", "nosuchmodel"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "nosuchmodel" in lines[0] and "llama2-70b" in lines[0]
    assert captured.out == ""


@pytest.mark.parametrize("argv", [["--micro-batch", "0"], ["--seq-len", "0"]])
def test_cli_bad_numbers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "check", "--model", "7b", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
