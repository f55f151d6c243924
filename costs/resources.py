"""The named resources that flows use, and their capacities (units per second).

A resource is a string key:

- ``<link>:fwd`` / ``<link>:rev``: one direction of a topology link (bytes/s; forward = away from host DRAM);
- ``<link>:duplex``: the link's budget for both directions together, where it has one (bytes/s);
- ``<gpu>.sm``: a GPU's SMs, capacity 1 (seconds of work per second);
- ``cpu.adam``: the host's CPU-Adam throughput (parameters/s, shared by every rank's optimizer; with nodes,
  every node's hosts together, as the ``cpu`` pool: ``hardware_models.topology``);
- ``host.cores``: the host's cores where the "GPU" is the host itself (``gpu.shares_host``): capacity
  ``host.cores`` (every node's), each flow one thread's work using at most one core (seconds of work/s).
"""

from __future__ import annotations

from hardware_models import HardwareSpec, Link, Topology

__all__ = [
    "CPU_ADAM", "HOST_CORES", "both_ways_bw", "direction_key", "duplex_key", "link_capacities",
    "machine_capacities", "sm_resource",
]

CPU_ADAM = "cpu.adam"
HOST_CORES = "host.cores"


def direction_key(link: str, forward: bool) -> str:
    """Resource of one direction of ``link``."""
    return f"{link}:{'fwd' if forward else 'rev'}"


def duplex_key(link: str) -> str:
    """Resource of ``link``'s both-directions budget (exists only where ``Link.duplex_bw`` is set)."""
    return f"{link}:duplex"


def sm_resource(gpu: str) -> str:
    """Resource of a GPU's SMs (capacity 1 second of work per second)."""
    return f"{gpu}.sm"


def both_ways_bw(link: Link) -> float:
    """Bytes/s ``link`` carries with both directions busy: its duplex cap, or fwd + rev if full duplex."""
    return link.duplex_bw if link.duplex_bw is not None else link.bw_fwd + link.bw_rev


def link_capacities(topo: Topology) -> dict[str, float]:
    """Bytes/s of every link resource of ``topo``: each direction, and the duplex budget where there is one."""
    caps: dict[str, float] = {}
    for name, ln in topo.links.items():
        caps[direction_key(name, True)] = ln.bw_fwd
        caps[direction_key(name, False)] = ln.bw_rev
        if ln.duplex_bw is not None:
            caps[duplex_key(name)] = ln.duplex_bw
    return caps


def machine_capacities(hw: HardwareSpec, topo: Topology) -> dict[str, float]:
    """Capacity of every resource the engine's flows use on ``hw``: links, each GPU's SMs, CPU Adam and,
    on a shared host, its cores."""
    caps = link_capacities(topo)
    for g in topo.gpu_locations():
        caps[sm_resource(g)] = 1.0
    caps[CPU_ADAM] = hw.host.optimizer_params_per_s * hw.nodes
    if hw.gpu.shares_host:
        # one core per concurrent flow: on a CPU-only machine every "GPU" kernel, copy and optimizer step
        # is one thread's work (replay.threads), at most one core each, all of them sharing the cores
        caps[HOST_CORES] = float(hw.host.cores * hw.nodes)
    return caps
