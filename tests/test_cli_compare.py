"""`simulate --policy all`: every registered policy on one job, infeasible ones as verdicts."""

from __future__ import annotations

import json

import pytest

from policies import POLICIES
from reports.units import group_numbered
from tiersim.cli import simulate_main


def test_policy_all_prints_one_row_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate_main(["--policy", "all", "--hw", "a100", "--model", "gpt2", "--seq-len", "1024"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    for name in POLICIES:
        assert any(line.startswith(name + " ") for line in lines), name


def test_policy_all_json_lists_every_policy_and_infeasible_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate_main(["--policy", "all", "--hw", "a100-40g", "--model", "13b", "--seq-len", "1024",
                          "--global-batch", "1", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in d["results"]] == list(POLICIES)
    none = next(r for r in d["results"] if r["policy"] == "none")
    assert none["feasible"] is False and none["oom"]["pool"] == "gpu0" and none["oom"]["over_by_bytes"] > 0
    assert code == (0 if any(r["feasible"] for r in d["results"]) else 3)


def test_policy_all_rejects_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--policy", "all", "--hw", "a100", "--model", "gpt2", "--knob", "stage=1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--knob" in err


def test_identical_numbered_rows_are_grouped() -> None:
    rows = [["gpu0", "1"], ["gpu1", "1"], ["gpu2", "2"], ["cpu", "3"], ["sw0.uplink", "4"], ["sw1.uplink", "4"]]
    assert group_numbered(rows) == [["gpu0-1 (each)", "1"], ["gpu2", "2"], ["cpu", "3"],
                                    ["sw0-1.uplink (each)", "4"]]
