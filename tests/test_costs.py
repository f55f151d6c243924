"""The pure pricing layer ``costs``: exact figures on small topologies, max-min laws, and the engine's charge.

Topologies come from ``engine_helpers`` (sizes in GB, bandwidths in GB/s), so every expected figure can be
worked out by hand. The last section runs one task alone through the engine and checks that the engine
charges exactly what the ``costs`` function says.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from engine_helpers import GB, both_ways, compute, copy, link, one_link, plan, ring, run, switched, topology
from hypothesis import given, settings
from hypothesis import strategies as st

import costs
from costs import (
    CPU_ADAM,
    RouteResources,
    RouteTable,
    both_ways_bw,
    both_ways_transfer_rate,
    bottleneck_share,
    busy_seconds,
    compute_seconds,
    copy_resource_bytes,
    copy_seconds,
    cpu_adam_seconds,
    gpu_optimizer_seconds,
    kernel_seconds,
    link_capacities,
    machine_capacities,
    max_min_rates,
    resource_load,
    route_resources,
    slowest_transfer_rate,
    solo_rate,
    transfer_rates,
    usage,
)
from hardware_models import build_topology, list_presets, load_hardware
from simulator import TaskSpec
from simulator.phase import Phase
from simulator.plan_workload import PlanWorkload
from workloads import WorkloadConfig, load_model
from workloads.ops import layer_ops


def _gb(xs: list[float]) -> list[float]:
    return [round(x / GB, 9) for x in xs]


# -- layering -------------------------------------------------------------------------------------------------------
def test_costs_imports_no_simpy_nor_any_layer_above_it() -> None:
    import subprocess

    code = ("import sys, costs; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'simpy', 'simulator', 'policies', 'planner', 'reports', 'replay', 'tiersim'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- routes and capacities ------------------------------------------------------------------------------------------
def test_route_resources_name_each_direction_and_the_duplex_budget() -> None:
    topo = topology({"gpu0": 80.0, "cpu": 1000.0}, [link("l", 10, duplex=15, latency=1e-3), link("m", 20)],
                    both_ways({("cpu", "gpu0"): [("m", True), ("l", True)]}))
    assert route_resources(topo, "cpu", "gpu0") == RouteResources(("m:fwd", "l:fwd", "l:duplex"), 1e-3, ("m", "l"))
    assert route_resources(topo, "gpu0", "cpu") == RouteResources(("l:rev", "l:duplex", "m:rev"), 1e-3, ("l", "m"))
    assert link_capacities(topo) == {"l:fwd": 10 * GB, "l:rev": 10 * GB, "l:duplex": 15 * GB,
                                     "m:fwd": 20 * GB, "m:rev": 20 * GB}
    routes = RouteTable(topo)
    assert routes("cpu", "gpu0") is routes("cpu", "gpu0")  # worked out once
    assert routes("cpu", "cpu") == RouteResources((), 0.0, ())


def test_both_ways_bandwidth_is_the_duplex_cap_or_the_sum_of_the_directions() -> None:
    assert both_ways_bw(link("l", 10, 4, duplex=12)) == 12 * GB
    assert both_ways_bw(link("l", 10, 4)) == 14 * GB


def test_machine_capacities_of_a_preset() -> None:
    spec = load_hardware("a100x8")
    topo = build_topology(spec)
    caps = machine_capacities(spec, topo)
    assert caps[CPU_ADAM] == spec.host.optimizer_params_per_s
    assert {caps[f"gpu{i}.sm"] for i in range(8)} == {1.0}
    assert caps["gpu0.pcie:duplex"] == spec.pcie.duplex_bw
    assert "host.cores" not in caps
    assert {k: v for k, v in caps.items() if ":" in k} == link_capacities(topo)


# -- shared rates ---------------------------------------------------------------------------------------------------
def test_two_gpus_uploading_over_one_switch_uplink_share_it() -> None:
    topo = switched(gpu_bw=(10.0, 10.0), uplink_bw=10.0)
    caps = link_capacities(topo)
    up = [("cpu", "gpu0"), ("cpu", "gpu1")]
    assert _gb(transfer_rates(topo, up, caps)) == [5.0, 5.0]
    assert _gb(transfer_rates(topo, up[:1], caps)) == [10.0]
    assert slowest_transfer_rate(topo, up, caps) == (5 * GB, 0.0)
    # the uplink carries both GPUs' bytes: 2 GB each -> 4 GB on up:fwd, 0.4 s of it
    load = resource_load(topo, [("cpu", g, 2 * GB) for g in ("gpu0", "gpu1")])
    assert load == {"up:fwd": 4 * GB, "g0:fwd": 2 * GB, "g1:fwd": 2 * GB}
    assert busy_seconds(load, caps) == {"up:fwd": 0.4, "g0:fwd": 0.2, "g1:fwd": 0.2}


def test_a_narrow_gpu_link_leaves_the_uplink_to_the_other_gpu() -> None:
    topo = switched(gpu_bw=(4.0, 10.0), uplink_bw=10.0)
    caps = link_capacities(topo)
    # gpu0 is held to 4 by its own link; max-min gives gpu1 the rest of the uplink
    assert _gb(transfer_rates(topo, [("cpu", "gpu0"), ("cpu", "gpu1")], caps)) == [4.0, 6.0]
    assert slowest_transfer_rate(topo, [("cpu", "gpu0"), ("cpu", "gpu1")], caps)[0] == 4 * GB
    # a pair that moves nothing gets inf and takes no share
    assert _gb(transfer_rates(topo, [("cpu", "cpu"), ("cpu", "gpu1")], caps))[1] == 10.0
    assert transfer_rates(topo, [("cpu", "cpu")], caps) == [float("inf")]
    assert slowest_transfer_rate(topo, [("gpu0", "gpu0")], caps) == (float("inf"), 0.0)


def test_uploads_and_downloads_share_a_duplex_cap() -> None:
    topo = one_link(bw=10.0, duplex=15.0)
    caps = link_capacities(topo)
    assert _gb(transfer_rates(topo, [("cpu", "gpu0"), ("gpu0", "cpu")], caps)) == [7.5, 7.5]
    assert _gb(transfer_rates(topo, [("cpu", "gpu0")], caps)) == [10.0]
    # asymmetric: the download is held to its 4 GB/s direction, the upload takes the duplex budget's rest (8)
    asym = topology({"gpu0": 80.0, "cpu": 1000.0}, [link("l", 10, 4, duplex=12)],
                    both_ways({("cpu", "gpu0"): [("l", True)]}))
    assert _gb(transfer_rates(asym, [("gpu0", "cpu"), ("cpu", "gpu0")], link_capacities(asym))) == [4.0, 8.0]


def test_both_ways_rate_is_the_duplex_budget_or_both_directions_split_among_users() -> None:
    up = [("cpu", "gpu0")]
    capped, full = one_link(10.0, duplex=15.0), one_link(10.0)
    assert both_ways_transfer_rate(capped, up, link_capacities(capped)) == 15 * GB
    assert both_ways_transfer_rate(full, up, link_capacities(full)) == 20 * GB
    # two GPUs swapping over one 10 GB/s uplink: each gets half of its 20 GB/s both ways
    topo = switched(gpu_bw=(10.0, 10.0), uplink_bw=10.0)
    assert both_ways_transfer_rate(topo, [("cpu", "gpu0"), ("cpu", "gpu1")], link_capacities(topo)) == 10 * GB


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_the_slowest_rate_is_the_smallest_max_min_rate(preset: str) -> None:
    topo = build_topology(load_hardware(preset))
    caps = link_capacities(topo)
    gpus = topo.gpu_locations()
    ring_pairs = [(g, gpus[(i + 1) % len(gpus)]) for i, g in enumerate(gpus)]
    for pairs in ([("cpu", g) for g in gpus], [(g, "cpu") for g in gpus], ring_pairs):
        rates = [x for x in transfer_rates(topo, pairs, caps) if x != float("inf")]
        slowest, lat = slowest_transfer_rate(topo, pairs, caps)
        assert slowest == pytest.approx(min(rates, default=float("inf")), rel=1e-12)
        assert lat == max((route_resources(topo, s, d).latency_s for s, d in pairs if s != d), default=0.0)


def test_a_resource_listed_twice_is_used_twice() -> None:
    assert usage(["a", "b", "a"]) == {"a": 2.0, "b": 1.0}
    assert usage(["a", "b", "a"], [1.0, 3.0, 0.5]) == {"a": 1.5, "b": 3.0}
    # gpu0 -> gpu1 bounced through the root port crosses the uplink's duplex budget going up and coming down
    bounce = topology({"gpu0": 80.0, "gpu1": 80.0, "cpu": 1000.0},
                      [link("g0", 10), link("g1", 10), link("up", 10, duplex=15)],
                      {("gpu0", "gpu1"): (("g0", False), ("up", False), ("up", True), ("g1", True))})
    rt = route_resources(bounce, "gpu0", "gpu1")
    assert copy_resource_bytes(rt, 3 * GB)["up:duplex"] == 6 * GB
    assert copy_seconds(rt, 3 * GB, link_capacities(bounce)) == pytest.approx(3 / 7.5)


def test_copy_seconds_alone() -> None:
    topo = one_link(bw=10.0, latency=2e-3)
    rt = route_resources(topo, "cpu", "gpu0")
    assert copy_seconds(rt, 5 * GB, link_capacities(topo)) == pytest.approx(0.5 + 2e-3)
    assert copy_seconds(rt, 0.0, link_capacities(topo)) == 0.0
    assert copy_resource_bytes(rt, 5 * GB) == {"l:fwd": 5 * GB}


# -- ring collectives -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("coll", "per_rank_gb", "steps"), [("all_gather", 6.0, 3), ("reduce_scatter", 6.0, 3),
                                                            ("all_reduce", 12.0, 6)])
def test_ring_over_four_gpus(coll: str, per_rank_gb: float, steps: int) -> None:
    topo = ring(4, 100.0, latency=1e-3)
    rg = costs.ring(RouteTable(topo), ["gpu0", "gpu1", "gpu2", "gpu3"], 8 * GB, coll)
    assert rg.per_rank == pytest.approx(per_rank_gb * GB) and rg.steps == steps
    assert rg.latency_s == pytest.approx(2e-3 * steps)  # two hops of 1 ms per ring step
    assert rg.links == ("nv0", "nv1", "nv2", "nv3")
    # every link direction carries one hop's bytes
    assert rg.resource_bytes() == {f"nv{i}:{d}": pytest.approx(per_rank_gb * GB) for i in range(4)
                                   for d in ("fwd", "rev")}
    assert rg.seconds(link_capacities(topo)) == pytest.approx(per_rank_gb / 100 + 2e-3 * steps)
    assert costs.ring_seconds(RouteTable(topo), ["gpu0", "gpu1", "gpu2", "gpu3"], 8 * GB, coll,
                              link_capacities(topo)) == rg.seconds(link_capacities(topo))


def test_a_ring_of_one_rank_moves_nothing() -> None:
    rg = costs.ring(RouteTable(ring(4, 100.0)), ["gpu0"], 8 * GB, "all_reduce")
    assert rg.hops == () and rg.per_rank == 0.0 and rg.seconds({}) == 0.0 and rg.resource_bytes() == {}


def test_a_ring_crossing_one_uplink_twice_is_held_by_it() -> None:
    # two GPUs under one switch, no p2p: each hop bounces through the uplink (both directions, twice each)
    topo = topology({"gpu0": 80.0, "gpu1": 80.0, "cpu": 1000.0},
                    [link("g0", 10), link("g1", 10), link("up", 10)],
                    {("gpu0", "gpu1"): (("g0", False), ("up", False), ("up", True), ("g1", True)),
                     ("gpu1", "gpu0"): (("g1", False), ("up", False), ("up", True), ("g0", True))})
    rg = costs.ring(RouteTable(topo), ["gpu0", "gpu1"], 4 * GB, "all_gather")
    assert rg.per_rank == 2 * GB
    assert rg.resource_bytes()["up:fwd"] == 4 * GB
    assert rg.seconds(link_capacities(topo)) == pytest.approx(0.4)  # 2 GB at 10 GB/s / 2 hops on up


# -- compute and optimizer ------------------------------------------------------------------------------------------
def test_compute_seconds_roofline() -> None:
    spec = load_hardware("a100")
    assert compute_seconds(spec, 0.0, 2039 * GB, "bf16") == pytest.approx(1.0)  # HBM-bound: 2039 GB at 2039 GB/s
    flops = 1e14
    want = flops / (spec.peak_flops_for("bf16") * spec.gpu.gemm_efficiency(flops))
    assert compute_seconds(spec, flops, 0.0, "bf16") == want
    assert kernel_seconds(spec, flops, 0.0, "bf16") == want + spec.gpu.launch_overhead_s
    assert compute_seconds(spec, 0.0, 0.0, "bf16") == 0.0


def test_optimizer_seconds() -> None:
    spec = load_hardware("a100")
    assert spec.gpu.optimizer_bytes_per_param == 36
    assert gpu_optimizer_seconds(spec, 2039e9 / 36) == pytest.approx(1.0 + spec.gpu.launch_overhead_s)
    rate = spec.host.optimizer_params_per_s
    assert cpu_adam_seconds(spec, rate) == pytest.approx(1.0)
    assert cpu_adam_seconds(spec, rate, ranks=8) == pytest.approx(8.0)  # eight ranks share the host's rate


def test_operator_level_pricing_needs_the_op_overhead_and_a_known_layer() -> None:
    spec = load_hardware("a100", ["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s"])
    model, config = load_model("gpt2"), WorkloadConfig(micro_batch=2, seq_len=256)
    ops = layer_ops(model, config, 1, "fwd")
    pricer = costs.ComputePricer(spec, "bf16", (model, config))
    assert pricer.seconds(ops.flops, 0.0, 1, "fwd") == costs.ops_seconds(spec, ops, "bf16")
    # a task of no known layer keeps the roofline; hardware without op_overhead prices the layer's matmul
    # kernels on the curve (each at its own size) plus one launch overhead
    assert pricer.seconds(ops.flops, 0.0, None, "fwd") == kernel_seconds(spec, ops.flops, 0.0, "bf16")
    a100 = load_hardware("a100")
    plain = costs.ComputePricer(a100, "bf16", (model, config))
    # (the A100 preset prices the element-wise bytes apart: gpu.elementwise_efficiency x gpu.hbm_bw)
    ew = ops.elementwise_bytes / (a100.gpu.elementwise_efficiency * a100.gpu.hbm_bw)
    kernels = costs.gemm_kernels_seconds(a100, ops, "bf16") + ew + a100.gpu.launch_overhead_s
    assert plain.seconds(ops.flops, 0.0, 1, "fwd") == kernels
    assert kernels > kernel_seconds(a100, ops.flops, 0.0, "bf16")  # smaller kernels, lower efficiency
    # the task's HBM traffic stays a floor
    assert pricer.seconds(ops.flops, 2039 * GB, 1, "fwd") == pytest.approx(1.0)


# -- max-min laws ---------------------------------------------------------------------------------------------------
RESOURCES = ("a", "b", "c", "d", "e")


@st.composite
def networks(draw: st.DrawFn) -> tuple[dict[str, float], list[dict[str, float]]]:
    caps = {r: draw(st.floats(0.5, 100.0)) for r in RESOURCES}
    flow = st.dictionaries(st.sampled_from(RESOURCES), st.sampled_from([1.0, 2.0, 0.5, 3.0]), min_size=1)
    return caps, draw(st.lists(flow, min_size=1, max_size=8))


@settings(max_examples=200, deadline=None)
@given(networks())
def test_max_min_rates_are_feasible_and_every_flow_has_a_bottleneck(
        net: tuple[dict[str, float], list[dict[str, float]]]) -> None:
    caps, flows = net
    rates = max_min_rates(flows, caps)
    assert len(rates) == len(flows) and all(x > 0 for x in rates)
    load = dict.fromkeys(RESOURCES, 0.0)
    for f, x in zip(flows, rates, strict=True):
        for r, w in f.items():
            load[r] += x * w
    tol = 1e-9
    for r in RESOURCES:  # feasible: no resource over its capacity
        assert load[r] <= caps[r] * (1 + tol)
    for f, x in zip(flows, rates, strict=True):
        # bottlenecked: some resource of the flow is saturated and no flow on it runs faster
        assert any(load[r] >= caps[r] * (1 - tol)
                   and all(y <= x * (1 + tol) for g, y in zip(flows, rates, strict=True) if r in g)
                   for r in f), (f, x)
    assert min(rates) == pytest.approx(bottleneck_share(flows, caps), rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(networks())
def test_a_lone_flow_gets_its_narrowest_resource(net: tuple[dict[str, float], list[dict[str, float]]]) -> None:
    caps, flows = net
    assert max_min_rates(flows[:1], caps) == [solo_rate(flows[0], caps)]


# -- the engine charges what costs says -----------------------------------------------------------------------------
def _lone(task: TaskSpec, streams: list[tuple[str, str, str]], topo, spec=None) -> float:  # type: ignore[no-untyped-def]
    res = run(plan([task], streams), topo, spec)
    (rec,) = res.records
    return rec.end - rec.start


@pytest.mark.parametrize(("src", "dst"), [("cpu", "gpu0"), ("gpu3", "cpu"), ("gpu0", "gpu5"), ("gpu2", "nvme")])
def test_the_engine_charges_a_lone_copy_its_copy_seconds(src: str, dst: str) -> None:
    spec = load_hardware("a100x8")
    topo = build_topology(spec)
    dev = src if src.startswith("gpu") else dst
    got = _lone(copy("x", f"{dev}.c", src, dst, 3.0), [(f"{dev}.c", dev, "copy")], topo, spec)
    want = copy_seconds(route_resources(topo, src, dst), 3 * GB, machine_capacities(spec, topo))
    assert got == pytest.approx(want, rel=1e-12)


def test_the_engine_charges_a_bounced_copy_twice_on_the_duplex_budget_it_crosses_twice() -> None:
    bounce = topology({"gpu0": 80.0, "gpu1": 80.0, "cpu": 1000.0},
                      [link("g0", 10), link("g1", 10), link("up", 10, duplex=15)],
                      {("gpu0", "gpu1"): (("g0", False), ("up", False), ("up", True), ("g1", True))})
    got = _lone(copy("x", "gpu0.c", "gpu0", "gpu1", 3.0), [("gpu0.c", "gpu0", "copy")], bounce)
    assert got == pytest.approx(3 / 7.5, rel=1e-12)


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter"])
def test_the_engine_charges_a_lone_collective_its_ring_seconds(coll: str) -> None:
    spec = load_hardware("a100x8")
    topo = build_topology(spec)
    ranks = tuple(f"gpu{i}" for i in range(8))
    t = TaskSpec("x", "collective", "gpu0.comm", bytes=5 * GB, coll=coll, ranks=ranks)
    got = _lone(t, [("gpu0.comm", "gpu0", "comm")], topo, spec)
    want = costs.ring_seconds(RouteTable(topo), ranks, 5 * GB, coll, machine_capacities(spec, topo))
    assert got == pytest.approx(want, rel=1e-12)


def test_the_engine_charges_a_lone_compute_and_optimizer_their_seconds() -> None:
    spec = load_hardware("a100")
    topo = build_topology(spec)
    comp = [("gpu0.compute", "gpu0", "compute")]
    assert _lone(compute("c", "gpu0.compute", 3e13, hbm_gb=5.0), comp, topo, spec) == pytest.approx(
        kernel_seconds(spec, 3e13, 5 * GB, "bf16"), rel=1e-12)
    assert _lone(TaskSpec("o", "optimizer", "gpu0.compute", params=1e9), comp, topo, spec) == pytest.approx(
        gpu_optimizer_seconds(spec, 1e9), rel=1e-12)
    assert _lone(TaskSpec("o", "optimizer", "cpu.optim", params=1e9), [("cpu.optim", "cpu", "optim")],
                 topo, spec) == pytest.approx(cpu_adam_seconds(spec, 1e9), rel=1e-12)


def test_the_engine_charges_operator_level_compute_what_the_pricer_says() -> None:
    spec = load_hardware("a100", ["gpu.op_overhead=10us", "gpu.elementwise_bw=500GB/s"])
    model, config = load_model("gpt2"), WorkloadConfig(micro_batch=2, seq_len=256)
    ops = layer_ops(model, config, 3, "bwd")
    p = plan([compute("c", "gpu0.compute", ops.flops, tags={"layer": 3, "phase": Phase.BWD})],
             [("gpu0.compute", "gpu0", "compute")])
    p = replace(p, workload=PlanWorkload(model, config, "test: one layer's backward"))
    (rec,) = run(p, build_topology(spec), spec).records
    want = costs.ComputePricer(spec, "bf16", (model, config)).seconds(ops.flops, 0.0, 3, "bwd")
    assert want == costs.ops_seconds(spec, ops, "bf16")
    assert rec.end - rec.start == pytest.approx(want, rel=1e-12)


def test_the_engine_runs_concurrent_uploads_at_their_transfer_rates() -> None:
    # gpu0 and gpu1 share one switch uplink on a100x8: both start together and each runs at its max-min rate
    spec = load_hardware("a100x8")
    topo = build_topology(spec)
    pairs = [("cpu", "gpu0"), ("cpu", "gpu1")]
    p = plan([copy(f"u{i}", f"gpu{i}.h2d", "cpu", f"gpu{i}", 2.0) for i in range(2)],
             [(f"gpu{i}.h2d", f"gpu{i}", "h2d") for i in range(2)])
    res = run(p, topo, spec)
    rates = transfer_rates(topo, pairs, machine_capacities(spec, topo))
    assert rates[0] == rates[1] < spec.pcie.per_direction_bw  # the uplink, not the GPU's own link, holds them
    lat = route_resources(topo, "cpu", "gpu0").latency_s
    for rec, rate in zip(sorted(res.records, key=lambda r: r.id), rates, strict=True):
        assert rec.end - rec.start == pytest.approx(lat + 2 * GB / rate, rel=1e-12)


def test_max_min_rates_ends_when_rounding_leaves_a_done_resource_a_count() -> None:
    """Weights of bytes/s (~3e10) leave a rounding residue in a saturated resource's count once its flows are
    frozen; the progressive filling must not pick that resource again (it froze nothing, for ever: a
    validation case hung here). The case the hang was caught in: compute beside three PCIe copies on 2 cores."""
    from costs.rates import max_min_rates

    w = 29518070398.828526
    flows = [{"gpu0.sm": 1.0, "host.cores": 1.0},
             {"gpu0.pcie:fwd": w, "gpu0.pcie:duplex": w, "host.cores": 1.0},
             {"gpu0.pcie:rev": w, "gpu0.pcie:duplex": w, "host.cores": 1.0},
             {"gpu0.pcie:fwd": w, "gpu0.pcie:duplex": w, "host.cores": 1.0}]
    cap = {"gpu0.pcie:fwd": w, "gpu0.pcie:rev": w, "gpu0.pcie:duplex": 39874359876.116875, "gpu0.sm": 1.0,
           "host.cores": 2.0}
    rates = max_min_rates(flows, cap)
    copy = 39874359876.116875 / (3 * w)  # the duplex budget shared by the three copies
    assert rates[1:] == pytest.approx([copy] * 3, rel=1e-12)
    assert rates[0] == pytest.approx(min(1.0, 2.0 - 3 * copy), rel=1e-12)
