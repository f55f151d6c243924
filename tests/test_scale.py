"""Cluster scale (issue 13): what keeps a symmetric 1024-GPU or 128-node job's cost independent of the GPU count.

- Two GPUs of one node route by a rule (``Topology.peer``), so a machine's stored routes grow with its GPU
  count, not with its square, and the rule gives exactly the routes the topology rules define.
- Across nodes, a hierarchical ring's hops that carry the same share play one role in the symmetric
  simulation (every node's NICs fold onto one representative), and the reduced run still agrees with the
  full one exactly.
- ``simulate`` has a default ``--budget`` (said in ``--help``); past it the command stops with one line.
Speed itself is measured in tests/benchmarks/test_bench_simulate.py (``make bench``), never here.
"""

from __future__ import annotations

import math

import pytest

from hardware_models import Hop, build_topology, list_presets, load_hardware
from simulator import simulate_plan
from simulator.engine import plan_symmetry
from simulator.symmetry import Symmetry
from tiersim.api import make_job, make_plan
from tiersim.cli import simulate_main


def _hops(route: tuple[Hop, ...]) -> list[tuple[str, bool]]:
    return [(h.link, h.forward) for h in route]


@pytest.mark.parametrize("preset", list_presets())
def test_gpu_pairs_route_by_the_topology_rules(preset: str) -> None:
    """Every pair of GPUs of one node: NVLink where the machine has it; else PCIe peer-to-peer between two
    GPUs behind one switch where the machine allows it; else down to host DRAM and up again."""
    spec = load_hardware(preset)
    topo = build_topology(spec)
    gpus = topo.gpu_locations()
    for a in gpus:
        for b in gpus:
            if a == b:
                continue
            got = _hops(topo.route(a, b))
            up, down = topo.route(a, "cpu"), topo.route("cpu", b)
            if spec.nvlink is not None:
                want = [(f"{a}.nvlink", False), (f"{b}.nvlink", True)]
            elif spec.pcie.p2p and spec.c2c is None and len(down) == 2 and up[-1].link == down[0].link:
                want = [(f"{a}.pcie", False), (f"{b}.pcie", True)]
            else:
                want = _hops(up) + _hops(down)
            assert got == want, (preset, a, b)


def test_stored_routes_grow_with_the_gpu_count_not_its_square() -> None:
    topo = build_topology(load_hardware("a100x8", overrides=["gpu.count=1024"]))
    assert len(topo.gpu_locations()) == 1024
    assert len(topo.routes) <= 4 * 1024 + 8
    assert _hops(topo.route("gpu5", "gpu1000")) == [("gpu5.nvlink", False), ("gpu1000.nvlink", True)]


def test_a_peer_rule_without_its_links_is_refused() -> None:
    from dataclasses import replace

    from hardware_models import HardwareInputError

    topo = build_topology(load_hardware("a100x8"))
    links = {k: v for k, v in topo.links.items() if k != "gpu3.nvlink"}
    with pytest.raises(HardwareInputError, match="gpu3"):
        replace(topo, links=links)
    with pytest.raises(HardwareInputError, match="peer"):
        replace(topo, peer="carrier-pigeon")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_every_nodes_nics_fold_onto_one_representative_and_the_figures_agree() -> None:
    """Four nodes of two GPUs: the data-parallel rings cross every node's NICs with one share; the
    symmetric run folds them onto one representative per direction and still gives the full run's figures."""
    job, _ = make_job("a100x8", "gpt2", hw_overrides=["gpu.count=2", "nodes=4"])
    plan = make_plan(job, "zero-offload")
    sym = plan_symmetry(plan, job.hw)
    assert isinstance(sym, Symmetry), sym
    nic_reps = {sym.rep[r] for r in sym.rep if ".nic" in r}
    assert len(nic_reps) == 2, nic_reps  # one per direction
    assert sum(1 for r in sym.rep if ".nic" in r) == 16  # 4 nodes x 2 NICs x 2 directions
    full = simulate_plan(plan, job.hw, symmetric=False)
    red = simulate_plan(plan, job.hw)
    assert red.sim.reduction == "8 ranks simulated as 1 class of 8"
    assert _close(full.step_time_s, red.step_time_s)
    for name in ("link_bytes", "link_busy_s", "stream_busy_s", "peak_bytes"):
        a, b = dict(getattr(full, name)), dict(getattr(red, name))
        assert set(a) == set(b), name
        bad = [k for k in a if not _close(a[k], b[k])]
        assert not bad, (name, bad[:3], [(a[k], b[k]) for k in bad[:3]])
    assert any(".nic" in ln and b > 0 for ln, b in red.link_bytes.items())


def test_simulate_has_a_default_budget_said_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--budget TIME" in out and "(default 10m; 'none' for no limit" in out
    assert "4 no answer within --budget" in out


def test_simulate_past_its_budget_stops_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A 70b plan and simulation take far more than 50 ms on any machine."""
    code = simulate_main(["--hw", "a100x8", "--model", "70b", "--budget", "0.05s"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert len(err) == 1 and "no answer within the budget of 0.05 s" in err[0] and "--budget" in err[0]


@pytest.mark.parametrize("text", ["0s", "-1m", "soon"])
def test_a_bad_budget_is_one_line_and_exit_2(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--hw", "a100", "--model", "gpt2", "--budget", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget" in err[0]



def test_a_swallowed_budget_ring_rings_again() -> None:
    """The first ring lands where it is swallowed (as in a gc callback); the next one still stops the block."""
    import time

    from tiersim.commands.simulate import _budget, _OutOfBudget

    rings = 0
    with pytest.raises(_OutOfBudget), _budget(0.01):
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                time.sleep(0.5)
            except _OutOfBudget:
                rings += 1
                if rings > 1:
                    raise
    assert rings == 2
    time.sleep(0.3)  # the timer is off once the block has ended: nothing rings here
