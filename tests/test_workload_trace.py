"""WorkloadTrace structure, serialisation, configuration checks and scaling laws (Hypothesis)."""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workloads
from workloads import (
    LayerTrace,
    WorkloadConfig,
    WorkloadInputError,
    WorkloadTrace,
    build_trace,
    list_models,
    load_model,
)

PACKAGE_DIR = Path(workloads.__file__).parent


def test_layer_structure() -> None:
    m = load_model("llama2-13b")
    t = build_trace(m, WorkloadConfig(seq_len=1024))
    assert [layer.name for layer in t.layers] == ["embedding", *[f"block{i}" for i in range(40)], "head"]
    assert [layer.index for layer in t.layers] == list(range(42))
    assert {layer.kind for layer in t.layers[1:-1]} == {"block"}
    assert (t.layers[0].kind, t.layers[-1].kind) == ("embedding", "head")
    assert t.tokens_per_micro_batch == 1024
    assert t.provenance.startswith("formula:")
    assert t.hardware_flops_per_token() > t.model_flops_per_token()


def test_tied_head_owns_only_the_final_norm() -> None:
    t = build_trace(load_model("gpt2"), WorkloadConfig(seq_len=1024))
    assert t.layers[-1].params == 2 * 768
    assert t.layers[0].params == (50257 + 1024) * 768


def test_round_trip_dict_and_file(tmp_path: Path) -> None:
    t = build_trace(load_model("mixtral-8x7b"), WorkloadConfig(micro_batch=2, seq_len=4096,
                                                                 checkpointing="selective"))
    assert WorkloadTrace.from_dict(t.to_dict()) == t
    path = tmp_path / "trace.json"
    t.save(path)
    assert WorkloadTrace.load(path) == t
    measured = WorkloadTrace(model=t.model, config=t.config, layers=t.layers, provenance="measured: test")
    measured.save(path)
    assert WorkloadTrace.load(path).provenance == "measured: test"


def test_trace_file_errors(tmp_path: Path) -> None:
    t = build_trace(load_model("gpt2"), WorkloadConfig(seq_len=128))
    data = t.to_dict()
    with pytest.raises(WorkloadInputError, match="version"):
        WorkloadTrace.from_dict({**data, "version": 99})
    layer = {**t.layers[0].to_dict()}
    del layer["fwd_flops"]
    with pytest.raises(WorkloadInputError, match="missing field 'fwd_flops'"):
        LayerTrace.from_dict(layer)
    path = tmp_path / "bad.json"
    path.write_text('{"schema": \n')
    with pytest.raises(WorkloadInputError, match=r"bad\.json: line 2, column 1:"):
        WorkloadTrace.load(path)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"micro_batch": 0}, "field 'micro_batch' must be >= 1"),
    ({"seq_len": -1}, "field 'seq_len' must be >= 1"),
    ({"global_batch": 0}, "field 'global_batch' must be >= 1"),
    ({"precision": "bf61"}, "did you mean 'bf16'"),
    ({"checkpointing": "partial"}, "must be one of none, selective, full"),
    ({"causal_attention_factor": 0.0}, "causal_attention_factor"),
])
def test_config_validation(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(WorkloadInputError, match=fragment):
        WorkloadConfig(**kwargs)  # type: ignore[arg-type]


def test_config_defaults_and_round_trip() -> None:
    cfg = WorkloadConfig(micro_batch=4)
    assert (cfg.seq_len, cfg.global_batch, cfg.precision, cfg.checkpointing, cfg.flash_attention) == (
        2048, 4, "bf16", "full", True)
    assert WorkloadConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(WorkloadInputError, match="unknown key 'seqlen'; did you mean 'seq_len'"):
        WorkloadConfig.from_dict({"seqlen": 4})


def test_learned_positions_limit_seq_len() -> None:
    with pytest.raises(WorkloadInputError, match="seq_len 2048 exceeds model 'gpt2' max_pos 1024"):
        build_trace(load_model("gpt2"), WorkloadConfig())
    build_trace(load_model("llama2-7b"), WorkloadConfig(seq_len=8192))  # rotary: allowed


def test_package_imports_nothing_else_of_the_project() -> None:
    allowed = set(sys.stdlib_module_names) | {"yaml", "numpy", "workloads", "userfiles", "__future__"}
    for path in PACKAGE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"


# ---- scaling laws ------------------------------------------------------------------------------
_configs = st.fixed_dictionaries({
    "seq_len": st.sampled_from([64, 256, 1024]),
    "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
    "checkpointing": st.sampled_from(["none", "selective", "full"]),
    "flash_attention": st.booleans(),
})


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(list_models()), cfg=_configs, b=st.integers(1, 16), k=st.integers(2, 8))
def test_flops_and_activations_linear_in_micro_batch(name: str, cfg: dict[str, object], b: int,
                                                     k: int) -> None:
    model = load_model(name)
    one = build_trace(model, WorkloadConfig(micro_batch=b, **cfg))  # type: ignore[arg-type]
    many = build_trace(model, WorkloadConfig(micro_batch=k * b, **cfg))  # type: ignore[arg-type]
    for total in ("fwd_flops", "bwd_flops", "recompute_flops"):
        assert math.isclose(getattr(many, total), k * getattr(one, total), rel_tol=1e-12)
    for small, big in zip(one.layers, many.layers, strict=True):
        assert big.activation_bytes == k * small.activation_bytes
        assert big.activation_bytes_nockpt == k * small.activation_bytes_nockpt
        assert big.output_bytes == (4 if big.kind == "head" else k * small.output_bytes)
        assert math.isclose(big.fwd_flops, k * small.fwd_flops, rel_tol=1e-12)
    assert many.activation_bytes == k * one.activation_bytes
    assert math.isclose(many.model_flops_per_token(), one.model_flops_per_token(), rel_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(list_models()), cfg=_configs, b=st.integers(1, 64))
def test_params_and_states_independent_of_batch(name: str, cfg: dict[str, object], b: int) -> None:
    model = load_model(name)
    t = build_trace(model, WorkloadConfig(micro_batch=b, **cfg))  # type: ignore[arg-type]
    ref = build_trace(model, WorkloadConfig(micro_batch=1, seq_len=64, precision=cfg["precision"]))  # type: ignore[arg-type]
    assert t.params == model.params()
    assert [(x.params, x.model_state_bytes) for x in t.layers] == [
        (x.params, x.model_state_bytes) for x in ref.layers]
