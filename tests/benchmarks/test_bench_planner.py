"""Benchmarks of `tiersim plan` (deselected by default; `make bench`).

Targets (issue 5): `tiersim plan --hw a100x8 --model 70b` under 60 s on the 2-core development machine;
a repeated query (warm cache) near-instant; the analytic pruning rejects at least 80% of the candidates
without a simulation. Each benchmark prints wall seconds, candidates, simulations and the pruning ratio.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import pytest

from planner.cache import EvalCache
from planner.search import search
from tiersim.cli import main

pytestmark = pytest.mark.benchmark


@pytest.fixture(autouse=True)
def _time_the_search_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite checks invariants after every simulation (conftest); a benchmark times the search."""
    monkeypatch.setenv("TIERSIM_CHECK_INVARIANTS", "0")


def _plan_70b(cache_dir: Path, workers: int) -> tuple[float, str]:
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "--hw", "a100x8", "--model", "70b", "--cache-dir", str(cache_dir),
                     "--workers", str(workers)])
    assert code == 0
    return time.perf_counter() - t0, out.getvalue()


@pytest.mark.parametrize("workers", [1, 2])
def test_bench_plan_70b_a100x8_cold_then_warm(tmp_path: Path, workers: int) -> None:
    cold, text = _plan_70b(tmp_path, workers)
    warm, again = _plan_70b(tmp_path, workers)
    assert again == text  # byte for byte, from the cache
    counts = next(line for line in text.splitlines() if " candidates: " in line)
    print(f"\nplan --hw a100x8 --model 70b --workers {workers}: cold cache {cold:.1f} s, warm cache {warm:.2f} s "
          f"(target < 60 s); {counts}")


def test_bench_pruning_ratio_70b_a100x8(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    out = search("a100x8", "70b", cache=EvalCache(tmp_path), workers=2)
    wall = time.perf_counter() - t0
    ratio = out.n_pruned / out.n_candidates
    print(f"\n70b/a100x8: {out.n_candidates} candidates, {out.n_simulated} simulated, {out.n_pruned} rejected "
          f"without a simulation ({100 * ratio:.1f}%, target >= 80%); {wall:.1f} s; rejected: {out.rejected}")
    assert out.best is not None and out.best.feasible
    assert ratio >= 0.8
