"""Stores, caches and what a sweep opens, against hostile and broken files (issue 17).

- ``--store`` pointed at another application's SQLite database (with or without its own ``runs``
  table), at a file that is not SQLite, or at a store of another schema: one line, exit 2, and the file
  byte-identical (by hash), with no journal beside it; ``tiersim results`` and ``tiersim report`` alike.
- A store that cannot be written: one line naming the path.
- Corrupted evaluation-cache entries: ignored, evaluated again, overwritten, one warning line.
- Permissions: new stores 0o600, cache directories 0o700 and entries 0o600.
- A local Dask cluster listens on 127.0.0.1 only, on exactly the addresses it names, and no HTTP.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import stat
import time
from pathlib import Path

import pytest
import yaml

from planner.sweep.store import SCHEMA_VERSION, StoreError, SweepStore
from tiersim.cli import main

GRID = {"hardware": ["a100"], "models": ["gpt2"], "policies": ["none"],
        "workload": {"global_batch": 4, "micro_batch": 1, "seq_len": 256}}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return path


def _sqlite(path: Path, script: str) -> Path:
    db = sqlite3.connect(path)
    db.executescript(script)
    db.commit()
    db.close()
    return path


def foreign_files(d: Path) -> dict[str, Path]:
    other_schema = d / "schema_other.sqlite"
    with SweepStore(other_schema):
        pass
    _sqlite(other_schema, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE name = 'schema';")
    return {
        "another app": _sqlite(d / "app.db", "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
                                             "INSERT INTO users VALUES (1, 'ada');"),
        "its own runs table": _sqlite(d / "runs.db", "CREATE TABLE runs (key TEXT PRIMARY KEY, what TEXT);"
                                                     "INSERT INTO runs VALUES ('a', 'theirs');"),
        "runs and meta but not ours": _sqlite(d / "meta.db", "CREATE TABLE runs (key TEXT, status TEXT);"
                                                             "CREATE TABLE meta (name TEXT, value TEXT);"
                                                             "INSERT INTO meta VALUES ('owner', 'x');"),
        "another application's meta row": _sqlite(
            d / "claimed.db", "CREATE TABLE runs (key TEXT); CREATE TABLE meta (name TEXT, value TEXT);"
                              "INSERT INTO meta VALUES ('schema', '1'), ('application', 'acme.jobs');"),
        "not SQLite": (d / "notes.txt"),
        "a store of another schema": other_schema,
    }


@pytest.mark.parametrize("which", ["another app", "its own runs table", "runs and meta but not ours",
                                   "another application's meta row", "not SQLite", "a store of another schema"])
def test_a_store_that_is_not_ours_is_refused_and_left_unchanged(grid: Path, tmp_path: Path, which: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("my notes\n")
    path = foreign_files(tmp_path)[which]
    before = digest(path)
    siblings = sorted(p.name for p in tmp_path.iterdir())
    for argv in (["sweep", str(grid), "--store", str(path), "--processes", "1"],
                 ["results", str(path)],
                 ["report", str(path), "-o", str(tmp_path / "report")]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        line = one_line(err)
        assert str(path) in line and ("not a" in line or "unknown kind" in line), line
        assert out == ""
        assert digest(path) == before, argv
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "report") == siblings  # no -wal, -shm, -journal


def test_new_stores_are_private_and_empty_files_are_adopted(tmp_path: Path) -> None:
    with SweepStore(tmp_path / "new.sqlite"):
        pass
    assert stat.S_IMODE((tmp_path / "new.sqlite").stat().st_mode) == 0o600
    (tmp_path / "empty.sqlite").touch()  # e.g. from mktemp: nothing in it to damage
    with SweepStore(tmp_path / "empty.sqlite") as s:
        assert s.keys() == set()
    with SweepStore(tmp_path / "empty.sqlite") as s:  # and it is a store now
        assert s.keys() == set()


def test_a_read_only_store_is_one_line_naming_the_path(grid: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ro.sqlite"
    with SweepStore(path):
        pass
    path.chmod(0o444)
    if os.geteuid() == 0:  # root writes read-only files: make access() answer as it does for anyone else
        real = os.access
        monkeypatch.setattr("planner.sweep.store.os.access",
                            lambda p, mode: False if Path(p) == path and mode == os.W_OK else real(p, mode))
    before = digest(path)
    assert main(["sweep", str(grid), "--store", str(path), "--processes", "1"]) == 2
    out, err = capsys.readouterr()
    line = one_line(err)
    assert str(path) in line and "read-only" in line and out == ""
    assert digest(path) == before


def test_a_write_that_fails_mid_way_names_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    with SweepStore(path) as s:
        s._db.execute("PRAGMA query_only = 1")  # any later write fails inside SQLite, as on a full disk
        with pytest.raises(StoreError) as err:
            s.add("k", {"hardware": "a100", "model": "gpt2", "policy": "none"},
                  {"status": "failed", "error": "x"})
    assert str(path) in str(err.value) and "cannot write" in str(err.value)


# -- the evaluation cache ---------------------------------------------------------------------------------
PLAN = ["plan", "--hw", "a100", "--model", "gpt2", "--policies", "none", "--seq-len", "256",
        "--global-batch", "4", "--json"]


def _corrupt(files: list[Path]) -> None:
    ways = [
        lambda d: {k: v for k, v in d.items() if k != "verdict"},  # KeyError 'verdict' once
        lambda d: {**d, "bound_time_s": "fast"},
        lambda d: {**d, "verdict": 5},
        lambda d: {**d, "verdict": "maybe"},
        lambda d: [1, 2],
        lambda d: {**d, "sim": {"feasible": True}},
        lambda d: {**d, "capacity_bytes": {"gpu0": "lots"}},
        lambda d: {**d, "n_gpus": 1.5},
    ]
    for i, f in enumerate(files):
        if i % 10 == 9:
            f.write_bytes(b"\xff\xfe not utf-8")
        elif i % 10 == 8:
            f.write_text('{"verdict": "bounded",')
        else:
            f.write_text(json.dumps(ways[i % 10 % len(ways)](json.loads(f.read_text()))))


def test_corrupt_cache_entries_are_recomputed_with_one_warning(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    argv = [*PLAN, "--cache-dir", str(cache)]
    assert main(argv) == 0
    clean, err = capsys.readouterr()
    assert "warning" not in err
    files = sorted(cache.rglob("*.json"))
    assert len(files) > 10
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.parent.stat().st_mode) == 0o700 for f in files)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    _corrupt(files)
    assert main(argv) == 0
    out, err = capsys.readouterr()
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "corrupt evaluation cache entry" in warnings[0], err
    assert "Traceback" not in err

    def best(text: str) -> object:
        d = json.loads(text)
        return d["best"]

    assert best(out) == best(clean)
    assert main(argv) == 0  # the entries were rewritten: no warning, every entry a hit
    _, err = capsys.readouterr()
    assert "warning" not in err


# -- what a local Dask sweep opens -------------------------------------------------------------------------
def test_a_local_dask_cluster_listens_on_loopback_only_and_serves_no_http() -> None:
    pytest.importorskip("distributed")
    import socket

    import distributed
    import psutil

    from planner.sweep.runner import close_http, local_cluster

    def listening() -> set[tuple[str, int]]:
        me = psutil.Process()
        out = set()
        for p in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                out |= {(c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                        if c.status == psutil.CONN_LISTEN}
        return out

    before = listening()
    with local_cluster(1) as cluster, distributed.Client(cluster) as client:
        named = close_http(client)
        assert len(named) == 3  # the scheduler, one worker, its nanny
        assert sorted(a.split()[0] for a in named) == ["nanny", "scheduler", "worker"]
        expected = {(a.split("//")[1].rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in named}
        deadline = time.monotonic() + 15  # the HTTP servers stop asynchronously: slow on a loaded machine
        while (now := listening() - before) != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert now == expected
        assert all(ip == "127.0.0.1" for ip, _ in now)
        with socket.socket() as s:  # dask's default HTTP port answers nothing of ours
            s.settimeout(2)
            assert s.connect_ex(("127.0.0.1", 8787)) != 0 or (("127.0.0.1", 8787) in before)
