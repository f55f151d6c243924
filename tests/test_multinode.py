"""Multi-node machines: the inter-node network, --nodes, cross-node routes, hierarchical collectives, N=1 identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costs import RouteTable, link_capacities, machine_capacities, ring
from costs.resources import CPU_ADAM
from hardware_models import HardwareInputError, Hop, build_topology, load_hardware, spec_from_dict
from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan
from tiersim.cli import main, simulate_main
from userfiles.limits import MAX_GPUS_PER_MACHINE

A100_YAML = (Path(__file__).resolve().parents[1] / "hardware_models" / "presets" / "a100x8.yaml").read_text()
GB = 1e9


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


# ------------------------------------------------------------------------------------------ hardware


def test_every_cluster_node_preset_has_a_sourced_network() -> None:
    for name in ("a100", "a100-40g", "a100x8", "dgx2", "h200", "h200x8", "h800", "h800x8", "rtx4090x4", "v100"):
        spec = load_hardware(name)
        assert spec.network is not None, name
        assert {"network.nics", "network.nic_bw", "network.efficiency", "network.latency"} <= set(spec.sources)
    a100x8, dgx2, h200x8 = (load_hardware(n).network for n in ("a100x8", "dgx2", "h200x8"))
    assert a100x8 is not None and (a100x8.nics, a100x8.nic_bw) == (8, 25 * GB)      # 8x 200 Gb/s HDR
    assert dgx2 is not None and (dgx2.nics, dgx2.nic_bw) == (8, 12.5 * GB)          # 8x 100 Gb/s EDR
    assert h200x8 is not None and (h200x8.nics, h200x8.nic_bw) == (8, 50 * GB)      # 8x 400 Gb/s NDR


def test_one_node_is_the_machine_it_always_was() -> None:
    one = load_hardware("a100x8")
    d = one.to_dict()
    assert "network" not in d and "nodes" not in d and not any(k.startswith("network.") for k in d["sources"])
    assert spec_from_dict(d) == one and hash(spec_from_dict(d)) == hash(one)
    assert load_hardware("a100x8", ["nodes=1"]) == one
    topo = build_topology(one)
    assert topo.nodes == 1 and not any(ln.kind == "nic" for ln in topo.links.values())


def test_nodes_multiply_gpus_and_round_trip() -> None:
    four = load_hardware("a100x8", ["nodes=4"])
    assert (four.nodes, four.gpu.count, four.gpus_per_node) == (4, 32, 8)
    d = four.to_dict()
    assert d["nodes"] == 4 and d["gpu"]["count"] == 8 and "network" in d
    assert spec_from_dict(d) == four
    assert four != load_hardware("a100x8", ["nodes=4", "network.nic_bw=50GB/s"])


def test_cross_node_route_goes_gpu_pcie_nic_network_nic_pcie_gpu() -> None:
    topo = build_topology(load_hardware("a100x8", ["nodes=2"]))
    assert topo.route("gpu7", "gpu8") == (Hop("gpu7.pcie", False), Hop("n0.nic7", False), Hop("n1.nic0", True),
                                          Hop("gpu8.pcie", True))
    assert topo.route("gpu8", "gpu9") == (Hop("gpu8.nvlink", False), Hop("gpu9.nvlink", True))  # NVLink in a node
    assert topo.route("gpu9", "cpu") == (Hop("gpu9.pcie", False), Hop("sw4.uplink", False))   # node 1's own switch
    nic = topo.links["n1.nic3"]
    assert nic.kind == "nic" and nic.bw_fwd == nic.bw_rev == pytest.approx(25 * GB * 0.92) and nic.duplex_bw is None
    assert topo.route_latency("gpu7", "gpu8") == pytest.approx(10e-6 + 2.5e-6 + 2.5e-6 + 10e-6)
    # DGX-2: 16 GPUs share 8 NICs, two GPUs per NIC
    dgx2 = build_topology(load_hardware("dgx2", ["nodes=2"]))
    assert dgx2.to_network["gpu0"][-1] == dgx2.to_network["gpu1"][-1] == Hop("n0.nic0", False)
    assert dgx2.to_network["gpu17"][-1] == Hop("n1.nic0", False)


def test_host_dram_nvme_and_cpu_adam_are_per_node() -> None:
    one, four = load_hardware("a100x8"), load_hardware("a100x8", ["nodes=4"])
    t1, t4 = build_topology(one), build_topology(four)
    assert t4.pools["cpu"].capacity_bytes == pytest.approx(4 * t1.pools["cpu"].capacity_bytes)
    assert t4.pools["nvme"].capacity_bytes == pytest.approx(4 * t1.pools["nvme"].capacity_bytes)
    assert t4.links["nvme.io"].bw_rev == pytest.approx(4 * t1.links["nvme.io"].bw_rev)
    assert machine_capacities(four, t4)[CPU_ADAM] == pytest.approx(4 * machine_capacities(one, t1)[CPU_ADAM])


# ----------------------------------------------------------------------------------------- collectives


def _pcie(spec_name: str) -> tuple[float, float]:
    p = load_hardware(spec_name).pcie
    return p.per_direction_bw, p.duplex_bw


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter"])
def test_hierarchical_collective_matches_the_hand_formula(coll: str) -> None:
    """2 DGX A100: reduce-scatter/all-gather over NVLink inside each node, 1/8 of the bytes across nodes on every
    GPU's own NIC, each GPU's PCIe link carrying its NIC traffic both ways."""
    spec = load_hardware("a100x8", ["nodes=2"])
    topo = build_topology(spec)
    caps = link_capacities(topo)
    s, f, m, n_nodes = 8 * GB, (2 if coll == "all_reduce" else 1), 8, 2
    v = f * (m - 1) / m * s                      # each rank over NVLink
    i = f * (n_nodes - 1) / n_nodes * s / m      # each rank over its NIC (and its PCIe link)
    pcie_dir, pcie_both = _pcie("a100x8")
    nic = 25 * GB * 0.92
    nvl = 300 * GB
    latency = f * (m - 1) * 5e-6 + f * (n_nodes - 1) * 25e-6
    expect = latency + max(v / nvl, i / nic, i / pcie_dir, 2 * i / pcie_both)
    rg = ring(RouteTable(topo), [f"gpu{k}" for k in range(16)], s, coll)
    assert rg.seconds(caps) == pytest.approx(expect, rel=1e-9)
    assert rg.per_rank == pytest.approx(v + i)
    load = rg.resource_bytes()
    assert load["n0.nic3:rev"] == pytest.approx(i) and load["n1.nic3:fwd"] == pytest.approx(i)
    assert load["gpu5.nvlink:rev"] == pytest.approx(v)
    assert rg.moved_bytes == pytest.approx(16 * (v + i))


def test_one_gpu_per_node_is_a_ring_over_the_network_and_one_node_is_unchanged() -> None:
    four = build_topology(load_hardware("a100", ["nodes=4"]))
    s = 4 * GB
    rg = ring(RouteTable(four), ["gpu0", "gpu1", "gpu2", "gpu3"], s, "all_reduce")
    i = 2 * 3 / 4 * s
    pcie_dir, pcie_both = _pcie("a100")
    expect = 2 * 3 * 25e-6 + max(i / (25 * GB * 0.92), i / pcie_dir, 2 * i / pcie_both)
    assert rg.seconds(link_capacities(four)) == pytest.approx(expect, rel=1e-9)
    # ranks of one node on a 2-node machine: the plain ring, exactly as on one node
    one, two = build_topology(load_hardware("a100x8")), build_topology(load_hardware("a100x8", ["nodes=2"]))
    ranks = [f"gpu{k}" for k in range(8)]
    a, b = ring(RouteTable(one), ranks, s, "all_gather"), ring(RouteTable(two), ranks, s, "all_gather")
    assert (a.per_rank, a.hops, a.steps, a.shares, a.latency_s) == (b.per_rank, b.hops, b.steps, b.shares,
                                                                    b.latency_s)


def test_data_parallel_groups_span_nodes_and_the_engine_charges_the_nics() -> None:
    job, _ = make_job("a100x8", "gpt2", JobRequest(global_batch=16), hw_overrides=("nodes=2",))
    plan = make_plan(job, "none", {})
    ranks = {r for seg in plan.segments for t in seg.tasks if t.op == "collective" for r in t.ranks}
    assert ranks == {f"gpu{k}" for k in range(16)}
    res = simulate_plan(plan, job.hw)
    assert res.feasible and res.n_gpus == 16
    nic_bytes = {k: v for k, v in res.link_bytes.items() if ".nic" in k}
    assert len(nic_bytes) == 16 and len(set(round(v) for v in nic_bytes.values())) == 1  # every rail alike


# ----------------------------------------------------------------------------------------------- N = 1


def test_a_one_node_plan_is_byte_identical() -> None:
    model = "gpt2"
    for policy in ("none", "zero-offload"):
        plans = []
        for sets in ((), ("nodes=1",)):
            job, _ = make_job("a100x8", model, JobRequest(global_batch=8), hw_overrides=sets)
            plans.append(json.dumps(make_plan(job, policy, {}).to_dict(), sort_keys=True))
        assert plans[0] == plans[1], policy


# -------------------------------------------------------------------------------------------------- CLI


def test_simulate_with_nodes_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--hw", "a100x8", "--nodes", "2", "--model", "gpt2", "--policy", "none", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"n_gpus": 16' in out
    json.loads(out)


def test_hardware_show_lists_the_network(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware", "show", "a100x8", "--set", "nodes=2"]) == 0
    out = capsys.readouterr().out
    assert "network:" in out and "nic_bw" in out and "n*.nic* (x16)" in out and "8 per node x 2 = 16 GPUs" in out


@pytest.mark.parametrize(("argv", "words"), [
    (["simulate", "--hw", "a100x8", "--nodes", "0", "--model", "gpt2"], ("--nodes", "positive")),
    (["simulate", "--hw", "a100x8", "--nodes", "x", "--model", "gpt2"], ("--nodes",)),
    (["simulate", "--hw", "a100x8", "--nodes", str(MAX_GPUS_PER_MACHINE + 1), "--model", "gpt2"],
     ("MAX_GPUS_PER_MACHINE",)),
    (["simulate", "--hw", "a100x8", "--nodes", "10000", "--model", "gpt2"], ("nodes", "MAX_GPUS_PER_MACHINE")),
    (["simulate", "--hw", "dgx-spark", "--nodes", "2", "--model", "gpt2"], ("nodes", "unified")),
    (["simulate", "--hw", "a100x8", "--set", "nodes=2", "--nodes", "3", "--model", "gpt2"], ("twice",)),
    (["simulate", "--hw", "a100x8", "--nodes", "2", "--set", "network.nic_bw=-1GB/s", "--model", "gpt2"],
     ("network.nic_bw",)),
    (["simulate", "--hw", "a100x8", "--nodes", "2", "--set", "network.efficiency=1.5", "--model", "gpt2"],
     ("network.efficiency",)),
    (["simulate", "--hw", "a100x8", "--nodes", "2", "--set", "network=none", "--model", "gpt2"],
     ("network", "nodes 1")),
    (["plan", "--hw", "a100x8", "--nodes", "-3", "--model", "gpt2"], ("--nodes",)),
])
def test_bad_nodes_and_networks_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                    words: tuple[str, ...]) -> None:
    _one_line_exit_2(capsys, argv, *words)


def test_bad_network_in_a_yaml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(A100_YAML.replace("  nics: 8\n", "  nics: 0\n"))
    _one_line_exit_2(capsys, ["hardware", "show", str(bad)], "network.nics")
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(A100_YAML.replace("unified_memory: false\n", "unified_memory: false\nnodes: 0\n"))
    _one_line_exit_2(capsys, ["hardware", "show", str(nodes)], "nodes")
    with pytest.raises(HardwareInputError, match="nodes"):
        load_hardware(str(nodes))


def test_sweep_with_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text("hardware: [a100x8]\nmodels: [gpt2]\npolicies: [none]\n"
                                     "workload: {global_batch: 16}\n")
    assert main(["sweep", "g.yaml", "--nodes", "2", "--processes", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["done"] == 1
    (tmp_path / "twice.yaml").write_text("hardware: [{preset: a100x8, set: {nodes: [1, 2]}}]\nmodels: [gpt2]\n"
                                         "policies: [none]\n")
    _one_line_exit_2(capsys, ["sweep", "twice.yaml", "--nodes", "2"], "nodes", "--nodes")
