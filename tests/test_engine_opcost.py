"""Compute pricing (simulator.opcost) and the shared-host model (gpu.shares_host) of the engine.

Exact logs where the times can be worked out by hand (the helpers' round bandwidths, launch overhead
zeroed), and the operator-level price of real layer tasks checked against workloads.ops.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_helpers import GB, compute, copy, hw, log, one_link, plan, ring, run

from costs import compute_seconds, gemm_kernels_seconds, ops_seconds
from hardware_models import HardwareInputError, load_hardware
from planner.job import JobRequest, make_job, make_plan
from simulator import TaskSpec
from simulator.simulate import simulate_plan
from workloads.ops import layer_ops

H2D = ("gpu0.h2d", "gpu0", "h2d")
COMP = ("gpu0.compute", "gpu0", "compute")
OPT = ("cpu.optim", "cpu", "optim")
HALF_S_OF_HBM = 2039 / 2  # GB: 0.5 s of HBM-bound work on an A100 (2039 GB/s)


def shared(spec=None, cores: int = 1):  # type: ignore[no-untyped-def]
    spec = spec or hw()
    return replace(spec, gpu=replace(spec.gpu, shares_host=True), host=replace(spec.host, sockets=1, cores=cores))


def test_compute_and_copy_overlap_for_free_on_a_gpu() -> None:
    p = plan([compute("c", "gpu0.compute", hbm_gb=HALF_S_OF_HBM), copy("a", "gpu0.h2d", "cpu", "gpu0", 5)],
             [COMP, H2D])
    assert log(run(p, one_link(10))) == [("a", 0, 0.5), ("c", 0, 0.5)]


def test_on_a_shared_host_compute_and_copy_split_the_cores() -> None:
    # each alone takes 0.5 s; together each runs at half speed on the host's cores: both end at 1.0
    p = plan([compute("c", "gpu0.compute", hbm_gb=HALF_S_OF_HBM), copy("a", "gpu0.h2d", "cpu", "gpu0", 5)],
             [COMP, H2D])
    res = run(p, one_link(10), spec=shared())
    assert log(res) == [("a", 0, 1.0), ("c", 0, 1.0)]
    assert res.link_bytes == {"l": 5 * GB}


def test_on_a_shared_host_as_many_flows_as_cores_run_at_solo_speed() -> None:
    # two cores: compute and copy (one thread each) both end at 0.5 s, as on a GPU; never faster than solo
    p = plan([compute("c", "gpu0.compute", hbm_gb=HALF_S_OF_HBM), copy("a", "gpu0.h2d", "cpu", "gpu0", 5)],
             [COMP, H2D])
    assert log(run(p, one_link(10), spec=shared(cores=2))) == [("a", 0, 0.5), ("c", 0, 0.5)]
    assert log(run(p, one_link(10), spec=shared(cores=8))) == [("a", 0, 0.5), ("c", 0, 0.5)]


def test_on_a_shared_host_three_flows_on_two_cores_run_at_two_thirds() -> None:
    spec = shared(hw(optimizer_params_per_s=1e9), cores=2)
    opt = TaskSpec("o", "optimizer", "cpu.optim", params=0.5e9)  # 0.5 s alone
    p = plan([compute("c", "gpu0.compute", hbm_gb=HALF_S_OF_HBM), copy("a", "gpu0.h2d", "cpu", "gpu0", 5), opt],
             [COMP, H2D, OPT])
    # each 0.5 s of work at 2/3 speed: all three end at 0.75 s
    got = {name: (start, end) for name, start, end in log(run(p, one_link(10), spec=spec))}
    assert got.keys() == {"a", "c", "o"}
    assert all(start == 0 and end == pytest.approx(0.75, rel=1e-12) for start, end in got.values())


def test_on_a_shared_host_the_cpu_optimizer_slows_the_compute() -> None:
    spec = shared(hw(optimizer_params_per_s=1e9))
    opt = TaskSpec("o", "optimizer", "cpu.optim", params=0.25e9)  # 0.25 s alone
    p = plan([compute("c", "gpu0.compute", hbm_gb=HALF_S_OF_HBM), opt], [COMP, OPT])
    # 0..0.5: half speed each, o done at 0.5 (0.25 s of work); c has 0.25 s left alone: ends at 0.75
    assert log(run(p, one_link(10), spec=spec)) == [("o", 0, 0.5), ("c", 0, 0.75)]
    assert log(run(p, one_link(10), spec=hw(optimizer_params_per_s=1e9))) == [("o", 0, 0.25), ("c", 0, 0.5)]


def test_on_a_shared_host_a_collective_holds_a_core_per_rank() -> None:
    """Two CPU ranks' gloo all-reduce is each rank's thread copying and summing on the host's cores: beside
    both ranks' compute (one core each) on two cores, the three flows want four cores and all run at half
    speed (measured on a 2-core host: the reductions of gpt-h512-none-bf16-2r took 6x their solo price beside
    the compute, and the forwards beside them 1.6x theirs, docs/calib.md)."""
    ranks = ("gpu0", "gpu1")
    ar = TaskSpec("ar", "collective", "gpu0.comm", bytes=50 * GB, coll="all_reduce", ranks=ranks)  # 0.5 s alone
    tasks = [ar, compute("c0", "gpu0.compute", hbm_gb=HALF_S_OF_HBM), compute("c1", "gpu1.compute",
                                                                            hbm_gb=HALF_S_OF_HBM)]
    streams = [("gpu0.comm", "gpu0", "comm"), COMP, ("gpu1.compute", "gpu1", "compute")]
    topo = ring(2, 100)
    assert log(run(plan(tasks[:1], streams), topo, spec=shared(cores=2))) == [("ar", 0, 0.5)]  # solo: 2 cores
    both = log(run(plan(tasks, streams), topo, spec=shared(cores=2)))
    assert [(n, a, pytest.approx(b, rel=1e-12)) for n, a, b in both] == [("ar", 0, 1.0), ("c0", 0, 1.0),
                                                                          ("c1", 0, 1.0)]
    assert log(run(plan(tasks, streams), topo, spec=shared(cores=4))) == [("ar", 0, 0.5), ("c0", 0, 0.5),
                                                                          ("c1", 0, 0.5)]
    assert log(run(plan(tasks, streams), topo)) == [("ar", 0, 0.5), ("c0", 0, 0.5), ("c1", 0, 0.5)]  # GPUs


def _layer_records(overrides: list[str]):  # type: ignore[no-untyped-def]
    job, _ = make_job("a100", "gpt2", JobRequest(micro_batch=2, seq_len=256, precision="bf16"),
                      hw_overrides=overrides)
    p = make_plan(job, "none")
    res = simulate_plan(p, job.hw)
    recs = [r for r in res.records if r.op == "compute" and r.step == max(x.step for x in res.records)]
    return job, recs


def test_operator_level_price_of_every_layer_task() -> None:
    job, recs = _layer_records(["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s"])
    assert job.hw.gpu.op_overhead_s == pytest.approx(10e-6)
    seen = set()
    for r in recs:
        layer, phase = r.tags["layer"], r.tags["phase"]
        ops = layer_ops(job.model, job.config, layer, phase)
        trace = job.trace.layers[layer]
        floor = (trace.bwd_hbm_bytes if phase == "bwd" else trace.fwd_hbm_bytes) / job.hw.gpu.hbm_bw
        assert ops_seconds(job.hw, ops, "bf16") > floor  # here the operators, not the HBM floor, set the time
        assert r.end - r.start == pytest.approx(ops_seconds(job.hw, ops, "bf16"), rel=1e-9), (layer, phase)
        seen.add((layer == 0, layer == job.model.n_layers + 1, phase))
    assert {(True, False, "fwd"), (False, False, "fwd"), (False, False, "bwd"), (False, True, "bwd")} <= seen


def test_the_task_hbm_traffic_stays_a_floor() -> None:
    job, recs = _layer_records(["gpu.op_overhead=0us", "gpu.elementwise_bw=1e15", "gpu.hbm_bw=1GB/s"])
    block = next(r for r in recs if r.tags["phase"] == "fwd" and r.tags["layer"] == 1)
    assert block.end - block.start == pytest.approx(job.trace.layers[1].fwd_hbm_bytes / 1e9, rel=1e-9)


def test_operator_level_costs_more_than_one_big_kernel() -> None:
    """Smaller kernels are less efficient and element-wise work and per-operator costs add up."""
    _, plain = _layer_records([])
    _, ops = _layer_records(["gpu.op_overhead=5us"])
    assert len(plain) == len(ops)
    for a, b in zip(plain, ops, strict=True):
        assert b.end - b.start > a.end - a.start


def test_presets_price_a_layer_kernel_by_kernel_on_the_curve() -> None:
    """Without op_overhead a layer task is its matmul kernels, each at its own size on the curve (not one
    kernel of the layer's FLOPs: slower, since smaller kernels are less efficient), and where the preset prices
    them apart (an A100: gpu.elementwise_efficiency) its element-wise bytes."""
    job, recs = _layer_records([])
    spec = job.hw
    blocks = [r for r in recs if r.tags["phase"] == "fwd" and 0 < r.tags["layer"] <= job.model.n_layers]
    layer = job.trace.layers[1]
    ops = layer_ops(job.model, job.config, 1, "fwd")
    ew = ops.elementwise_bytes / (spec.gpu.elementwise_efficiency * spec.gpu.hbm_bw)
    want = max(gemm_kernels_seconds(spec, ops, "bf16") + ew, layer.fwd_hbm_bytes / spec.gpu.hbm_bw)
    want += spec.gpu.launch_overhead_s
    assert blocks and all(r.end - r.start == pytest.approx(want, rel=1e-12) for r in blocks)
    one_kernel = compute_seconds(spec, layer.fwd_flops, layer.fwd_hbm_bytes, "bf16") + spec.gpu.launch_overhead_s
    assert want > one_kernel


def test_new_gpu_fields_are_optional_validated_and_omitted_when_absent() -> None:
    spec = load_hardware("a100")
    assert spec.gpu.op_overhead_s is None and spec.gpu.elementwise_bw is None and spec.gpu.shares_host is False
    d = spec.to_dict()["gpu"]
    assert not {"op_overhead", "elementwise_bw", "shares_host"} & set(d)
    with pytest.raises(HardwareInputError, match="gpu.op_overhead"):
        load_hardware("a100", ["gpu.op_overhead=-1us"])
    with pytest.raises(HardwareInputError, match="gpu.elementwise_bw"):
        load_hardware("a100", ["gpu.elementwise_bw=0GB/s"])
    with_fields = load_hardware("a100", ["gpu.op_overhead=7us", "gpu.elementwise_bw=1TB/s", "gpu.shares_host=true"])
    assert (with_fields.gpu.op_overhead_s, with_fields.gpu.elementwise_bw, with_fields.gpu.shares_host) == (
        pytest.approx(7e-6), pytest.approx(1e12), True)
    assert with_fields.to_dict()["gpu"]["shares_host"] is True
    assert "gpu.op_overhead" in with_fields.sources


def test_a_measured_unaligned_rate_prices_a_forward_gemm_whose_output_width_is_not_a_multiple_of_8() -> None:
    """``gpu.gemm_unaligned_efficiency`` (calibrate measures it): a GPT-2 head (vocab 50257) runs its forward
    GEMM at that share of the curve's rate; an aligned vocabulary, the backward and specs without it do not."""
    from costs.compute import KernelCurves, matmul_seconds, unaligned_factor
    from workloads import ModelSpec, WorkloadConfig

    spec = load_hardware("a100", ["gpu.op_overhead=5us", "gpu.gemm_unaligned_efficiency=0.625"])
    assert spec.gpu.gemm_unaligned_efficiency == 0.625
    assert spec.to_dict()["gpu"]["gemm_unaligned_efficiency"] == 0.625
    assert "gemm_unaligned_efficiency" not in load_hardware("a100").to_dict()["gpu"]
    cfg = WorkloadConfig(micro_batch=1, seq_len=256, precision="bf16")

    def head(vocab: int, phase: str) -> float:
        m = ModelSpec(name="t", family="gpt2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=4, ffn=1024,
                      vocab=vocab, max_pos=512, tied_embeddings=False, mlp="gelu", norm="layernorm", bias=True,
                      learned_pos=True)
        ops = layer_ops(m, cfg, 3, phase)
        return matmul_seconds(ops, spec.peak_flops_for("bf16"), KernelCurves.of(spec.gpu), phase) / ops.matmul_flops[0]

    assert head(50257, "fwd") == pytest.approx(head(50264, "fwd") / 0.625, rel=1e-3)  # per FLOP
    assert head(50257, "bwd") == pytest.approx(head(50264, "bwd"), rel=1e-3)
    assert unaligned_factor(None, "fwd", (256, 50257, 256)) == 1.0
    assert unaligned_factor(0.5, "recompute", (256, 50257, 256)) == 0.5
    assert unaligned_factor(0.5, "fwd", (256, 4096, 257)) == 1.0  # the output width decides
    with pytest.raises(HardwareInputError, match="gpu.gemm_unaligned_efficiency"):
        load_hardware("a100", ["gpu.gemm_unaligned_efficiency=1.5"])


def test_with_dispatch_overlap_a_layer_task_costs_the_larger_of_its_kernels_and_its_dispatch() -> None:
    """CUDA launches are asynchronous: the host's per-operator cost overlaps the kernels within a task."""
    from costs.compute import KernelCurves, matmul_seconds

    job, serial = _layer_records(["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s"])
    _, overlapped = _layer_records(["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s",
                                    "gpu.dispatch_overlap=true"])
    g = job.hw.gpu
    assert not g.dispatch_overlap and len(serial) == len(overlapped)
    for a, b in zip(serial, overlapped, strict=True):
        layer, phase = b.tags["layer"], b.tags["phase"]
        ops = layer_ops(job.model, job.config, layer, phase)
        kernels = (matmul_seconds(ops, job.hw.peak_flops_for("bf16"), KernelCurves.of(g), phase)
                   + ops.elementwise_bytes / 500e9)
        fixed = ops.n_ops * 10e-6
        assert a.end - a.start == pytest.approx(kernels + fixed, rel=1e-9)
        assert b.end - b.start == pytest.approx(max(kernels, fixed), rel=1e-9)
    with pytest.raises(HardwareInputError, match="gpu.dispatch_overlap"):
        load_hardware("a100", ["gpu.dispatch_overlap=3"])
    assert "dispatch_overlap" not in load_hardware("a100").to_dict()["gpu"]


def test_the_host_side_per_matmul_and_per_task_where_measured() -> None:
    """``gpu.gemm_op_overhead`` prices each matmul or attention operator's dispatch, ``gpu.op_overhead`` the
    others, and ``gpu.task_overhead`` is added once per task (outside the overlap); each engine task of a real
    layer costs exactly that."""
    from costs.compute import KernelCurves, dispatch_seconds, matmul_seconds

    base = ["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s", "gpu.dispatch_overlap=true"]
    job, recs = _layer_records([*base, "gpu.gemm_op_overhead=70us", "gpu.task_overhead=300us"])
    g = job.hw.gpu
    assert (g.gemm_op_overhead_s, g.task_overhead_s) == (pytest.approx(70e-6), pytest.approx(300e-6))
    seen_host_bound = False
    for r in recs:
        layer, phase = r.tags["layer"], r.tags["phase"]
        ops = layer_ops(job.model, job.config, layer, phase)
        n_mm = len(ops.matmul_flops)
        host = n_mm * 70e-6 + (ops.n_ops - n_mm) * 10e-6
        assert dispatch_seconds(job.hw, ops) == pytest.approx(host, rel=1e-12)
        kernels = (matmul_seconds(ops, job.hw.peak_flops_for("bf16"), KernelCurves.of(g), phase)
                   + ops.elementwise_bytes / 500e9)
        seen_host_bound |= host > kernels
        assert r.end - r.start == pytest.approx(max(kernels, host) + 300e-6, rel=1e-9)
    assert seen_host_bound
    # absent: every operator at op_overhead and no task cost (the specs written before these fields)
    _, plain = _layer_records(base)
    for r in plain:
        ops = layer_ops(job.model, job.config, r.tags["layer"], r.tags["phase"])
        assert dispatch_seconds(load_hardware("a100", base), ops) == pytest.approx(ops.n_ops * 10e-6, rel=1e-12)
    # validated, optional, and written back only where set
    for name in ("gemm_op_overhead", "task_overhead"):
        with pytest.raises(HardwareInputError, match=f"gpu.{name}"):
            load_hardware("a100", [f"gpu.{name}=-1us"])
        assert name not in load_hardware("a100").to_dict()["gpu"]
    d = load_hardware("a100", ["gpu.gemm_op_overhead=70us", "gpu.task_overhead=0.3ms"]).to_dict()["gpu"]
    assert (d["gemm_op_overhead"], d["task_overhead"]) == (pytest.approx(70e-6), pytest.approx(300e-6))
