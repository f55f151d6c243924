"""Training coverage (planner.coverage, tiersim coverage): cells are per-cell searches; format; bad input."""

from __future__ import annotations

import json

import pytest

from planner.coverage import coverage
from planner.job import JobRequest
from planner.search import search
from tiersim.cli import main

SMALL = JobRequest(global_batch=4, seq_len=512)
SMALL_FLAGS = ["--global-batch", "4", "--seq-len", "512"]
SET = ["gpu.memory=8GB"]  # opt-1.3b does not fit on an 8 GB GPU without offloading; gpt2 does


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The commands cache evaluations on disk by default: keep this suite's cache out of the home directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_cells_match_per_cell_searches() -> None:
    models, policies = ["gpt2", "opt-1.3b"], ["none", "zero-offload"]
    out = coverage("a100", models, policies=policies, request=SMALL, hw_overrides=SET)
    assert [(c.policy, c.model.name) for c in out.cells] == [(p, m) for p in policies for m in models]
    for c in out.cells:
        alone = search("a100", c.model.name, request=SMALL, hw_overrides=SET, policies=[c.policy])
        if alone.best is None:
            assert not c.best.feasible
        else:
            assert c.best.feasible and c.best.policy == c.policy
            assert (c.best.knobs, c.best.micro_batch, c.best.checkpointing, c.best.tokens_per_s) == (
                alone.best.knobs, alone.best.micro_batch, alone.best.checkpointing, alone.best.tokens_per_s)
    assert out.cell("none", "opt-1.3b").best.feasible is False
    assert out.cell("none", "opt-1.3b").best.binding == "gpu0"
    assert out.cell("zero-offload", "opt-1.3b").best.feasible is True
    assert out.cell("none", "gpt2").best.feasible is True


def test_cli_json_format_and_reproducible(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["coverage", "--hw", "a100", "--set", SET[0], "--models", "gpt2,opt-1.3b", "--policies", "none",
            *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    d = json.loads(first)
    assert d["kind"] == "tiersim.coverage" and d["hardware"] == "a100"
    assert [(r["policy"], r["model"]) for r in d["rows"]] == [("none", "gpt2"), ("none", "opt-1.3b")]
    for r in d["rows"]:
        assert set(r) >= {"policy", "model", "params", "feasible", "tokens_per_s", "tflops_per_gpu", "binding",
                          "knobs"}
    gpt2, opt = d["rows"]
    assert gpt2["feasible"] and gpt2["tokens_per_s"] > 0 and gpt2["binding"] is None and gpt2["params"] == 124439808
    assert not opt["feasible"] and opt["tokens_per_s"] is None and opt["binding"] == "gpu0"
    assert main(argv) == 0
    assert capsys.readouterr().out == first


def test_cli_table_shows_throughput_or_the_binding_pool(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["coverage", "--hw", "a100", "--set", SET[0], "--models", "gpt2,opt-1.3b", "--policies", "none",
            *SMALL_FLAGS]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "no: gpu0" in out and "1 of 2 cells feasible" in out


def test_nothing_feasible_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["coverage", "--hw", "a100", "--set", SET[0], "--models", "opt-1.3b", "--policies", "none", *SMALL_FLAGS]
    assert main(argv) == 3
    assert "no: gpu0" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "needle"), [
    (["--models", "gpt2,,7b"], "--models"),
    (["--models", "gpt2,gpt2"], "--models"),
    (["--models", "gpt5"], "gpt5"),
    (["--models", "gpt2", "--policies", "fastest"], "--policies"),
    (["--models", "gpt2", "--budget", "soon"], "--budget"),
    (["--models", "gpt2", "--total-budget", "soon"], "--total-budget"),
    (["--models", "gpt2", "--workers", "0"], "--workers"),
    (["--models", "gpt2", "--set", "host.dramx=1TB"], "host.dramx"),
])
def test_bad_input_is_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coverage", "--hw", "a100", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_progress_goes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["coverage", "--hw", "a100", "--models", "gpt2", "--policies", "none,zero-offload", *SMALL_FLAGS, "--json"]
    assert main(argv) == 0
    quiet = capsys.readouterr()
    assert main([*argv, "--progress"]) == 0
    loud = capsys.readouterr()
    assert loud.out == quiet.out
    assert "[1/2] none x gpt2:" in loud.err and "[2/2] zero-offload x gpt2:" in loud.err
    assert " x gpt2" not in quiet.err


def test_bounded_cells_settle_the_verdict_first() -> None:
    models, policies = ["gpt2", "opt-1.3b"], ["none", "zero-offload"]
    free = coverage("a100", models, policies=policies, request=SMALL, hw_overrides=SET)
    roomy = coverage("a100", models, policies=policies, request=SMALL, hw_overrides=SET, max_candidates=1000)
    assert [c.best for c in roomy.cells] == [c.best for c in free.cells]  # bounds never reached: same answers
    tight = coverage("a100", models, policies=policies, request=SMALL, hw_overrides=SET, max_candidates=1)
    verdicts = set()
    for f, t in zip(free.cells, tight.cells, strict=True):
        if t.best.feasible:  # one simulation cannot promise the best throughput, and the cell says so
            assert f.best.feasible and t.best.tokens_per_s <= f.best.tokens_per_s * (1 + 1e-12)
            assert t.best.cut_short or t.best == f.best
            verdicts.add("feasible")
        elif t.best.binding == "budget":  # not settled within one simulation: said, never passed off as a pool
            assert t.best.cut_short and "max candidates" in t.best.cut_short
            verdicts.add("budget")
        else:  # proven without simulating more than allowed
            assert not f.best.feasible and t.best.binding == f.best.binding
            verdicts.add("infeasible")
    assert verdicts >= {"feasible", "infeasible"}


def test_cells_searched_in_parallel_give_the_serial_answers() -> None:
    """workers > 1 searches the cells in worker processes (planner.whatif.best_within_each): the same matrix, in
    the same order, as the serial loop."""
    models, policies = ["gpt2", "opt-1.3b"], ["none", "zero-offload"]
    serial = coverage("a100", models, policies=policies, request=SMALL, hw_overrides=SET)
    lines: list[str] = []
    parallel = coverage("a100", models, policies=policies, request=SMALL, hw_overrides=SET, workers=2,
                        progress=lines.append)
    assert parallel.to_dict() == serial.to_dict()
    assert sorted(ln.split("]")[0] for ln in lines) == [f"[{i}/4" for i in range(1, 5)]
