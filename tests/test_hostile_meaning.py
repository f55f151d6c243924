"""Validation of meaning, not only form (issue 17 item 2): inputs that parse but cannot be right are
refused with one line naming the field (exit 2); a plan that does not fit is a verdict (exit 3) in
``replay`` exactly as in ``simulate --plan``.

Through the real command line (``tiersim.cli.main``): exit code, exactly one stderr line, nothing on
stdout for bad input.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tiersim.cli import main

SMALL = ["--hw", "a100", "--model", "gpt2", "--seq-len", "256", "--global-batch", "4"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def bad_input(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    rc, out, err = run(argv, capsys)
    assert rc == 2, (argv, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert out == ""
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["simulate", *SMALL, "--policy", "none", "--plan-out", str(path), "--json"]) == 0
    return json.loads(path.read_text())


def write(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


# -- plans ----------------------------------------------------------------------------------------------
def _no_segments(d: dict[str, Any]) -> None:
    d["segments"] = []


def _no_tasks(d: dict[str, Any]) -> None:
    for s in d["segments"]:
        s["tasks"] = []


def _never_freed(d: dict[str, Any], tensor: str = "act0.gpu0") -> None:
    """The plan with every free of ``tensor`` taken out (the fuzzer's leaked activation)."""
    found = False
    for s in d["segments"]:
        for t in s["tasks"]:
            kept = [f for f in t.get("frees", []) if f[0].split("@")[0].split("^")[0] != tensor]
            found |= len(kept) != len(t.get("frees", []))
            if "frees" in t:
                t["frees"] = kept
    assert found, f"the plan frees no {tensor}"


PLAN_CASES = {
    "no segments": (_no_segments, ["'segments' is empty"]),
    "no tasks": (_no_tasks, ["no segment holds a task"]),
    "unknown policy": (lambda d: d.update(policy="zero-offlaod"), ["'policy'", "'zero-offlaod'", "zero-offload"]),
    "fractional steps": (lambda d: d.update(steps=2.5), ["'steps'", "2.5"]),
    "steps as text": (lambda d: d.update(steps="2"), ["'steps'"]),
    "steps true": (lambda d: d.update(steps=True), ["'steps'"]),
    "zero steps": (lambda d: d.update(steps=0), ["'steps'"]),
    "knobs the policy refuses": (lambda d: d.update(knobs={"stage": 9}), ["'knobs'", "stage"]),
    "a knob the policy lacks": (lambda d: d.update(knobs={"chunks": 2}), ["'knobs'", "chunks"]),
    "a micro-batch above the global batch": (lambda d: d["workload"].update(micro_batch=16),
                                             ["'workload.global_batch'", "micro_batch 16"]),
    "a global batch its figures were not made for": (lambda d: d["workload"].update(global_batch=3),
                                                     ["'metrics.tokens_per_step'"]),
    "a sequence beyond the model's positions": (lambda d: d["workload"].update(seq_len=4096),
                                                ["'workload.seq_len'", "max_pos 1024"]),
    # the contract of a run's end: every tensor neither persistent nor homed is freed where it was allocated
    "an activation never freed": (_never_freed, ["'act0.gpu0'", "never freed", "persistent"]),
    "two segments of one name": (lambda d: d["segments"][-1].update(name=d["segments"][0]["name"]),
                                 ["'segments'", "more than one segment"]),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_a_plan_that_cannot_mean_anything_is_refused(plan_doc: dict[str, Any], tmp_path: Path, case: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    mutate, words = PLAN_CASES[case]
    doc = copy.deepcopy(plan_doc)
    mutate(doc)
    path = write(tmp_path, "plan.json", doc)
    bad_input(["simulate", "--plan", str(path)], capsys, str(path), *words)
    bad_input(["replay", str(path)], capsys, str(path), *words)
    bad_input(["report", str(path), "-o", str(tmp_path / "out")], capsys, str(path), *words)
    assert not (tmp_path / "out" / "report.html").exists()


def test_a_persistent_tensor_may_stay_allocated(plan_doc: dict[str, Any], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Only a non-persistent tensor left allocated is refused: the same plan with the tensor marked persistent
    runs, and the invariant check finds no leak."""
    doc = copy.deepcopy(plan_doc)
    _never_freed(doc)
    for t in doc["tensors"]:
        if t["id"] == "act0.gpu0":
            t["persistent"] = True
    path = write(tmp_path, "plan.json", doc)
    rc, out, err = run(["simulate", "--plan", str(path), "--check"], capsys)
    assert rc == 0 and out and "Traceback" not in err, err


def _oversized(plan_doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(plan_doc)
    persistent = next(t for t in doc["tensors"] if str(t.get("home", "")).startswith("gpu"))
    persistent["bytes"] = 1e15  # 1,000,000 GB of persistent GPU tensors
    return doc


def test_replay_gives_the_simulators_verdict_on_a_plan_that_does_not_fit(
        plan_doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "big.json", _oversized(plan_doc))
    rc, out, _ = run(["simulate", "--plan", str(path)], capsys)
    assert rc == 3
    verdict = next(line for line in out.splitlines() if line.startswith("Verdict: "))
    assert "INFEASIBLE: gpu0 runs out of memory" in verdict
    rc, out, err = run(["replay", str(path)], capsys)
    assert rc == 3 and err == ""
    assert out.splitlines()[0] == verdict  # the same verdict, word for word
    assert "1,000,000" not in out.split("\n", 1)[1]  # no measured peak reported as if it had run

    rc, out, _ = run(["simulate", "--plan", str(path), "--json"], capsys)
    sim = json.loads(out)
    rc, out, _ = run(["replay", str(path), "--json"], capsys)
    rep = json.loads(out)
    assert rc == 3 and rep["replayed"] is False and rep["feasible"] is False
    assert rep["verdict"] == sim["verdict"] and rep["oom"] == sim["oom"]


def test_the_runner_checks_the_persistent_tensors_before_the_first_task(plan_doc: dict[str, Any]) -> None:
    pytest.importorskip("torch")  # replay's optional extra (part of the dev install)
    from replay.errors import ReplayOom
    from replay.runner import Runner
    from simulator import Plan

    plan = Plan.from_dict(_oversized(plan_doc))
    with pytest.raises(ReplayOom, match="out of memory on gpu0 before the first task"):
        Runner(plan, plan.hardware, device="cpu").run()


# -- flags given twice --------------------------------------------------------------------------------------
def test_a_knob_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bad_input(["simulate", *SMALL, "--policy", "none", "--knob", "stage=1", "--knob", "stage=3"], capsys,
              "--knob stage given twice", "stage=1", "stage=3")
    bad_input(["simulate", *SMALL, "--policy", "none", "--knob", "stage=0", "--knob", " stage = 0"], capsys,
              "given twice")


def test_a_hardware_override_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bad_input(["simulate", *SMALL, "--policy", "none", "--set", "gpu.count=2", "--set", "gpu.count=1"], capsys,
              "given twice", "gpu.count=2", "gpu.count=1")
    bad_input(["hardware", "show", "a100", "--set", "host.dram=1TB", "--set", "host.dram=2TB"], capsys,
              "given twice")


# -- sweep files -------------------------------------------------------------------------------------------
GRID: dict[str, Any] = {"hardware": ["a100"], "models": ["gpt2"], "policies": ["none"],
                        "workload": {"global_batch": 4, "micro_batch": 1, "seq_len": 256}}


@pytest.mark.parametrize(("change", "words"), [
    ({"workload": {"global_batch": 4, "micro_batch": []}}, ["workload.micro_batch", "empty list"]),
    ({"workload": {"precision": []}}, ["workload.precision", "empty list"]),
    ({"policies": {"none": {"stage": []}}}, ["policies.none.stage", "empty list"]),
    ({"hardware": [{"preset": "a100", "set": {"pcie.gen": []}}]}, ["hardware[0].set.pcie.gen", "empty list"]),
    ({"models": []}, ["models", "empty"]),
])
def test_an_empty_sweep_axis_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any],
                                        words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump({**GRID, **change}))
    bad_input(["sweep", "grid.yaml", "--processes", "1"], capsys, "grid.yaml", *words)
    assert not (tmp_path / "grid.sqlite").exists()


@pytest.mark.parametrize(("workload", "words"), [
    ({"seq_len": 4096}, ["workload.seq_len", "4096", "max_pos 1024", "gpt2"]),
    ({"precision": "bf16", "__hardware": ["dgx2"]}, ["workload.precision", "bf16", "fp16"]),
])
def test_a_contradictory_sweep_workload_is_refused_before_any_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workload: dict[str, Any], words: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """What simulate refuses as flags (exit 2) a sweep refuses when it expands the grid, not as failed points."""
    monkeypatch.chdir(tmp_path)
    hardware = workload.pop("__hardware", GRID["hardware"])
    grid = {**GRID, "hardware": hardware, "workload": {**GRID["workload"], **workload}}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    bad_input(["sweep", "grid.yaml", "--processes", "1"], capsys, "grid.yaml", *words)
    assert not (tmp_path / "grid.sqlite").exists()


# -- report inputs ----------------------------------------------------------------------------------------
COVERAGE = {"kind": "tiersim.coverage", "hardware": "a100", "rows": [
    {"policy": "none", "model": "gpt2", "params": 1.2e8, "feasible": True, "tokens_per_s": 9.0e4,
     "tflops_per_gpu": 130.0, "binding": None, "knobs": {}}]}
WHATIF = {"kind": "tiersim.whatif", "hardware": "a100", "model": "gpt2", "sensitivity": [
    {"change": "pcie.gen=5", "base_tokens_per_s": 2236.0, "tokens_per_s": 2800.0, "gain": 0.25,
     "makes_feasible": False}]}
REPLAY = {"policy": "none", "simulated": {"step_time_s": 0.2, "peak_bytes": {"gpu0": 3e6}},
          "measured": {"step_time_s": 0.25, "peak_bytes": {"gpu0": 3e6}}, "error": {}}
RESULT = {"feasible": True, "policy": "none", "hardware": "a100", "model": {"name": "gpt2"},
          "peak_bytes": {"gpu0": 1e9}, "capacity_bytes": {"gpu0": 8e10}, "step_time_s": 0.1,
          "tokens_per_s": 1e4, "tflops_per_gpu": 100.0, "mfu": 0.3, "hw_tflops_per_gpu": 120.0, "hfu": 0.36,
          "oom": None}


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the field at ``path`` (dots; digits index lists) set, or removed for DELETE."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return out


DELETE = object()
REPORT_CASES = {
    "coverage without rows": (_with(COVERAGE, "rows", []), ["'rows' is empty"]),
    "coverage rows not a list": (_with(COVERAGE, "rows", {"none": 1}), ["'rows'", "expected a list"]),
    "coverage row without a model": (_with(COVERAGE, "rows.0.model", DELETE), ["rows[0]", "missing field 'model'"]),
    "coverage feasible as text": (_with(COVERAGE, "rows.0.feasible", "yes"), ["rows[0]", "'feasible'"]),
    "coverage feasible without speed": (_with(COVERAGE, "rows.0.tokens_per_s", None), ["'tokens_per_s'"]),
    "coverage speed as text": (_with(COVERAGE, "rows.0.tokens_per_s", "fast"), ["'tokens_per_s'"]),
    "a what-if labelled coverage": ({**WHATIF, "kind": "tiersim.coverage"}, ["'rows'"]),
    "what-if without sensitivity": (_with(WHATIF, "sensitivity", []), ["'sensitivity' is empty"]),
    "what-if change as a number": (_with(WHATIF, "sensitivity.0.change", 5), ["sensitivity[0]", "'change'"]),
    "what-if gain as text": (_with(WHATIF, "sensitivity.0.gain", "25%"), ["'gain'"]),
    "replay step as text": (_with(REPLAY, "simulated.step_time_s", "fast"), ["simulated", "'step_time_s'"]),
    "replay peaks as a list": (_with(REPLAY, "measured.peak_bytes", [1, 2]), ["measured", "'peak_bytes'"]),
    "replay without a measured step": (_with(REPLAY, "measured.step_time_s", DELETE), ["measured", "step_time_s"]),
    "result feasible with an oom": (_with(RESULT, "oom", {"pool": "gpu0"}), ["'oom'", "feasible"]),
    "result infeasible without an oom": (_with(RESULT, "feasible", False), ["'oom'", "infeasible"]),
    "result peak as text": (_with(RESULT, "peak_bytes", {"gpu0": "1GB"}), ["'peak_bytes'", "gpu0"]),
    "result NaN speed": (_with(RESULT, "tokens_per_s", float("nan")), ["'tokens_per_s'"]),
    # every field the tables and figures read is typed and in range (the fuzzer's mapping-valued mfu/hfu was a
    # TypeError in summary_tables; a null or zero capacity a matplotlib warning, a traceback under -W error)
    "result mfu as an object": (_with(RESULT, "mfu", {"a": 1}), ["'mfu'", "finite number"]),
    "result hfu as an object": (_with(RESULT, "hfu", {"a": 1}), ["'hfu'", "finite number"]),
    "result hardware TFLOP/s as text": (_with(RESULT, "hw_tflops_per_gpu", "x"), ["'hw_tflops_per_gpu'"]),
    "result capacity null": (_with(RESULT, "capacity_bytes", {"gpu0": 8e10, "cpu": None}),
                             ["'capacity_bytes'", "'cpu'", "null"]),
    "result capacity zero": (_with(RESULT, "capacity_bytes", {"gpu0": 8e10, "cpu": 0}),
                             ["'capacity_bytes'", "'cpu'", "> 0"]),
    "result negative peak": (_with(RESULT, "peak_bytes", {"gpu0": -1e9}), ["'peak_bytes'", ">= 0"]),
    "result negative step": (_with(RESULT, "step_time_s", -1), ["'step_time_s'", ">= 0"]),
    "result speed that overflows": (_with(RESULT, "tokens_per_s", 1e308), ["'tokens_per_s'", "out of range"]),
    "result source as a list": (_with(RESULT, "source", [1]), ["'source'"]),
    "coverage negative params": (_with(COVERAGE, "rows.0.params", -3), ["rows[0]", "'params'"]),
    "replay negative step": (_with(REPLAY, "measured.step_time_s", -0.25), ["measured", "'step_time_s'"]),
    "results with a bad one": ({"job": {}, "results": [RESULT, _with(RESULT, "policy", 3)]},
                               ["results[1]", "'policy'"]),
    "validation rows without a case": ({"rows": [{"sim_step_s": 1.0, "meas_step_s": 1.1}]}, ["rows[0]", "'case'"]),
}


@pytest.mark.parametrize("case", list(REPORT_CASES))
def test_malformed_report_inputs_are_one_line(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc, words = REPORT_CASES[case]
    path = write(tmp_path, "in.json", doc)
    bad_input(["report", str(path), "-o", str(tmp_path / "out")], capsys, str(path), *words)
    assert not (tmp_path / "out" / "report.html").exists()


# Hypothesis: a document of a known kind with random field values is either refused in one line by the
# check, or every frame its figure is drawn from builds without error and is not empty
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=4),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.floats(), max_size=2))


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["coverage", "whatif", "replay", "result"]), st.data())
def test_checked_documents_draw_without_error(kind: str, data: st.DataObject) -> None:
    from reports import frames
    from reports.input_checks import InputMeaningError, check_document
    from reports.inputs import kind_of

    base, fields = {"coverage": (COVERAGE, ["rows.0." + k for k in COVERAGE["rows"][0]] + ["rows"]),
                    "whatif": (WHATIF, ["sensitivity.0." + k for k in WHATIF["sensitivity"][0]] + ["sensitivity"]),
                    "replay": (REPLAY, ["simulated.step_time_s", "simulated.peak_bytes", "measured.step_time_s",
                                        "measured.peak_bytes", "simulated", "measured"]),
                    "result": (RESULT, list(RESULT))}[kind]
    doc = base
    for path in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        try:
            doc = _with(doc, path, data.draw(st.one_of(st.just(DELETE), _ANY)))
        except (KeyError, IndexError, TypeError):  # a parent already replaced by a scalar
            continue
    found = kind_of(doc)
    if found == "unknown":
        return  # refused as an unknown kind (covered above)
    try:
        check_document(found, doc, "in.json")
    except InputMeaningError as e:
        assert "\n" not in str(e) and str(e).startswith("in.json")
        return
    if found == "coverage":
        assert len(frames.coverage_frame(doc))
    elif found == "whatif":
        assert len(frames.whatif_frame(doc))
    elif found == "replay":
        assert frames.replay_rows(doc)
    else:
        assert len(frames.comparison_frame([doc]))
        from reports.build import summary_tables
        from reports.contents import ReportInputs
        assert summary_tables(ReportInputs(items=[doc], item_sources=["in.json"]))
