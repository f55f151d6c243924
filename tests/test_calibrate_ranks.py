"""``tiersim calibrate --ranks 2``: what two CPU-only ranks share, written into a spec that prices 2-rank plans."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import replay.calibrate as rc  # noqa: E402
from hardware_models import load_hardware, spec_from_dict  # noqa: E402
from replay.calibrate_ranks import RanksCalibration  # noqa: E402
from replay.calibrate_spec import spec_dict  # noqa: E402
from tiersim.cli import main, simulate_main  # noqa: E402


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setattr(rc, "CalibrationSizes", rc.CalibrationSizes.tiny)
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _fake_cal() -> rc.Calibration:
    disk = rc.DiskResult(read_bw=3e9, write_bw=2e9, method="O_DIRECT", capacity_free=10**12, directory="/d",
                         file_bytes=2**28)
    return rc.Calibration(
        host="box", date="2026-01-01T00:00:00Z", device="cpu", gpu_model="CPU as GPU", gpu_count=1, gpu_memory=16e9,
        gpu_memory_method="budget", cpu_model="cpu", cores=2, dram=64e9, gemm_dtype="bf16",
        gemm_curve=[(1e6, 1e9), (1e9, 1e10)], peak_flops={"bf16": 1e10, "fp32": 2e10},
        peak_at={"bf16": 1e9, "fp32": 1e9}, h2d_bw=5e9, d2h_bw=5e9, duplex_bw=8e9, copy_method="memcpy",
        copy_latency_s=1e-6, hbm_bw=10e9, hbm_method="memcpy", dram_bw=10e9, launch_overhead_s=5e-6,
        optimizer_params_per_s=1e8, optimizer_variant="fused", gpu_optimizer_params_per_s=1e8, disk=disk)


RANKS = RanksCalibration(ranks=2, allreduce_bytes=2**20, allreduce_s=2e-3, collective_bw=0.6e9,
                         collective_latency_s=50e-6, gemm_alone=2e10, gemm_shared=1.5e10, copy_alone=5e9,
                         copy_shared_total=7e9, precision="bf16", method="2 local processes",
                         reduce_scatter_s=2.0e-3, all_gather_s=1.0e-3)


def test_spec_prices_what_two_ranks_share() -> None:
    one = spec_from_dict(spec_dict(_fake_cal()))
    two = spec_from_dict(spec_dict(_fake_cal(), ranks=RANKS))
    assert one.gpu.count == 1 and one.nvlink is None
    assert two.gpu.count == 2 and two.nvlink is not None
    assert two.nvlink.per_direction_bw == pytest.approx(0.6e9) and two.nvlink.latency_s == pytest.approx(50e-6)
    for k, v in one.gpu.peak_flops.items():  # each rank computes at the measured share of its solo rate
        assert two.gpu.peak_flops[k] == pytest.approx(v * 0.75)
    assert two.pcie.gpus_per_switch == 2
    assert two.missing_sources() == ()
    assert "gloo all_reduce" in two.sources["nvlink.per_direction_bw"]
    assert "1 MiB bf16" in two.sources["nvlink.per_direction_bw"]  # timed in the plan's gradient dtype
    # gloo's reduce-scatter and all-gather priced as the multiple of a ring's bytes their times are at the
    # all-reduce's rate: (t - 1 latency step) / (2^20 B x 1/2 / 0.6 GB/s)
    ring_s = 2**20 / 2 / 0.6e9
    assert two.nvlink.reduce_scatter_bytes == pytest.approx((2.0e-3 - 50e-6) / ring_s)
    assert two.nvlink.all_gather_bytes == pytest.approx((1.0e-3 - 50e-6) / ring_s)
    assert "gloo reduce_scatter" in two.sources["nvlink.reduce_scatter_bytes"]
    # and gets the measured share of its memory bandwidth (7 GB/s for two copies at once, 5 GB/s alone: 0.7)
    assert RANKS.memory_share == pytest.approx(0.7)
    assert two.gpu.hbm_bw == pytest.approx(one.gpu.hbm_bw * 0.7)
    assert "0.700" in two.sources["gpu.hbm_bw"]
    assert replace(RANKS, copy_shared_total=12e9).memory_share == 1.0  # never faster than alone
    cal = _fake_cal()
    cal.elementwise_bw, cal.elementwise_method = 4e9, "probe block"
    two_ew = spec_from_dict(spec_dict(cal, ranks=RANKS))
    assert two_ew.gpu.elementwise_bw == pytest.approx(4e9 * 0.7) and two_ew.missing_sources() == ()
    assert RANKS.compute_share == pytest.approx(0.75)
    assert replace(RANKS, gemm_shared=3e10).compute_share == 1.0  # never faster than alone


def test_calibrate_ranks_2_writes_a_spec_a_2_rank_plan_is_priced_on(tmp_path: Path) -> None:
    out = tmp_path / "two.yaml"
    code, stdout, stderr = _run(["calibrate", "-o", str(out), "--dir", str(tmp_path), "--ranks", "2",
                                 "--precision", "fp32", "--json"])
    assert code == 0, stderr
    data = json.loads(stdout)
    r = data["ranks"]
    assert r["ranks"] == 2 and r["collective_bw"] > 0 and r["gemm_shared"] > 0 and r["copy_shared_total"] > 0
    spec = load_hardware(out)
    assert spec.gpu.count == 2 and spec.nvlink is not None and spec.missing_sources() == ()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = simulate_main(["--hw", str(out), "--model", "gpt2", "--seq-len", "128", "--global-batch", "2",
                              "--precision", "fp32", "--policy", "none", "--json"])
    assert code == 0
    result = json.loads(buf.getvalue())
    moved = {k: v for k, v in _find(result, "link_bytes").items() if "nvlink" in k and v > 0}
    assert moved, "the 2-rank plan's gradient all-reduce crosses the measured collective link"


def _find(d: Any, key: str) -> dict[str, float]:
    """The first mapping named ``key`` anywhere in a JSON object."""
    if isinstance(d, dict):
        if key in d and isinstance(d[key], dict):
            return d[key]
        for v in d.values():
            got = _find(v, key)
            if got:
                return got
    return {}


@pytest.mark.parametrize("bad", ["0", "9", "x"])
def test_bad_ranks_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    code, _, err = _run(["calibrate", "-o", str(tmp_path / "x.yaml"), "--ranks", bad])
    assert code == 2 and "--ranks" in err and "Traceback" not in err



@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_collectives_are_timed_in_the_precisions_dtype(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo sums on the CPU, fp16 much slower per byte than fp32 or bf16: a rank of measure_ranks times its
    collectives on a buffer of the precision's dtype (what the runner sends, Precision.wire_gradients) and of the
    asked bytes. One rank, the process group's calls recorded instead of run."""
    import queue

    import torch

    import replay.calibrate_ranks as cr

    seen: list[tuple[str, torch.dtype, int]] = []

    def record(name: str):  # noqa: ANN202
        return lambda t, *a, **k: seen.append((name, t.dtype, t.numel() * t.element_size()))

    for name in ("init_process_group", "destroy_process_group", "barrier"):
        monkeypatch.setattr(cr.dist, name, lambda *a, **k: None)
    for name in ("all_reduce", "reduce_scatter_single", "all_gather_single"):
        monkeypatch.setattr(cr.dist, name, record(name))
    monkeypatch.setattr(cr.dist, "all_gather_object", lambda got, obj: got.__setitem__(slice(None), [obj]))
    sizes = {"allreduce_bytes": 4096, "gemm_n": 16, "copy_bytes": 4096, "repeats": 1, "share_s": 0.001}
    cr._rank_main(0, 1, "unused", sizes, precision, queue.Queue())
    want = {"fp16": torch.float16, "fp32": torch.float32}[precision]
    timed = [(name, dt, nbytes) for name, dt, nbytes in seen if nbytes > 4]  # not the 4-byte latency probe
    assert {name for name, _, _ in timed} == {"all_reduce", "reduce_scatter_single", "all_gather_single"}
    assert all(dt == want for _, dt, _ in timed)
    assert {nbytes for name, _, nbytes in timed if name == "all_reduce"} == {4096}


def test_shared_rates_are_medians_of_alternating_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """What every rank gets while all run the same work is each rank's work over windows of back-to-back calls
    (a single 5 ms copy per rank after a barrier overlapped the other rank's only in part), alternated with rank
    0's solo windows so that both sample the same minutes; the medians of ``windows`` of each."""
    import replay.calibrate_ranks as cr

    events: list[str] = []
    monkeypatch.setattr(cr.dist, "barrier", lambda *a, **k: events.append("barrier"))
    clock = iter(float(x) for x in range(10_000))
    monkeypatch.setattr(cr.time, "perf_counter", lambda: next(clock))  # each reading of the clock: 1 s later
    calls = []
    alone, shared = cr._alone_and_shared(lambda: calls.append(1), 2.0, rank=0, seconds=4.0, windows=3)
    # a window: a warm-up call, three calls (the minimum), then one per reading until 4 s have passed (three
    # more), read once more at the end: 6 calls x 2 units over 5 s
    assert alone == pytest.approx(2.4) and shared == pytest.approx(2.4)
    assert events == ["barrier"] * 6  # after each solo window and each shared one
    assert len(calls) == 6 * (1 + 6)
    others, shared_1 = cr._alone_and_shared(lambda: None, 2.0, rank=1, seconds=0.0, windows=3)
    assert others == 0.0 and shared_1 > 0  # rank 1 only waits while rank 0 runs alone
