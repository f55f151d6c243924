"""hardware_models.topology: pools, links and routes of the presets."""

from __future__ import annotations

import dataclasses

import pytest

from hardware_models import (
    C2CSpec,
    HardwareInputError,
    Hop,
    Link,
    Pool,
    build_topology,
    list_presets,
    load_hardware,
)


def _topo(name: str, overrides: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return build_topology(load_hardware(name, overrides))


def H(link: str, forward: bool) -> Hop:  # noqa: N802 - short constructor for readable expectations
    return Hop(link, forward)


def test_two_gpus_under_one_switch_share_its_uplink() -> None:
    topo = _topo("a100x8")
    assert topo.route("gpu0", "cpu") == (H("gpu0.pcie", False), H("sw0.uplink", False))
    assert topo.route("gpu1", "cpu") == (H("gpu1.pcie", False), H("sw0.uplink", False))
    assert topo.route("gpu2", "cpu") == (H("gpu2.pcie", False), H("sw1.uplink", False))
    assert topo.route("cpu", "gpu7") == (H("sw3.uplink", True), H("gpu7.pcie", True))
    assert sorted(k for k in topo.links if k.startswith("sw")) == [f"sw{k}.uplink" for k in range(4)]


def test_pcie_links_carry_the_duplex_budget() -> None:
    topo = _topo("a100x8")
    link = topo.links["gpu0.pcie"]
    assert link.kind == "pcie"
    assert link.bw_fwd == link.bw_rev == pytest.approx(31.5e9 * 0.79)
    assert link.duplex_bw == pytest.approx(2 * 31.5e9 * 0.79 * 0.70)
    assert topo.links["sw0.uplink"].bw_fwd == pytest.approx(31.5e9 * 0.79)


def test_gpu_to_gpu_over_nvlink() -> None:
    topo = _topo("a100x8")
    assert topo.route("gpu0", "gpu1") == (H("gpu0.nvlink", False), H("gpu1.nvlink", True))
    assert topo.route("gpu5", "gpu2") == (H("gpu5.nvlink", False), H("gpu2.nvlink", True))
    nvlink = topo.links["gpu3.nvlink"]
    assert (nvlink.kind, nvlink.bw_fwd, nvlink.bw_rev, nvlink.duplex_bw) == ("nvlink", 300e9, 300e9, None)
    assert topo.route_latency("gpu0", "gpu1") == pytest.approx(5e-6)
    assert topo.route_latency("gpu0", "cpu") == pytest.approx(10e-6)


def test_without_nvlink_gpus_copy_over_pcie() -> None:
    topo = _topo("a100x8", ("nvlink=none",))
    assert not any(k.endswith(".nvlink") for k in topo.links)
    assert topo.route("gpu0", "gpu1") == (H("gpu0.pcie", False), H("gpu1.pcie", True))  # same switch
    assert topo.route("gpu0", "gpu2") == (
        H("gpu0.pcie", False), H("sw0.uplink", False), H("sw1.uplink", True), H("gpu2.pcie", True),
    )  # fmt: skip


def test_rtx4090x4_gpus_talk_over_pcie_through_host_memory() -> None:
    topo = _topo("rtx4090x4")
    route = topo.route("gpu0", "gpu1")
    assert {topo.links[h.link].kind for h in route} == {"pcie"}
    assert route == (
        H("gpu0.pcie", False),
        H("sw0.uplink", False),
        H("sw0.uplink", True),
        H("gpu1.pcie", True),
    )
    assert all(topo.route(g, "cpu")[-1] == H("sw0.uplink", False) for g in topo.gpu_locations())
    direct = _topo("rtx4090x4", ("pcie.p2p=true",))
    assert direct.route("gpu0", "gpu1") == (H("gpu0.pcie", False), H("gpu1.pcie", True))


def test_dgx_spark_gpu_and_cpu_share_one_pool_and_copy_through_dram() -> None:
    spec = load_hardware("dgx-spark")
    topo = build_topology(spec)
    assert topo.locations == ("gpu0", "cpu", "nvme")
    assert topo.pool_of["gpu0"] == topo.pool_of["cpu"] == "unified"
    assert set(topo.pools) == {"unified", "nvme"}
    assert topo.route("gpu0", "cpu") == (H("unified.memcpy", False),)
    assert topo.route("cpu", "gpu0") == (H("unified.memcpy", True),)
    memcpy = topo.links["unified.memcpy"]
    assert memcpy.kind == "memcpy"
    assert memcpy.bw_fwd == memcpy.bw_rev == memcpy.duplex_bw == pytest.approx(273e9 / 2)
    assert topo.route("gpu0", "nvme") == (H("nvme.io", True),)
    assert all("c2c" not in h.link for a in topo.locations for b in topo.locations for h in topo.route(a, b))
    pool = topo.pools["unified"]
    reserved = sum(spec.gpu.reserved.values()) + sum(spec.host.reserved.values())
    assert pool.kind == "unified"
    assert pool.capacity_bytes == pytest.approx(spec.host.dram_bytes - reserved)
    assert "gpu.cuda_context" in pool.reserved and "host.display_carveout" in pool.reserved


def test_nvme_routes_bounce_through_host_dram() -> None:
    topo = _topo("a100x8")
    assert topo.route("cpu", "nvme") == (H("nvme.io", True),)
    assert topo.route("nvme", "cpu") == (H("nvme.io", False),)
    assert topo.route("gpu3", "nvme") == (H("gpu3.pcie", False), H("sw1.uplink", False), H("nvme.io", True))
    assert topo.route("nvme", "gpu3") == (H("nvme.io", False), H("sw1.uplink", True), H("gpu3.pcie", True))
    io = topo.links["nvme.io"]
    assert io.bw_fwd == pytest.approx(8 * 3.5e9 * 0.75)  # forward = write
    assert io.bw_rev == pytest.approx(8 * 7.0e9 * 0.9)  # reverse = read
    assert io.duplex_bw == max(io.bw_fwd, io.bw_rev)


def test_pools_of_a_discrete_machine() -> None:
    spec = load_hardware("a100x8")
    topo = build_topology(spec)
    assert topo.locations == (*[f"gpu{i}" for i in range(8)], "cpu", "nvme")
    assert all(topo.pool_of[loc] == loc for loc in topo.locations)
    gpu = topo.pools["gpu5"]
    free = spec.gpu.memory_bytes - (426 + 9.125) * 2**20 - 2**29  # CUDA context, cuBLAS workspaces, NCCL
    assert gpu.kind == "hbm"
    assert gpu.capacity_bytes == pytest.approx(free)  # fragmentation 0: the allocator is modelled per tensor
    assert topo.pools["cpu"].capacity_bytes == pytest.approx(2e12 - 48 * 2**30)
    assert topo.pools["nvme"].capacity_bytes == pytest.approx(8 * 3.84e12)


def test_dgx2_has_eight_switches() -> None:
    topo = _topo("dgx2")
    assert len(topo.gpu_locations()) == 16
    assert topo.route("gpu15", "cpu")[-1] == H("sw7.uplink", False)


def test_single_gpu_machines_have_no_switch() -> None:
    topo = _topo("a100")
    assert set(topo.links) == {"gpu0.pcie", "nvme.io"}
    assert topo.route("gpu0", "cpu") == (H("gpu0.pcie", False),)


def test_a_c2c_host_link_replaces_pcie_on_a_discrete_machine() -> None:
    spec = dataclasses.replace(load_hardware("h200"), c2c=C2CSpec(450e9, 5e-6))
    topo = build_topology(spec)
    assert topo.route("gpu0", "cpu") == (H("gpu0.c2c", False),)
    assert "gpu0.pcie" not in topo.links
    assert topo.links["gpu0.c2c"].duplex_bw == 450e9


@pytest.mark.parametrize("name", list_presets())
def test_route_laws(name: str) -> None:
    topo = _topo(name)
    spec = load_hardware(name)
    for a in topo.locations:
        assert topo.route(a, a) == ()
        for b in topo.locations:
            route = topo.route(a, b)
            back = topo.route(b, a)
            assert back == tuple(Hop(h.link, not h.forward) for h in reversed(route))
            assert all(h.link in topo.links for h in route)
            if a != b:
                assert route, f"{a}->{b} has no hops"
    if not spec.unified_memory:
        for loc in topo.locations:
            assert all(h.forward for h in topo.route("cpu", loc)), "forward = away from host DRAM"


def test_unknown_location_is_a_clear_error() -> None:
    topo = _topo("a100")
    with pytest.raises(HardwareInputError, match="unknown location 'gpu9'; known: gpu0, cpu, nvme"):
        topo.route("gpu9", "cpu")
    with pytest.raises(ValueError):
        topo.route("cpu", "disk")


def test_link_and_pool_validation() -> None:
    with pytest.raises(HardwareInputError, match="duplex_bw"):
        Link("x", "pcie", 10.0, 10.0, 5.0, 0.0)
    with pytest.raises(HardwareInputError, match="kind"):
        Link("x", "ethernet", 10.0, 10.0, None, 0.0)
    with pytest.raises(HardwareInputError, match="capacity"):
        Pool("p", "hbm", 100.0, {"a": 10.0}, 95.0)
    assert Link("x", "nvme", 2.0, 5.0, 5.0, 0.0).bw(False) == 5.0
