"""Exact event logs of tiny scenarios (SimPy's own testing style): every time is worked out by hand.

Links are hand-made with round bandwidths (GB/s) and no latency unless a test says otherwise; the GPU's
launch overhead is zeroed; compute durations come from ``compute_seconds`` (the roofline).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_helpers import (
    GB,
    compute,
    copy,
    hw,
    log,
    noop,
    one_link,
    place,
    plan,
    rates,
    refs,
    ring,
    run,
    switched,
    tensor,
)

from costs import compute_seconds
from simulator import Plan, Segment, TaskSpec
from simulator.invariants import check_invariants
from simulator.simulate import EXPLICIT_MAX, simulate_plan

H2D = ("gpu0.h2d", "gpu0", "h2d")
D2H = ("gpu0.d2h", "gpu0", "d2h")
CP = ("gpu0.copy", "gpu0", "copy")
COMP = ("gpu0.compute", "gpu0", "compute")
COMP2 = ("gpu0.compute2", "gpu0", "compute")

# compute durations on an A100 (bf16), from the roofline the engine uses
T_BIG = compute_seconds(hw(), 1e14, 0.0, "bf16")      # ~0.416 s
T_SMALL = compute_seconds(hw(), 2e13, 0.0, "bf16")    # ~0.083 s
T_HBM = compute_seconds(hw(), 0.0, 2039 * GB, "bf16")  # 1.0 s: 2039 GB at 2039 GB/s


def r9(x: float) -> float:
    return round(x, 9)


# -- (a) flows sharing one link --------------------------------------------------------------------------------------
def test_two_flows_share_one_link_max_min_fair() -> None:
    p = plan([copy("a", "gpu0.h2d", "cpu", "gpu0", 10), copy("b", "gpu0.copy", "cpu", "gpu0", 5)], [H2D, CP])
    res = run(p, one_link(10))
    # both at 5 GB/s until b (5 GB) ends at 1.0; a has 5 GB left, alone at 10 GB/s: 0.5 s more
    assert log(res) == [("b", 0, 1.0), ("a", 0, 1.5)]
    assert res.step_time_s == pytest.approx(1.5, rel=1e-12)
    assert res.link_bytes == {"l": 15 * GB}
    assert res.link_busy_s == {"l": pytest.approx(1.5, rel=1e-12)}
    assert rates(res, "l:fwd") == [(0, 10.0), (1.5, 0.0)]
    assert rates(res, "l:rev") in ([], [(0, 0.0)])


def test_a_flow_joining_later_takes_its_share_from_then_on() -> None:
    # a: 10 GB from 0; b (4 GB) starts when the 0.5 s compute ends: a has 5 GB done by then
    p = plan([copy("a", "gpu0.h2d", "cpu", "gpu0", 10), compute("c", "gpu0.compute", hbm_gb=2039 / 2),
              copy("b", "gpu0.copy", "cpu", "gpu0", 4, deps=["c"])], [H2D, CP, COMP])
    res = run(p, one_link(10))
    # 0.5..1.3: 5 GB/s each, b's 4 GB end at 1.3 (a: 4 of its last 5 GB); a's last 1 GB alone: 1.4
    assert log(res) == [("c", 0, 0.5), ("b", 0.5, 1.3), ("a", 0, 1.4)]


def test_latency_is_paid_before_the_flow_starts() -> None:
    p = plan([copy("a", "gpu0.h2d", "cpu", "gpu0", 10), copy("b", "gpu0.copy", "cpu", "gpu0", 5)], [H2D, CP])
    res = run(p, one_link(10, latency=0.25))
    assert log(res) == [("b", 0, 1.25), ("a", 0, 1.75)]


# -- (b) a shared uplink ---------------------------------------------------------------------------------------------
def test_one_gpu_alone_gets_the_full_uplink() -> None:
    p = plan([copy("x0", "gpu0.d2h", "gpu0", "cpu", 10)], [D2H])
    res = run(p, switched())
    assert log(res) == [("x0", 0, 1.0)]
    assert res.link_bytes == {"g0": 10 * GB, "up": 10 * GB}


def test_two_gpus_behind_one_switch_halve_the_uplink() -> None:
    p = plan([copy("x0", "gpu0.d2h", "gpu0", "cpu", 10), copy("x1", "gpu1.d2h", "gpu1", "cpu", 10)],
             [D2H, ("gpu1.d2h", "gpu1", "d2h")])
    res = run(p, switched())
    assert log(res) == [("x0", 0, 2.0), ("x1", 0, 2.0)]
    assert res.link_bytes == {"g0": 10 * GB, "g1": 10 * GB, "up": 20 * GB}


def test_max_min_fairness_across_the_whole_path() -> None:
    # g0 = 6 GB/s carries A (gpu0 -> cpu) and C (gpu0 -> gpu1): 3 each. The uplink (10) carries A and B:
    # A is held to 3 by g0, so B gets the 7 left, not a 5/5 split of the uplink.
    p = plan([copy("A", "gpu0.d2h", "gpu0", "cpu", 3), copy("B", "gpu1.d2h", "gpu1", "cpu", 14),
              copy("C", "gpu0.p2p", "gpu0", "gpu1", 6)],
             [D2H, ("gpu1.d2h", "gpu1", "d2h"), ("gpu0.p2p", "gpu0", "copy")])
    res = run(p, switched(gpu_bw=(6.0, 10.0), uplink_bw=10.0))
    # t=1: A done (3 GB); C has 3 GB left, alone on g0 at 6 GB/s -> 1.5; B has 7 GB left at 10 GB/s -> 1.7
    assert log(res) == [("A", 0, 1.0), ("C", 0, 1.5), ("B", 0, 1.7)]
    assert rates(res, "up:rev") == [(0, 10.0), (1.7, 0.0)]  # the uplink stays saturated: A's 3 + B's 7, then B's 10
    assert rates(res, "g1:fwd") == [(0, 3.0), (1.0, 6.0), (1.5, 0.0)]


# -- (c) duplex budget -----------------------------------------------------------------------------------------------
def test_h2d_and_d2h_share_a_duplex_budget() -> None:
    p = plan([copy("h", "gpu0.h2d", "cpu", "gpu0", 7), copy("d", "gpu0.d2h", "gpu0", "cpu", 14)], [H2D, D2H])
    res = run(p, one_link(10, duplex=14))
    # 14 GB/s together -> 7 each; h ends at 1.0, then d alone gets 10 (its direction's cap) for 7 GB
    assert log(res) == [("h", 0, 1.0), ("d", 0, 1.7)]
    assert rates(res, "l:duplex") == [(0, 14.0), (1.0, 10.0), (1.7, 0.0)]


def test_without_a_duplex_budget_each_direction_runs_at_full_rate() -> None:
    p = plan([copy("h", "gpu0.h2d", "cpu", "gpu0", 7), copy("d", "gpu0.d2h", "gpu0", "cpu", 14)], [H2D, D2H])
    res = run(p, one_link(10))
    assert log(res) == [("h", 0, 0.7), ("d", 0, 1.4)]
    assert "l:duplex" not in res.link_rate_log


def test_one_direction_alone_is_capped_by_its_own_bandwidth_not_the_duplex_budget() -> None:
    p = plan([copy("h", "gpu0.h2d", "cpu", "gpu0", 10)], [H2D])
    assert log(run(p, one_link(10, duplex=14))) == [("h", 0, 1.0)]


# -- (d) streams: overlap, dependencies, order -----------------------------------------------------------------------
def test_compute_and_copy_overlap_on_separate_streams() -> None:
    p = plan([copy("h", "gpu0.h2d", "cpu", "gpu0", 10), compute("c", "gpu0.compute", 1e14)], [H2D, COMP])
    res = run(p, one_link(10))
    assert log(res) == [("c", 0, r9(T_BIG)), ("h", 0, 1.0)]
    assert res.step_time_s == pytest.approx(1.0, rel=1e-12)
    assert res.compute_busy_s == pytest.approx(T_BIG, rel=1e-12)
    assert res.exposed_transfer_s == pytest.approx(1.0 - T_BIG, rel=1e-9)


def test_a_dependent_task_starts_exactly_when_its_dependency_ends() -> None:
    p = plan([copy("h", "gpu0.h2d", "cpu", "gpu0", 10),
              compute("c0", "gpu0.compute", 1e14),
              compute("c1", "gpu0.compute", 2e13, deps=["h"]),
              copy("d", "gpu0.d2h", "gpu0", "cpu", 10, deps=["c1"])], [H2D, COMP, D2H])
    res = run(p, one_link(10))
    assert log(res) == [("c0", 0, r9(T_BIG)), ("h", 0, 1.0), ("c1", 1.0, r9(1.0 + T_SMALL)),
                        ("d", r9(1.0 + T_SMALL), r9(2.0 + T_SMALL))]


def test_tasks_of_one_stream_run_in_order() -> None:
    # c1 has no dependency but waits for c0 on its stream; the copies queue on the same h2d stream
    p = plan([compute("c0", "gpu0.compute", 1e14), compute("c1", "gpu0.compute", 2e13),
              copy("h0", "gpu0.h2d", "cpu", "gpu0", 5), copy("h1", "gpu0.h2d", "cpu", "gpu0", 5)], [H2D, COMP])
    res = run(p, one_link(10))
    want = [("h0", 0, 0.5), ("c0", 0, r9(T_BIG)), ("c1", r9(T_BIG), r9(T_BIG + T_SMALL)), ("h1", 0.5, 1.0)]
    assert log(res) == sorted(want, key=lambda x: (x[2], x[1], x[0]))


def test_kernels_of_two_streams_share_the_gpu() -> None:
    p = plan([compute("a", "gpu0.compute", hbm_gb=2039), compute("b", "gpu0.compute2", hbm_gb=2039 / 2)],
             [COMP, COMP2])
    res = run(p, one_link(10))
    # processor sharing of the SMs: both at half speed until b's 0.5 s of work is done at 1.0
    assert pytest.approx(1.0, rel=1e-12) == T_HBM
    assert log(res) == [("b", 0, 1.0), ("a", 0, 1.5)]


def test_the_launch_overhead_is_added_to_each_kernel() -> None:
    spec = replace(hw(), gpu=replace(hw().gpu, launch_overhead_s=0.125))
    p = plan([compute("a", "gpu0.compute", hbm_gb=2039), compute("b", "gpu0.compute", hbm_gb=2039, deps=["a"])],
             [COMP])
    assert log(run(p, one_link(10), spec)) == [("a", 0, 1.125), ("b", 1.125, 2.25)]


# -- (e) OOM in the middle of a step ---------------------------------------------------------------------------------
def test_oom_is_a_verdict_with_its_context_and_the_run_completes() -> None:
    tasks = [copy("w1", "gpu0.h2d", "cpu", "gpu0", 10),
             noop("a1", "gpu0.h2d", allocs=(place("t1", "gpu0"),)),
             copy("w2", "gpu0.h2d", "cpu", "gpu0", 10),
             noop("a2", "gpu0.h2d", allocs=(place("t2", "gpu0"),)),
             copy("w3", "gpu0.h2d", "cpu", "gpu0", 10),
             noop("f", "gpu0.h2d", frees=(place("t1", "gpu0"), place("t2", "gpu0")))]
    p = plan(tasks, [H2D], tensors=[tensor("t1", 6), tensor("t2", 6)])
    res = run(p, one_link(10, gpu_gb=10))
    assert log(res) == [("w1", 0, 1.0), ("a1", 1.0, 1.0), ("w2", 1.0, 2.0), ("a2", 2.0, 2.0),
                        ("w3", 2.0, 3.0), ("f", 3.0, 3.0)]
    assert res.feasible is False
    oom = res.oom
    assert oom is not None
    assert (oom.pool, oom.time_s, oom.task, oom.tensor) == ("gpu0", 2.0, "a2[s0.0]", "t2")
    assert (oom.requested_bytes, oom.free_bytes, oom.capacity_bytes) == (6e9, 4e9, 10e9)
    assert (oom.total_demand_bytes, oom.over_by_bytes) == (12e9, 2e9)
    assert res.ooms == (oom,)
    assert res.peak_bytes["gpu0"] == 12e9
    assert res.to_dict()["oom"]["over_by_bytes"] == 2e9
    assert res.step_time_s == 3.0  # the run went on past the OOM
    assert res.leaked == ()


def test_an_allocation_that_fits_exactly_is_not_an_oom() -> None:
    p = plan([noop("a", "gpu0.h2d", allocs=(place("t1", "gpu0"), place("t2", "gpu0"))),
              noop("f", "gpu0.h2d", frees=(place("t1", "gpu0"), place("t2", "gpu0")))],
             [H2D], tensors=[tensor("t1", 6), tensor("t2", 4)])
    res = run(p, one_link(10, gpu_gb=10))
    assert res.feasible is True and res.oom is None
    assert res.peak_bytes["gpu0"] == 10e9


# -- (f) collectives -------------------------------------------------------------------------------------------------
RANKS = ("gpu0", "gpu1", "gpu2", "gpu3")
COMM = [(f"{g}.comm", g, "comm") for g in RANKS]


def _collective(coll: str, gbytes: float) -> TaskSpec:
    return TaskSpec("x", "collective", "gpu0.comm", bytes=gbytes * GB, coll=coll, ranks=RANKS)


@pytest.mark.parametrize(("coll", "seconds"), [("all_gather", 0.06), ("reduce_scatter", 0.06),
                                                ("all_reduce", 0.12)])
def test_ring_collective_over_four_gpus(coll: str, seconds: float) -> None:
    # ring: every rank sends (n-1)/n of the bytes to its neighbour (twice for all-reduce): 3/4 * 8 GB / 100 GB/s
    res = run(plan([_collective(coll, 8)], COMM), ring(4, 100))
    assert log(res) == [("x", 0, seconds)]
    per_rank = 0.75 * 8 * GB * (2 if coll == "all_reduce" else 1)
    # each rank's link sends per_rank to its right and receives per_rank from its left
    assert res.link_bytes == {f"nv{i}": pytest.approx(2 * per_rank, rel=1e-12) for i in range(4)}
    assert res.records[0].bytes == pytest.approx(4 * per_rank, rel=1e-12)


def test_ring_collective_pays_a_latency_per_ring_step() -> None:
    # route latency = 2 hops x 1 ms; all-gather has n-1 = 3 ring steps, all-reduce 6
    res = run(plan([_collective("all_gather", 8), replace(_collective("all_reduce", 8), id="y", deps=())],
                   COMM), ring(4, 100, latency=1e-3))
    assert log(res) == [("x", 0, 0.066), ("y", 0.066, 0.198)]


def test_a_collective_of_one_rank_moves_nothing() -> None:
    t = TaskSpec("x", "collective", "gpu0.comm", bytes=8 * GB, coll="all_reduce", ranks=("gpu0",))
    res = run(plan([t], COMM[:1]), ring(4, 100))
    assert log(res) == [("x", 0, 0)]
    assert res.link_bytes == {}


# -- (g) CPU optimizer -----------------------------------------------------------------------------------------------
def test_cpu_optimizer_tasks_of_two_streams_share_cpu_adam() -> None:
    spec = hw(optimizer_params_per_s=1e9)
    p = plan([TaskSpec("o0", "optimizer", "cpu.optim0", params=1e9),
              TaskSpec("o1", "optimizer", "cpu.optim1", params=2e9)],
             [("cpu.optim0", "cpu", "optim"), ("cpu.optim1", "cpu", "optim")])
    res = run(p, one_link(10), spec)
    # 0.5e9 params/s each until o0 is done at 2.0; o1's last 1e9 params alone at 1e9/s
    assert log(res) == [("o0", 0, 2.0), ("o1", 0, 3.0)]


def test_gpu_optimizer_is_hbm_bound() -> None:
    spec = hw()
    p = plan([TaskSpec("o", "optimizer", "gpu0.compute", params=2039e9 / 36)], [COMP])
    assert spec.gpu.optimizer_bytes_per_param == 36
    assert log(run(p, one_link(10), spec)) == [("o", 0, 1.0)]


# -- (h) repeated segments and the dependency syntax -----------------------------------------------------------------
def _prefetch_plan(back: int) -> list[tuple[str, float, float]]:
    # h (1 GB at 1 GB/s, 1 s) prefetches what c (2 s) needs; h may run at most `back` iterations ahead of c
    seg = [copy("h", "gpu0.h2d", "cpu", "gpu0", 1, deps=[f"c@{back}"]),
           compute("c", "gpu0.compute", hbm_gb=2 * 2039, deps=["h"])]
    p = plan([], [H2D, COMP], segments=[("micro", 3, seg)])
    return log(run(p, one_link(1)), uid=True)


def test_at_k_waits_for_k_iterations_back() -> None:
    # c@1: the next prefetch waits for the previous compute: fully serial
    assert _prefetch_plan(1) == [("h[s0.0]", 0, 1.0), ("c[s0.0]", 1.0, 3.0), ("h[s0.1]", 3.0, 4.0),
                                 ("c[s0.1]", 4.0, 6.0), ("h[s0.2]", 6.0, 7.0), ("c[s0.2]", 7.0, 9.0)]
    # c@2: double buffering, h1 runs during c0; h2 waits for c0 to end
    assert _prefetch_plan(2) == [("h[s0.0]", 0, 1.0), ("h[s0.1]", 1.0, 2.0), ("c[s0.0]", 1.0, 3.0),
                                 ("h[s0.2]", 3.0, 4.0), ("c[s0.1]", 3.0, 5.0), ("c[s0.2]", 5.0, 7.0)]


def test_caret_k_waits_for_the_last_iteration_k_steps_back_and_plain_names_the_last_iteration() -> None:
    # micro (x2): g on the copy stream; upd (once): u after the *last* g of this step;
    # the next step's first g waits for the previous step's u ("u^1", dropped in step 0)
    micro = [copy("g", "gpu0.d2h", "gpu0", "cpu", 1, deps=["u^1"])]
    upd = [compute("u", "gpu0.compute", hbm_gb=2039, deps=["g"])]
    p = plan([], [D2H, COMP], segments=[("micro", 2, micro), ("upd", 1, upd)], steps=2)
    res = run(p, one_link(1), extrapolate=False)  # every iteration of the warm-up step too
    assert log(res, uid=True) == [("g[s0.0]", 0, 1.0), ("g[s0.1]", 1.0, 2.0), ("u[s0.0]", 2.0, 3.0),
                                  ("g[s1.0]", 3.0, 4.0), ("g[s1.1]", 4.0, 5.0), ("u[s1.0]", 5.0, 6.0)]
    assert res.step_time_s == 3.0 and res.window == (3.0, 6.0)


def test_at_k_crosses_into_the_previous_step() -> None:
    # c@1 of the first iteration of step 1 is the last iteration of step 0
    seg = [compute("c", "gpu0.compute", hbm_gb=2039), copy("h", "gpu0.h2d", "cpu", "gpu0", 1, deps=["c@1"])]
    p = plan([], [H2D, COMP], segments=[("micro", 2, seg)], steps=2)
    res = run(p, one_link(4), extrapolate=False)
    assert [x for x in log(res, uid=True) if x[0].startswith("h")] == [
        ("h[s0.0]", 0, 0.25), ("h[s0.1]", 1.0, 1.25), ("h[s1.0]", 2.0, 2.25), ("h[s1.1]", 3.0, 3.25)]


def test_iteration_scoped_tensors_are_allocated_and_freed_every_iteration() -> None:
    # fwd allocates this iteration's activation, bwd frees it; two iterations never hold it together
    seg = [compute("fwd", "gpu0.compute", hbm_gb=2039, allocs=(place("act", "gpu0"),)),
           compute("bwd", "gpu0.compute", hbm_gb=2039, frees=(place("act", "gpu0"),))]
    p = plan([], [COMP], tensors=[tensor("act", 3, scope="iteration")], segments=[("micro", 3, seg)])
    res = run(p, one_link(10))
    assert res.peak_bytes["gpu0"] == 3 * GB
    assert [(t, r9(b / GB)) for t, _, b in res.memory_series["gpu0"]] == [
        (0, 3.0), (2.0, 0.0), (2.0, 3.0), (4.0, 0.0), (4.0, 3.0), (6.0, 0.0)]
    assert res.leaked == ()


def test_an_iteration_scoped_tensor_freed_one_iteration_later_doubles_the_peak() -> None:
    # fwd allocates this iteration's act and frees the previous iteration's ("act@1"): two live at once; the
    # last iteration's act stays allocated, which is allowed because the tensor is persistent
    seg = [compute("fwd", "gpu0.compute", hbm_gb=2039, allocs=(place("act", "gpu0"),),
                   frees=(place("act@1", "gpu0"),))]
    p = plan([], [COMP], tensors=[tensor("act", 3, scope="iteration", persistent=True)],
             segments=[("micro", 3, seg)])
    res = run(p, one_link(10))
    assert res.peak_bytes["gpu0"] == 6 * GB
    assert res.leaked == ()  # persistent: the last iteration's activation may stay


def test_a_later_segment_names_the_last_iteration_of_an_iteration_scoped_tensor() -> None:
    micro = [compute("fwd", "gpu0.compute", hbm_gb=2039, allocs=(place("act", "gpu0"),),
                     frees=(place("act@1", "gpu0"),))]
    upd = [compute("bwd", "gpu0.compute", hbm_gb=2039, frees=(place("act", "gpu0"),))]
    p = plan([], [COMP], tensors=[tensor("act", 3, scope="iteration")], segments=[("micro", 2, micro), ("upd", 1, upd)])
    res = run(p, one_link(10))
    assert res.leaked == () and res.peak_bytes["gpu0"] == 6 * GB


def test_a_leaked_iteration_tensor_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERSIM_CHECK_INVARIANTS", "0")  # this run breaks an invariant on purpose
    seg = [compute("fwd", "gpu0.compute", hbm_gb=2039, allocs=(place("act", "gpu0"),),
                   frees=(place("act@1", "gpu0"),))]
    p = plan([], [COMP], tensors=[tensor("act", 3, scope="iteration")], segments=[("micro", 3, seg)])
    res = simulate_plan(p, hw(), topology=one_link(10))
    assert res.leaked == ("act[s0.0.2]@gpu0",)
    assert check_invariants(res) == ["tensor act[s0.0.2]@gpu0 is still allocated at the end and is not persistent"]


# -- (i) steady-state extrapolation ----------------------------------------------------------------------------------
def _periodic(repeat: int) -> Plan:
    micro = [copy("h", "gpu0.h2d", "cpu", "gpu0", 1, deps=["c@1"]),
             compute("c", "gpu0.compute", hbm_gb=2039 * 0.2, deps=["h"], allocs=(place("act", "gpu0"),)),
             copy("d", "gpu0.d2h", "gpu0", "cpu", 0.5, deps=["c"], frees=(place("act", "gpu0"),))]
    opt = [TaskSpec("o", "optimizer", "cpu.optim", deps=refs(["d"]), params=1e9)]
    return plan([], [H2D, D2H, COMP, ("cpu.optim", "cpu", "optim")],
                tensors=[tensor("act", 2, scope="iteration")],
                segments=[("micro", repeat, micro), ("opt", 1, opt)], steps=2)


def test_extrapolation_matches_the_full_simulation_of_a_periodic_plan() -> None:
    p = _periodic(40)
    topo = one_link(10, duplex=14)
    spec = hw(optimizer_params_per_s=4e9)
    ext = run(p, topo, spec)
    full = run(p, topo, spec, extrapolate=False)
    assert ext.sim.method.startswith("extrapolated")
    assert full.sim.method == "full"
    assert ext.sim.simulated_tasks < full.sim.simulated_tasks
    assert ext.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert set(ext.link_bytes) == set(full.link_bytes) == {"l"}
    assert ext.link_bytes["l"] == pytest.approx(full.link_bytes["l"], rel=1e-9)
    assert full.link_bytes["l"] == pytest.approx(40 * 1.5 * GB, rel=1e-12)
    assert ext.peak_bytes["gpu0"] == full.peak_bytes["gpu0"] == 2 * GB
    assert ext.compute_busy_s == pytest.approx(full.compute_busy_s, rel=1e-9)
    assert ext.stream_busy_s == pytest.approx(full.stream_busy_s, rel=1e-9)


def test_short_segments_are_simulated_in_full() -> None:
    res = run(_periodic(EXPLICIT_MAX), one_link(10), hw(optimizer_params_per_s=4e9))
    assert res.sim.method.startswith("full")
    assert res.sim.simulated_tasks == len(res.records)


def test_a_plan_without_a_steady_state_is_simulated_in_full() -> None:
    # h (0.1 s) runs ahead of c (1 s) and every h allocates a buffer that its c frees: the number of live
    # buffers, and so the peak, grows with every iteration - no iteration looks like the next
    micro = [copy("h", "gpu0.h2d", "cpu", "gpu0", 1, allocs=(place("buf", "gpu0"),)),
             compute("c", "gpu0.compute", hbm_gb=2039, deps=["h"], frees=(place("buf", "gpu0"),))]
    p = plan([], [H2D, COMP], tensors=[tensor("buf", 1, scope="iteration")],
             segments=[("micro", 40, micro)], steps=1)
    res = run(p, one_link(10))
    full = run(p, one_link(10), extrapolate=False)
    assert res.sim.method.startswith("full (no steady state")
    assert res.step_time_s == full.step_time_s == pytest.approx(0.1 + 40 * 1.0, rel=1e-9)
    # at 3.6 s the 37th buffer arrives while c3 (3.1..4.1) still holds buffer 3: buffers 3..36 live
    assert res.peak_bytes["gpu0"] == full.peak_bytes["gpu0"] == 37 * GB


def _run_ahead(compute_s: float, gbytes: float, allocate: bool, pre_s: float = 0.0) -> Plan:
    """h (gbytes at 10 GB/s) is never held back by c, so h runs ahead while c is slower."""
    pre = [compute("D", "gpu0.compute", hbm_gb=2039 * pre_s)] if pre_s else []
    micro = [copy("h", "gpu0.h2d", "cpu", "gpu0", gbytes, allocs=(place("buf", "gpu0"),) if allocate else ()),
             compute("c", "gpu0.compute", hbm_gb=2039 * compute_s, deps=["h"],
                     frees=(place("buf", "gpu0"),) if allocate else ())]
    segs = ([("pre", 1, pre)] if pre else []) + [("micro", 40, micro)]
    return plan([], [H2D, COMP], tensors=[tensor("buf", 1, scope="iteration")], segments=segs, steps=1)


def test_extrapolation_is_not_fooled_by_a_transient_longer_than_its_sample() -> None:
    p = _run_ahead(0.2, 3, allocate=False, pre_s=1.0)
    full = run(p, one_link(10), extrapolate=False)
    assert full.step_time_s == pytest.approx(0.3 * 40 + 0.2, rel=1e-9)  # copy-bound in the end
    assert run(p, one_link(10)).step_time_s == pytest.approx(full.step_time_s, rel=1e-9)


def test_extrapolation_keeps_a_growing_peak() -> None:
    # c (0.15 s) frees buffer i at 0.25 + 0.15 i while h allocates one every 0.1 s: the lag grows by 0.05 s
    # per iteration, so one more buffer is live every 3 iterations or so
    p = _run_ahead(0.15, 1, allocate=True)
    topo = one_link(10, gpu_gb=10)
    full = run(p, topo, extrapolate=False)
    assert full.peak_bytes["gpu0"] == 15 * GB and not full.feasible
    ext = run(p, topo)
    assert (ext.peak_bytes["gpu0"], ext.feasible) == (full.peak_bytes["gpu0"], full.feasible)


def test_segment_objects_round_trip_through_with_repeats() -> None:
    p = _periodic(40)
    q = p.with_repeats({"micro": 3})
    assert [s.repeat for s in q.segments] == [3, 1]
    assert q.segments[0] == Segment("micro", 3, p.segments[0].tasks)
    assert (q.tensors, q.streams, q.steps) == (p.tensors, p.streams, p.steps)


def test_the_measured_step_of_overlapping_steps_satisfies_the_invariants() -> None:
    # the all-reduce (0.1 GB per rank, on g0 and g1 both ways) shares g1's reverse direction with d; d of step 1
    # starts while the all-reduce of step 0 still runs, so step 1's d runs inside step 0's window
    ar = TaskSpec("ar", "collective", "gpu0.comm", bytes=0.1 * GB, coll="all_reduce", ranks=("gpu0", "gpu1"))
    p = plan([ar, copy("d", "gpu1.d2h", "gpu1", "cpu", 0.05)],
             [("gpu0.comm", "gpu0", "comm"), ("gpu1.d2h", "gpu1", "d2h")], steps=2)
    # two steps measure 0.1 s, less than g1 needs for a step's 0.25 GB (0.125 s). Nothing ties d to ar, so
    # d's stream runs ahead and finishes early while ar's continues alone: the plan has no steady state.
    # The simulator adds steps looking for one, and says it found none instead of reporting 0.1 s.
    two = simulate_plan(p, hw(), topology=switched((1.0, 1.0), 1.0), extrapolate=False)
    assert "NOT steady" in two.sim.method
    assert any("did not reach a steady state" in n for n in two.notes)
    assert two.link_bytes == {"g0": pytest.approx(0.2 * GB), "g1": pytest.approx(0.25 * GB),
                              "up": pytest.approx(0.05 * GB)}
    assert check_invariants(two) == []
