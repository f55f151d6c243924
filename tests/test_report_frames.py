"""The data behind every report figure (the CSV) checked against the Result or document it came from."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.result_json import infeasible_json
from reports import frames
from simulator import Result
from simulator.result import union
from tiersim.api import JobRequest, make_job, make_plan


@pytest.fixture(scope="module")
def job():  # noqa: ANN201
    return make_job("a100", "gpt2", JobRequest(global_batch=4))[0]


@pytest.fixture(scope="module", params=["zero-offload", "zero-infinity"])
def result(request: pytest.FixtureRequest, job) -> Result:  # noqa: ANN001
    from simulator import simulate_plan

    return simulate_plan(make_plan(job, request.param), job.hw, extrapolate=False)


def whole_run(r: Result) -> Result:
    """The same Result with its window stretched over the whole simulated run."""
    return dataclasses.replace(r, window=(0.0, max(x.end for x in r.records)))


def test_memory_frame_over_the_whole_run_peaks_at_the_results_peak(result: Result) -> None:
    r = whole_run(result)
    pools = [p for p in r.memory_series if r.memory_series[p]]
    df = frames.memory_frame(r, pools)
    kinds = [c for c in df.columns if c not in ("pool", "time_s", "total_bytes", "capacity_bytes")]
    for pool in pools:
        part = df[df["pool"] == pool]
        assert part["total_bytes"].max() == pytest.approx(r.peak_bytes[pool], rel=1e-12)
        assert (part["capacity_bytes"] == r.capacity_bytes[pool]).all()
        # the row at the peak holds what the Result says was there at the peak, kind by kind
        at_peak = part.loc[part["total_bytes"].idxmax()]
        for k in kinds:
            assert at_peak[k] == pytest.approx(r.peak_by_kind[pool].get(k, 0.0), abs=1.0)
    assert (df[kinds].sum(axis=1) - df["total_bytes"]).abs().max() < 1.0


def test_memory_frame_of_the_step_stays_within_the_window_and_the_peak(result: Result) -> None:
    df = frames.memory_frame(result)
    lo, hi = result.window
    assert df["time_s"].min() == 0.0 and df["time_s"].max() == pytest.approx(hi - lo)
    assert df["pool"].iloc[0] == "gpu0" and "cpu" in set(df["pool"])
    for pool, part in df.groupby("pool"):
        assert part["total_bytes"].max() <= result.peak_bytes[pool] * (1 + 1e-12)
        assert part["time_s"].is_monotonic_increasing


def test_timeline_frame_holds_every_task_of_the_gpu_in_the_step(result: Result) -> None:
    df = frames.timeline_frame(result, "gpu0")
    lo, hi = result.window
    expect = sorted((x.uid, x.start - lo, x.end - lo) for x in result.records
                    if x.device in ("gpu0", "cpu") and x.end > lo and x.start < hi and x.end > x.start)
    got = sorted(zip(df[df["task"] != ""]["task"], df[df["task"] != ""]["start_s"], df[df["task"] != ""]["end_s"],
                     strict=True))
    assert [g[0] for g in got] == [e[0] for e in expect]
    assert all(g[1] == pytest.approx(e[1]) and g[2] == pytest.approx(e[2]) for g, e in zip(got, expect, strict=True))
    cats = set(df["category"])
    assert {"forward", "backward", "copy"} <= cats
    assert set(df[df["op"] == "compute"]["category"]) <= {"forward", "backward", "recompute", "other compute"}


def test_exposed_rows_are_transfers_of_that_gpu_with_no_compute_beside_them(result: Result) -> None:
    df = frames.timeline_frame(result, "gpu0")
    lo = result.window[0]
    exposed = df[df["category"] == frames.EXPOSED]
    comp = union((x.start - lo, x.end - lo) for x in result.records
                 if x.op in ("compute", "optimizer") and "gpu0" in x.gpus)
    xfer = union((x.start - lo, x.end - lo) for x in result.records
                 if x.op in ("copy", "collective") and "gpu0" in x.gpus)
    for a, b in zip(exposed["start_s"], exposed["end_s"], strict=True):
        assert b > a
        assert not any(c0 < b - 1e-12 and a + 1e-12 < c1 for c0, c1 in comp)
        assert any(x0 <= a + 1e-12 and b - 1e-12 <= x1 for x0, x1 in xfer)


def test_link_frame_moves_the_bytes_of_the_copies_in_the_step(result: Result) -> None:
    lo, hi = result.window
    df = frames.link_frame(result)
    total = sum(frames.integrate_rate(df[df["direction"] == d]) for d in ("fwd", "rev"))
    assert total == pytest.approx(result.link_bytes["gpu0.pcie"], rel=1e-6)  # no copy crosses the step's ends
    assert set(df["link"]) == {"gpu0.pcie"}
    assert (df["utilisation"] <= 1 + 1e-9).all()
    for d, forward in (("fwd", True), ("rev", False)):
        part = df[(df["link"] == "gpu0.pcie") & (df["direction"] == d)]
        # copies entirely inside the window and going that way (to the GPU is forward)
        moved = sum(x.bytes for x in result.records if x.op == "copy" and "gpu0.pcie" in x.links
                    and lo <= x.start and x.end <= hi and (x.stream.endswith("h2d") == forward))
        crossing = [x for x in result.records if x.op == "copy" and "gpu0.pcie" in x.links
                    and x.start < hi and x.end > lo and not (lo <= x.start and x.end <= hi)]
        if not crossing:
            assert frames.integrate_rate(part) == pytest.approx(moved, rel=1e-6)
        assert part["capacity_Bps"].iloc[0] == result.topology.links["gpu0.pcie"].bw_fwd


def test_comparison_frame_reads_results_and_verdicts(job, result: Result) -> None:  # noqa: ANN001
    from policies import PlanInfeasible

    bad = infeasible_json(PlanInfeasible("none", "gpu0", 200e9, 79.5e9, "the model states"), job)
    df = frames.comparison_frame([result.to_dict(), bad])
    ok, no = df.iloc[0], df.iloc[1]
    assert ok["feasible"] and ok["tokens_per_s"] == result.tokens_per_s
    assert ok["gpu_peak_bytes"] == result.peak_bytes["gpu0"] and ok["cpu_peak_bytes"] == result.peak_bytes["cpu"]
    assert ok["gpu_capacity_bytes"] == result.capacity_bytes["gpu0"]
    assert not no["feasible"] and no["peak_source"] == "policy estimate"
    assert no["gpu_peak_bytes"] == 200e9 and no["over_by_bytes"] == pytest.approx(200e9 - 79.5e9)
    assert math.isnan(no["tokens_per_s"]) and math.isnan(no["cpu_peak_bytes"])
    assert list(df["label"]) == [result.policy, "none"]


def test_duplicate_policies_are_told_apart_by_their_sweep_point() -> None:
    row = {"policy": "none", "feasible": True, "peak_bytes": {}, "capacity_bytes": {}, "hardware": "a100",
           "model": {"name": "gpt2"}}
    rows = [{**row, "point": {"policy": "none", "set": [s], "model": "gpt2"}} for s in ("pcie.gen=4", "pcie.gen=5")]
    assert list(frames.comparison_frame(rows)["label"]) == ["none [set=pcie.gen=4]", "none [set=pcie.gen=5]"]


def test_coverage_whatif_and_replay_frames_keep_the_documents_figures() -> None:
    cov = {"kind": "tiersim.coverage", "hardware": "a100", "rows": [
        {"policy": "none", "model": "gpt2", "params": 1.2e8, "feasible": True, "tokens_per_s": 9000.0,
         "tflops_per_gpu": 120.0, "binding": None, "knobs": {"stage": 0}},
        {"policy": "none", "model": "70b", "params": 6.9e10, "feasible": False, "tokens_per_s": None,
         "tflops_per_gpu": None, "binding": "gpu0", "knobs": {}}]}
    c = frames.coverage_frame(cov)
    assert list(c["feasible"]) == [True, False] and c["tokens_per_s"].iloc[0] == 9000.0
    assert c["binding"].iloc[1] == "gpu0" and c["knobs"].iloc[0] == '{"stage": 0}'
    wi = {"kind": "tiersim.whatif", "sensitivity": [
        {"change": "pcie.gen=5", "base_tokens_per_s": 100.0, "tokens_per_s": 150.0, "gain": 0.5,
         "makes_feasible": False},
        {"change": "host.dram=512GB", "base_tokens_per_s": 100.0, "tokens_per_s": 20.0, "gain": -0.8,
         "makes_feasible": False},
        {"change": "nvme.count=4", "base_tokens_per_s": 100.0, "tokens_per_s": 110.0, "gain": 0.1,
         "makes_feasible": True}]}
    w = frames.whatif_frame(wi)
    assert list(w["change"]) == ["host.dram=512GB", "pcie.gen=5", "nvme.count=4"]  # largest |change| first
    assert list(w["delta_tokens_per_s"]) == [-80.0, 50.0, 10.0]
    assert w["relative"].iloc[1] == pytest.approx(0.5)
    rep = {"policy": "zero-offload", "simulated": {"step_time_s": 2.0, "peak_bytes": {"gpu0": 4e9, "cpu": 0.0}},
           "measured": {"step_time_s": 2.5, "peak_bytes": {"gpu0": 5e9, "cpu": 0.0}}, "error": {}}
    val = {"rows": [{"case": "c1", "policy": "none", "sim_step_s": 1.0, "meas_step_s": 0.5,
                     "sim_peak": {"gpu0": 2e9}, "meas_peak": {"gpu0": 2e9}}], "summary": {}}
    r = frames.replay_frame([(None, rep), (None, val)])
    assert list(zip(r["case"], r["figure"], r["error"], strict=True)) == [
        ("zero-offload", "step time", pytest.approx(0.25)), ("zero-offload", "peak gpu0", pytest.approx(0.25)),
        ("c1", "step time", pytest.approx(-0.5)), ("c1", "peak gpu0", pytest.approx(0.0))]


def test_memory_drawing_thins_rows_but_keeps_every_bins_peak() -> None:
    import numpy as np
    import pandas as pd

    from reports.figures.memory import thinned

    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 10, 5000))
    total = rng.uniform(0, 1, 5000)
    part = pd.DataFrame({"time_s": t, "total_bytes": total})
    thin = thinned(part, 10.0, bins=100)
    assert len(thin) <= 2 * 100 + 2
    assert thin["total_bytes"].max() == total.max()
    assert thin.index[0] == 0 and thin.index[-1] == 4999  # the step's first and last rows stay
    assert thinned(part.iloc[:150], 10.0, bins=100) is not None and len(thinned(part.iloc[:150], 10.0, bins=100)) == 150
