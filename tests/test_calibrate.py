"""``tiersim calibrate``: measures this machine (tiny sizes here) and writes a spec the simulator loads."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import replay.calibrate as rc  # noqa: E402
from hardware_models import PCIE_X16_PER_DIRECTION, load_hardware, spec_from_dict  # noqa: E402
from replay.calibrate_spec import pcie_fields, spec_dict  # noqa: E402
from tiersim.cli import main, simulate_main  # noqa: E402


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setattr(rc, "CalibrationSizes", rc.CalibrationSizes.tiny)  # calibrate()'s default sizes -> tiny
        rc_ = main(argv)
    return rc_, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("calibrate")
    disk = tmp / "disk"
    disk.mkdir()
    out = tmp / "local.yaml"
    code, stdout, stderr = _run(["calibrate", "-o", str(out), "--dir", str(disk), "--json"])
    return {"code": code, "path": out, "json": json.loads(stdout) if code == 0 else None, "stderr": stderr,
            "disk": disk}


def test_writes_a_spec_that_loads(calibrated: dict[str, Any]) -> None:
    assert calibrated["code"] == 0, calibrated["stderr"]
    spec = load_hardware(calibrated["path"])
    assert spec.gpu.count == 1 and spec.nvme is not None and spec.nvme.count == 1
    assert spec.missing_sources() == ()
    for path, citation in spec.sources.items():
        assert citation.startswith(("measured: tiersim calibrate on ", "derived: ", "assumed: tiersim calibrate")), path
    assert list(calibrated["disk"].iterdir()) == []  # the disk test file is removed


def test_progress_on_stderr_and_json_on_stdout(calibrated: dict[str, Any]) -> None:
    lines = calibrated["stderr"].strip().splitlines()
    assert len(lines) >= 5 and all(line.startswith("calibrate: ") for line in lines)
    assert set(calibrated["json"]) == {"output", "measurements", "spec", "tiersim_version"}
    assert calibrated["json"]["spec"] == load_hardware(calibrated["path"]).to_dict()


def test_simulate_runs_on_the_written_spec(calibrated: dict[str, Any]) -> None:
    path = str(calibrated["path"])
    with contextlib.redirect_stdout(io.StringIO()):
        code = simulate_main(["--hw", path, "--model", "gpt2", "--seq-len", "128", "--global-batch", "1",
                              "--policy", "zero-offload"])
    assert code == 0


def test_measured_figures_are_positive(calibrated: dict[str, Any]) -> None:
    spec = load_hardware(calibrated["path"])
    m = calibrated["json"]["measurements"]
    assert spec.gpu.peak_flops["fp32"] > 0 and "bf16" in spec.gpu.peak_flops  # simulate's default dtype
    assert all(0 < eff <= 1 for _, eff in spec.gpu.gemm_efficiency.points)
    g = spec.gpu  # the peak is the best measured rate of any kernel kind (docs/calib.md)
    curves = [c for c in (g.gemm_efficiency, g.gemm_backward_efficiency, g.attention_efficiency,
                          g.attention_backward_efficiency) if c is not None]
    assert max(eff for c in curves for _, eff in c.points) == 1.0
    for value in (spec.gpu.hbm_bw, spec.host.dram_bw, spec.host.optimizer_params_per_s, spec.gpu.memory_bytes,
                  spec.nvme.read_bw_each, spec.nvme.write_bw_each, spec.nvme.capacity_bytes_each,  # type: ignore[union-attr]
                  spec.pcie.per_direction_bw, spec.host.dram_bytes):
        assert value > 0
    assert spec.host.cores >= 1
    assert spec.gpu.memory_bytes == pytest.approx(spec.host.dram_bytes / 4, rel=1e-5)  # CPU-only budget
    # per-operator pricing: measured, and the CPU-only "GPU" shares the host's cores
    assert spec.gpu.op_overhead_s is not None and spec.gpu.op_overhead_s > 0
    assert spec.gpu.elementwise_bw is not None and spec.gpu.elementwise_bw > 0
    assert spec.gpu.shares_host is True
    assert spec.gpu.op_overhead_s == pytest.approx(m["op_overhead_s"], rel=1e-5)
    assert "workloads.ops" in spec.sources["gpu.op_overhead"]
    # the pcie fields reproduce the measured gpu0 <-> cpu copy rate
    assert spec.pcie.per_direction_bw == pytest.approx((m["h2d_bw"] + m["d2h_bw"]) / 2, rel=1e-4)
    assert 0.5 <= spec.pcie.duplex_fraction <= 1


def test_disk_method_is_reported(calibrated: dict[str, Any]) -> None:
    m = calibrated["json"]["measurements"]
    assert m["disk"]["method"] in ("O_DIRECT", "fsync+fadvise")
    spec = load_hardware(calibrated["path"])
    method_words = "O_DIRECT" if m["disk"]["method"] == "O_DIRECT" else "posix_fadvise"
    assert method_words in spec.sources["nvme.read_bw_each"]
    assert m["disk"]["method"] in spec.description


def test_disk_fallback_without_o_direct(tmp_path: Path) -> None:
    d = rc.measure_disk(tmp_path, nbytes=2**20, chunk=2**18, direct=False)
    assert d.method == "fsync+fadvise" and d.read_bw > 0 and d.write_bw > 0 and d.file_bytes == 2**20
    assert d.fs_type == rc.filesystem_type(tmp_path) and d.fs_type
    assert list(tmp_path.iterdir()) == []


def test_missing_dir_is_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "x.yaml"
    code, stdout, stderr = _run(["calibrate", "-o", str(out), "--dir", str(tmp_path / "nope")])
    assert code == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1 and "--dir" in stderr
    assert not out.exists()


@pytest.mark.parametrize("argv", [["-o", "{tmp}/no/such/dir/x.yaml"], ["-o", "{tmp}"],
                                  ["-o", "{tmp}/x.yaml", "--base", "no-such-preset"]])
def test_bad_output_or_base_is_bad_input(tmp_path: Path, argv: list[str]) -> None:
    code, stdout, stderr = _run(["calibrate", *(a.format(tmp=tmp_path) for a in argv)])
    assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1


def test_pcie_fields_express_the_rate() -> None:
    gen, lanes, eff, capped = pcie_fields(12e9)
    assert (gen, lanes, capped) == (3, 16, False)
    assert PCIE_X16_PER_DIRECTION[gen] * eff == pytest.approx(12e9)
    assert pcie_fields(40e9)[0] == 5
    assert pcie_fields(500e9) == (6, 16, 1.0, True)


def _fake(device: str = "cpu", **kw: Any) -> rc.Calibration:
    disk = rc.DiskResult(read_bw=3e9, write_bw=2e9, method="O_DIRECT", capacity_free=10**12, directory="/d",
                         file_bytes=2**28)
    cal = rc.Calibration(
        host="box", date="2026-01-01T00:00:00Z", device=device, gpu_model="X", gpu_count=1, gpu_memory=80e9,
        gpu_memory_method="props", cpu_model="cpu", cores=8, dram=64e9, gemm_dtype="bf16",
        gemm_curve=[(1e6, 1e12), (1e9, 1e14), (1e12, 3e14)], peak_flops={"bf16": 3e14, "fp32": 5e13},
        peak_at={"bf16": 1e12, "fp32": 1e12}, h2d_bw=25e9, d2h_bw=26e9, duplex_bw=36e9, copy_method="pinned",
        copy_latency_s=1e-5, hbm_bw=3e12, hbm_method="d2d", dram_bw=100e9, launch_overhead_s=5e-6,
        optimizer_params_per_s=1e9, optimizer_variant="fused", gpu_optimizer_params_per_s=1e11, disk=disk)
    return replace(cal, **kw)


@pytest.mark.parametrize(("model", "count", "cublas_mib", "comm"), [
    ("NVIDIA A100-SXM4-80GB", 1, 9.125, 0.0), ("NVIDIA H200", 1, 33.0, 0.0), ("NVIDIA H200", 8, 33.0, 0.5 * 2**30)])
def test_calibrated_cuda_spec_reserves_by_architecture(model: str, count: int, cublas_mib: float,
                                                       comm: float) -> None:
    """No flat 5% fragmentation and 1 GiB workspace guess: cuBLAS's workspace by architecture, NCCL's
    buffers only with more than one GPU, fragmentation 0 (the caching allocator's rounding is charged)."""
    spec = spec_from_dict(spec_dict(_fake("cuda", gpu_model=model, gpu_count=count)))
    assert spec.gpu.reserved["cublas_workspace"] == pytest.approx(cublas_mib * 2**20)
    assert spec.gpu.reserved["comm_buffers"] == pytest.approx(comm)
    assert spec.gpu.fragmentation == 0.0 and "framework_workspace" not in spec.gpu.reserved


def test_cuda_shaped_calibration_makes_a_valid_spec() -> None:
    """The CUDA branch of the spec builder (the measuring code itself needs a GPU and is untested here)."""
    spec = spec_from_dict(spec_dict(_fake("cuda")))
    assert spec.gpu.shares_host is False and spec.gpu.op_overhead_s is None  # not measured in this fake
    assert spec.pcie.gen == 4 and spec.pcie.per_direction_bw == pytest.approx(25.5e9)
    assert spec.pcie.duplex_fraction == pytest.approx(36 / 51)
    assert spec.gpu.gemm_efficiency(1e12) == 1.0 and spec.gpu.gemm_efficiency(1e6) == pytest.approx(1 / 300, rel=1e-3)
    assert spec.gpu.reserved["cuda_context"] > 0 and spec.gpu.optimizer_bytes_per_param == pytest.approx(30)
    assert spec.missing_sources() == ()


def test_a_cuda_calibration_writes_the_host_side_it_fitted() -> None:
    """The dispatch fit (replay.calibrate_dispatch) lands as gpu.op_overhead, gpu.gemm_op_overhead and
    gpu.task_overhead, each with the fit's citation; dispatch_overlap with them."""
    how = "fitted: tasks as the runner runs them"
    spec = spec_from_dict(spec_dict(_fake("cuda", op_overhead_s=12e-6, gemm_op_overhead_s=60e-6,
                                          task_overhead_s=250e-6, op_overhead_method=how, dispatch_overlap=True)))
    g = spec.gpu
    assert (g.op_overhead_s, g.gemm_op_overhead_s, g.task_overhead_s) == (
        pytest.approx(12e-6), pytest.approx(60e-6), pytest.approx(250e-6))
    assert g.dispatch_overlap is True
    for key in ("op_overhead", "gemm_op_overhead", "task_overhead"):
        assert how in spec.sources[f"gpu.{key}"]
    assert spec.missing_sources() == ()


def test_base_preset_fields_are_kept_with_their_source() -> None:
    base = load_hardware("a100x8")
    spec = spec_from_dict(spec_dict(_fake("cuda", gpu_count=8), base.to_dict(), "a100x8"))
    assert spec.pcie.gpus_per_switch == base.pcie.gpus_per_switch
    assert spec.nvlink == base.nvlink
    assert spec.sources["pcie.gpus_per_switch"].startswith("from --base a100x8: ")
    assert spec.sources["gpu.hbm_bw"].startswith("measured: tiersim calibrate on box")


def test_records_backward_and_attention_rates(calibrated: dict[str, Any]) -> None:
    """calibrate measures a linear layer's backward products and the attention kernel (forward, backward) in
    its precision, records them, and writes them as curves of the spec with their method."""
    m = calibrated["json"]["measurements"]
    spec = load_hardware(calibrated["path"])
    for key, field in (("gemm_backward_curve", "gemm_backward_efficiency"), ("attention_curve", "attention_efficiency"),
                       ("attention_backward_curve", "attention_backward_efficiency")):
        pts = m[key]
        assert pts and all(len(p) == 2 and p[0] > 0 and p[1] > 0 for p in pts), key
        curve = getattr(spec.gpu, field)
        assert curve is not None and [x for x, _ in curve.points] == sorted(x for x, _ in pts)
        assert all(0 < eff <= 1 for _, eff in curve.points)
        assert spec.sources[f"gpu.{field}"].startswith("measured: tiersim calibrate on ")
    # the attention FLOPs are those workloads.flops counts: 4 s^2 heads head_dim forward, twice backward
    heads, head_dim = rc.CalibrationSizes.tiny().attention_heads
    seqs = sorted(rc.CalibrationSizes.tiny().attention_seqs)
    assert [p[0] for p in m["attention_curve"]] == [4.0 * s * s * heads * head_dim for s in seqs]
    assert [p[0] for p in m["attention_backward_curve"]] == [8.0 * s * s * heads * head_dim for s in seqs]
    assert "scaled_dot_product_attention" in spec.sources["gpu.attention_efficiency"]


def test_kind_curves_are_fractions_of_the_peak_and_optional() -> None:
    cal = _fake("cuda", gemm_backward_curve=[(1e6, 3e11), (1e9, 1.5e14)], attention_curve=[(1e8, 1.5e14)],
                attention_backward_curve=[(2e8, 3e13)], attention_method="sdpa")
    spec = spec_from_dict(spec_dict(cal))
    assert spec.gpu.gemm_backward_efficiency is not None and spec.gpu.attention_backward_efficiency is not None
    assert spec.gpu.gemm_backward_efficiency.points == ((1e6, 0.001), (1e9, 0.5))
    assert spec.gpu.attention_efficiency is not None and spec.gpu.attention_efficiency(1e8) == 0.5
    assert spec.gpu.attention_backward_efficiency(2e8) == pytest.approx(0.1)
    assert spec.gpu.peak_flops == {"bf16": 3e14, "fp32": 5e13}  # no kind beat the forward peak
    assert spec.missing_sources() == ()
    # a kind faster than the best forward linear layer (bf16 attention on a CPU): every peak is scaled by it, the
    # curves are fractions of the new peak, and a forward GEMM's rate and every kind's rate stay as measured
    fast = spec_from_dict(spec_dict(replace(cal, attention_curve=[(1e8, 6e14)])))
    assert fast.gpu.peak_flops["bf16"] == pytest.approx(6e14) and fast.gpu.peak_flops["fp32"] == pytest.approx(1e14)
    assert fast.gpu.attention_efficiency is not None and fast.gpu.attention_efficiency(1e8) == 1.0
    for flops in (1e6, 1e9, 1e12):
        assert fast.gpu.peak_flops["bf16"] * fast.gpu.gemm_efficiency(flops) == pytest.approx(
            spec.gpu.peak_flops["bf16"] * spec.gpu.gemm_efficiency(flops), rel=1e-3)
    assert "x 2.000" in fast.sources["gpu.peak_flops.bf16"]
    bare = spec_from_dict(spec_dict(_fake("cuda")))  # an older record without them: the forward curve prices all
    assert bare.gpu.gemm_backward_efficiency is None and bare.gpu.attention_efficiency is None
    assert "attention_efficiency" not in bare.to_dict()["gpu"]


def test_the_16bit_gemm_path_is_printed_measured_and_cited(calibrated: dict[str, Any]) -> None:
    """calibrate prints the 16-bit GEMM path it picked, measures on it (the runner's) and cites it in the spec,
    from which replay reads it back to tell a mismatch."""
    from replay.precision import gemm16_path, replay_gemm16_lines, spec_gemm16

    spec = load_hardware(calibrated["path"])
    picked = gemm16_path("cpu", torch.bfloat16)
    assert any(line.startswith("calibrate: 16-bit GEMMs: ") for line in calibrated["stderr"].splitlines())
    assert calibrated["json"]["measurements"]["gemm16"]["bf16"] == picked
    assert spec_gemm16(spec.sources, "bf16") == picked and spec_gemm16(spec.sources, "fp32") is None
    assert len(replay_gemm16_lines("bf16", "cpu", spec.sources)) == 1  # the same path: no warning
    other = "native" if picked == "emulated" else "emulated"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIERSIM_GEMM16", other)
        lines = replay_gemm16_lines("bf16", "cpu", spec.sources)
    assert len(lines) == 2 and lines[1].startswith(f"warning: the plan's hardware was calibrated on the {picked}")


def test_the_host_adam_sample_outgrows_the_last_level_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An offloaded optimizer sweeps its state from DRAM: the measured Adam's state is 4x the largest cache
    (sysfs sizes such as 32768K), never below the configured sample, at most ADAM_MAX_PARAMS; tiny sizes as set."""
    from replay.calibrate import (
        ADAM_MAX_PARAMS,
        CalibrationSizes,
        adam_sample_params,
        last_level_cache_bytes,
    )

    for i, size in enumerate(["48K", "2048K", "320M", "junk"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 320 * 2**20
    assert last_level_cache_bytes(tmp_path / "missing") == 0
    sizes = CalibrationSizes()
    assert adam_sample_params(sizes, 320 * 2**20) == 4 * 320 * 2**20 // 16
    assert adam_sample_params(sizes, 0) == sizes.adam_params
    assert adam_sample_params(sizes, 64 * 2**30) == ADAM_MAX_PARAMS
    assert adam_sample_params(CalibrationSizes.tiny(), 320 * 2**20) == CalibrationSizes.tiny().adam_params
