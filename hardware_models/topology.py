"""The derived view of a machine that the simulator uses: memory pools, links and routes.

Locations are ``gpu0 .. gpu{n-1}``, ``cpu`` and (with drives) ``nvme``. Each location allocates from
one pool; on a discrete machine the pool has the location's name, on a unified machine (DGX Spark)
``gpu0`` and ``cpu`` share the pool ``unified``.

A `Link` has a bandwidth per direction. "Forward" always means AWAY from host DRAM: host -> device,
switch -> GPU, NVSwitch -> GPU, cpu -> nvme (a write). `duplex_bw` caps both directions together
(None = full duplex). A route is the ordered tuple of `Hop`s a copy from `src` to `dst` crosses; a
simulator shares each link's bandwidth among the flows crossing it.

Links built by `build_topology` (``i`` = GPU index, ``k = i // pcie.gpus_per_switch``):

* ``gpu{i}.pcie`` (kind pcie): GPU i <-> its PCIe switch or root port. ``pcie.per_direction_bw`` each
  way, ``duplex_bw = 2 * per_direction * duplex_fraction`` (A100 Gen4: 25 one way, ~24 + 11 together).
* ``sw{k}.uplink`` (kind pcie, only when ``gpus_per_switch > 1``): switch k <-> CPU root port, an x16
  link of the same generation; the GPUs under one switch share it on their way to host DRAM.
* ``gpu{i}.nvlink`` (kind nvlink, with NVLink): GPU i <-> NVSwitch, full duplex. GPU i -> GPU j is
  ``[gpu{i}.nvlink reverse, gpu{j}.nvlink forward]``. Without NVLink, GPUs under one switch with
  ``pcie.p2p`` copy through the switch; otherwise the copy goes up to the CPU root complex and down
  again (with ``p2p: false`` that is a bounce through host DRAM, modelled as one flow).
* ``gpu{i}.c2c`` (kind c2c): on a discrete machine with an NVLink-C2C host link (GH200-like) it
  replaces the PCIe path; ``duplex_bw = per_direction`` because bidirectional C2C copies reach about
  half the bidirectional peak (nvbw_41). On a unified machine it is present but on no route: a
  gpu0 <-> cpu copy never crosses it (see ``unified.memcpy``).
* ``unified.memcpy`` (kind memcpy, unified only): a gpu0 <-> cpu copy reads and writes the same
  LPDDR5x, so it gets ``host.dram_bw / 2`` in each direction and in total.
* ``nvme.io`` (kind nvme): cpu <-> the NVMe set; forward (write) ``nvme.write_bw``, reverse (read)
  ``nvme.read_bw``. ASSUMPTION: reads and writes of a drive contend, modelled as
  ``duplex_bw = max(read_bw, write_bw)``. GPU <-> NVMe routes bounce through host DRAM (the GPU's
  cpu route + ``nvme.io``): GPUDirect Storage is not modelled. On a unified machine gpu0 <-> nvme is
  ``nvme.io`` alone.

Nodes (``spec.nodes`` > 1): GPUs are numbered node by node (node k holds ``gpu{k*g} .. gpu{k*g+g-1}``, g =
``spec.gpus_per_node``); PCIe links, switch uplinks and NVLink are each node's own (``sw{k}`` counts
switches over all nodes), NVLink joins only the GPUs of one node. Each node has ``min(network.nics, g)`` NIC
links ``n{k}.nic{j}`` (kind nic, full duplex, ``network.nic_bw x efficiency`` each way, times
``nics / links`` where a GPU has more than one NIC; forward = from the network into the node); GPU l of a
node uses NIC ``l * links // g`` (DGX: one NIC per GPU, under the GPU's own PCIe switch: GPUDirect RDMA
crosses the GPU's PCIe link but not the switch uplink). A copy between GPUs of two nodes crosses
``[gpu_a.pcie rev, nic_a rev, nic_b fwd, gpu_b.pcie fwd]``; the fabric between the NICs is non-blocking.
Those routes are worked out when asked (`Topology.route`), not stored: a 1,024-GPU cluster would otherwise
hold a million of them. ``cpu`` and ``nvme`` stand for every node's host DRAM and NVMe set taken together
(the plans name one ``cpu`` and one ``nvme``): their pools hold ``nodes x`` one node's bytes, ``nvme.io``
carries ``nodes x`` one node's bandwidth, and each GPU reaches ``cpu`` over its own node's PCIe path. For a
plan whose nodes run alike (every data-parallel plan) that is exact: max-min sharing of an ``N x`` resource
among ``N x`` the same flows gives each flow what one node's resource would, and the pool overflows exactly
when one node's would. A plan that loads one node's host more than another's would see the sum.

Not modelled: NICs sharing a switch uplink (DGX A100 has 2 per switch), NUMA (socket-local vs remote
DRAM), host DRAM bandwidth as a shared resource, pageable (unpinned) copies, size-dependent link
efficiency.

Latency: `route_latency` sums the hops' `latency_s`. The transfer-setup latency is charged once per
route: ``pcie.latency`` sits on ``gpu{i}.pcie`` (uplinks carry 0), each ``gpu{i}.nvlink`` carries half
of ``nvlink.latency``, ``unified.memcpy`` carries ``gpu.launch_overhead`` (a copy launch).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from hardware_models.errors import HardwareInputError
from hardware_models.frozen import FrozenDict
from hardware_models.spec import HardwareSpec

__all__ = ["COMM_BUFFERS", "Hop", "Link", "Pool", "Topology", "build_topology", "gpu_reserved"]

POOL_KINDS: Final = ("hbm", "dram", "nvme", "unified")
LINK_KINDS: Final = ("pcie", "nvlink", "c2c", "nvme", "memcpy", "nic")
TOPOLOGY_CACHE: Final = 8  # machines whose topology ``build_topology`` keeps


@dataclass(frozen=True)
class Pool:
    """A memory pool: `capacity_bytes` is what tensors may use after `reserved` and fragmentation."""

    name: str
    kind: str
    physical_bytes: float
    reserved: Mapping[str, float]
    capacity_bytes: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "reserved", FrozenDict(self.reserved))
        if self.kind not in POOL_KINDS:
            raise HardwareInputError(
                f"pool kind must be one of {', '.join(POOL_KINDS)}, got {self.kind!r}",
                field=f"pools.{self.name}.kind",
            )
        usable = self.physical_bytes - sum(self.reserved.values())
        if not 0 < self.capacity_bytes <= usable * (1 + 1e-12):
            raise HardwareInputError(
                f"capacity {self.capacity_bytes!r} must be > 0 and <= physical - reserved ({usable!r})",
                field=f"pools.{self.name}.capacity_bytes",
            )


@dataclass(frozen=True)
class Link:
    """A link with bytes/s per direction; `duplex_bw` caps fwd + rev together (None: full duplex)."""

    name: str
    kind: str
    bw_fwd: float
    bw_rev: float
    duplex_bw: float | None
    latency_s: float

    def __post_init__(self) -> None:
        where = f"links.{self.name}"
        if self.kind not in LINK_KINDS:
            raise HardwareInputError(
                f"link kind must be one of {', '.join(LINK_KINDS)}, got {self.kind!r}", field=f"{where}.kind"
            )
        if not (self.bw_fwd > 0 and self.bw_rev > 0):
            raise HardwareInputError("bandwidths must be > 0", field=where)
        if self.duplex_bw is not None and not (
            max(self.bw_fwd, self.bw_rev) <= self.duplex_bw <= self.bw_fwd + self.bw_rev
        ):
            raise HardwareInputError("duplex_bw must lie between max(fwd, rev) and fwd + rev", field=where)
        if not self.latency_s >= 0:
            raise HardwareInputError("latency must be >= 0", field=where)

    def bw(self, forward: bool) -> float:
        """Bandwidth of one direction."""
        return self.bw_fwd if forward else self.bw_rev


@dataclass(frozen=True)
class Hop:
    """One link of a route and the direction it is crossed in (forward = away from host DRAM)."""

    link: str
    forward: bool


Route = tuple[Hop, ...]


@dataclass(frozen=True)
class Topology:
    """Locations, their pools, the links and the route between every pair of locations."""

    locations: tuple[str, ...]
    pool_of: Mapping[str, str]
    pools: Mapping[str, Pool]
    links: Mapping[str, Link]
    routes: Mapping[tuple[str, str], Route] = field(repr=False)
    nodes: int = 1
    gpus_per_node: int = 0  # 0: every GPU is on the one node
    to_network: Mapping[str, Route] = field(default_factory=FrozenDict, repr=False)  # GPU -> its NIC, out
    # two GPUs of one node, derived on demand (n^2 stored routes were most of a 1024-GPU job's time): "nvlink",
    # "p2p" (PCIe peer-to-peer where they share a switch, else through the host), "host"; "": stored in routes
    peer: str = ""
    # collective kind -> what it moves over the GPUs' fabric, as a multiple of a ring's bytes (NvlinkSpec)
    collective_bytes: Mapping[str, float] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        for name in ("pool_of", "pools", "links", "routes", "to_network", "collective_bytes"):
            object.__setattr__(self, name, FrozenDict(getattr(self, name)))
        object.__setattr__(self, "_known", frozenset(self.locations))  # (``route`` checks both ends: a set)
        for gpu, hops in self.to_network.items():
            for hop in hops:
                if hop.link not in self.links:
                    raise HardwareInputError(f"route {gpu}->network uses unknown link {hop.link!r}", field="routes")
        for loc in self.locations:
            if self.pool_of.get(loc) not in self.pools:
                raise HardwareInputError(f"location {loc!r} has no pool", field="pool_of")
        if self.peer not in ("", "nvlink", "p2p", "host"):
            raise HardwareInputError(f"peer must be nvlink, p2p or host, got {self.peer!r}", field="peer")
        suffix = {"nvlink": ".nvlink", "p2p": ".pcie"}.get(self.peer, "")
        for loc in self.locations if suffix else ():
            if loc.startswith("gpu") and loc + suffix not in self.links:
                raise HardwareInputError(f"GPU {loc!r} has no link {loc + suffix!r} for its peers", field="peer")
        for (src, dst), hops in self.routes.items():
            for hop in hops:
                if hop.link not in self.links:
                    raise HardwareInputError(
                        f"route {src}->{dst} uses unknown link {hop.link!r}", field="routes"
                    )

    def _check_location(self, loc: str) -> None:
        if loc not in self._known:  # type: ignore[attr-defined]  # (set in __post_init__)
            raise HardwareInputError(f"unknown location {loc!r}; known: {', '.join(self.locations)}")

    def route(self, src: str, dst: str) -> Route:
        """The hops of a copy from `src` to `dst`; () when they are the same location."""
        self._check_location(src)
        self._check_location(dst)
        if src == dst:
            return ()
        got = self.routes.get((src, dst))
        if got is not None:
            return got
        if self.peer and src.startswith("gpu") and dst.startswith("gpu") and self.node_of(src) == self.node_of(dst):
            return self._peer_route(src, dst)
        if src in self.to_network and dst in self.to_network:
            return self.to_network[src] + _reverse(self.to_network[dst])  # GPUs of two nodes
        return self.routes[(src, dst)]

    def _peer_route(self, a: str, b: str) -> Route:
        if self.peer == "nvlink":
            return (Hop(f"{a}.nvlink", False), Hop(f"{b}.nvlink", True))
        down_a, down_b = self.routes[("cpu", a)], self.routes[("cpu", b)]
        if self.peer == "p2p" and len(down_a) == 2 and down_a[0] == down_b[0]:  # behind one switch
            return (Hop(f"{a}.pcie", False), Hop(f"{b}.pcie", True))
        return _reverse(down_a) + down_b

    def node_of(self, loc: str) -> int:
        """The node a GPU location is on (``cpu`` and ``nvme``, every node's together, count as node 0)."""
        if self.nodes == 1 or not loc.startswith("gpu"):
            return 0
        return int(loc[3:]) // self.gpus_per_node

    def route_latency(self, src: str, dst: str) -> float:
        """Sum of the latencies of the route's links (seconds)."""
        return sum(self.links[h.link].latency_s for h in self.route(src, dst))

    def gpu_locations(self) -> tuple[str, ...]:
        """``gpu0 .. gpu{n-1}``."""
        return tuple(loc for loc in self.locations if loc.startswith("gpu"))


def _reverse(route: Route) -> Route:
    return tuple(Hop(h.link, not h.forward) for h in reversed(route))


def _nvme_link(spec: HardwareSpec) -> Link | None:
    """The NVMe set's link (with nodes: every node's set together, ``nodes x`` the bandwidth)."""
    if spec.nvme is None:
        return None
    nvme, k = spec.nvme, spec.nodes
    return Link(
        "nvme.io", "nvme", k * nvme.write_bw, k * nvme.read_bw, k * max(nvme.read_bw, nvme.write_bw),
        nvme.latency_s,
    )


COMM_BUFFERS: Final = "comm_buffers"


def gpu_reserved(spec: HardwareSpec) -> dict[str, float]:
    """The reserved lines that apply on this machine: ``gpu.reserved.comm_buffers`` (NCCL's per-rank
    buffers) only with more than one GPU, since a single rank creates no NCCL communicator."""
    return {k: v for k, v in spec.gpu.reserved.items() if k != COMM_BUFFERS or spec.gpu.count > 1}


def build_topology(spec: HardwareSpec) -> Topology:
    """The pools, links and routes of `spec` (rules in the module docstring).

    Memoised on the (frozen, hashable) spec, a few machines at a time (``TOPOLOGY_CACHE``): a planner's search asks
    for the same machine's topology once per candidate, in its policies, bounds and simulations, and a 1024-GPU
    machine's takes 20 ms to build. A pure function of the spec whose result is immutable (frozen dataclasses over
    ``FrozenDict``), so the cache changes no result."""
    try:
        return _cached_topology(spec)
    except TypeError:  # a spec holding something unhashable: built afresh
        return _build(spec)


@functools.lru_cache(maxsize=TOPOLOGY_CACHE)
def _cached_topology(spec: HardwareSpec) -> Topology:
    return _build(spec)


def _build(spec: HardwareSpec) -> Topology:
    if spec.unified_memory:
        return _unified(spec)
    return _discrete(spec)


def _discrete(spec: HardwareSpec) -> Topology:
    gpu, pcie, nodes, per_node = spec.gpu, spec.pcie, spec.nodes, spec.gpus_per_node
    gpus = [f"gpu{i}" for i in range(gpu.count)]
    pools: dict[str, Pool] = {}
    reserved = gpu_reserved(spec)
    for g in gpus:
        base = gpu.memory_bytes - sum(reserved.values())
        pools[g] = Pool(g, "hbm", gpu.memory_bytes, reserved, base * (1 - gpu.fragmentation))
    host_free = spec.host.dram_bytes - sum(spec.host.reserved.values())
    if nodes == 1:
        pools["cpu"] = Pool("cpu", "dram", spec.host.dram_bytes, spec.host.reserved, host_free)
    else:  # every node's host DRAM together (module docstring)
        pools["cpu"] = Pool("cpu", "dram", nodes * spec.host.dram_bytes,
                            {k: nodes * v for k, v in spec.host.reserved.items()}, nodes * host_free)

    links: dict[str, Link] = {}
    down: dict[str, Route] = {}  # cpu -> gpu
    switched = spec.c2c is None and pcie.gpus_per_switch > 1
    per_switch = pcie.gpus_per_switch
    switches_per_node = -(-per_node // per_switch)

    def switch(i: int) -> int:
        return (i // per_node) * switches_per_node + (i % per_node) // per_switch

    for i, g in enumerate(gpus):
        if spec.c2c is not None:
            bw = spec.c2c.per_direction_bw
            links[f"{g}.c2c"] = Link(f"{g}.c2c", "c2c", bw, bw, bw, spec.c2c.latency_s)
            down[g] = (Hop(f"{g}.c2c", True),)
            continue
        links[f"{g}.pcie"] = Link(
            f"{g}.pcie", "pcie", pcie.per_direction_bw, pcie.per_direction_bw, pcie.duplex_bw, pcie.latency_s
        )
        if switched:
            sw = f"sw{switch(i)}.uplink"
            up_bw = pcie.uplink_bw
            links.setdefault(sw, Link(sw, "pcie", up_bw, up_bw, 2 * up_bw * pcie.duplex_fraction, 0.0))
            down[g] = (Hop(sw, True), Hop(f"{g}.pcie", True))
        else:
            down[g] = (Hop(f"{g}.pcie", True),)
    if spec.nvlink is not None:
        bw = spec.nvlink.per_direction_bw
        for g in gpus:
            links[f"{g}.nvlink"] = Link(f"{g}.nvlink", "nvlink", bw, bw, None, spec.nvlink.latency_s / 2)

    routes: dict[tuple[str, str], Route] = {}
    for a in gpus:  # GPU pairs of one node: Topology.peer; across nodes: Topology.to_network
        routes[("cpu", a)] = down[a]
        routes[(a, "cpu")] = _reverse(down[a])
    peer = "nvlink" if spec.nvlink is not None else "p2p" if switched and pcie.p2p else "host"
    to_network = _network(spec, gpus, links, down)

    locations = [*gpus, "cpu"]
    nvme_link = _nvme_link(spec)
    if nvme_link is not None and spec.nvme is not None:
        links["nvme.io"] = nvme_link
        capacity = nodes * spec.nvme.capacity_bytes
        pools["nvme"] = Pool("nvme", "nvme", capacity, {}, capacity)
        locations.append("nvme")
        write, read = (Hop("nvme.io", True),), (Hop("nvme.io", False),)
        routes[("cpu", "nvme")], routes[("nvme", "cpu")] = write, read
        for g in gpus:
            routes[(g, "nvme")] = routes[(g, "cpu")] + write
            routes[("nvme", g)] = read + routes[("cpu", g)]
    return Topology(tuple(locations), {loc: loc for loc in locations}, pools, links, routes,
                    nodes, per_node if nodes > 1 else 0, to_network, peer,
                    spec.nvlink.collective_bytes() if spec.nvlink is not None else {})


def _network(spec: HardwareSpec, gpus: list[str], links: dict[str, Link], down: Mapping[str, Route]
             ) -> dict[str, Route]:
    """The NIC links of every node (added to ``links``) and each GPU's way out to its NIC (one node: none)."""
    net = spec.network
    if spec.nodes == 1 or net is None:
        return {}
    per_node = spec.gpus_per_node
    n_links = min(net.nics, per_node)
    bw = net.per_direction_bw * net.nics / n_links
    out: dict[str, Route] = {}
    for i, g in enumerate(gpus):
        node, local = divmod(i, per_node)
        nic = f"n{node}.nic{local * n_links // per_node}"
        links.setdefault(nic, Link(nic, "nic", bw, bw, None, net.latency_s / 2))
        to_nic = (Hop(f"{g}.pcie", False),) if f"{g}.pcie" in links else _reverse(down[g])
        out[g] = (*to_nic, Hop(nic, False))
    return out


def _unified(spec: HardwareSpec) -> Topology:
    reserved = {f"gpu.{k}": v for k, v in gpu_reserved(spec).items()}
    reserved.update({f"host.{k}": v for k, v in spec.host.reserved.items()})
    physical = spec.host.dram_bytes
    pools = {"unified": Pool("unified", "unified", physical, reserved, physical - sum(reserved.values()))}
    half = spec.host.dram_bw / 2
    links = {"unified.memcpy": Link("unified.memcpy", "memcpy", half, half, half, spec.gpu.launch_overhead_s)}
    if spec.c2c is not None:
        bw = spec.c2c.per_direction_bw
        links["gpu0.c2c"] = Link("gpu0.c2c", "c2c", bw, bw, bw, spec.c2c.latency_s)
    routes: dict[tuple[str, str], Route] = {
        ("cpu", "gpu0"): (Hop("unified.memcpy", True),),
        ("gpu0", "cpu"): (Hop("unified.memcpy", False),),
    }
    locations = ["gpu0", "cpu"]
    pool_of = {"gpu0": "unified", "cpu": "unified"}
    nvme_link = _nvme_link(spec)
    if nvme_link is not None and spec.nvme is not None:
        links["nvme.io"] = nvme_link
        pools["nvme"] = Pool("nvme", "nvme", spec.nvme.capacity_bytes, {}, spec.nvme.capacity_bytes)
        locations.append("nvme")
        pool_of["nvme"] = "nvme"
        for loc in ("cpu", "gpu0"):
            routes[(loc, "nvme")] = (Hop("nvme.io", True),)
            routes[("nvme", loc)] = (Hop("nvme.io", False),)
    return Topology(tuple(locations), pool_of, pools, links, routes)
