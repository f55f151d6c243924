"""``ModelSpec.with_shape``: changing a dimension re-resolves the widths the old shape implied (head_dim,
v_head_dim, expert_ffn, shared_expert_ffn) and keeps those given explicitly; ``dataclasses.replace`` would
carry the stale resolved widths, so no shipped module may change a width with it."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from planner.maxmodel import preset_scaler
from workloads import ModelSpec, WorkloadInputError, load_model
from workloads.model import list_models

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = {"hidden", "n_heads", "n_kv_heads", "ffn", "head_dim", "v_head_dim", "expert_ffn", "shared_expert_ffn",
          "n_experts", "shared_experts", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim"}


def _fresh(m: ModelSpec, **dims: object) -> ModelSpec:
    """The model built from scratch with ``dims`` (no resolved width carried over)."""
    data = m.to_dict()
    data.update(dims)
    for k in ("head_dim", "v_head_dim", "expert_ffn", "shared_expert_ffn"):
        if k not in dims:
            data.pop(k, None)
    return ModelSpec.from_dict(data)


def test_every_preset_is_its_own_with_shape() -> None:
    for name in list_models():
        m = load_model(name)
        assert m.with_shape() == m, name


def test_an_implied_head_dim_follows_the_new_shape() -> None:
    m = load_model("7b")  # head_dim 128 = 4096 / 32, implied
    wide = m.with_shape(hidden=8192, n_heads=32, n_kv_heads=32, ffn=22016)
    assert wide.head_dim == wide.v_head_dim == 256 and wide.q_dim == 8192
    assert wide == _fresh(m, hidden=8192, n_heads=32, n_kv_heads=32, ffn=22016)
    assert wide.params() == _fresh(m, hidden=8192, n_heads=32, n_kv_heads=32, ffn=22016).params()
    # what replace() does, and why it is not used for shapes
    assert replace(m, hidden=8192, n_heads=32, n_kv_heads=32, ffn=22016).head_dim == 128


def test_an_explicit_head_dim_stays_and_zero_rederives_it() -> None:
    gemma_like = load_model("7b").with_shape(name="gemma-like", hidden=3072, n_heads=16, n_kv_heads=16,
                                             head_dim=256, ffn=24576)
    assert gemma_like.head_dim == 256 and gemma_like.q_dim == 4096
    deeper = gemma_like.with_shape(n_layers=10, hidden=4096)
    assert deeper.head_dim == 256 and deeper.hidden == 4096
    assert gemma_like.with_shape(head_dim=0).head_dim == 3072 // 16


def test_expert_widths() -> None:
    moe = load_model("mixtral-8x7b")  # expert_ffn implied (= ffn): follows it
    assert moe.with_shape(ffn=2 * moe.ffn).expert_ffn == 2 * moe.ffn
    fine = moe.with_shape(expert_ffn=1408)  # given explicitly: kept when the dense width changes
    assert fine.with_shape(ffn=2 * moe.ffn).expert_ffn == 1408
    dense = load_model("7b")
    assert dense.with_shape(ffn=12288).expert_ffn == 12288  # a dense model's expert width is its MLP


def test_unknown_field_is_refused() -> None:
    with pytest.raises(WorkloadInputError, match="hiden"):
        load_model("7b").with_shape(hiden=1)


def test_the_max_model_width_scaler_keeps_heads_consistent() -> None:
    scaler = preset_scaler("7b", "width")
    for n in (8, 16, 40):
        m = scaler.build(n)
        assert m.hidden == m.n_heads * m.head_dim and m == _fresh(m, hidden=m.hidden, n_heads=m.n_heads)


def _width_replaces(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            changed = {k.arg for k in node.keywords} & WIDTHS
            if name == "replace" and changed:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} replace(..., {', '.join(sorted(changed))})")
    return out


def test_no_shipped_module_changes_a_width_with_replace() -> None:
    packages = ("workloads", "planner", "policies", "tiersim", "reports", "costs", "simulator", "replay",
                "hardware_models", "userfiles")
    found = [hit for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py")) for hit in _width_replaces(p)]
    assert found == [], "use ModelSpec.with_shape(...) to change a model's dimensions: " + "; ".join(found)
