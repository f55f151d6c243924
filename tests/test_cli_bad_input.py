"""Bad input: exit code 2, nothing on stdout, exactly ONE line on stderr naming the field and the fix.

Each case lists words the line must contain: the field, file or flag at fault and the fix (the
accepted values, the closest name, the known presets...).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiersim.cli import main, simulate_main

SMALL = ["--hw", "a100", "--model", "gpt2", "--policy", "none"]
A100_YAML = (Path(__file__).resolve().parents[1] / "hardware_models" / "presets" / "a100.yaml").read_text()


def _files(tmp: Path) -> None:
    """Bad files for the cases below, in ``tmp`` (the cases run with it as the working directory)."""
    (tmp / "broken.yaml").write_text("name: x\ngpu:\n  memory: [80GB\n")
    (tmp / "negative.yaml").write_text(A100_YAML.replace("memory: 81920MiB", "memory: -80GB"))
    (tmp / "zero_dram.yaml").write_text(A100_YAML.replace("dram: 256GB", "dram: 0GB"))
    assert "memory: -80GB" in (tmp / "negative.yaml").read_text()
    assert "dram: 0GB" in (tmp / "zero_dram.yaml").read_text()
    (tmp / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1024,
        "vocab_size": 1000, "max_position_embeddings": 512}))  # no num_hidden_layers
    (tmp / "truncated_plan.json").write_text('{"schema": "tiersim.plan",\n "version": ')
    (tmp / "list_plan.json").write_text("[]")
    (tmp / "a_dir").mkdir()


@pytest.fixture()
def good_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert simulate_main([*SMALL, "--plan-out", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    return json.loads((tmp_path / "plan.json").read_text())


SIMULATE_CASES = {
    "unknown hardware preset": (["--hw", "a100x9", "--model", "gpt2"], ["a100x9", "known:", "a100x8", "h200"]),
    "unknown model": (["--hw", "a100", "--model", "llama9"], ["unknown model 'llama9'", "known:", "gpt2"]),
    "malformed hardware YAML": (["--hw", "broken.yaml", "--model", "gpt2"], ["broken.yaml", "line 4"]),
    "negative size in a hardware file": (["--hw", "negative.yaml", "--model", "gpt2"],
                                         ["negative.yaml", "gpu.memory", "size"]),
    "zero size in a hardware file": (["--hw", "zero_dram.yaml", "--model", "gpt2"],
                                     ["zero_dram.yaml", "host.dram", "> 0"]),
    "negative --set size": ([*SMALL, "--set", "gpu.memory=-1GB"], ["gpu.memory", ">= 0"]),
    "zero --set size": ([*SMALL, "--set", "gpu.memory=0GB"], ["gpu.memory", "positive"]),
    "unknown --set path": ([*SMALL, "--set", "gpu.memroy=40GB"], ["gpu.memroy", "valid keys", "memory"]),
    "--set without a value": ([*SMALL, "--set", "gpu.memory"], ["PATH=VALUE", "host.dram=1TB"]),
    "unknown knob": ([*SMALL, "--knob", "stag=1"], ["unknown knob 'stag'", "did you mean 'stage'"]),
    "bad knob type": ([*SMALL, "--knob", "stage=two"], ["knob 'stage'", "int", "'two'"]),
    "bad knob value": ([*SMALL, "--knob", "stage=7"], ["knob 'stage'", "0, 1, 2 or 3"]),
    "knob without a value": ([*SMALL, "--knob", "stage"], ["name=value", "stage"]),
    "unknown policy": (["--hw", "a100", "--model", "gpt2", "--policy", "zero"], ["'zero'", "zero-offload"]),
    "config.json missing a field": (["--hw", "a100", "--model", "config.json"],
                                    ["config.json", "num_hidden_layers"]),
    "malformed plan JSON": (["--plan", "truncated_plan.json"], ["truncated_plan.json", "line 2", "JSON"]),
    "plan not an object": (["--plan", "list_plan.json"], ["list_plan.json", "JSON object"]),
    "plan file missing": (["--plan", "nowhere.json"], ["nowhere.json", "No such file"]),
    "zero micro-batch": ([*SMALL, "--micro-batch", "0"], ["--micro-batch", ">= 1", "'0'"]),
    "negative micro-batch": ([*SMALL, "--micro-batch", "-2"], ["--micro-batch", ">= 1", "'-2'"]),
    "zero global batch": ([*SMALL, "--global-batch", "0"], ["--global-batch", ">= 1"]),
    "negative sequence length": ([*SMALL, "--seq-len", "-3"], ["--seq-len", ">= 1"]),
    "micro-batch not a number": ([*SMALL, "--micro-batch", "two"], ["--micro-batch", "int"]),
    "global batch not divisible": (["--hw", "a100x8", "--model", "gpt2", "--policy", "none",
                                    "--global-batch", "12"], ["global batch 12", "multiple of 8"]),
    "sequence longer than the model": ([*SMALL, "--seq-len", "4096"], ["seq_len 4096", "max_pos 1024"]),
    "dtype the GPU lacks": (["--hw", "v100", "--model", "gpt2", "--precision", "bf16"],
                            ["gpu.peak_flops.bf16", "fp16"]),
    "unknown precision": ([*SMALL, "--precision", "fp8"], ["--precision", "bf16"]),
    "--plan-out into a missing directory": ([*SMALL, "--plan-out", "missing/plan.json"],
                                            ["--plan-out", "'missing'", "does not exist"]),
    "--trace into a missing directory": ([*SMALL, "--trace", "missing/t.json"],
                                         ["--trace", "'missing'", "does not exist"]),
    "--plan-out is a directory": ([*SMALL, "--plan-out", "a_dir"], ["--plan-out", "is a directory"]),
    "empty --hw": (["--hw", "", "--model", "gpt2"], ["--hw", "empty value", "tiersim hardware list"]),
    "empty --model": (["--hw", "a100", "--model", ""], ["--model", "empty value", "tiersim models list"]),
    "empty --plan-out": ([*SMALL, "--plan-out", ""], ["--plan-out", "empty path"]),
    "unknown flag": ([*SMALL, "--gpus", "8"], ["unrecognized arguments", "--gpus"]),
}


@pytest.mark.parametrize("case", list(SIMULATE_CASES))
def test_simulate_bad_input(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    argv, words = SIMULATE_CASES[case]
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc = simulate_main(argv)
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), err
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert err.startswith("simulate: error: ") and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert not list(tmp_path.glob("**/plan.json")) and not list(tmp_path.glob("**/t.json"))


def _plan_case(plan: dict, case: str) -> tuple[dict, list[str]]:
    if case == "missing tensor":
        task = next(t for s in plan["segments"] for t in s["tasks"] if t.get("allocs"))
        victim = task["allocs"][0][0]
        plan["tensors"] = [t for t in plan["tensors"] if t["id"] != victim]
        return plan, ["references missing tensor", repr(victim)]
    if case == "missing field":
        del plan["streams"]
        return plan, ["missing field 'streams'"]
    if case == "wrong version":
        plan["version"] = 999
        return plan, ["'version'", "999", "re-create"]
    if case == "bad embedded hardware":
        plan["hardware"]["gpu"]["memory"] = -5
        return plan, ["embedded hardware", "gpu.memory"]
    if case == "non-numeric bytes":
        plan["tensors"][0]["bytes"] = "lots"
        return plan, ["malformed plan", "'lots'"]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing tensor", "missing field", "wrong version", "bad embedded hardware",
                                  "non-numeric bytes"])
def test_bad_plan_file(case: str, good_plan: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, words = _plan_case(good_plan, case)
    path = tmp_path / "bad_plan.json"
    path.write_text(json.dumps(plan))
    rc = simulate_main(["--plan", str(path)])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "bad_plan.json" in err
    for w in words:
        assert w in err, (w, err)


def test_plan_for_more_gpus_than_the_hardware_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan8.json"
    assert simulate_main(["--hw", "a100x8", "--model", "gpt2", "--policy", "none", "--plan-out", str(path)]) == 0
    capsys.readouterr()
    rc = simulate_main(["--plan", str(path), "--hw", "a100"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert len(err.splitlines()) == 1 and "plan8.json on hardware 'a100'" in err and "'gpu1'" in err


@pytest.mark.parametrize("flag", [["--model", "7b"], ["--policy", "none"], ["--knob", "stage=1"],
                                  ["--micro-batch", "2"], ["--no-flash-attention"]])
def test_job_flags_with_a_plan_are_rejected(flag: list[str], good_plan: dict, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc = simulate_main(["--plan", str(tmp_path / "plan.json"), *flag])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert len(err.splitlines()) == 1 and flag[0] in err and "cannot be combined with --plan" in err


CATALOG_CASES = {
    "hardware show without a name": (["hardware", "show"], ["needs a NAME", "a100x8"]),
    "models show without a name": (["models", "show"], ["needs a NAME", "gpt2"]),
    "policies show without a name": (["policies", "show"], ["needs a NAME", "zero-offload"]),
    "unknown hardware to show": (["hardware", "show", "b200"], ["'b200'", "known:", "h200"]),
    "unknown model to show": (["models", "show", "gpt5"], ["'gpt5'", "gpt2"]),
    "unknown policy to show": (["policies", "show", "tinypipe9"], ["'tinypipe9'", "zero-offload"]),
    "list with a name": (["hardware", "list", "a100"], ["takes no NAME", "hardware show a100"]),
    "unknown --set on show": (["hardware", "show", "a100", "--set", "nvme.speed=1GB/s"], ["nvme.speed"]),
    "unknown action": (["hardware", "describe"], ["invalid choice", "'describe'"]),
    "unknown command": (["simulat"], ["invalid choice", "simulate"]),
    "no command": ([], ["required", "cmd"]),
}


@pytest.mark.parametrize("case", list(CATALOG_CASES))
def test_tiersim_bad_input(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv, words = CATALOG_CASES[case]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), err
    assert len(err.splitlines()) == 1 and err.startswith("tiersim") and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


# the job flags are declared once (tiersim.job_flags) with their checks: every command that takes them
# refuses a non-positive size the same way, before any work
JOB_FLAG_COMMANDS = {
    "simulate": ["simulate", "--hw", "a100", "--model", "gpt2"],
    "plan": ["plan", "--hw", "a100", "--model", "gpt2", "--no-cache"],
    "whatif": ["whatif", "--hw", "a100", "--model", "gpt2", "--no-cache"],
    "coverage": ["coverage", "--hw", "a100", "--models", "gpt2", "--no-cache"],
    "max-model": ["max-model", "--hw", "a100", "--shape", "gpt", "--hidden", "1024", "--no-cache"],
}


@pytest.mark.parametrize("command", list(JOB_FLAG_COMMANDS))
@pytest.mark.parametrize("flag", ["--micro-batch", "--seq-len", "--global-batch"])
@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_every_command_checks_the_job_flags_alike(command: str, flag: str, value: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([*JOB_FLAG_COMMANDS[command], flag, value])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), (out, err)
    assert err == (f"tiersim {command}: error: argument {flag}: expected a positive int (a whole number >= 1), "
                   f"got '{value}' (see --help)\n")


@pytest.mark.parametrize("command", list(JOB_FLAG_COMMANDS))
def test_every_command_refuses_an_empty_hw(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*JOB_FLAG_COMMANDS[command]]
    argv[argv.index("--hw") + 1] = " "
    rc = main(argv)
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert len(err.splitlines()) == 1 and "--hw" in err and "empty value" in err and "tiersim hardware list" in err


def test_tiersim_simulate_reports_bad_input_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--hw", "a100x9", "--model", "gpt2"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.startswith("tiersim: error: unknown hardware preset 'a100x9'") and len(err.splitlines()) == 1


def test_help_returns_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--plan-out" in out and "exit codes" in out
