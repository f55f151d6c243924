"""Sweep files: expansion into points, keys that hash the canonical inputs, one-line errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from planner.sweep import SweepFileError, expand_grid, load_grid

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sweep.yaml"


def grid(**sections):
    base = {"hardware": ["a100"], "models": ["gpt2"], "policies": ["none"]}
    return {**base, **sections}


def test_example_expands_to_the_product_of_its_axes():
    points = load_grid(EXAMPLE)
    # hardware 2 (a100, a100 with pcie.gen=5) x models 2 x policies 5 (zero-offload has 2 knob values) x mb 2
    assert len(points) == 40
    assert len({p.key for p in points}) == 40
    first = points[0].inputs
    assert first == {"hardware": "a100", "set": [], "model": "gpt2", "policy": "none", "knobs": {},
                     "workload": {"global_batch": 16, "micro_batch": 1, "seq_len": 1024, "precision": "bf16",
                                  "checkpointing": "full"}}
    assert [p.key for p in load_grid(EXAMPLE)] == [p.key for p in points]  # deterministic


def test_axes_multiply_in_file_order():
    points = expand_grid(grid(hardware=[{"preset": "a100", "set": {"pcie.gen": [4, 5], "host.dram": ["512GB"]}}],
                              policies={"none": {"stage": [0, 1]}, "zero-offload": {}},
                              workload={"micro_batch": [1, 2]}))
    got = [(p.inputs["set"], p.inputs["policy"], p.inputs["knobs"], p.inputs["workload"]) for p in points]
    want = [(list(s), pol, kn, {"micro_batch": mb}) for s, mb, (pol, kn) in itertools.product(
        [("pcie.gen=4", "host.dram=512GB"), ("pcie.gen=5", "host.dram=512GB")], [1, 2],
        [("none", {"stage": 0}), ("none", {"stage": 1}), ("zero-offload", {})])]
    assert got == want


def test_checkpoint_early_stop_is_a_workload_axis():
    points = expand_grid(grid(workload={"checkpointing": "full", "checkpoint_early_stop": [False, True]}))
    assert [p.inputs["workload"]["checkpoint_early_stop"] for p in points] == [False, True]
    assert len({p.key for p in points}) == 2


def test_key_hashes_the_canonical_inputs_not_their_spelling():
    def key(**sections):
        (point,) = expand_grid(grid(**sections))
        return point.key

    plain = key()
    assert key(policies={"none": {"stage": 0}}) == plain          # a knob at its default
    assert key(hardware=[{"preset": "a100", "set": {"pcie.gen": 4}}]) == plain  # an override to the preset's value
    assert key(policies={"none": {"stage": 1}}) != plain
    assert key(hardware=[{"preset": "a100", "set": {"pcie.gen": 5}}]) != plain
    assert key(workload={"seq_len": 512}) != plain
    assert key(models=["opt-1.3b"]) != plain
    # the same point written twice in one file is one point
    assert len(expand_grid(grid(policies={"none": {"stage": [0, 0]}}))) == 1


def test_files_are_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "mine.yaml").write_text(Path(load_preset_path("a100")).read_text())
    sweep = tmp_path / "s.yaml"
    sweep.write_text("hardware: [hw/mine.yaml]\nmodels: [gpt2]\npolicies: [none]\n")
    (point,) = load_grid(sweep)
    assert point.inputs["hardware"] == str((tmp_path / "hw" / "mine.yaml").resolve())


def load_preset_path(name: str) -> str:
    from importlib.resources import files

    return str(files("hardware_models") / "presets" / f"{name}.yaml")


@pytest.mark.parametrize(("data", "words"), [
    ([], ["expected a mapping"]),
    ({"hardware": ["a100"], "models": ["gpt2"]}, ["policies", "missing"]),
    (grid(extra=1), ["unknown section 'extra'"]),
    (grid(hardware=["a100x9"]), ["hardware[0]", "a100x9"]),
    (grid(hardware=[{"preset": "a100", "set": {"pcie.speed": 5}}]), ["hardware[0]", "pcie.speed"]),
    (grid(hardware=[{"preset": "a100", "set": {"pcie.gen": [[4]]}}]), ["hardware[0].set.pcie.gen"]),
    (grid(hardware=[{"name": "a100"}]), ["hardware[0]", "preset"]),
    (grid(models=["gpt-9"]), ["models[0]", "gpt-9"]),
    (grid(policies=["nonesuch"]), ["policies.nonesuch", "unknown policy"]),
    (grid(policies={"none": {"stag": 1}}), ["policies.none", "stag", "did you mean 'stage'"]),
    (grid(policies={"none": {"stage": 7}}), ["policies.none", "stage"]),
    (grid(workload={"micro_batch": 0}), ["workload.micro_batch", "positive integer"]),
    (grid(workload={"precision": ["bf16", "fp8"]}), ["workload.precision", "'fp8'", "bf16, fp16, fp32"]),
    (grid(workload={"flash_attention": "yes"}), ["workload.flash_attention", "true or false"]),
    (grid(workload={"checkpoint_early_stop": 1}), ["workload.checkpoint_early_stop", "true or false"]),
    (grid(workload={"batch": 8}), ["workload.batch", "unknown field"]),
])
def test_bad_sweep_files_are_one_line_naming_the_field(data, words):
    with pytest.raises(SweepFileError) as e:
        expand_grid(data, label="s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s.yaml")
    for w in words:
        assert w in msg


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(SweepFileError, match="cannot read"):
        load_grid(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hardware: [a100\nmodels: x\n")
    with pytest.raises(SweepFileError, match=r"bad\.yaml: line 2, column 7: malformed YAML"):
        load_grid(bad)
