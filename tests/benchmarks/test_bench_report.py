"""Benchmark (issue 6): the report of `simulate --policy all` on 70b/a100x8 in under 10 s on the 2-core
development machine, timing the report step alone (the simulations run first, untimed)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from policies import POLICIES
from reports.build import ReportInputs, write_report
from tiersim.api import make_job
from tiersim.compare_policies import _one

pytestmark = pytest.mark.benchmark


@pytest.fixture(autouse=True)
def _time_the_report_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERSIM_CHECK_INVARIANTS", "0")


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the figure-rendering workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def test_bench_report_policy_all_70b_a100x8(tmp_path: Path) -> None:
    job, _ = make_job("a100x8", "70b")
    done = [_one(name, job, True, keep=True) for name in POLICIES]  # what `simulate --policy all --report` has
    inputs = ReportInputs(items=[r if r is not None else d for d, r in done], title="every policy, 70b on a100x8")
    t0, c0 = time.perf_counter(), _cpu()
    paths = write_report(tmp_path / "report", inputs)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    figures = sum(1 for p in paths if p.suffix == ".png")
    print(f"\nreport of simulate --policy all, 70b on a100x8: {figures} figures (PNG+SVG+CSV), report.html and "
          f"report.md in {wall:.1f} s wall (target < 10 s), {cpu:.1f} s CPU in this and the rendering processes; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    assert figures == 16 and all(p.stat().st_size > 0 for p in paths)
    assert wall < 10.0
