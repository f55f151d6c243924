"""``tiersim report FILE... -o DIR`` and ``simulate ... --report DIR``: inputs told apart by kind or shape,
bad input as one line (exit 2), every file written."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tiersim.cli import main, simulate_main

GPT2 = ["--hw", "a100", "--model", "gpt2", "--global-batch", "4"]


def run(argv: list[str], entry=main) -> tuple[int, str, str]:  # noqa: ANN001
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = entry(argv)
    return rc, out.getvalue(), err.getvalue()


def figures(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.png"))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    rc, out, _ = run([*GPT2, "--policy", "zero-offload", "--json", "--plan-out", str(d / "plan.json")], simulate_main)
    assert rc == 0
    (d / "result.json").write_text(out)
    rc, out, _ = run(["--hw", "a100", "--model", "gpt2", "--policy", "none", "--json", "--micro-batch", "256",
                      "--checkpointing", "none"], simulate_main)
    assert rc == 3
    (d / "oom.json").write_text(out)
    (d / "coverage.json").write_text(json.dumps({"kind": "tiersim.coverage", "hardware": "a100", "rows": [
        {"policy": "none", "model": "gpt2", "params": 1.2e8, "feasible": True, "tokens_per_s": 9.0e4,
         "tflops_per_gpu": 130.0, "binding": None, "knobs": {}}]}))
    (d / "unknown.json").write_text(json.dumps({"rows": [{"a": 1}]}))
    (d / "text.txt").write_text("hello")
    return {p.stem: p for p in d.iterdir()}


def test_report_from_json_and_a_plan(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "r"
    rc, stdout, err = run(["report", str(files["result"]), str(files["oom"]), str(files["plan"]),
                           str(files["coverage"]), "-o", str(out)])
    assert rc == 0, err
    assert "report.html" in stdout and err == ""
    # JSON results only feed the comparison; the plan is re-simulated, so it gets figures 2-4
    assert figures(out) == ["fig1-comparison", "fig2-memory-zero-offload", "fig3-timeline-zero-offload",
                            "fig4-links-zero-offload", "fig5-coverage-a100"]
    comp = (out / "fig1-comparison.csv").read_text().splitlines()
    assert len(comp) == 4 and comp[1].startswith("zero-offload (result.json),") and comp[2].startswith("none,")
    assert comp[3].startswith("zero-offload (plan.json),")
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    assert all(f.stat().st_size > 0 for f in out.iterdir())


@pytest.mark.parametrize("bad, needle", [
    ("unknown", "unknown kind of file"), ("text", "not JSON and not a sweep store"), ("missing", "no such file")])
def test_a_file_of_unknown_shape_is_one_line_and_exit_2(files: dict[str, Path], tmp_path: Path, bad: str,
                                                        needle: str) -> None:
    path = files.get(bad, tmp_path / "missing.json")
    rc, stdout, err = run(["report", str(files["result"]), str(path), "-o", str(tmp_path / "r")])
    assert rc == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and str(path) in err
    assert not (tmp_path / "r").exists()  # nothing written


def test_output_folder_problems_are_bad_input(files: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for target, needle in ((tmp_path / "f", "is a file"), (tmp_path / "no" / "r", "does not exist")):
        rc, _, err = run(["report", str(files["result"]), "-o", str(target)])
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    rc, _, err = run([*GPT2, "--policy", "none", "--report", str(tmp_path / "f")], simulate_main)
    assert rc == 2 and "--report" in err


def test_simulate_report_with_one_policy(tmp_path: Path) -> None:
    rc, stdout, _ = run([*GPT2, "--policy", "tinypipe", "--report", str(tmp_path / "r")], simulate_main)
    assert rc == 0 and f"report: {tmp_path / 'r' / 'report.html'}" in stdout
    assert [f for f in figures(tmp_path / "r") if not f.startswith("fig4")] == [
        "fig1-comparison", "fig2-memory-tinypipe", "fig3-timeline-tinypipe"]
    rc, stdout, _ = run([*GPT2, "--policy", "zero-offload", "--json", "--report", str(tmp_path / "j")], simulate_main)
    assert rc == 0 and json.loads(stdout)["policy"] == "zero-offload"  # stdout stays one JSON object
    assert (tmp_path / "j" / "report.html").stat().st_size > 0


def test_simulate_policy_all_report_has_every_policy(tmp_path: Path) -> None:
    from policies import POLICIES

    rc, stdout, _ = run([*GPT2, "--policy", "all", "--report", str(tmp_path / "r")], simulate_main)
    assert rc == 0 and "report: " in stdout
    names = figures(tmp_path / "r")
    for p in POLICIES:
        assert f"fig2-memory-{p}" in names and f"fig3-timeline-{p}" in names
    comp = [line.split(",")[0] for line in (tmp_path / "r" / "fig1-comparison.csv").read_text().splitlines()[1:]]
    assert comp == list(POLICIES)


def test_sweep_store_and_replay_inputs(files: dict[str, Path], tmp_path: Path) -> None:
    SweepStore = pytest.importorskip("planner.sweep.store").SweepStore  # helper D's sweeps  # noqa: N806
    result = json.loads(files["result"].read_text())
    store = tmp_path / "sweep.db"
    with SweepStore(store) as s:
        for gen in (4, 5):
            point = {"hardware": "a100", "set": [f"pcie.gen={gen}"], "model": "gpt2", "policy": "zero-offload",
                     "knobs": {}, "workload": {}}
            s.add(f"k{gen}", point, {"status": "done", "result": {**result, "tokens_per_s": 1000.0 * gen}})
    replay = {"policy": "zero-offload", "hardware": "x", "simulated": {"step_time_s": 1.0, "peak_bytes": {"gpu0": 2e6}},
              "measured": {"step_time_s": 1.2, "peak_bytes": {"gpu0": 2e6}}, "error": {}}
    (tmp_path / "replay.json").write_text(json.dumps(replay))
    rc, _, err = run(["report", str(store), str(tmp_path / "replay.json"), "-o", str(tmp_path / "r")])
    assert rc == 0, err
    assert figures(tmp_path / "r") == ["fig1-comparison", "fig7-replay"]
    lines = (tmp_path / "r" / "fig1-comparison.csv").read_text().splitlines()
    assert [ln.split(",")[0] for ln in lines[1:]] == ["zero-offload [set=pcie.gen=4]", "zero-offload [set=pcie.gen=5]"]
