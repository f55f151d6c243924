"""Parameter counts of every preset against the published totals of hardware_models/reference/hardware_specs.yaml."""

from __future__ import annotations

import pytest

from hardware_models import reference_specs
from workloads import WorkloadConfig, build_trace, list_models, load_model
from workloads.presets import published_params

# Copied from hardware_models/reference/hardware_specs.yaml `models:` (reference key in the comment).
REFERENCE_TOTALS = {
    "gpt2": 124_439_808,             # gpt2_124m
    "gpt2-xl": 1_557_611_200,        # gpt2_xl_1_5b
    "opt-1.3b": 1_315_758_080,       # opt_1_3b
    "opt-6.7b": 6_658_473_984,       # opt_6_7b
    "opt-13b": 12_853_473_280,       # opt_13b
    "opt-30b": 29_974_540_288,       # opt_30b
    "opt-66b": 65_719_701_504,       # opt_66b
    "opt-175b": 174_604_468_224,     # opt_175b
    "gpt3-175b": 174_604_259_328,    # gpt3_175b
    "llama2-7b": 6_738_415_616,      # llama2_7b
    "llama2-13b": 13_015_864_320,    # llama2_13b
    "llama2-70b": 68_976_648_192,    # llama2_70b
    "llama3-8b": 8_030_261_248,      # llama3_8b
    "llama3-70b": 70_553_706_496,    # llama3_70b
    "llama3.1-405b": 405_853_388_800,  # llama3_1_405b
    "mistral-7b": 7_241_732_096,     # mistral_7b
    "mixtral-8x7b": 46_702_792_704,  # mixtral_8x7b params_total
}
MIXTRAL_ACTIVE = 12_879_925_248      # mixtral_8x7b params_active
REFERENCE_KEYS = {
    "gpt2": "gpt2_124m", "gpt2-xl": "gpt2_xl_1_5b", "opt-1.3b": "opt_1_3b", "opt-6.7b": "opt_6_7b",
    "opt-13b": "opt_13b", "opt-30b": "opt_30b", "opt-66b": "opt_66b", "opt-175b": "opt_175b",
    "gpt3-175b": "gpt3_175b", "llama2-7b": "llama2_7b", "llama2-13b": "llama2_13b",
    "llama2-70b": "llama2_70b", "llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b",
    "llama3.1-405b": "llama3_1_405b", "mistral-7b": "mistral_7b", "mixtral-8x7b": "mixtral_8x7b",
}


def test_every_preset_has_a_reference_total() -> None:
    assert list_models() == list(REFERENCE_TOTALS)


@pytest.mark.parametrize("name", list(REFERENCE_TOTALS))
def test_params_match_published_total_within_0_1_percent(name: str) -> None:
    assert load_model(name).params() == pytest.approx(REFERENCE_TOTALS[name], rel=1e-3)


@pytest.mark.parametrize("name", list(REFERENCE_TOTALS))
def test_params_are_exact(name: str) -> None:
    # The reference totals were computed from the same dims, so the count is exact: GPT-2/OPT biases
    # and OPT's 2 extra position rows are part of the formula, not a residual.
    assert load_model(name).params() == REFERENCE_TOTALS[name]


def test_mixtral_total_and_active() -> None:
    m = load_model("mixtral-8x7b")
    assert m.params() == pytest.approx(46_702_792_704, rel=1e-3)
    assert m.active_params() == pytest.approx(MIXTRAL_ACTIVE, rel=1e-3)
    assert m.active_params() == MIXTRAL_ACTIVE
    assert m.router_params() == 4096 * 8


@pytest.mark.parametrize("name", [n for n in REFERENCE_TOTALS if n != "mixtral-8x7b"])
def test_dense_models_active_equals_total(name: str) -> None:
    m = load_model(name)
    assert m.active_params() == m.params()


def test_preset_file_totals_agree_with_the_table() -> None:
    published = published_params()
    assert {k: v[0] for k, v in published.items()} == REFERENCE_TOTALS
    assert published["mixtral-8x7b"][1] == MIXTRAL_ACTIVE


def test_table_agrees_with_reference_file() -> None:
    ref = reference_specs()["models"]
    for name, key in REFERENCE_KEYS.items():
        entry = ref[key]
        assert entry.get("params", entry.get("params_total")) == REFERENCE_TOTALS[name], name
        m = load_model(name)
        dims = (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.ffn, m.vocab, m.max_pos)
        ref_dims = tuple(entry[k] for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab",
                                             "max_pos"))
        assert dims == ref_dims, name


def test_opt_has_two_extra_position_rows_and_gpt3_does_not() -> None:
    opt, gpt3 = load_model("opt-175b"), load_model("gpt3-175b")
    assert opt.position_rows == 2050 and gpt3.position_rows == 2048
    # same dims except vocab (50272 vs 50257) and the 2 offset rows
    assert opt.params() - gpt3.params() == (50272 - 50257 + 2) * 12288


def test_shorthands() -> None:
    expected = {"7b": "llama2-7b", "13b": "llama2-13b", "70b": "llama2-70b", "8b": "llama3-8b",
                "405b": "llama3.1-405b", "175b": "gpt3-175b"}
    for short, name in expected.items():
        assert load_model(short) == load_model(name)
    assert load_model("LLaMA2-7B").name == "llama2-7b"


@pytest.mark.parametrize("name", ["gpt2", "llama2-70b", "mixtral-8x7b"])
def test_trace_params_sum_to_model_params(name: str) -> None:
    model = load_model(name)
    trace = build_trace(model, WorkloadConfig(seq_len=512))
    assert trace.params == model.params()


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_model_states_are_16_bytes_per_param(precision: str) -> None:
    # ZeRO (arXiv 1910.02054) Sec. 3.1: 2 + 2 + 12 bytes/param for mixed-precision Adam.
    model = load_model("llama2-7b")
    trace = build_trace(model, WorkloadConfig(precision=precision, seq_len=256))
    assert trace.model_state_bytes == 16 * model.params()
    head = trace.layers[-1]
    assert head.optimizer_bytes == 8 * head.params
    assert head.master_bytes == (0 if precision == "fp32" else 4 * head.params)
