"""A GPU fabric whose library moves more than a ring (``nvlink.reduce_scatter_bytes`` / ``all_gather_bytes``,
measured by ``calibrate --ranks`` for gloo) makes those collectives cost that multiple of a ring's bytes, in the
engine, the bounds and the runner's accounting alike (``costs.collective.fabric_factor``); NCCL presets keep rings."""

from __future__ import annotations

import pytest

from costs import RouteTable, ring
from costs.collective import fabric_factor
from hardware_models import HardwareInputError, build_topology, load_hardware
from simulator import Plan, simulate_plan
from simulator.plan import Segment, StreamSpec, TaskSpec


def _hw(rs: float | None = None, ag: float | None = None):
    extra = [f"nvlink.{k}={v}" for k, v in (("reduce_scatter_bytes", rs), ("all_gather_bytes", ag)) if v is not None]
    return load_hardware("a100x8", overrides=["gpu.count=2", *extra])


@pytest.mark.parametrize("coll,rs,ag,factor", [("reduce_scatter", 3.0, 1.0, 3.0), ("all_gather", 1.0, 1.9, 1.9),
                                               ("all_reduce", 3.0, 1.9, 1.0)])
def test_a_fabric_factor_scales_a_rings_bytes(coll: str, rs: float, ag: float, factor: float) -> None:
    base = ring(RouteTable(build_topology(_hw())), ["gpu0", "gpu1"], 1e9, coll)
    scaled = ring(RouteTable(build_topology(_hw(rs, ag))), ["gpu0", "gpu1"], 1e9, coll)
    assert scaled.per_rank == pytest.approx(base.per_rank * factor)
    assert scaled.steps == base.steps  # the latency steps are the ring's
    assert fabric_factor(RouteTable(build_topology(_hw(rs, ag))), coll) == factor
    assert fabric_factor(build_topology(_hw(rs, ag)), coll) == factor  # the runner passes its topology


def test_presets_run_rings() -> None:
    hw = load_hardware("a100x8")
    assert hw.nvlink is not None and hw.nvlink.collective_bytes() == {}
    assert "reduce_scatter_bytes" not in hw.to_dict()["nvlink"]  # omitted while a ring


def test_a_non_positive_factor_is_refused_naming_the_field() -> None:
    with pytest.raises(HardwareInputError, match="nvlink.reduce_scatter_bytes"):
        _hw(rs=0.0)


def test_the_engine_prices_a_reduce_scatter_at_the_fabrics_multiple() -> None:
    """One reduce-scatter of 1 GB over two GPUs alone on the machine: its time less the ring's latency is the
    factor times the ring's."""
    from policies.job import make_job, make_plan

    def run(rs: float | None) -> float:
        hw = _hw(rs)
        job, _ = make_job(hw, "gpt2")
        base = make_plan(job, "none")  # for its workload
        tasks = (TaskSpec("rs", "collective", "comm", coll="reduce_scatter", bytes=1e9, ranks=("gpu0", "gpu1")),)
        plan = Plan(base.policy, {}, hw, base.workload, (), (StreamSpec("comm", "gpu0", "comm"),),
                    (Segment("s", 1, tasks),), steps=1)
        return simulate_plan(plan, hw).step_time_s

    latency = ring(RouteTable(build_topology(_hw())), ["gpu0", "gpu1"], 1e9, "reduce_scatter").latency_s
    one, three = run(None), run(3.0)
    assert one > latency
    assert three - latency == pytest.approx(3.0 * (one - latency), rel=1e-6)
