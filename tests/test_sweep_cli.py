"""`tiersim sweep` and `tiersim results` on the command line (serial runs, small gpt2 points)."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from tiersim.cli import main

GRID = {"hardware": ["a100"], "models": ["gpt2", "llama2-7b"], "policies": ["none"],
        "workload": {"global_batch": 4, "micro_batch": [1, 3], "seq_len": 256}}
# gpt2 mb 1 feasible; llama2-7b mb 1 infeasible (the policy's verdict); mb 3 does not divide 4: two failures


@pytest.fixture
def grid_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return path


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_sweep_then_results(grid_file, tmp_path, capsys):
    assert main(["sweep", str(grid_file), "--processes", "1"]) == 1  # two points fail
    out = capsys.readouterr().out
    assert "4 points, 0 already stored; this run: 2 done, 2 failed" in out and "-> grid.sqlite" in out
    assert out.count("  failed: --hw a100 --model ") == 2 and "--micro-batch 3" in out
    assert (tmp_path / "grid.sqlite").is_file()  # the default store: SWEEP.sqlite in the current directory

    assert main(["sweep", str(grid_file), "--processes", "1", "--json"]) == 1  # nothing left to run
    summary = json.loads(capsys.readouterr().out)
    assert (summary["kind"], summary["points"], summary["already"], summary["done"]) == ("tiersim.sweep", 4, 4, 0)
    assert [f["error"].split(":")[0] for f in summary["failures"]] == ["KnobError", "KnobError"]

    assert main(["results", "grid.sqlite"]) == 0
    out = capsys.readouterr().out
    assert "grid.sqlite: 4 runs (2 done, 2 failed)" in out
    assert "feasible" in out and "OOM gpu0" in out and "FAILED" in out and "not a multiple" in out

    assert main(["results", "grid.sqlite", "--where", "feasible", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["model"], r["micro_batch"], r["feasible"]) for r in rows] == [("gpt2", 1, True)]
    assert rows[0]["tokens_per_s"] > 0

    assert main(["results", "grid.sqlite", "--status", "done", "--where", "model == 'llama2-7b'",
                 "--csv", "out.csv"]) == 0
    assert capsys.readouterr().out.strip() == "1 run written to out.csv"
    with open(tmp_path / "out.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["model"], row["feasible"], row["oom_pool"], row["tokens_per_s"]) == ("llama2-7b", "False", "gpu0", "")


@pytest.mark.parametrize(("argv", "words"), [
    (["sweep", "missing.yaml"], ["missing.yaml", "cannot read"]),
    (["sweep", "grid.yaml", "--processes", "0"], ["--processes 0", "positive"]),
    (["sweep", "grid.yaml", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], ["not allowed with"]),
    (["sweep", "grid.yaml", "--store", "no/such/dir/s.sqlite"], ["does not exist"]),
    (["results", "nothing.sqlite"], ["no such sweep store"]),
    (["results", "grid.yaml"], ["not a sweep store"]),
])
def test_bad_input_is_one_line_and_exit_2(grid_file, capsys, argv, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    for w in words:
        assert w in line
    assert captured.out == ""


def test_bad_where_names_the_columns(grid_file, capsys):
    assert main(["sweep", str(grid_file), "--processes", "1"]) == 1
    capsys.readouterr()
    assert main(["results", "grid.sqlite", "--where", "speed > 3"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--where 'speed > 3'" in line and "tokens_per_s" in line
    assert main(["results", "grid.sqlite", "--where", "model ==="]) == 2
    one_error_line(capsys.readouterr().err)


def test_bad_sweep_file_is_one_line(grid_file, capsys):
    grid_file.write_text(yaml.safe_dump({**GRID, "policies": {"none": {"stage": 9}}}))
    assert main(["sweep", str(grid_file)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "grid.yaml: policies.none" in line and "stage" in line
