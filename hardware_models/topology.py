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

Not modelled: NICs sharing a switch uplink (DGX A100 has 2 per switch), NUMA (socket-local vs remote
DRAM), host DRAM bandwidth as a shared resource, pageable (unpinned) copies, size-dependent link
efficiency.

Latency: `route_latency` sums the hops' `latency_s`. The transfer-setup latency is charged once per
route: ``pcie.latency`` sits on ``gpu{i}.pcie`` (uplinks carry 0), each ``gpu{i}.nvlink`` carries half
of ``nvlink.latency``, ``unified.memcpy`` carries ``gpu.launch_overhead`` (a copy launch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from hardware_models.errors import HardwareInputError
from hardware_models.frozen import FrozenDict
from hardware_models.spec import HardwareSpec

__all__ = ["COMM_BUFFERS", "Hop", "Link", "Pool", "Topology", "build_topology", "gpu_reserved"]

POOL_KINDS: Final = ("hbm", "dram", "nvme", "unified")
LINK_KINDS: Final = ("pcie", "nvlink", "c2c", "nvme", "memcpy")


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

    def __post_init__(self) -> None:
        for name in ("pool_of", "pools", "links", "routes"):
            object.__setattr__(self, name, FrozenDict(getattr(self, name)))
        for loc in self.locations:
            if self.pool_of.get(loc) not in self.pools:
                raise HardwareInputError(f"location {loc!r} has no pool", field="pool_of")
        for (src, dst), hops in self.routes.items():
            for hop in hops:
                if hop.link not in self.links:
                    raise HardwareInputError(
                        f"route {src}->{dst} uses unknown link {hop.link!r}", field="routes"
                    )

    def _check_location(self, loc: str) -> None:
        if loc not in self.locations:
            raise HardwareInputError(f"unknown location {loc!r}; known: {', '.join(self.locations)}")

    def route(self, src: str, dst: str) -> Route:
        """The hops of a copy from `src` to `dst`; () when they are the same location."""
        self._check_location(src)
        self._check_location(dst)
        if src == dst:
            return ()
        return self.routes[(src, dst)]

    def route_latency(self, src: str, dst: str) -> float:
        """Sum of the latencies of the route's links (seconds)."""
        return sum(self.links[h.link].latency_s for h in self.route(src, dst))

    def gpu_locations(self) -> tuple[str, ...]:
        """``gpu0 .. gpu{n-1}``."""
        return tuple(loc for loc in self.locations if loc.startswith("gpu"))


def _reverse(route: Route) -> Route:
    return tuple(Hop(h.link, not h.forward) for h in reversed(route))


def _nvme_link(spec: HardwareSpec) -> Link | None:
    if spec.nvme is None:
        return None
    nvme = spec.nvme
    return Link(
        "nvme.io", "nvme", nvme.write_bw, nvme.read_bw, max(nvme.read_bw, nvme.write_bw), nvme.latency_s
    )


COMM_BUFFERS: Final = "comm_buffers"


def gpu_reserved(spec: HardwareSpec) -> dict[str, float]:
    """The reserved lines that apply on this machine: ``gpu.reserved.comm_buffers`` (NCCL's per-rank
    buffers) only with more than one GPU, since a single rank creates no NCCL communicator."""
    return {k: v for k, v in spec.gpu.reserved.items() if k != COMM_BUFFERS or spec.gpu.count > 1}


def build_topology(spec: HardwareSpec) -> Topology:
    """The pools, links and routes of `spec` (rules in the module docstring)."""
    if spec.unified_memory:
        return _unified(spec)
    return _discrete(spec)


def _discrete(spec: HardwareSpec) -> Topology:
    gpu, pcie = spec.gpu, spec.pcie
    gpus = [f"gpu{i}" for i in range(gpu.count)]
    pools: dict[str, Pool] = {}
    reserved = gpu_reserved(spec)
    for g in gpus:
        base = gpu.memory_bytes - sum(reserved.values())
        pools[g] = Pool(g, "hbm", gpu.memory_bytes, reserved, base * (1 - gpu.fragmentation))
    host_free = spec.host.dram_bytes - sum(spec.host.reserved.values())
    pools["cpu"] = Pool("cpu", "dram", spec.host.dram_bytes, spec.host.reserved, host_free)

    links: dict[str, Link] = {}
    down: dict[str, Route] = {}  # cpu -> gpu
    switched = spec.c2c is None and pcie.gpus_per_switch > 1
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
            sw = f"sw{i // pcie.gpus_per_switch}.uplink"
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
    for i, a in enumerate(gpus):
        routes[("cpu", a)] = down[a]
        routes[(a, "cpu")] = _reverse(down[a])
        for j, b in enumerate(gpus):
            if a == b:
                continue
            if spec.nvlink is not None:
                routes[(a, b)] = (Hop(f"{a}.nvlink", False), Hop(f"{b}.nvlink", True))
            elif switched and pcie.p2p and i // pcie.gpus_per_switch == j // pcie.gpus_per_switch:
                routes[(a, b)] = (Hop(f"{a}.pcie", False), Hop(f"{b}.pcie", True))
            else:
                routes[(a, b)] = _reverse(down[a]) + down[b]

    locations = [*gpus, "cpu"]
    nvme_link = _nvme_link(spec)
    if nvme_link is not None and spec.nvme is not None:
        links["nvme.io"] = nvme_link
        pools["nvme"] = Pool("nvme", "nvme", spec.nvme.capacity_bytes, {}, spec.nvme.capacity_bytes)
        locations.append("nvme")
        write, read = (Hop("nvme.io", True),), (Hop("nvme.io", False),)
        routes[("cpu", "nvme")], routes[("nvme", "cpu")] = write, read
        for g in gpus:
            routes[(g, "nvme")] = routes[(g, "cpu")] + write
            routes[("nvme", g)] = read + routes[("cpu", g)]
    return Topology(tuple(locations), {loc: loc for loc in locations}, pools, links, routes)


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
