"""`simulate` / `tiersim simulate`: the human report, the JSON object, exit codes, --plan-out and --plan.

Everything runs in-process (``simulate_main([...])`` with capsys) on small cases (gpt2 on one A100), except
one subprocess test of the installed ``simulate`` script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hardware_models import load_hardware
from simulator import Plan
from tiersim.cli import main, simulate_main

SMALL = ["--hw", "a100", "--model", "gpt2"]
OFFLOAD = [*SMALL, "--policy", "zero-offload"]
NOOFF = [*SMALL, "--policy", "none"]
SIM_OOM = [*NOOFF, "--micro-batch", "256", "--checkpointing", "none"]  # activations overflow the GPU
PLAN_OOM = ["--hw", "a100-40g", "--model", "70b", "--policy", "none"]  # 1.1 TB of model states on 40 GB

# every key the JSON promises, and what type its value has when the job was simulated
KEY_TYPES: dict[str, type | tuple[type, ...]] = {
    "feasible": bool, "verdict": str, "policy": str, "knobs": dict, "hardware": str, "model": dict,
    "workload": dict, "n_gpus": int, "step_time_s": float, "tokens_per_s": float, "tflops_per_gpu": float,
    "mfu": float, "peak_bytes": dict, "capacity_bytes": dict, "reserved_bytes": dict, "peak_by_kind": dict,
    "link_bytes": dict, "link_busy_s": dict, "stream_busy_s": dict, "compute_busy_s": float,
    "exposed_transfer_s": float, "oom": (dict, type(None)), "ooms": list, "sim": dict, "notes": list,
    "info": dict,
}
OOM_KEYS = {"stage", "pool", "requested_bytes", "capacity_bytes", "over_by_bytes", "total_demand_bytes",
            "free_bytes", "time_s", "task", "tensor", "what", "message"}
WORKLOAD_DEFAULTS = ("seq_len", "micro_batch", "global_batch", "precision", "checkpointing", "flash_attention",
                     "checkpoint_early_stop")


def _strict(text: str) -> Any:
    def bad_constant(name: str) -> Any:
        raise AssertionError(f"JSON contains {name}, which strict parsers reject")

    return json.loads(text, parse_constant=bad_constant)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = simulate_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str, rc: int = 0) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json")
    assert (code, err) == (rc, "")
    d = _strict(out)  # exactly one JSON document: json.loads rejects trailing text
    assert isinstance(d, dict)
    return d


# -- the JSON object ------------------------------------------------------------------------------------
def test_json_has_every_promised_key_with_its_type(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, *OFFLOAD)
    for key, typ in KEY_TYPES.items():
        assert key in d, key
        assert isinstance(d[key], typ), (key, d[key])
    assert d["feasible"] is True and d["oom"] is None and d["ooms"] == [] and d["verdict"] == "FEASIBLE"
    assert (d["policy"], d["hardware"], d["n_gpus"]) == ("zero-offload", "a100", 1)
    assert d["model"]["name"] == "gpt2" and isinstance(d["model"]["params"], int) and d["model"]["params"] > 1e8
    for key in ("global_batch", "micro_batch", "seq_len"):
        assert isinstance(d["workload"][key], int) and d["workload"][key] >= 1
    assert set(d["peak_bytes"]) == set(d["capacity_bytes"]) == {"gpu0", "cpu", "nvme"}
    for pool, cap in d["capacity_bytes"].items():
        assert isinstance(cap, float) and cap > 0, pool
        assert isinstance(d["peak_bytes"][pool], float) and 0 <= d["peak_bytes"][pool] <= cap
    assert d["link_bytes"] and all(isinstance(v, float) and v >= 0 for v in d["link_bytes"].values())
    assert d["link_bytes"]["gpu0.pcie"] > 0  # zero-offload moves gradients and parameters over PCIe
    assert isinstance(d["sim"]["events"], int) and d["sim"]["events"] > 0
    assert isinstance(d["sim"]["wall_s"], float) and d["sim"]["wall_s"] >= 0
    assert d["step_time_s"] > 0 and d["exposed_transfer_s"] >= 0


def test_json_figures_are_consistent(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    d = run_json(capsys, *OFFLOAD, "--global-batch", "4", "--seq-len", "512", "--plan-out", str(plan_file))
    wl = d["workload"]
    assert (wl["global_batch"], wl["seq_len"]) == (4, 512)
    assert d["tokens_per_s"] * d["step_time_s"] == pytest.approx(4 * 512, rel=1e-12)
    peak = load_hardware("a100").peak_flops_for(wl["precision"])
    assert d["mfu"] == pytest.approx(d["tflops_per_gpu"] * 1e12 / peak, rel=1e-12)
    flops = Plan.load(plan_file).metrics["model_flops_per_step"]
    assert d["tflops_per_gpu"] == pytest.approx(flops / d["step_time_s"] / d["n_gpus"] / 1e12, rel=1e-12)
    assert 0 < d["mfu"] < 1
    assert d["exposed_transfer_s"] <= d["step_time_s"]
    assert d["compute_busy_s"] <= d["step_time_s"] * (1 + 1e-12)


def test_tiersim_simulate_and_simulate_print_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    a = run_json(capsys, *NOOFF)
    assert main(["simulate", *NOOFF, "--json"]) == 0
    b = _strict(capsys.readouterr().out)
    for d in (a, b):
        d["sim"].pop("wall_s")
    assert a == b


# -- the human report -----------------------------------------------------------------------------------
def test_report_shows_every_figure_and_pool(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, *OFFLOAD)
    rc, out, err = run(capsys, *OFFLOAD)
    assert (rc, err) == (0, "")
    for label in ("Verdict: FEASIBLE", "step time", "tokens/s", "TFLOP/s per GPU", "MFU", "exposed transfer",
                  "Memory", "capacity", "Links", "gpu0.pcie", "simulation:"):
        assert label in out, label
    assert f"{d['tokens_per_s']:,.0f}" in out
    assert f"{d['mfu'] * 100:.1f}%" in out
    for pool, cap in d["capacity_bytes"].items():
        line = next(ln for ln in out.splitlines() if ln.startswith(pool + " "))
        assert f"{cap / 1e9:,.1f} GB" in line
    assert "A100-SXM4-80GB" in out and "PCIe" in out  # the hardware assumed


def test_report_lists_every_default_it_picked(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, *NOOFF)
    assumed = d["workload"]["assumed"]
    assert [a.split("=")[0] for a in assumed] == list(WORKLOAD_DEFAULTS)
    rc, out, _ = run(capsys, *NOOFF)
    assert rc == 0
    for a in assumed:
        assert f"default picked: {a}" in out
    for key in WORKLOAD_DEFAULTS:  # and the value used is in the workload table
        line = next(ln for ln in out.splitlines() if ln.startswith(key + " "))
        assert line.split()[1] == str(d["workload"][key])


def test_explicit_settings_are_not_called_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, *NOOFF, "--seq-len", "256", "--micro-batch", "2", "--global-batch", "4",
                     "--precision", "fp16", "--checkpointing", "selective", "--no-flash-attention")
    assert rc == 0
    assert "default picked" not in out
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.split()}
    assert rows["seq_len"] == ["256"] and rows["flash_attention"] == ["False"]
    assert rows["checkpoint_early_stop"] == ["False"]  # no effect with selective: not a picked default


def test_checkpoint_early_stop_flag_skips_the_down_projection(capsys: pytest.CaptureFixture[str]) -> None:
    """``--checkpoint-early-stop``: the same run with less recompute (each block's MLP down projection; GPT-2's
    dropout after it would keep it, so a LLaMA)."""
    job = ["--hw", "a100", "--model", "llama2-7b", "--policy", "zero-offload", "--seq-len", "512", "--checkpointing",
           "full"]
    whole = run_json(capsys, *job)
    early = run_json(capsys, *job, "--checkpoint-early-stop")
    assert whole["workload"]["checkpoint_early_stop"] is False and early["workload"]["checkpoint_early_stop"] is True
    assert not any(a.startswith("checkpoint_early_stop=") for a in early["workload"]["assumed"])
    assert any(a.startswith("checkpoint_early_stop=False") for a in whole["workload"]["assumed"])
    # this run waits on the CPU's Adam, so the step is the same; the GPU computes a down projection less per block
    assert early["mfu"] == pytest.approx(whole["mfu"]) and early["step_time_s"] == pytest.approx(whole["step_time_s"])
    assert early["compute_busy_s"] < whole["compute_busy_s"]
    h, f, layers = 4096, 11008, 32  # LLaMA-2 7B: skipped 2*tokens*f*h per block of the 8*tokens*P executed
    per_token = 2 * f * h * layers
    executed = whole["hw_tflops_per_gpu"] / whole["tokens_per_s"]  # TFLOP per token
    assert early["hw_tflops_per_gpu"] / early["tokens_per_s"] == pytest.approx(executed - per_token / 1e12, rel=1e-6)


def test_hardware_model_and_policy_defaults_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--hw", "a100-40g", "--policy", "none")  # model defaults to 70b: infeasible
    assert rc == 3
    assert "default picked: model=70b (default" in out
    assert "default picked: hardware=" not in out and "default picked: policy=" not in out
    d = run_json(capsys, "--model", "gpt2", "--policy", "none", "--global-batch", "8")
    assert d["hardware"] == "a100x8" and d["n_gpus"] == 8
    assert any(a.startswith("hardware=a100x8 (default") for a in d["workload"]["assumed"])
    d = run_json(capsys, *SMALL)
    assert d["policy"] == "zero-offload"
    assert any(a.startswith("policy=zero-offload (default") for a in d["workload"]["assumed"])


def test_overrides_are_shown_and_applied(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, *NOOFF, "--set", "host.dram=512GB")
    assert rc == 0
    assert "--set host.dram=512GB" in out and "512.0 GB DRAM" in out


def test_unified_memory_machine_is_described_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--hw", "dgx-spark", "--model", "gpt2", "--policy", "none")
    assert rc == 0
    gpus = next(ln for ln in out.splitlines() if ln.startswith("GPUs "))
    assert "unified memory" in gpus and "0.0 GB" not in gpus


# -- infeasible: an answer with exit code 3 -------------------------------------------------------------
def test_simulated_oom_is_an_answer(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, *SIM_OOM, rc=3)
    o = d["oom"]
    assert d["feasible"] is False and o is not None and d["ooms"][0] == o
    assert set(o) >= OOM_KEYS and o["stage"] == "simulation" and o["pool"] == "gpu0"
    assert o["over_by_bytes"] == pytest.approx(o["total_demand_bytes"] - o["capacity_bytes"])
    assert o["over_by_bytes"] > 0 and o["requested_bytes"] > o["free_bytes"] >= 0
    assert isinstance(d["step_time_s"], float)  # the run still went on and has figures
    rc, out, err = run(capsys, *SIM_OOM)
    assert (rc, err) == (3, "")
    verdict = next(ln for ln in out.splitlines() if ln.startswith("Verdict:"))
    assert "INFEASIBLE" in verdict and "gpu0" in verdict
    assert f"over by {o['over_by_bytes'] / 1e9:,.1f} GB" in verdict


def test_policy_verdict_is_an_answer(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, *PLAN_OOM)
    assert (rc, err) == (3, "")
    verdict = next(ln for ln in out.splitlines() if ln.startswith("Verdict:"))
    assert "INFEASIBLE" in verdict and "gpu0" in verdict and "over by" in verdict
    assert "GB" in verdict.split("over by")[1]
    assert "default picked: seq_len=4096" in out  # the assumptions come with the answer


def test_both_infeasible_shapes_share_one_schema(capsys: pytest.CaptureFixture[str]) -> None:
    feasible = run_json(capsys, *NOOFF)
    sim = run_json(capsys, *SIM_OOM, rc=3)
    plan = run_json(capsys, *PLAN_OOM, rc=3)
    assert set(plan) == set(sim) == set(feasible)
    assert set(plan["oom"]) == set(sim["oom"]) == OOM_KEYS
    assert plan["feasible"] is False and plan["verdict"].startswith("INFEASIBLE")
    assert (plan["policy"], plan["hardware"], plan["model"]["name"]) == ("none", "a100-40g", "llama2-70b")
    o = plan["oom"]
    assert o["stage"] == "plan" and o["pool"] == "gpu0"
    assert o["over_by_bytes"] == pytest.approx(o["requested_bytes"] - o["capacity_bytes"])
    assert o["capacity_bytes"] == pytest.approx(plan["capacity_bytes"]["gpu0"])
    assert o["requested_bytes"] == pytest.approx(16 * plan["model"]["params"])  # ZeRO-0: 16 B/param
    assert (o["time_s"], o["task"], o["free_bytes"]) == (None, None, None)
    assert plan["step_time_s"] is None and plan["peak_bytes"] is None
    assert plan["sim"]["events"] == 0 and "not simulated" in plan["sim"]["method"]
    assert plan["model"]["params"] > 6e10


def test_infeasible_policy_writes_no_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = run(capsys, *PLAN_OOM, "--plan-out", str(tmp_path / "p.json"))
    assert rc == 3 and "--plan-out not written" in out
    assert not (tmp_path / "p.json").exists()


def test_check_reports_invariants(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, *OFFLOAD, "--check")
    assert rc == 0 and "invariants: all hold" in out
    assert run_json(capsys, *OFFLOAD, "--check")["invariant_violations"] == []


# -- --plan-out and --plan ------------------------------------------------------------------------------
def test_plan_out_loads_and_resimulates_to_the_same_step(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    first = run_json(capsys, *OFFLOAD, "--plan-out", str(path))
    plan = Plan.load(path)
    assert plan.policy == "zero-offload" and plan.hardware.name == "a100"
    again = run_json(capsys, "--plan", str(path))
    assert again["step_time_s"] == first["step_time_s"]
    assert again["hardware"] == "a100"  # the plan's own hardware, not the a100x8 default
    assert again["link_bytes"] == first["link_bytes"] and again["peak_bytes"] == first["peak_bytes"]
    assert any("embedded in" in a for a in again["workload"]["assumed"])


def test_plan_with_explicit_hw_and_overrides(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    base = run_json(capsys, *NOOFF, "--plan-out", str(path))
    other = run_json(capsys, "--plan", str(path), "--hw", "h200")
    assert other["hardware"] == "h200" and other["step_time_s"] < base["step_time_s"]
    small = run_json(capsys, "--plan", str(path), "--set", "gpu.memory=2GB", rc=3)
    assert small["hardware"] == "a100" and small["oom"]["pool"] == "gpu0"


# -- the installed script -------------------------------------------------------------------------------
def test_installed_simulate_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("simulate")
    assert script.exists(), f"{script}: install tiersim (pip install -e .) to get the console script"
    ok = subprocess.run([str(script), *NOOFF, "--json"], capture_output=True, text=True, cwd=tmp_path,
                        timeout=120)
    assert (ok.returncode, ok.stderr) == (0, "")
    assert _strict(ok.stdout)["feasible"] is True
    bad = subprocess.run([str(script), *NOOFF, "--plan-out", "missing/plan.json"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr


# -- the Python API under the command line ----------------------------------------------------------------
def test_api_applies_overrides_to_a_spec_object() -> None:
    import tiersim

    spec = load_hardware("a100")
    res = tiersim.simulate(hw=spec, model="gpt2", policy="none", hw_overrides=["host.dram=512GB"])
    plain = tiersim.simulate(hw=spec, model="gpt2", policy="none")
    assert res.capacity_bytes["cpu"] - plain.capacity_bytes["cpu"] == pytest.approx(256e9)
    assert res.step_time_s == plain.step_time_s
