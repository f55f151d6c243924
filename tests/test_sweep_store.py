"""The sweep store and the in-process (serial) sweep: each row a `simulate --json` object, written once,
failures recorded, reruns compute only what is missing."""

from __future__ import annotations

import json
import sqlite3

import pytest

from planner.sweep import (
    StoreError,
    expand_grid,
    read_failures,
    read_results,
    results_frame,
    run_sweep,
    sweep,
)
from planner.sweep.store import COLUMNS, SweepStore
from tiersim.cli import main

FEASIBLE = ["--hw", "a100", "--model", "gpt2", "--policy", "none", "--global-batch", "8", "--micro-batch", "1",
            "--seq-len", "512", "--precision", "bf16", "--checkpointing", "full"]
SIM_OOM = ["--hw", "a100-40g", "--model", "gpt2", "--policy", "zero-offload", "--global-batch", "128",
           "--micro-batch", "128", "--seq-len", "1024", "--precision", "bf16", "--checkpointing", "none"]
PLAN_INFEASIBLE = ["--hw", "a100", "--model", "llama2-7b", "--policy", "none", "--global-batch", "8",
                   "--micro-batch", "1", "--seq-len", "512", "--precision", "bf16", "--checkpointing", "full"]


def point_of(argv):
    """The sweep file of the one point that `simulate argv` runs."""
    a = dict(zip(argv[::2], argv[1::2], strict=True))
    workload = {"global_batch": int(a["--global-batch"]), "micro_batch": int(a["--micro-batch"]),
                "seq_len": int(a["--seq-len"]), "precision": a["--precision"], "checkpointing": a["--checkpointing"]}
    return {"hardware": [a["--hw"]], "models": [a["--model"]], "policies": [a["--policy"]], "workload": workload}


def without_wall_time(d):
    d = json.loads(json.dumps(d))
    d["sim"].pop("wall_s")
    return d


@pytest.mark.parametrize("argv", [FEASIBLE, SIM_OOM, PLAN_INFEASIBLE], ids=["feasible", "sim-oom", "plan-oom"])
def test_each_row_is_the_simulate_json_object(argv, tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    points = expand_grid(point_of(argv))
    summary = run_sweep(points, store, processes=1)
    assert (summary.done, summary.failed, summary.executor) == (1, 0, "serial")
    (row,) = read_results(store)
    assert row.pop("point") == dict(points[0].inputs)
    assert row.pop("key") == points[0].key
    rc = main(["simulate", *argv, "--json"])
    cli = json.loads(capsys.readouterr().out)
    assert rc == (0 if cli["feasible"] else 3)
    assert without_wall_time(row) == without_wall_time(cli)
    assert list(row) == list(cli)  # same keys in the same order
    if argv is not FEASIBLE:
        assert row["oom"]["stage"] == ("plan" if argv is PLAN_INFEASIBLE else "simulation")


def test_columns_hold_the_main_figures(tmp_path):
    store = tmp_path / "s.sqlite"
    frame = sweep(expand_grid(point_of(FEASIBLE)), store, processes=1)
    assert list(frame.columns) == list(COLUMNS)
    (r,) = frame.to_dict(orient="records")
    (full,) = read_results(store)
    assert r["status"] == "done" and r["feasible"] is True and r["error"] is None
    assert (r["hardware"], r["model"], r["policy"], r["global_batch"], r["seq_len"]) == ("a100", "gpt2", "none", 8, 512)
    assert r["flash_attention"] is True  # the default the run picked, not left empty
    assert r["tokens_per_s"] == full["tokens_per_s"] and r["step_time_s"] == full["step_time_s"]
    assert r["peak_gpu_bytes"] == full["peak_bytes"]["gpu0"] and r["peak_cpu_bytes"] == full["peak_bytes"]["cpu"]
    assert r["sim_events"] == full["sim"]["events"] > 0


def test_a_run_that_raises_is_recorded_as_failed_and_the_sweep_goes_on(tmp_path):
    store = tmp_path / "s.sqlite"
    # global batch 4 with micro-batch 3: the policy raises in the worker (a combination, not one bad field)
    points = expand_grid({"hardware": ["a100"], "models": ["gpt2"], "policies": ["none"],
                          "workload": {"global_batch": 4, "micro_batch": [1, 2, 3], "seq_len": 256}})
    summary = run_sweep(points, store, processes=1)
    assert (summary.done, summary.failed) == (2, 1)
    (failure,) = read_failures(store)
    assert failure["point"]["workload"]["micro_batch"] == 3
    assert failure["error"].startswith("KnobError: global batch 4 is not a multiple of micro-batch 3")
    assert "\n" not in failure["error"]
    assert "Traceback" in failure["traceback"]
    frame = results_frame(store)
    assert sorted(frame["status"]) == ["done", "done", "failed"]
    assert frame.loc[frame["status"] == "failed", "feasible"].isna().all()
    # a rerun skips the failure; --retry-failed runs it again and replaces its row (still one row per key)
    again = run_sweep(points, store, processes=1)
    assert (again.already, again.done, again.failed) == (3, 0, 0)
    retry = run_sweep(points, store, processes=1, retry_failed=True)
    assert (retry.already, retry.done, retry.failed) == (2, 0, 1)
    assert len(results_frame(store)) == 3


def test_rerun_computes_only_what_is_missing(tmp_path):
    store = tmp_path / "s.sqlite"
    points = expand_grid({"hardware": ["a100"], "models": ["gpt2"], "policies": ["none", "zero-offload"],
                          "workload": {"global_batch": 8, "seq_len": 256, "micro_batch": [1, 2]}})
    first = run_sweep(points[:3], store, processes=1)
    assert (first.points, first.already, first.done) == (3, 0, 3)
    stored = {r["key"]: r for r in read_results(store)}
    second = run_sweep(points, store, processes=1)
    assert (second.points, second.already, second.done, second.failed) == (4, 3, 1, 0)
    after = {r["key"]: r for r in read_results(store)}
    assert set(after) == {p.key for p in points}
    for key, row in stored.items():  # nothing finished was recomputed or rewritten
        assert after[key] == row


def test_a_key_is_written_once(tmp_path):
    point = {"hardware": "a100", "set": [], "model": "gpt2", "policy": "none", "knobs": {}, "workload": {}}
    done = {"status": "done", "result": {"feasible": True, "verdict": "FEASIBLE", "tokens_per_s": 1.0}, "wall_s": 1}
    failed = {"status": "failed", "result": None, "error": "ValueError: x", "wall_s": 1}
    with SweepStore(tmp_path / "s.sqlite") as st:
        assert st.add("k1", point, done) is True
        assert st.add("k1", point, {**done, "result": {**done["result"], "tokens_per_s": 2.0}}) is False
        assert st.add("k1", point, failed, replace_failed=True) is False  # a done row is never replaced
        assert st.add("k2", point, failed) is True
        assert st.add("k2", point, done) is False
        assert st.add("k2", point, done, replace_failed=True) is True
        assert st.keys() == {"k1", "k2"} and st.keys(["failed"]) == set()
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        rows = db.execute("SELECT key, status, tokens_per_s FROM runs ORDER BY key").fetchall()
    db.close()
    assert rows == [("k1", "done", 1.0), ("k2", "done", 1.0)]


def test_store_errors_are_one_line(tmp_path):
    with pytest.raises(StoreError, match="no such sweep store"):
        read_results(tmp_path / "none.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database, just text " * 100)
    with pytest.raises(StoreError, match="not a sweep store"):
        results_frame(junk)
    with pytest.raises(StoreError, match="not a sweep store"):
        SweepStore(junk)
    with pytest.raises(StoreError, match="does not exist"):
        SweepStore(tmp_path / "no" / "dir.sqlite")


def test_tasks_group_points_of_one_hardware_and_model():
    from planner.sweep.runner import MAX_TASK_POINTS, tasks

    points = expand_grid({"hardware": ["a100", "a100-40g"], "models": ["gpt2", "opt-1.3b"],
                          "policies": {"none": {"stage": [0, 1, 2, 3]}}, "workload": {"micro_batch": [1, 2, 4, 8, 16]}})
    assert len(points) == 80
    for workers, size in ((1, MAX_TASK_POINTS), (2, 10), (20, 1)):
        work = tasks(points, workers)
        assert [key for task in work for key, _ in task] == [p.key for p in points]  # all, once, in order
        assert max(len(t) for t in work) == size
        for task in work:  # one hardware and model per task
            assert len({(i["hardware"], i["model"]) for _, i in task}) == 1


def test_a_task_of_several_points_gives_each_point_its_own_result():
    from planner.sweep.worker import run_point, run_points

    points = expand_grid({"hardware": ["a100"], "models": ["gpt2"], "policies": ["none", "zero-offload"],
                          "workload": {"global_batch": 4, "micro_batch": [1, 3], "seq_len": 256}})
    together = run_points([(p.key, p.inputs) for p in points])
    alone = [run_point(p.key, p.inputs) for p in points]
    assert [o["status"] for o in together] == ["done", "done", "failed", "failed"]
    for a, b in zip(together, alone, strict=True):
        assert a["key"] == b["key"] and a["error"] == b["error"]
        if a["result"] is not None:
            assert without_wall_time(a["result"]) == without_wall_time(b["result"])
