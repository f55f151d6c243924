"""``replay/device_check.sh`` on CPU paths: its stages and bounds (dry run), its refusals, the table it writes, one
real ``--cpu-smoke`` run of every stage at tiny sizes, and (on a CUDA machine only) the CUDA stages themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay.device_check_table import build, main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "replay/device_check.sh"


def run_script(out: Path, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), **env}
    return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def stages(out: Path) -> dict[str, str]:
    rows = (out / "stages.tsv").read_text().splitlines()
    assert rows[0] == "stage\tstatus\tseconds\tlimit_s"
    return {r.split("\t")[0]: r.split("\t")[1] for r in rows[1:]}


def test_dry_run_lists_every_stage_with_its_bound(tmp_path: Path) -> None:
    r = run_script(tmp_path, "--cpu-smoke", DEVICE_CHECK_DRY="1", DEVICE_CHECK_TIMEOUT_REPLAY="7",
                   DEVICE_CHECK_POLICIES="tinypipe synergyscale", timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("dry: ")]
    names = [ln.split()[1] for ln in lines]
    assert names == ["env", "calibrate", "plan-tinypipe", "replay-tinypipe", "plan-synergyscale",
                     "replay-synergyscale", "validation", "table"]
    replay = next(ln for ln in lines if ln.startswith("dry: replay-tinypipe"))
    assert "(timeout 7s)" in replay and "--device cpu" in replay and "--verify" in replay
    assert "--quick" in next(ln for ln in lines if ln.startswith("dry: validation"))
    assert "gpu.memory=30MB" in next(ln for ln in lines if ln.startswith("dry: plan-tinypipe"))
    assert set(stages(tmp_path).values()) <= {"dry", "skipped (cpu smoke run: the CUDA stages ran on the CPU with "
                                                      "tiny sizes)",
                                              "skipped (cpu smoke run: gpt2 at its default workload is device-sized)"}


def test_cuda_mode_dry_run_replays_on_cuda_with_every_policy(tmp_path: Path) -> None:
    r = run_script(tmp_path, DEVICE_CHECK_DRY="1", timeout=60)
    assert r.returncode == 0, r.stderr
    replays = [ln for ln in r.stdout.splitlines() if ln.startswith("dry: replay-")]
    assert len(replays) == 9 and all("--device cuda" in ln for ln in replays)
    nvme = next(ln for ln in r.stdout.splitlines() if ln.startswith("dry: plan-zero-infinity-nvme"))
    assert "--policy zero-infinity --knob param_device=nvme" in nvme
    workflow = [ln for ln in replays if ln.startswith("dry: replay-gpt2-")]
    assert [ln.split()[1] for ln in workflow] == ["replay-gpt2-zero-offload", "replay-gpt2-none"]
    assert all("--verify" not in ln for ln in workflow)
    assert "--model gpt2" in next(ln for ln in r.stdout.splitlines() if ln.startswith("dry: plan-gpt2-none"))
    assert "--quick" not in next(ln for ln in r.stdout.splitlines() if ln.startswith("dry: validation"))


@pytest.mark.parametrize("args,env,msg", [
    (["--bogus"], {}, "unknown argument '--bogus'"),
    (["--cpu-smoke"], {"DEVICE_CHECK_TIMEOUT_CALIBRATE": "soon"}, "must be a whole number of seconds"),
    (["--cpu-smoke"], {"DEVICE_CHECK_TIMEOUT_ENV": "0"}, "must be a whole number of seconds"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str], env: dict[str, str],
                                               msg: str) -> None:
    r = run_script(tmp_path / "o", *args, timeout=60, **env)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(_torch_cuda(), reason="this machine has CUDA: test_cuda_stages_run covers it")
def test_without_cuda_the_cuda_run_fails_loudly_at_once(tmp_path: Path) -> None:
    r = run_script(tmp_path, timeout=300)
    assert r.returncode == 1
    assert "stage 'env' FAILED" in r.stderr and "no CUDA device here" in r.stderr and "--cpu-smoke" in r.stderr
    assert stages(tmp_path) == {"env": "failed (exit 1)"}
    assert "| env | failed (exit 1) |" in (tmp_path / "table.md").read_text()


def _write(path: Path, obj: object) -> None:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def test_table_reads_what_each_stage_left_and_names_what_is_missing(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "stages.tsv").write_text("stage\tstatus\tseconds\tlimit_s\nenv\tok\t3\t120\n"
                                         "replay-none\tfailed (timed out after 9s)\t9\t9\n")
    _write(tmp_path / "env.out", {"mode": "cuda", "device": "NVIDIA H200", "cuda": "12.8", "device_count": 1,
                                  "torch": "2.13.0", "python": "3.11", "platform": "Linux"})
    _write(tmp_path / "replay-tinypipe.out", {
        "simulated": {"step_time_s": 0.010}, "measured": {"step_time_s": 0.012, "device": "cuda"},
        "error": {"step_time": 0.2, "peak_bytes": {"gpu0": 0.0, "cpu": -0.03, "nvme": None}},
        "verify": {"ok": True}})
    _write(tmp_path / "replay-none.out", "{broken")
    _write(tmp_path / "validation.json", {"rows": [{"case": "zoff-small", "policy": "zero-offload",
                                                    "sim_step_s": 0.1, "meas_step_s": 0.11, "step_error": 0.1,
                                                    "peak_error": {"gpu0": 0.0, "cpu": 0.0, "nvme": None}}],
                                          "summary": {"median_abs_step_error": 0.1, "peak_ok": True}})
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "table.md").read_text()
    assert capsys.readouterr().out == text
    assert "| replay-none | failed (timed out after 9s) | 9 | 9 |" in text
    assert "device NVIDIA H200 (CUDA 12.8, 1 device(s))" in text
    assert "| tinypipe | cuda | ok | 10.0 | 12.0 | +20.0% | -3.0% (cpu) |" in text
    assert "| none | - | - | - | - | - | replay-none.out: not JSON (JSONDecodeError) |" in text
    assert "| zoff-small | zero-offload | 100.0 | 110.0 | +10.0% | +0.0% / +0.0% / - |" in text
    assert "calibrate.out: not written" in text
    assert main([str(tmp_path / "missing")]) == 2


def test_table_of_an_empty_folder(tmp_path: Path) -> None:
    text = build(tmp_path)
    assert "stages.tsv: not written" in text and "no replay ran" in text and "validation.json: not written" in text


@pytest.mark.slow
def test_cpu_smoke_runs_every_stage(tmp_path: Path) -> None:
    """Every stage for real at tiny sizes on the CPU: calibrate, a zero-infinity plan replayed with --verify (its
    replayed peaks equal the simulated ones: they do not depend on timing), the quick validation matrix, the
    table."""
    pytest.importorskip("torch")
    r = run_script(tmp_path, "--cpu-smoke", DEVICE_CHECK_POLICIES="zero-infinity", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    st = stages(tmp_path)
    assert [k for k, v in st.items() if v != "ok"] == ["cuda", "workflow"]
    assert {"env", "calibrate", "plan-zero-infinity", "replay-zero-infinity", "validation"} <= set(st)
    replay = json.loads((tmp_path / "replay-zero-infinity.out").read_text())
    assert replay["verify"]["ok"]
    assert all(e is None or abs(e) < 1e-9 for e in replay["error"]["peak_bytes"].values())
    assert (tmp_path / "calibrated.yaml").is_file() and (tmp_path / "validation.json").is_file()
    table = (tmp_path / "table.md").read_text()
    assert "| zero-infinity | cpu | ok |" in table and "## Validation matrix" in table and "none-tiny" in table
    assert r.stdout.endswith(table)


@pytest.mark.skipif(not _torch_cuda(), reason="needs a CUDA device (the CPU paths are covered above)")
def test_cuda_stages_run(tmp_path: Path) -> None:
    r = run_script(tmp_path, DEVICE_CHECK_POLICIES="zero-offload", DEVICE_CHECK_VALIDATION="0", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    st = stages(tmp_path)
    assert st["env"] == st["calibrate"] == st["replay-zero-offload"] == "ok"
    assert json.loads((tmp_path / "replay-zero-offload.out").read_text())["measured"]["device"].startswith("cuda")
