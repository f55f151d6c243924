"""Benchmark (deselected by default; `make bench`): `tiersim max-model` on the issue's example.

Target (issue 5): `max-model --hw a100 --policy synergyscale --shape gpt --hidden 8192` under 60 s on the
2-core development machine. Prints the wall time, the answer and the number of feasibility checks.
"""

from __future__ import annotations

import time

import pytest

from planner.maxmodel import max_model, shape_scaler

pytestmark = pytest.mark.benchmark


@pytest.fixture(autouse=True)
def _time_the_search_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite checks invariants after every simulation (conftest); a benchmark times the planner."""
    monkeypatch.setenv("TIERSIM_CHECK_INVARIANTS", "0")


def test_bench_max_model_synergyscale_gpt_8192_a100() -> None:
    t0 = time.perf_counter()
    out = max_model("a100", shape_scaler("gpt", 8192), "synergyscale")
    wall = time.perf_counter() - t0
    assert out.largest is not None and out.first_infeasible is not None
    print(f"\nmax-model --hw a100 --policy synergyscale --shape gpt --hidden 8192: {wall:.1f} s wall (target < 60 s); "
          f"largest {out.largest.model.n_layers} layers ({out.largest.model.params() / 1e9:.2f}B), "
          f"binding one layer more: {out.binding}; {len(out.checks)} checks")
    assert out.first_infeasible.n == out.largest.n + 1
    assert wall < 60
