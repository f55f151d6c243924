"""Loading models: presets, HF config.json files, YAML of dimensions, and the error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads import ModelSpec, WorkloadInputError, list_models, load_model

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-05,
}
GPT2_CONFIG = {
    "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "vocab_size": 50257, "n_positions": 1024, "resid_pdrop": 0.1,
}
OPT_CONFIG = {
    "model_type": "opt", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
    "ffn_dim": 8192, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 2048,
    "dropout": 0.1,
}
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def _write(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.mark.parametrize(("config", "preset"), [(LLAMA_CONFIG, "llama2-7b"), (GPT2_CONFIG, "gpt2"),
                                                (OPT_CONFIG, "opt-1.3b"), (MIXTRAL_CONFIG, "mixtral-8x7b")])
def test_hf_config_matches_preset(tmp_path: Path, config: dict[str, object], preset: str) -> None:
    m = load_model(str(_write(tmp_path, config)))
    p = load_model(preset)
    dims = ("family", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab", "max_pos",
            "tied_embeddings", "mlp", "norm", "bias", "learned_pos", "n_experts", "experts_per_token",
            "dropout")
    assert {k: getattr(m, k) for k in dims} == {k: getattr(p, k) for k in dims}
    assert m.params() == p.params()
    assert m.source.startswith("HF config.json")


def test_hf_config_directory_and_defaults(tmp_path: Path) -> None:
    dropped = ("num_key_value_heads", "tie_word_embeddings")
    config = {k: v for k, v in LLAMA_CONFIG.items() if k not in dropped}
    _write(tmp_path, config)
    m = load_model(str(tmp_path))                         # a folder holding config.json
    assert m.n_kv_heads == 32 and not m.tied_embeddings   # defaults: kv heads = heads, untied
    gpt2 = load_model(str(_write(tmp_path, {**GPT2_CONFIG, "n_inner": None}, "g.json")))
    assert gpt2.ffn == 4 * 768


def test_hf_missing_field(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "num_hidden_layers"}
    with pytest.raises(WorkloadInputError) as err:
        load_model(str(_write(tmp_path, config)))
    msg = str(err.value)
    assert "config.json: missing field 'num_hidden_layers' (needed for the layer count)" in msg
    assert "\n" not in msg


def test_hf_missing_field_gpt2_and_opt(tmp_path: Path) -> None:
    with pytest.raises(WorkloadInputError, match="missing field 'n_embd'"):
        load_model(str(_write(tmp_path, {k: v for k, v in GPT2_CONFIG.items() if k != "n_embd"})))
    with pytest.raises(WorkloadInputError, match="missing field 'ffn_dim'"):
        load_model(str(_write(tmp_path, {k: v for k, v in OPT_CONFIG.items() if k != "ffn_dim"})))


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096\n  "vocab_size": 32000\n}\n')
    with pytest.raises(WorkloadInputError) as err:
        load_model(str(path))
    assert f"{path}: line 4, column 3:" in str(err.value) and "malformed JSON" in str(err.value)
    assert "\n" not in str(err.value)


def test_unsupported_model_type(tmp_path: Path) -> None:
    # qwen2 (the example here before) is supported since the formula route covers today's families
    with pytest.raises(WorkloadInputError, match="unsupported model_type 'mamba'; supported: llama"):
        load_model(str(_write(tmp_path, {**LLAMA_CONFIG, "model_type": "mamba"})))


@pytest.mark.parametrize(("field", "value"), [("hidden_size", -4096), ("num_hidden_layers", 0),
                                              ("vocab_size", "big")])
def test_hf_bad_dims_name_the_field(tmp_path: Path, field: str, value: object) -> None:
    with pytest.raises(WorkloadInputError, match=f"field '{field}'"):
        load_model(str(_write(tmp_path, {**LLAMA_CONFIG, field: value})))


def test_custom_yaml(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: tiny\nlayers: 2\nhidden: 4096\nheads: 32\nkv_heads: 8\nvocab: 32000\n"
                    "mlp: swiglu\n")
    m = load_model(str(path))
    assert (m.name, m.family, m.n_layers, m.n_kv_heads) == ("tiny", "custom", 2, 8)
    assert m.ffn == 11008                 # LLaMA rule for hidden 4096
    assert (m.norm, m.bias, m.tied_embeddings, m.learned_pos, m.dropout) == ("rmsnorm", False, False,
                                                                              False, False)
    gelu = tmp_path / "g.yml"
    gelu.write_text("name: g\nlayers: 12\nhidden: 768\nheads: 12\nvocab: 50257\nmlp: gelu\nmax_pos: 1024\n")
    assert load_model(str(gelu)).params() == load_model("gpt2").params()


def test_custom_yaml_unknown_key_suggests(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: x\nlayers: 2\nhiden: 64\nheads: 2\nvocab: 10\nmlp: gelu\n")
    with pytest.raises(WorkloadInputError, match="unknown key 'hiden'; did you mean 'hidden'"):
        load_model(str(path))


def test_custom_yaml_negative_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: x\nlayers: 2\nhidden: -64\nheads: 2\nvocab: 10\nmlp: gelu\n")
    with pytest.raises(WorkloadInputError, match="field 'hidden' must be >= 1 \\(got -64\\)"):
        load_model(str(path))
    path.write_text("name: x\nlayers: 2\nhidden: 64\nvocab: 10\nmlp: gelu\n")
    with pytest.raises(WorkloadInputError, match="missing field 'heads'"):
        load_model(str(path))
    path.write_text("name: x\nlayers: 2\nhidden: 64\nheads: 2\nvocab: 10\nmlp: relu2\n")
    with pytest.raises(WorkloadInputError, match="field 'mlp' must be one of swiglu, gelu"):
        load_model(str(path))


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: x\nlayers: 2\nhidden: [64\nheads: 2\n")
    with pytest.raises(WorkloadInputError) as err:
        load_model(str(path))
    assert str(err.value).startswith(f"{path}: line ") and "malformed YAML" in str(err.value)
    line = int(str(err.value)[len(f"{path}: line "):].split(",")[0])
    assert line in (4, 5)


def test_unknown_model_lists_known() -> None:
    with pytest.raises(WorkloadInputError) as err:
        load_model("llama9")
    msg = str(err.value)
    assert msg.startswith("unknown model 'llama9'; known: gpt2, gpt2-xl, opt-1.3b,")
    assert all(name in msg for name in list_models())
    assert "(shorthands 7b, 13b, 70b, 8b, 405b, 175b) or a path to a config.json / YAML" in msg
    assert "\n" not in msg


def test_missing_file() -> None:
    with pytest.raises(WorkloadInputError, match="model file not found: /nonexistent/config.json"):
        load_model("/nonexistent/config.json")


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("hidden", -8, "field 'hidden' must be >= 1"),
    ("n_layers", 0, "field 'n_layers' must be >= 1"),
    ("n_kv_heads", 3, "multiple of 'n_kv_heads'"),
    ("hidden", 100, "divisible by 'n_heads'"),
    ("mlp", "relu", "field 'mlp' must be one of"),
    ("experts_per_token", 2, "must be <= 'n_experts'"),
])
def test_modelspec_validation(field: str, value: object, fragment: str) -> None:
    base = load_model("llama2-7b").to_dict()
    with pytest.raises(WorkloadInputError, match=fragment):
        ModelSpec(**{**base, field: value})


def test_modelspec_round_trip_and_unknown_key() -> None:
    m = load_model("mixtral-8x7b")
    assert ModelSpec.from_dict(m.to_dict()) == m
    with pytest.raises(WorkloadInputError, match="unknown key 'hiddn'; did you mean 'hidden'"):
        ModelSpec.from_dict({**m.to_dict(), "hiddn": 1})
