"""``tiersim --version``, the version in every ``--json`` object and in the sweep store (issue 14 item 4)."""

from __future__ import annotations

import importlib.metadata
import json
import sqlite3
import tomllib
from pathlib import Path

import pytest

from planner.sweep.store import StoreError, SweepStore
from planner.version import tiersim_version
from tiersim.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        expected = importlib.metadata.version("tiersim")
    except importlib.metadata.PackageNotFoundError:
        expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tiersim {expected}\n" and tiersim_version() == expected


def test_json_results_carry_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hw", "a100", "--model", "gpt2", "--policy", "none", "--seq-len", "128",
                 "--global-batch", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiersim_version"] == tiersim_version()


def test_a_store_filled_by_another_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    with SweepStore(path) as st:
        st.add("k1", {"hardware": "a100", "model": "gpt2", "policy": "none", "knobs": {}, "workload": {}},
               {"status": "failed", "error": "x"})
    with SweepStore(path):  # the same version: reused
        pass
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '0.0.1' WHERE name = 'tiersim_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="filled by tiersim 0.0.1"):
        SweepStore(path)
    db = sqlite3.connect(path)
    db.execute("DELETE FROM meta WHERE name = 'tiersim_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="did not record its version"):
        SweepStore(path)
