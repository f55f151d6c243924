"""replay.calibrate_dispatch: the host's side of a layer task (per task, per matmul, per other operator)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from replay.calibrate import _median_time  # noqa: E402
from replay.calibrate_dispatch import PROBES, fit_dispatch, measure_dispatch  # noqa: E402

COUNTS = [(8, 59), (16, 118), (15, 57), (7, 11), (14, 22), (13, 19)]


@given(task=st.floats(0, 1e-3), gemm=st.floats(0, 2e-4), op=st.floats(0, 5e-5))
@settings(max_examples=50, deadline=None)
def test_the_fit_recovers_figures_that_explain_the_tasks_exactly(task: float, gemm: float, op: float) -> None:
    pts = [(m, o, task + m * gemm + o * op + 1e-9) for m, o in COUNTS]
    fit = fit_dispatch(pts)
    for m, o, t in pts:
        assert fit.task_s + m * fit.gemm_op_s + o * fit.op_s == pytest.approx(t, rel=1e-6, abs=1e-12)
    assert fit.worst_error < 1e-6
    assert min(fit.task_s, fit.gemm_op_s, fit.op_s) >= 0.0


def test_the_fit_never_goes_negative_and_reports_how_far_off_it_is() -> None:
    # a per-operator cost that falls as tasks grow: the best non-negative fit, and its worst task named
    pts = [(8, 59, 600e-6), (16, 118, 700e-6), (7, 11, 500e-6), (14, 22, 520e-6)]
    fit = fit_dispatch(pts)
    assert min(fit.task_s, fit.gemm_op_s, fit.op_s) >= 0.0
    worst = max(abs(fit.task_s + m * fit.gemm_op_s + o * fit.op_s - t) / t for m, o, t in pts)
    assert fit.worst_error == pytest.approx(worst)
    assert fit.points == tuple(pts)


@pytest.mark.parametrize("pts, why", [
    ([(1, 2, 1e-4), (2, 4, 2e-4)], "at least 3"),
    ([(1, 2, 1e-4), (2, 4, 2e-4), (3, 6, 3e-4)], "tell the three figures apart"),
])
def test_the_fit_refuses_tasks_that_cannot_tell_the_figures_apart(pts: list, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        fit_dispatch(pts)


def test_measured_on_this_machine_as_the_runner_runs_its_tasks() -> None:
    """On the CPU (calibrate uses it on CUDA only): every probe task timed, the counts workloads.ops's."""
    fit, how = measure_dispatch(torch.device("cpu"), "fp32", 3, _median_time)
    assert len(fit.points) == 3 * len(PROBES)
    assert all(t > 0 for _, _, t in fit.points)
    assert min(fit.task_s, fit.gemm_op_s, fit.op_s) >= 0.0
    assert fit.task_s + fit.gemm_op_s + fit.op_s > 0
    # the same counts forward with and without recording, the backward's its own
    assert fit.points[0][:2] == fit.points[1][:2] != fit.points[2][:2]
    assert "functional_call" in how and "non-negative least squares" in how
