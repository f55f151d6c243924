"""The model-definition route (workloads/hf_inventory): a model inventory from transformers' own definition.

Every config below is written from the authors' published config.json (the Hugging Face repository named in
its comment), at full size: the meta device gives shapes without memory, so DeepSeek-V3's 671 B parameters
build in about a second. For every family both routes know, the inventory (tensors of the built model) and the
formula route (workloads/hf_config.py + workloads/model_params.py) must agree exactly on total and active
parameters, on the dimensions, and layer by layer on the matmul FLOPs; the inventory's FLOPs are also checked
against 2 x active matmul parameters + the attention term computed here from the published dimensions alone.
model_types the formulas do not know are described through the inventory and simulated.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiersim.cli import simulate_main
from workloads import ModelSpec, WorkloadInputError, load_model
from workloads.hf_inventory import (
    HF_EXTRA_HINT,
    ModelInventory,
    inventory_from_config,
    spec_from_hf_config,
    transformers_available,
)
from workloads.hf_inventory.classify import classify
from workloads.hf_inventory.spec import spec_from_inventory
from workloads.hf_inventory.walk import inventory_and_config, walk_model

# ---- published configurations (the authors' config.json, the keys that shape the model) -------------------
BOTH_ROUTES: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-2-7b-hf
    "llama": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
              "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
    # mistralai/Mistral-Nemo-Base-2407 (head_dim 128 != 5120/32)
    "mistral": {"model_type": "mistral", "hidden_size": 5120, "head_dim": 128, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 40,
                "vocab_size": 131072, "max_position_embeddings": 1024000, "sliding_window": None,
                "tie_word_embeddings": False, "rope_theta": 1000000.0},
    # mistralai/Mixtral-8x7B-v0.1
    "mixtral": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
                "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
                "sliding_window": None, "tie_word_embeddings": False},
    # Qwen/Qwen2.5-7B
    "qwen2": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
              "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
              "max_position_embeddings": 131072, "sliding_window": 131072, "use_sliding_window": False,
              "max_window_layers": 28, "tie_word_embeddings": False},
    # Qwen/Qwen3-8B
    "qwen3": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36, "vocab_size": 151936,
              "max_position_embeddings": 40960, "tie_word_embeddings": False},
    # Qwen/Qwen3-30B-A3B
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                  "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": 151936,
                  "max_position_embeddings": 40960, "tie_word_embeddings": False},
    # microsoft/Phi-3-mini-4k-instruct
    "phi3": {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
             "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
             "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "sliding_window": 2047,
             "tie_word_embeddings": False},
    # google/gemma-2-9b
    "gemma2": {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
               "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000,
               "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "tie_word_embeddings": True},
    # google/gemma-3-1b-pt
    "gemma3": {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
               "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 26,
               "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
               "sliding_window_pattern": 6, "query_pre_attn_scalar": 256, "tie_word_embeddings": True},
    # allenai/OLMo-2-1124-7B
    "olmo2": {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
              "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 100352,
              "max_position_embeddings": 4096, "tie_word_embeddings": False},
    # tiiuae/falcon-7b
    "falcon": {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
               "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False, "bias": False,
               "alibi": False, "vocab_size": 65024},
    # EleutherAI/pythia-6.9b
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 4096, "intermediate_size": 16384,
                 "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 50432,
                 "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
                 "tie_word_embeddings": False},
    # bigscience/bloom-7b1
    "bloom": {"model_type": "bloom", "hidden_size": 4096, "n_head": 32, "n_layer": 30, "vocab_size": 250880},
    # facebook/opt-1.3b
    "opt": {"model_type": "opt", "hidden_size": 2048, "ffn_dim": 8192, "num_attention_heads": 32,
            "num_hidden_layers": 24, "vocab_size": 50272, "max_position_embeddings": 2048,
            "word_embed_proj_dim": 2048, "do_layer_norm_before": True, "enable_bias": True, "dropout": 0.1},
    # openai-community/gpt2
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
             "vocab_size": 50257, "n_inner": None},
    # deepseek-ai/DeepSeek-V3
    "deepseek_v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
                    "num_hidden_layers": 61, "first_k_dense_replace": 3, "n_routed_experts": 256,
                    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
                    "tie_word_embeddings": False},
}

# model_types the formulas do not know; the published parameter count where the repository states one
STARCODER2_7B = {  # bigcode/starcoder2-7b; its Hub page lists 7.17B parameters (safetensors), the card "7B"
    "model_type": "starcoder2", "hidden_size": 4608, "intermediate_size": 18432, "num_attention_heads": 36,
    "num_key_value_heads": 4, "num_hidden_layers": 32, "vocab_size": 49152, "max_position_embeddings": 16384,
    "sliding_window": 4096, "use_bias": True, "tie_word_embeddings": True, "_name_or_path": "bigcode/starcoder2-7b",
}
FORMULA_UNKNOWN = {
    "starcoder2": STARCODER2_7B,
    # ibm-granite/granite-3.0-2b-base (dimensions; multipliers do not change shapes)
    "granite": {"model_type": "granite", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_hidden_layers": 40, "vocab_size": 49155,
                "max_position_embeddings": 4096, "tie_word_embeddings": True},
    # CohereForAI/c4ai-command-r-v01 (parallel block, one LayerNorm without bias)
    "cohere": {"model_type": "cohere", "hidden_size": 8192, "intermediate_size": 22528, "num_attention_heads": 64,
               "num_key_value_heads": 64, "num_hidden_layers": 40, "vocab_size": 256000,
               "max_position_embeddings": 8192, "use_qk_norm": False, "tie_word_embeddings": True},
    # stabilityai/stablelm-2-1_6b
    "stablelm": {"model_type": "stablelm", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "num_hidden_layers": 24, "vocab_size": 100352,
                 "max_position_embeddings": 4096, "partial_rotary_factor": 0.25, "use_qkv_bias": True,
                 "tie_word_embeddings": False},
}
NOT_DIMENSIONS = ("name", "source", "route", "notes")
# BLOOM's config.json names no context length: the formulas take 2048 (its training length), so does the inventory
# but says so in a note; DeepSeek-V3's router bias is a buffer of the definition, named in a note.
INVENTORY_NOTES = {"bloom": "no context length in the config", "deepseek_v3": "e_score_correction_bias (14,848)"}
SEQ, BATCH = 8192, 1   # longer than Gemma-2's window (4096) and Gemma-3's (512): the span differs per layer


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[ModelInventory, Any]]:
    """Every published config built once on the meta device: (inventory, transformers config)."""
    return {name: inventory_and_config(cfg, where=name) for name, cfg in BOTH_ROUTES.items()}


def _write(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_transformers_is_installed() -> None:
    assert transformers_available()   # the dev extra installs it: nothing below may pass by being skipped


@pytest.mark.parametrize("family", sorted(BOTH_ROUTES))
def test_routes_agree(family: str, tmp_path: Path, built: dict[str, tuple[ModelInventory, Any]]) -> None:
    """Inventory and formulas: same totals, same dimensions, same matmul FLOPs layer by layer."""
    from workloads import flops

    config = BOTH_ROUTES[family]
    formula = load_model(str(_write(tmp_path, config)), route="formula")
    inv, cfg = built[family]
    definition, notes = spec_from_inventory(inv, cfg, config, name=family, source="test")
    assert formula.route == "formula" and definition.route == "model definition"
    assert (inv.params(), inv.active_params()) == (formula.params(), formula.active_params())
    assert (definition.params(), definition.active_params()) == (formula.params(), formula.active_params())
    dims = [f.name for f in fields(ModelSpec) if f.name not in NOT_DIMENSIONS]
    assert {k: getattr(definition, k) for k in dims} == {k: getattr(formula, k) for k in dims}
    for layer in inv.layers:
        proj, core = layer.forward_flops(BATCH, SEQ)
        ref = flops.block_forward_flops(formula, BATCH, SEQ, layer=layer.index)
        assert proj == ref.qkv + ref.output_projection + ref.mlp + ref.router, layer.index
        assert core == ref.attention_core, layer.index
    assert inv.head_forward_flops(BATCH, SEQ) == flops.head_forward_flops(formula, BATCH, SEQ)
    expected = INVENTORY_NOTES.get(family)
    assert [n for n in notes if expected is None or expected not in n] == [], notes


@pytest.mark.parametrize("family", ["gemma2", "llama"])
def test_routes_name_the_same_unmodelled_keys(family: str, tmp_path: Path) -> None:
    """Soft-capping (Gemma-2) and rope scaling (Llama-3.1) are named once, the same way, by both routes."""
    rope = {"rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    config = {**BOTH_ROUTES[family], "num_hidden_layers": 2, **(rope if family == "llama" else {})}
    path = _write(tmp_path, config)
    formula, definition = load_model(str(path), route="formula"), load_model(str(path), route="definition")
    assert formula.notes and definition.notes == formula.notes


def _attention_term(h: int, a: int, qk: int, v: int, span: int) -> int:
    del h
    return 2 * a * (qk + v) * span


@pytest.mark.parametrize(("family", "per_token"), [
    # dense GQA: q,o h*a*d; k,v h*g*d; swiglu 3*h*f
    ("qwen3", 2 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 3 * 4096 * 12288)),
    # MoE: router h*E + top-8 experts of 3*h*768
    ("qwen3_moe", 2 * (2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 2048 * 128 + 8 * 3 * 2048 * 768)),
    # MLA + MoE (layer >= 3): q down/up, kv down (rank + rope)/up (heads*(nope+v)), o; router, 8 routed + 1 shared
    ("deepseek_v3", 2 * (7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * (128 + 128)
                         + 128 * 128 * 7168 + 7168 * 256 + 9 * 3 * 7168 * 2048)),
    # Falcon-7B multi-query fused QKV (71 + 2 heads of 64), 4h GELU MLP
    ("falcon", 2 * (4544 * (71 + 2) * 64 + 4544 * 4544 + 2 * 4544 * 4 * 4544)),
])
def test_flops_from_published_dimensions(family: str, per_token: int,
                                         built: dict[str, tuple[ModelInventory, Any]]) -> None:
    """Per-token matmul FLOPs of the last layer = 2 x active matmul params + the attention term, by hand."""
    inv, _ = built[family]
    layer = inv.layers[-1]
    proj, core = layer.forward_flops(1, SEQ)
    assert proj == per_token * SEQ
    heads, qk, v = {"qwen3": (32, 128, 128), "qwen3_moe": (32, 128, 128), "deepseek_v3": (128, 192, 128),
                    "falcon": (71, 64, 64)}[family]
    assert core == SEQ * _attention_term(inv.hidden, heads, qk, v, SEQ)


def test_sliding_windows_by_layer(built: dict[str, tuple[ModelInventory, Any]]) -> None:
    """Gemma-2 alternates a 4096-token window and full attention; Gemma-3 has 5 local layers per global one."""
    gemma2, _ = built["gemma2"]
    assert [la.attention.sliding_window for la in gemma2.layers[:4] if la.attention] == [4096, None, 4096, None]
    windowed, full = (la.forward_flops(1, SEQ)[1] for la in gemma2.layers[:2])
    assert full == 2 * windowed                       # span 4096 vs 8192 keys per query
    gemma3, _ = built["gemma3"]
    assert [la.index for la in gemma3.layers if la.attention and la.attention.sliding_window is None] == [
        5, 11, 17, 23]


def test_moe_inventory(built: dict[str, tuple[ModelInventory, Any]]) -> None:
    """Fused 3-D expert tensors, dense first layers, shared experts and the tied/untied heads are found."""
    ds, _ = built["deepseek_v3"]
    assert [la.moe is None for la in ds.layers[:4]] == [True, True, True, False]
    moe = ds.layers[3].moe
    assert moe is not None and (moe.n_experts, moe.top_k, moe.n_shared, moe.expert_ffn) == (256, 8, 1, 2048)
    kinds = {t.kind for t in ds.layers[3].tensors}
    assert {"attn.q_down", "attn.q_up", "attn.kv_down", "attn.kv_up", "router", "expert.gate_up", "expert.down",
            "shared.gate", "shared.down"} <= kinds
    assert ds.params() == 671_026_404_352               # 671 B (DeepSeek-V3 report, arXiv 2412.19437): main model
    assert any("e_score_correction_bias (14,848)" in n for n in ds.notes)   # 58 MoE layers x 256, a buffer
    assert built["gemma2"][0].tied_embeddings and not built["llama"][0].tied_embeddings
    # Qwen3-30B-A3B model card: "30.5B in total and 3.3B activated"; the count includes embedding and LM head
    assert built["qwen3_moe"][0].active_params() == 3_353_032_704
    assert abs(built["qwen3_moe"][0].active_params() / 3.3e9 - 1) < 0.02


@pytest.mark.parametrize("family", sorted(FORMULA_UNKNOWN))
def test_unknown_model_type_goes_through_the_definition(family: str, tmp_path: Path) -> None:
    config = FORMULA_UNKNOWN[family]
    spec = load_model(str(_write(tmp_path, config)))       # automatic route
    inv = inventory_from_config(config)
    assert spec.route == "model definition" and spec.family == family
    assert (spec.params(), spec.active_params()) == (inv.params(), inv.active_params())
    assert not [n for n in spec.notes if "describe" in n]   # the dimensions express every tensor
    if family == "starcoder2":
        assert abs(spec.params() / 7.17e9 - 1) < 0.005
        assert spec.sliding_window == 4096 and len(spec.sliding_layers) == 32 and spec.bias


def test_unknown_model_type_simulates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {**STARCODER2_7B, "num_hidden_layers": 2})
    rc = simulate_main(["--hw", "a100", "--model", str(path), "--seq-len", "2048", "--json"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    result = json.loads(out)
    assert result["feasible"] and result["step_time_s"] > 0
    assert result["model"]["route"] == "model definition" and result["model"]["family"] == "starcoder2"


def test_forced_routes(tmp_path: Path) -> None:
    path = _write(tmp_path, {**BOTH_ROUTES["llama"], "num_hidden_layers": 2})
    assert load_model(str(path)).route == "formula"                        # known family: the fast path
    assert load_model(str(path), route="definition").route == "model definition"
    unknown = _write(tmp_path, FORMULA_UNKNOWN["granite"], "granite.json")
    with pytest.raises(WorkloadInputError, match="model_type 'granite'"):
        load_model(str(unknown), route="formula")
    with pytest.raises(WorkloadInputError, match="model route 'magic' is not one of auto, formula, definition"):
        load_model(str(path), route="magic")


def test_without_transformers_one_line_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)   # import transformers -> ImportError
    assert not transformers_available()
    path = _write(tmp_path, FORMULA_UNKNOWN["granite"])
    with pytest.raises(WorkloadInputError) as err:
        load_model(str(path))
    assert HF_EXTRA_HINT in str(err.value) and "YAML" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(WorkloadInputError, match=r"install the optional extra: pip install 'tiersim\[hf\]'"):
        spec_from_hf_config(FORMULA_UNKNOWN["granite"], path=path)
    assert load_model(str(_write(tmp_path, BOTH_ROUTES["gpt2"], "gpt2.json"))).params() == 124_439_808
    rc = simulate_main(["--hw", "a100", "--model", str(path)])
    out, err_text = capsys.readouterr()
    assert rc == 2 and out == "" and HF_EXTRA_HINT in err_text and err_text.count("\n") == 1


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "no_such_model", "hidden_size": 64}, "model_type 'no_such_model' is not defined in transformers"),
    ({"hidden_size": 64}, "missing field 'model_type'"),
    ({**BOTH_ROUTES["gemma2"], "layer_types": ["full_attention"]}, "transformers refused the configuration"),
    ({**BOTH_ROUTES["llama"], "num_hidden_layers": 10**9}, "field 'num_hidden_layers' (1000000000) is above the 2048"),
    ({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
      "intermediate_size": 128, "vocab_size": 100}, "no MLP recognised in the decoder layers"),
])
def test_refusals_are_one_line(config: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadInputError) as err:
        spec_from_hf_config(config, path="config.json")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_walk_of_a_hand_built_model() -> None:
    """A module tree transformers does not ship: experts as a ModuleList, an unknown tensor, a tied head."""
    import torch
    from torch import nn

    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w3, self.w2 = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False), nn.Linear(
                16, 8, bias=False)

    class Moe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(8, 4, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(4))

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(8, 8, bias=False), nn.Linear(8, 4, bias=False)
            self.v_proj, self.o_proj = nn.Linear(8, 4, bias=False), nn.Linear(8, 8, bias=False)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self_attn, self.mlp = Attention(), Moe()
            self.input_layernorm = nn.LayerNorm(8)
            self.mystery = nn.Parameter(torch.zeros(3))

    class Toy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.layers = nn.ModuleList(Layer() for _ in range(2))
            self.lm_head = nn.Linear(8, 10, bias=False)
            self.lm_head.weight = self.embed.weight

        def get_input_embeddings(self) -> nn.Module:
            return self.embed

        def get_output_embeddings(self) -> nn.Module:
            return self.lm_head

    with torch.device("meta"):
        model = Toy()
    cfg = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_experts_per_tok=2)
    inv = walk_model(model, cfg, "toy")
    attention, expert, norm = 64 + 32 + 32 + 64, 3 * 8 * 16, 16
    assert inv.tied_embeddings and inv.head_params() == 0
    assert inv.params() == 80 + 2 * (attention + 32 + 4 * expert + norm + 3)
    assert inv.active_params() == 80 + 2 * (attention + 32 + 2 * expert + norm + 3)
    layer = inv.layers[0]
    assert layer.moe is not None and (layer.moe.n_experts, layer.moe.top_k, layer.moe.expert_ffn) == (4, 2, 16)
    assert layer.attention is not None and (layer.attention.n_heads, layer.attention.n_kv_heads) == (2, 1)
    assert any("'mystery' (3,) of 2 layer(s) not recognised" in n for n in inv.notes)


@pytest.mark.parametrize(("parts", "param", "shape", "beside", "kind"), [
    (["mlp", "experts"], "gate_up_proj", (8, 32, 16), False, "expert.gate_up"),
    (["mlp", "experts", "3", "w2"], "weight", (16, 32), False, "expert.down"),
    (["mlp", "gate"], "weight", (8, 16), True, "router"),
    (["mlp", "gate_proj"], "weight", (32, 16), False, "mlp.gate"),
    (["mlp", "shared_expert_gate"], "weight", (1, 16), False, "shared.router"),
    (["attn", "c_attn"], "bias", (48,), False, "attn.qkv"),
    (["self_attn", "kv_a_layernorm"], "weight", (512,), False, "attn.norm"),
    (["fc1"], "weight", (64, 16), False, "mlp.up"),
])
def test_classify(parts: list[str], param: str, shape: tuple[int, ...], beside: bool, kind: str) -> None:
    assert classify(parts, ["M"] * len(parts), param, shape, beside_experts=beside).kind == kind


_ABSENT = object()   # a key left out of the config: the transformers config class's default applies


@st.composite
def _small_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A small config of a family both routes know, with dimensions no published model has."""
    family = draw(st.sampled_from(["llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "olmo2",
                                   "falcon", "gpt_neox", "bloom", "deepseek_v3"]))
    heads = draw(st.sampled_from([2, 4, 8]))
    kv = draw(st.sampled_from([k for k in (1, 2, heads) if heads % k == 0]))
    hidden, layers = draw(st.sampled_from([32, 48, 64])), draw(st.integers(2, 4))
    config: dict[str, Any] = {
        "model_type": family, "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv,
        "num_hidden_layers": layers, "intermediate_size": draw(st.sampled_from([40, 64, 100])),
        "vocab_size": draw(st.sampled_from([97, 1000])), "max_position_embeddings": 512,
        "tie_word_embeddings": draw(st.booleans()), "head_dim": draw(st.sampled_from([8, 16, 32])),
        "sliding_window": draw(st.sampled_from([None, 16, _ABSENT])), "pad_token_id": None,
    }
    if family == "qwen3_moe":
        config.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=1,
                      mlp_only_layers=[])
    elif family == "mixtral":
        config.update(num_local_experts=4, num_experts_per_tok=draw(st.sampled_from([1, 2])))
    elif family == "deepseek_v3":
        config.update(num_key_value_heads=heads, first_k_dense_replace=draw(st.integers(0, layers - 1)),
                      n_routed_experts=8, n_shared_experts=draw(st.sampled_from([1, 2])), num_experts_per_tok=2,
                      n_group=1, topk_group=1, moe_intermediate_size=16, kv_lora_rank=16, qk_nope_head_dim=16,
                      q_lora_rank=draw(st.sampled_from([None, 24, _ABSENT])), qk_rope_head_dim=8,
                      v_head_dim=draw(st.sampled_from([8, 16])))
    elif family == "gpt_neox":
        config.update(num_key_value_heads=heads, head_dim=None, use_parallel_residual=draw(st.booleans()))
    elif family == "falcon":
        config.update(multi_query=draw(st.booleans()), new_decoder_architecture=False, parallel_attn=True,
                      bias=draw(st.booleans()), alibi=False, head_dim=None)
    elif family == "bloom":
        config.update(head_dim=None)
    elif family == "gemma2":   # absent: the config class's 4096; null: no window (both routes)
        config.update(sliding_window=draw(st.sampled_from([16, 64, None, _ABSENT])))
    if family in ("llama", "mixtral", "qwen2", "falcon", "gpt_neox", "bloom"):
        config.pop("head_dim")
    return {k: v for k, v in config.items()
            if v is not _ABSENT and (v is not None or k in ("sliding_window", "pad_token_id", "q_lora_rank"))}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=_small_configs())
def test_routes_agree_on_unpublished_shapes(config: dict[str, Any], tmp_path: Path) -> None:
    """Every field and count of the two routes agree on small random shapes (head_dim != hidden/heads, GQA,
    tied heads, windows, dense-first MoE, shared experts, MLA with and without a query rank)."""
    path = _write(tmp_path, config)
    formula, definition = load_model(str(path), route="formula"), load_model(str(path), route="definition")
    dims = [f.name for f in fields(ModelSpec) if f.name not in NOT_DIMENSIONS]
    assert {k: getattr(definition, k) for k in dims} == {k: getattr(formula, k) for k in dims}
    assert (definition.params(), definition.active_params()) == (formula.params(), formula.active_params())
