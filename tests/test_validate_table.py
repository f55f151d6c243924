"""The held-out llm-foundry table (tiersim/validate_table.py, `tiersim validate --llm-foundry`)."""

from __future__ import annotations

import json

import pytest

import tiersim.validate_table as vt
from tiersim.cli import main
from tiersim.validate_runs import foundry_run


def test_the_packaged_table_is_the_published_rows_with_their_provenance() -> None:
    rows = vt.load_rows()
    assert len(rows) == 156
    assert {(r.table, r.gpu) for r in rows} == {("2023-10", "a100_80gb"), ("2023-10", "h100_80gb"),
                                                ("2023-05", "a100_80gb")}
    # the eight rows `tiersim validate` compares that come from these tables (the A100-40GB one does not)
    assert sum(r.in_validate for r in rows) == 7
    # what tiersim.foundry_fit fitted the A100 and H100 compute figures to, and what it held out
    roles = [(r.role, r.table, r.gpu) for r in rows]
    assert roles.count(("fitted", "2023-10", "a100_80gb")) == 55
    assert roles.count(("fitted", "2023-10", "h100_80gb")) == 18
    assert roles.count(("held out", "2023-05", "a100_80gb")) == 60
    assert roles.count(("held out", "2023-10", "h100_80gb")) == 16
    assert all(0 < r.mfu <= r.hfu < 1 and (r.hfu > r.mfu) == r.checkpointing for r in rows)


def test_every_row_reproduces_its_published_parameter_count() -> None:
    """The MPT shapes (tiersim.validate_runs.MPT_SHAPES) give each row's NumParams exactly (the learned
    positions follow its sequence length)."""
    for r in vt.load_rows():
        run = foundry_run(r.model, r.num_params, r.gpu, r.seq_len, r.micro_batch, r.grad_accum, r.checkpointing,
                          r.mfu, r.hfu)
        assert run.model.params() == r.num_params, r.label


def test_early_stop_follows_the_tables_software_stack() -> None:
    rows = [r for r in vt.load_rows() if r.checkpointing and r.model == "30b" and r.seq_len == 2048]
    assert {r.table for r in rows} == {"2023-10", "2023-05"}
    runs = {r.table: foundry_run(r.model, r.num_params, r.gpu, r.seq_len, r.micro_batch, r.grad_accum, True, r.mfu,
                                 r.hfu, torch_2_1=r.table in vt.TORCH_2_1_TABLES) for r in rows if r.gpu == "a100_80gb"}
    assert runs["2023-10"].early_stop and not runs["2023-05"].early_stop


def test_cli_prints_rows_and_groups(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    rows = vt.load_rows()
    some = [rows[0], next(r for r in rows if r.in_validate), next(r for r in rows if r.table == "2023-05")]
    monkeypatch.setattr("tiersim.commands.validate.load_rows", lambda: some)
    assert main(["validate", "--llm-foundry"]) == 0
    out = capsys.readouterr().out
    assert some[0].label in out and "held out" in out and "validate" in out and "median error" in out
    assert main(["validate", "--llm-foundry", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["row"] for r in d["rows"]] == [r.label for r in some]
    assert [r["role"] for r in d["rows"]] == ["held out", "validate", "held out"]
    assert all(r["fits"] and abs(r["error"]) < 1 for r in d["rows"])
    assert {g["group"] for g in d["groups"]} >= {"in tiersim validate"}
    o = vt.simulate_rows(some[1:2])[0]
    assert o.error == pytest.approx(o.simulated_mfu / o.row.mfu - 1)
