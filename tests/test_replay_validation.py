"""The replay validation suite's quick mode: two tiny cases run end to end and give a complete table.

No accuracy assertion here (timings on a shared CI machine are not a unit test); the full suite is
``python -m replay.validation`` (see README).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from replay import validation  # noqa: E402


def test_quick_mode_prints_a_complete_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "table.md"
    js = tmp_path / "rows.json"
    assert validation.main(["--quick", "--out", str(out), "--json", str(js),
                            "--cache-dir", str(tmp_path / "cache")]) == 0
    text = capsys.readouterr().out
    assert out.read_text().strip() == text.strip()
    header = next(line for line in text.splitlines() if line.startswith("| case"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == validation.HEADER
    for want in ("sim step ms", "meas step ms", "step err", "gpu0 sim MB", "gpu0 meas MB", "gpu0 err",
                 "cpu err", "nvme err"):
        assert want in cols
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert [r.split("|")[1].strip() for r in rows] == [c.name for c in validation.QUICK_CASES]
    assert "median |step error|" in text and "max |step error|" in text and "max |peak error|" in text


def test_quick_rows_have_finite_errors(tmp_path: Path) -> None:
    rows, hw, wall = validation.run(validation.QUICK_CASES, quick=True, steps=2, cache_dir=str(tmp_path))
    assert len(rows) == 2 and wall > 0 and hw.gpu.count == 1
    for r in rows:
        assert r.sim_step > 0 and r.meas_step > 0
        assert math.isfinite(r.step_error)
        assert r.sim_peak["gpu0"] > 0
        for p in validation.POOLS:
            e = r.peak_error(p)
            assert e is None or math.isfinite(e)
    offload = rows[1]
    assert offload.case.policy == "zero-offload" and offload.budget is not None
    assert offload.sim_peak["cpu"] > 0  # the small budget really made it offload
    s = validation.summary(rows)
    assert math.isfinite(s["median_abs_step_error"]) and math.isfinite(s["max_abs_step_error"])
    assert set(s) >= {"median_ok", "max_ok", "peak_ok"}


def test_full_suite_covers_the_issue() -> None:
    cases = validation.FULL_CASES
    assert len(cases) >= 8
    assert {c.policy for c in cases} == {"none", "zero-offload", "zero-infinity", "tinypipe", "lazytrain",
                                         "synergyscale"}
    assert len({c.model.name for c in cases}) >= 2
    assert any("param_device=nvme" in c.knobs and "optimizer_device=nvme" in c.knobs for c in cases)
    assert all(c.offload for c in cases if c.policy != "none")


def test_a_case_applies_its_policys_replay_knobs_and_its_own_win() -> None:
    from policies import get_policy
    from replay.validation import SMALL, Case

    pinned = get_policy("zero-infinity").replay_knobs
    assert "tile_factor=1" in pinned
    case = Case("z", "zero-infinity", SMALL, ("tile_factor=2",))
    assert case.all_knobs == (*pinned, "tile_factor=2")
    assert get_policy("synergyscale").replay_knobs == ()  # chunks, streams and split optimizers replay
    assert Case("n", "none", SMALL).all_knobs == ()


def test_heldout_matrix_covers_issue_12() -> None:
    """At least 24 held-out cases: the gpt2 preset at its default workload, GPT- and LLaMA-style models over the
    issue's ranges, every policy, 16-bit precisions; none of them is a tuned case."""
    from replay.validation import FULL_CASES, HELDOUT_CASES, TWO_RANK_CASES

    cases = HELDOUT_CASES
    assert len(cases) >= 24
    assert {c.policy for c in cases} == {c.policy for c in FULL_CASES}
    gpt2 = [c for c in cases if c.model.preset == "gpt2"]
    assert gpt2 and all(c.seq_len == 1024 and c.precision == "bf16" and c.micro_batch == 1 for c in gpt2)
    custom = [c for c in cases if c.model.preset is None]
    assert {c.model.mlp for c in custom} == {"gelu", "swiglu"}
    assert min(c.model.hidden for c in custom) == 256 and max(c.model.hidden for c in custom) == 2048
    assert min(c.seq_len for c in cases) == 128 and max(c.seq_len for c in cases) == 1024
    assert min(c.model.vocab for c in cases) <= 1024 and max(c.model.vocab for c in cases) >= 50_000
    assert {"fp32", "bf16", "fp16"} <= {c.precision for c in cases}
    tuned = {(c.model, c.seq_len) for c in FULL_CASES}
    assert not tuned & {(c.model, c.seq_len) for c in cases}
    assert len({c.name for c in cases}) == len(cases)
    assert TWO_RANK_CASES and all(c.gpus == 2 for c in TWO_RANK_CASES)


def test_a_16_bit_case_and_a_2_rank_case_run_as_rows(tmp_path: Path) -> None:
    """A bf16 case is planned, simulated on the bf16-calibrated spec and replayed in bf16; a 2-rank case is
    replayed as two processes on the 2-rank spec (what the ranks share measured on top), in its own set; the
    held-out synergyscale case at seq 1024 plans (it was infeasible at every budget)."""
    from replay.validation import TINY, Case

    bf16 = Case("tiny-bf16", "zero-offload", TINY, seq_len=32, micro_batch=1, global_batch=2, precision="bf16")
    two = Case("tiny-2r", "none", TINY, seq_len=32, micro_batch=1, global_batch=2, offload=False, gpus=2)
    rows, hw, _ = validation.run([bf16, two], quick=True, steps=2, cache_dir=str(tmp_path))
    assert rows[0].case.precision == "bf16" and math.isfinite(rows[0].step_error) and rows[0].sim_step > 0
    assert math.isfinite(rows[1].step_error), rows[1].note
    assert rows[1].case.gpus == 2 and rows[1].sim_peak["gpu0"] > 0 and rows[1].meas_peak["gpu0"] > 0
    syn = next(c for c in validation.HELDOUT_CASES if c.name == "gpt-h384-synergy")
    plan, _, sim, budget, _ = next(validation.candidates(hw, validation._model_file(syn.model, tmp_path), syn))
    assert sim.feasible and budget is not None and plan.policy == "synergyscale"
    s = validation.summary(rows, validation.HELDOUT_MAX_TARGET)
    assert s["ran"] == sum(math.isfinite(r.step_error) for r in rows) and s["max_target"] == 0.35
    text = validation.report(rows, hw, 1.0, [("tuned", rows[:1], 0.30), ("heldout", rows[1:], 0.35)])
    assert "## tuned: 1 plans" in text and "## heldout: 1 plans" in text and "load average" in text


@pytest.mark.parametrize("argv", [["--only", "no-such-case"], ["--steps", "1"], ["--set", "nope"]])
def test_bad_validation_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        validation.main(argv)
    assert e.value.code == 2
