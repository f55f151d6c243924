"""Today's open architectures, each from its authors' config.json (the formula route of workloads/).

Every case is a ``config.json`` written here from the model's published dimensions (the keys that matter
for its shape, as on the Hub), with its published parameter count and where that figure is published.
Checks: the total (and, for MoE, active) parameter count against the published figure within 0.5%; the
forward matmul FLOPs per token of the trace against 2 x the active matmul parameters plus an attention
term computed here independently; and an end-to-end simulation of every file.

Active counts published with two significant digits only ("3.3B", "37B") are checked to within one unit
of their last digit, and, like every count, against the exact module-tree count (``transformers``
instantiated on the meta device gives the same totals for all cases; that route has its own tests).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planner.result_json import simulated_json
from policies import PlanInfeasible
from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan
from workloads import ModelSpec, WorkloadConfig, WorkloadInputError, build_trace, load_model

B = 1_000_000_000

# model_type -> (config.json keys, published total, published active or None, exact module-tree total, source)
CASES: dict[str, tuple[dict[str, Any], float, float | None, int, str]] = {
    # Llama-3.1-8B: huggingface.co/meta-llama/Llama-3.1-8B config.json; 8.03B params (model page).
    "llama": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "max_position_embeddings": 131072, "tie_word_embeddings": False,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 8.03 * B, None, 8_030_261_248,
              "meta-llama/Llama-3.1-8B"),
    # Mistral-Nemo-Base-2407: head_dim 128 != 5120/32; 12.2B params (model page).
    "mistral": ({"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336, "num_hidden_layers": 40,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
                 "max_position_embeddings": 1024000, "sliding_window": None}, 12.2 * B, None, 12_247_782_400,
                "mistralai/Mistral-Nemo-Base-2407"),
    # Mixtral-8x7B: 46.7B total, 12.9B active (mistral.ai/news/mixtral-of-experts; HF blog "Welcome Mixtral").
    "mixtral": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                 "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2},
                46.7 * B, 12.9 * B, 46_702_792_704, "mistralai/Mixtral-8x7B-v0.1"),
    # Qwen2.5-7B: "Number of Parameters: 7.61B" (model card); q/k/v biases.
    "qwen2": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
               "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
               "max_position_embeddings": 131072, "use_sliding_window": False, "sliding_window": 131072,
               "max_window_layers": 28, "tie_word_embeddings": False}, 7.61 * B, None, 7_615_616_512,
              "Qwen/Qwen2.5-7B"),
    # Qwen3-8B: 8.19B params (model page; model card "8.2B"); head_dim 128, q/k norms.
    "qwen3": ({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
               "max_position_embeddings": 40960, "tie_word_embeddings": False}, 8.19 * B, None, 8_190_735_360,
              "Qwen/Qwen3-8B"),
    # Qwen3-30B-A3B: "30.5B in total and 3.3B activated" (model card).
    "qwen3_moe": ({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                   "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                   "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                   "max_position_embeddings": 40960, "tie_word_embeddings": False},
                  30.5 * B, 3.3 * B, 30_532_122_624, "Qwen/Qwen3-30B-A3B"),
    # Phi-3-mini-4k: 3.82B params (model page; arXiv 2404.14219 "3.8B"); sliding window 2047 on every block.
    "phi3": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
              "max_position_embeddings": 4096, "sliding_window": 2047, "tie_word_embeddings": False},
             3.82 * B, None, 3_821_079_552, "microsoft/Phi-3-mini-4k-instruct"),
    # Gemma-2-9B: 9.24B (model page; arXiv 2408.00118 Table 1); head_dim 256, 4 norms, alternating window.
    "gemma2": ({"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
                "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
                "max_position_embeddings": 8192, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256}, 9.24 * B, None, 9_241_705_984,
               "google/gemma-2-9b"),
    # Gemma-3-4B (text decoder): 675M embedding + 3,209M non-embedding (arXiv 2503.19786 Table 1; the 417M
    # vision encoder is not modelled and is named in a note). Keys absent from text_config take
    # Gemma3TextConfig's defaults (8 heads, 4 KV heads, head_dim 256, vocab 262208), as transformers does.
    "gemma3": ({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                                "num_hidden_layers": 34, "sliding_window": 1024,
                                "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
                "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}},
               3.884 * B, None, 3_880_263_168, "google/gemma-3-4b-pt"),
    # Gemma-3-1B: 302M embedding + 698M non-embedding (arXiv 2503.19786 Table 1).
    "gemma3_text": ({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                     "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                     "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512},
                    1.000 * B, None, 999_885_952, "google/gemma-3-1b-pt"),
    # OLMo-2-1124-7B: 7.30B params (model page); q/k norms over the whole projections.
    "olmo2": ({"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
               "max_position_embeddings": 4096, "tie_word_embeddings": False}, 7.30 * B, None, 7_298_617_344,
              "allenai/OLMo-2-1124-7B"),
    # Falcon-7B: the Hub's 7.22B counts the stored lm_head.weight and the embedding it is tied to
    # (6.92B unique + 0.30B); tiersim counts a tied matrix once, so the stored count is params + V*h.
    "falcon": ({"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False, "bias": False,
                "alibi": False, "vocab_size": 65024}, 7.22 * B, None, 6_921_720_704, "tiiuae/falcon-7b"),
    # Pythia-6.9B: 6,857,302,016 total (Biderman et al. 2023, arXiv 2304.01373, Table 1).
    "gpt_neox": ({"model_type": "gpt_neox", "hidden_size": 4096, "intermediate_size": 16384,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 50432,
                  "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
                  "tie_word_embeddings": False}, 6_857_302_016, None, 6_857_302_016, "EleutherAI/pythia-6.9b"),
    # BLOOM-7B1: 7,069,016,064 (BigScience, arXiv 2211.05100, Table 3); ALiBi, embedding LayerNorm, tied.
    "bloom": ({"model_type": "bloom", "hidden_size": 4096, "n_layer": 30, "num_attention_heads": 32,
               "vocab_size": 250880}, 7_069_016_064, None, 7_069_016_064, "bigscience/bloom-7b1"),
    # OPT-6.7B: 6,658,473,984 (hardware_models/reference/hardware_specs.yaml opt_6_7b, metaseq sizes).
    "opt": ({"model_type": "opt", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "ffn_dim": 16384, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 4096},
            6_658_473_984, None, 6_658_473_984, "facebook/opt-6.7b"),
    # GPT-2 small: 124M (Radford et al. 2019; 124,439,808 in the reference, gpt2_124m).
    "gpt2": ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
              "n_positions": 1024}, 124_439_808, None, 124_439_808, "openai-community/gpt2"),
    # DeepSeek-V3: "671B total parameters with 37B activated for each token" (arXiv 2412.19437, abstract;
    # the 14B multi-token-prediction module is on top, named in a note).
    "deepseek_v3": ({"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                     "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                     "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
                     "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
                     "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                     "vocab_size": 129280, "max_position_embeddings": 163840, "num_nextn_predict_layers": 1,
                     "rope_scaling": {"type": "yarn", "factor": 40}, "tie_word_embeddings": False},
                    671 * B, 37 * B, 671_026_404_352, "deepseek-ai/DeepSeek-V3"),
}
REQUIRED_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3", "olmo2",
                  "falcon", "gpt_neox", "bloom", "opt", "gpt2", "deepseek_v3")
# notes each config must carry (keys that change cost but are not modelled)
EXPECTED_NOTES = {"llama": ["rope_scaling"], "gemma2": ["attn_logit_softcapping", "final_logit_softcapping"],
                  "gemma3": ["rope_scaling", "vision_config"],
                  "deepseek_v3": ["rope_scaling", "num_nextn_predict_layers"]}


def _load(tmp_path: Path, model_type: str) -> ModelSpec:
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CASES[model_type][0]))
    return load_model(str(folder / "config.json"))


# Active counts published to two significant digits: the unit of their last digit ("3.3B": 0.1B, "37B": 1B).
# The exact counts are 3.353B and 37.55B (module tree, embedding and LM head included as for Mixtral);
# both are within that unit of the published figure but not within 0.5% of it.
ACTIVE_LAST_DIGIT = {"qwen3_moe": 0.1 * B, "deepseek_v3": 1.0 * B}


def test_every_required_model_type_has_a_case() -> None:
    assert set(REQUIRED_TYPES) <= set(CASES) and len(CASES) >= 15


@pytest.mark.parametrize("model_type", list(CASES))
def test_parameter_counts_match_published(tmp_path: Path, model_type: str) -> None:
    _, total, active, exact, _ = CASES[model_type]
    m = _load(tmp_path, model_type)
    assert m.params() == exact  # the module tree's count, tensor by tensor
    stored = m.params() + (m.vocab * m.hidden if model_type == "falcon" else 0)  # see the falcon case
    assert stored == pytest.approx(total, rel=0.005)
    if active is None:
        assert m.active_params() == m.params() and not m.is_moe
    else:
        assert m.is_moe and m.active_params() < m.params()
        assert abs(m.active_params() - active) <= max(0.005 * active, ACTIVE_LAST_DIGIT.get(model_type, 0.0))
    assert m.route == "formula" and m.family in (model_type, "gemma3")


@pytest.mark.parametrize("model_type", list(CASES))
def test_unmodelled_keys_are_named_in_notes(tmp_path: Path, model_type: str) -> None:
    m = _load(tmp_path, model_type)
    for key in EXPECTED_NOTES.get(model_type, []):
        assert sum(note.startswith(key) for note in m.notes) == 1, m.notes
    assert len(m.notes) == len(EXPECTED_NOTES.get(model_type, []))


def _norm(m: ModelSpec, width: int) -> int:
    return (2 if m.norm == "layernorm" else 1) * width


def _non_matmul_block_params(m: ModelSpec, layer: int) -> int:
    """Norm weights and biases of one block: parameters that are not a matmul operand."""
    h, a, g, d, dv = m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.v_head_dim
    norms = m.block_norms * _norm(m, h)
    norms += {"none": 0, "head": 2 * _norm(m, d), "full": _norm(m, a * d) + _norm(m, g * d)}[m.qk_norm]
    if m.kv_lora_rank:
        norms += (_norm(m, m.q_lora_rank) if m.q_lora_rank else 0) + _norm(m, m.kv_lora_rank)
    bias = (a * d + g * d + g * dv if m.bias or m.qkv_bias else 0) + (h if m.bias or m.o_bias else 0)
    moe = m.is_moe and layer >= m.first_dense_layers
    if (m.bias or m.mlp_bias) and not moe:
        bias += (m.mlp_matrices - 1) * m.ffn + h
    return norms + bias


def _matmul_params_per_token(m: ModelSpec) -> int:
    """Active parameters that are matmul weights: blocks (k experts + shared + router) and the LM head
    matrix (the embedding's table when tied); the embedding gather and learned positions are not matmuls."""
    table = m.vocab * m.hidden
    blocks = sum(m.block_params(active=True, layer=i) - _non_matmul_block_params(m, i) for i in range(m.n_layers))
    return blocks + table


def _attention_flops_per_token(m: ModelSpec, seq: int) -> float:
    """Q.K^T over head_dim and P.V over v_head_dim for every query head, each query against min(s, w)
    keys in a windowed block (the non-causal Narayanan convention, as the default workload counts)."""
    total = 0.0
    for i in range(m.n_layers):
        window = m.sliding_window if i in m.sliding_layers else 0
        keys = min(seq, window) if window else seq
        total += 2 * keys * m.n_heads * m.head_dim + 2 * keys * m.n_heads * m.v_head_dim
    return total


@pytest.mark.parametrize("model_type", list(CASES))
def test_matmul_flops_per_token(tmp_path: Path, model_type: str) -> None:
    m = _load(tmp_path, model_type)
    seq = 1024 if m.learned_pos else 4096  # past Phi-3's 2047 and Gemma-3's 1024/512 windows
    trace = build_trace(m, WorkloadConfig(micro_batch=1, seq_len=seq))
    per_token = trace.fwd_flops / trace.tokens_per_micro_batch
    expected = 2 * _matmul_params_per_token(m) + _attention_flops_per_token(m, seq)
    assert per_token == pytest.approx(expected, rel=1e-12)
    assert trace.bwd_flops == pytest.approx(2 * trace.fwd_flops, rel=1e-12)
    assert trace.params == m.params()
    # per block: heterogeneous blocks priced one by one
    blocks = [ly for ly in trace.layers if ly.kind == "block"]
    assert sum(ly.params for ly in blocks) == m.blocks_params()


def test_heterogeneous_blocks_differ_where_the_model_does(tmp_path: Path) -> None:
    ds = build_trace(_load(tmp_path, "deepseek_v3"), WorkloadConfig(seq_len=1024))
    dense, moe = ds.layers[1:4], ds.layers[4:-1]
    assert len({ly.params for ly in dense}) == 1 and len({ly.params for ly in moe}) == 1
    assert moe[0].params > 19 * dense[0].params and moe[0].fwd_flops != dense[0].fwd_flops
    g2 = build_trace(_load(tmp_path, "gemma2"), WorkloadConfig(seq_len=8192))
    local, global_ = g2.layers[1], g2.layers[2]  # block 0 slides (4096), block 1 attends globally
    assert local.params == global_.params and local.fwd_flops < global_.fwd_flops


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("architectures", 5, "field 'architectures' must be a list of class names"),
    ("attention_dropout", float("nan"), "key 'attention_dropout': NaN"),  # refused by the input layer
    ("model_type", 7, "field 'model_type' must be a string"),
    ("head_dim", 0, "field 'head_dim' must be >= 1"),
    ("layer_types", ["sliding_attention"], "field 'layer_types' has 1 entries for 42 layers"),
    ("rope_scaling", "yes", "field 'rope_scaling' must be an object or null"),
])
def test_bad_hf_values_are_one_line_naming_the_key(tmp_path: Path, key: str, value: object, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CASES["gemma2"][0], key: value}))
    with pytest.raises(WorkloadInputError) as err:
        load_model(str(path))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_yaml_of_dimensions_expresses_the_new_fields(tmp_path: Path) -> None:
    """The hand-written YAML route reaches the same counts as the config.json route."""
    yaml_text = """name: ds-by-hand
layers: 61
hidden: 7168
heads: 128
head_dim: 192
v_head_dim: 128
qk_rope_head_dim: 64
q_lora_rank: 1536
kv_lora_rank: 512
ffn: 18432
expert_ffn: 2048
experts: 256
experts_per_token: 8
shared_experts: 1
first_dense_layers: 3
vocab: 129280
mlp: swiglu
"""
    (tmp_path / "ds.yaml").write_text(yaml_text)
    by_hand, from_hf = load_model(str(tmp_path / "ds.yaml")), _load(tmp_path, "deepseek_v3")
    assert (by_hand.params(), by_hand.active_params()) == (from_hf.params(), from_hf.active_params())
    (tmp_path / "g.yaml").write_text("name: g\nlayers: 12\nhidden: 1024\nheads: 8\nhead_dim: 256\nvocab: 1000\n"
                                     "mlp: swiglu\nsliding_window: 512\nglobal_every: 6\nqk_norm: head\n")
    g = load_model(str(tmp_path / "g.yaml"))
    assert g.sliding_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10) and g.q_dim == 2048
    assert ModelSpec.from_dict(g.to_dict()) == g


@pytest.mark.parametrize("model_type", REQUIRED_TYPES)
def test_every_architecture_simulates_end_to_end(tmp_path: Path, model_type: str) -> None:
    m = _load(tmp_path, model_type)
    job, _ = make_job("a100", m, JobRequest(seq_len=512))
    assert job.trace.params == m.params()
    try:
        plan = make_plan(job, "zero-offload", {})
    except PlanInfeasible as e:  # a verdict before simulating is a result too: it names the pool
        assert m.params() > 14 * B and e.pool
        return
    d = simulated_json(simulate_plan(plan, job.hw))
    assert (d["model"]["params"], d["model"]["active_params"]) == (m.params(), m.active_params())
    assert d["model"]["route"] == "formula" and d["model"]["notes"] == list(m.notes)
    if m.params() < 14 * B:  # zero-offload's CPU states (16 B/param) fit the a100 host's 256 GB
        assert d["feasible"] is True, d["verdict"]
    else:
        assert d["feasible"] is False and "cpu" in d["verdict"]


@pytest.mark.parametrize(("extra", "fragment"), [
    ("expert_ffn: 512\n", "field 'expert_ffn' needs 'experts' > 1"),
    ("sliding_layers: [0, 40]\nsliding_window: 64\n", "field 'sliding_layers' holds 40; block indices run 0..3"),
    ("global_every: 2\n", "field 'global_every' needs 'sliding_window'"),
    ("kv_lora_rank: 64\n", "latent attention needs 0 < 'qk_rope_head_dim'"),
    ("qk_norm: partial\n", "field 'qk_norm' must be one of none, head, full"),
    ("head_dim: -1\n", "field 'head_dim' must be >= 0"),
    ("alibi: 1\n", "field 'alibi' must be true or false"),
])
def test_yaml_new_fields_are_checked(tmp_path: Path, extra: str, fragment: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nlayers: 4\nhidden: 256\nheads: 4\nvocab: 1000\nmlp: swiglu\n" + extra)
    with pytest.raises(WorkloadInputError) as err:
        load_model(str(path))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_models_show_prints_counts_and_route(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tiersim.cli import main

    m = _load(tmp_path, "deepseek_v3")
    assert main(["models", "show", str(tmp_path / "deepseek_v3" / "config.json")]) == 0
    rows = [ln.split(None, 1) for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    table = {k: v for k, v in rows if k != "note"}
    assert table["params"] == f"{m.params():,}" and table["active_params"] == f"{m.active_params():,}"
    assert table["route"] == "formula" and table["kv_lora_rank"] == "512" and table["first_dense_layers"] == "3"
    assert [v for k, v in rows if k == "note"] == list(m.notes) and len(m.notes) == 2
