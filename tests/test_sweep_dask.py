"""Sweeps on a real dask.distributed LocalCluster (loopback, two worker processes) and interrupted clients.

- a worker killed mid-way: Dask reruns its tasks elsewhere and every point is stored exactly once;
- a client interrupted (Ctrl-C) and killed (SIGKILL) mid-way: the rerun computes only what is missing;
- the local process pool, a Dask cluster and a serial run store identical results.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from planner.sweep import expand_grid, read_results, run_sweep
from planner.sweep.runner import local_cluster

distributed = pytest.importorskip("distributed")

# 8 quick points (gpt2 on one A100, about 0.1 s each): 4 policies x 2 micro-batches
GRID = {"hardware": ["a100"], "models": ["gpt2"], "policies": ["none", "zero-offload", "zero-infinity", "tinypipe"],
        "workload": {"global_batch": 8, "micro_batch": [1, 2], "seq_len": 256}}
ROOT = Path(__file__).resolve().parent.parent


def stored_rows(store: Path) -> list[tuple[str, str]]:
    """(key, status) of every row, read as another process would (read-only, while the sweep writes)."""
    if not store.exists():
        return []
    db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return db.execute("SELECT key, status FROM runs").fetchall()
    except sqlite3.OperationalError:  # the table is being created
        return []
    finally:
        db.close()


def comparable(rows):
    out = []
    for r in rows:
        r = json.loads(json.dumps(r))
        r["sim"].pop("wall_s")
        out.append(r)
    return out


def test_killed_worker_mid_way_every_point_completes_exactly_once(tmp_path):
    points = expand_grid(GRID)
    store = tmp_path / "s.sqlite"
    at_kill: list[int] = []
    with local_cluster(2) as cluster, distributed.Client(cluster) as client:
        pids = client.run(os.getpid)  # worker address -> pid of its process
        victim = pids[sorted(pids)[0]]

        def kill_after_two_rows() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                n = len(stored_rows(store))
                if n >= 2:
                    os.kill(victim, signal.SIGKILL)
                    at_kill.append(n)
                    return
                time.sleep(0.01)

        killer = threading.Thread(target=kill_after_two_rows)
        killer.start()
        summary = run_sweep(points, store, scheduler=cluster.scheduler_address)
        killer.join()
        assert victim not in client.run(os.getpid).values()  # the worker did die (its nanny started another)
    assert at_kill and at_kill[0] < len(points), "the worker must die mid-way"
    rows = stored_rows(store)
    assert sorted(k for k, _ in rows) == sorted(p.key for p in points)  # each point once, none lost
    assert {s for _, s in rows} == {"done"}
    assert (summary.done, summary.failed, summary.already) == (len(points), 0, 0)


def _start_sweep(grid_file: Path, store: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tiersim", "sweep", str(grid_file), "--store", str(store), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(proc: subprocess.Popen, store: Path, n: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        have = len(stored_rows(store))
        if have >= n:
            return have
        time.sleep(0.01)
    raise AssertionError(f"the sweep stored fewer than {n} rows (exit {proc.poll()})")


def test_interrupted_and_killed_client_resume_where_they_stopped(tmp_path):
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    store = tmp_path / "s.sqlite"
    points = expand_grid(GRID)

    proc = _start_sweep(grid_file, store)  # the local process pool; Ctrl-C after two results
    _wait_for_rows(proc, store, 2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command again" in err and "Traceback" not in err
    after_sigint = stored_rows(store)
    assert 2 <= len(after_sigint) < len(points)

    proc = _start_sweep(grid_file, store, "--processes", "1")  # killed outright after two more results
    _wait_for_rows(proc, store, len(after_sigint) + 2)
    proc.kill()
    proc.communicate(timeout=60)
    after_kill = stored_rows(store)
    assert set(after_sigint) < set(after_kill) and len(after_kill) < len(points)

    before = {r["key"]: r for r in read_results(store)}
    summary = run_sweep(points, store, processes=1)
    assert (summary.already, summary.done, summary.failed) == (len(after_kill), len(points) - len(after_kill), 0)
    rows = stored_rows(store)
    assert sorted(k for k, _ in rows) == sorted(p.key for p in points)
    after = {r["key"]: r for r in read_results(store)}
    assert all(after[k] == r for k, r in before.items())  # nothing that finished was recomputed


def test_pool_dask_and_serial_sweeps_store_identical_results(tmp_path):
    points = expand_grid(GRID)
    runs = {}
    for name, how in (("serial", {"processes": 1}), ("pool", {"processes": 2}), ("dask", {"workers": 2})):
        store = tmp_path / f"{name}.sqlite"
        summary = run_sweep(points, store, **how)
        assert (summary.done, summary.failed) == (len(points), 0)
        runs[name] = comparable(read_results(store))
    assert len(runs["serial"]) == len(points)
    assert runs["pool"] == runs["serial"]
    assert runs["dask"] == runs["serial"]


def test_missing_dask_is_one_clear_line(tmp_path, monkeypatch):
    from planner.sweep import SweepSetupError
    from planner.sweep.runner import DASK_MISSING

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(SweepSetupError) as e:
        run_sweep(expand_grid(GRID)[:1], tmp_path / "s.sqlite", workers=2)
    assert str(e.value) == DASK_MISSING and "pip install -e '.[dask]'" in DASK_MISSING
