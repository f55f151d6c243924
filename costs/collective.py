"""Collectives, the engine's collective model: a ring on one node, a hierarchical collective across nodes.

One node (every rank on one node, or a one-node machine): a ring. Rank i sends ``(n-1)/n`` of the bytes to
rank i+1 (twice that for an all-reduce: reduce-scatter then all-gather) over its route. The n transfers
move in lockstep, so the engine runs them as ONE flow of ``per_rank`` bytes that uses every hop's resources
(a resource on two hops of the ring is used twice). Before it, the ring pays the largest hop latency once
per ring step: ``n - 1`` steps (``2 (n - 1)`` for an all-reduce). Where the GPUs' fabric says its library
moves more than a ring for a kind (``NvlinkSpec.reduce_scatter_bytes`` / ``all_gather_bytes``, measured by
``calibrate --ranks`` for torch.distributed's gloo on one host), ``per_rank`` is that multiple of the ring's
(:func:`fabric_factor`).

Across nodes (ranks on N > 1 nodes, m on each): hierarchical, as NCCL does it on rail-optimised clusters
and as Megatron-LM / DeepSpeed describe it (Jeaugey, "Massively Scale Your Deep Learning Training with NCCL
2.4", NVIDIA blog 2019: rings within a node over NVLink, the inter-node part over every NIC at once, one
"rail" per local rank). For a collective of S bytes and factor f (2 for an all-reduce, 1 for all-gather or
reduce-scatter):

- inside each node, a ring over its m ranks (NVLink): each rank sends ``V = f (m-1)/m S`` to the next
  (reduce-scatter before, all-gather after the inter-node part);
- between nodes, m rings, one per local rank l (rail l: rank l of every node, over its own NIC), each over
  the N nodes on a 1/m shard: each rank sends ``I = f (N-1)/N S/m`` to rank l of the next node.

The phases are pipelined chunk by chunk, as NCCL's are, so the engine still runs the collective as one
flow: ``per_rank = V + I`` bytes (what each rank sends), whose every intra-node hop carries the share
``V / (V + I)`` and every inter-node hop ``I / (V + I)`` of it (:attr:`Ring.weights`). Alone, it takes
the latency plus the largest of ``bytes on a resource / its capacity``: a node's NICs carry
``f (N-1)/N S`` in all, so across nodes the bus bandwidth is the node's NIC bandwidth, the figure NCCL's
tests report (``busbw``). Latency: ``f (m-1)`` steps at the largest intra-node hop latency plus
``f (N-1)`` steps at the largest inter-node hop latency. Ranks spread unevenly over the nodes (m differs)
fall back to the one ring, in node order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from costs.rates import solo_rate, usage
from costs.routes import RouteResources

__all__ = [
    "Ring", "fabric_factor", "hierarchical", "node_groups", "ring", "ring_factor", "ring_per_rank_bytes",
    "ring_seconds", "ring_steps",
]


def ring_factor(coll: str) -> int:
    """How many times a ring passes the data: 2 for ``all_reduce``, 1 for all-gather / reduce-scatter."""
    return 2 if coll == "all_reduce" else 1


def ring_per_rank_bytes(nbytes: float, n: int, coll: str) -> float:
    """Bytes each of ``n`` ranks sends to the next in a ring collective of ``nbytes``."""
    return nbytes * (n - 1) / n * (2.0 if coll == "all_reduce" else 1.0)


def fabric_factor(route: Callable[[str, str], RouteResources] | object, coll: str) -> float:
    """What a collective of ``coll`` moves over the GPUs' fabric per rank, as a multiple of a ring's bytes: the
    topology's ``collective_bytes`` (``hardware_models.NvlinkSpec``: 1 for NCCL's rings; a calibrated gloo fabric
    measures its own). ``route``: a Topology, or a route table that knows its topology; else 1."""
    topo = getattr(route, "topo", route)
    factors = getattr(topo, "collective_bytes", None) or {}
    return float(factors.get(coll, 1.0))


def ring_steps(n: int, coll: str) -> int:
    """Ring steps of a collective over ``n`` ranks, each paying the largest hop latency once."""
    return (n - 1) * ring_factor(coll)


class Ring(NamedTuple):
    """One collective run as one flow: bytes per rank, its hops, its steps; across nodes also each hop's share
    of ``per_rank`` (``shares``, None: every hop carries all of it) and the latency (None: the largest hop
    latency once per step)."""

    per_rank: float
    hops: tuple[RouteResources, ...]
    steps: int
    shares: tuple[float, ...] | None = None
    latency: float | None = None

    @property
    def resources(self) -> tuple[str, ...]:
        """Every hop's resources, in ring order (a resource on two hops is listed twice)."""
        return tuple(r for h in self.hops for r in h.resources)

    @property
    def weights(self) -> tuple[float, ...] | None:
        """Units of each listed resource per unit of the flow (None: 1 each), for ``FlowNetwork.start``."""
        if self.shares is None:
            return None
        return tuple(x for h, x in zip(self.hops, self.shares, strict=True) for _ in h.resources)

    @property
    def latency_s(self) -> float:
        """The latency the collective pays (a ring: the largest hop latency once per ring step)."""
        if self.latency is not None:
            return self.latency
        return max((h.latency_s for h in self.hops), default=0.0) * self.steps

    @property
    def links(self) -> tuple[str, ...]:
        """The links the collective crosses, each once, in ring order."""
        return tuple(dict.fromkeys(ln for h in self.hops for ln in h.links))

    def hop_bytes(self) -> tuple[tuple[RouteResources, float], ...]:
        """(hop, bytes it carries) for every hop."""
        if self.shares is None:
            return tuple((h, self.per_rank) for h in self.hops)
        return tuple((h, self.per_rank * x) for h, x in zip(self.hops, self.shares, strict=True))

    @property
    def moved_bytes(self) -> float:
        """Bytes moved over all hops together."""
        return sum(b for _, b in self.hop_bytes())

    def resource_bytes(self) -> dict[str, float]:
        """Bytes the collective puts on each resource: what each hop crossing it carries (added hop by hop)."""
        acc: dict[str, float] = {}
        for hop, nbytes in self.hop_bytes():
            for r in hop.resources:
                acc[r] = acc.get(r, 0.0) + nbytes
        return acc

    def seconds(self, capacity: Mapping[str, float]) -> float:
        """Seconds with the machine to itself: latency, then ``per_rank`` bytes at the flow's narrowest
        resource. 0 for fewer than two ranks or nothing to move."""
        if not self.hops or self.per_rank <= 0:
            return 0.0
        return self.latency_s + self.per_rank / solo_rate(usage(self.resources, self.weights), capacity)


def node_groups(ranks: Sequence[str], node_of: Callable[[str], int]) -> list[list[str]]:
    """The ranks grouped by node, nodes in order of first appearance, ranks in their given order."""
    groups: dict[int, list[str]] = {}
    for r in ranks:
        groups.setdefault(node_of(r), []).append(r)
    return list(groups.values())


def ring(route: Callable[[str, str], RouteResources], ranks: Sequence[str], nbytes: float, coll: str) -> Ring:
    """The collective of ``coll`` over ``nbytes`` and ``ranks``; ``route`` gives each hop's route resources
    (a :class:`costs.RouteTable`; where it knows the topology's nodes, ranks on several nodes get the
    hierarchical collective). Fewer than two ranks: no hops, nothing to move."""
    n = len(ranks)
    if n <= 1:
        return Ring(0.0, (), 0)
    topo = getattr(route, "topo", None)
    if topo is not None and topo.nodes > 1:
        groups = node_groups(ranks, topo.node_of)
        if len(groups) > 1 and len({len(g) for g in groups}) == 1:
            return hierarchical(route, groups, nbytes, coll)
        ranks = [r for g in groups for r in g]
    hops = tuple(route(r, ranks[(i + 1) % n]) for i, r in enumerate(ranks))
    return Ring(ring_per_rank_bytes(nbytes, n, coll) * fabric_factor(route, coll), hops, ring_steps(n, coll))


def hierarchical(route: Callable[[str, str], RouteResources], groups: Sequence[Sequence[str]], nbytes: float,
                 coll: str) -> Ring:
    """The hierarchical collective over ``groups`` (one list of ranks per node, all of one length m; module
    docstring): intra-node rings and one inter-node ring per local rank, as one flow."""
    n_nodes, m = len(groups), len(groups[0])
    f = ring_factor(coll)
    intra_bytes = f * (m - 1) / m * nbytes * fabric_factor(route, coll)  # the intra-node rings: the GPUs' fabric
    inter_bytes = f * (n_nodes - 1) / n_nodes * nbytes / m
    per_rank = intra_bytes + inter_bytes
    intra = tuple(route(g[i], g[(i + 1) % m]) for g in groups for i in range(m)) if m > 1 else ()
    inter = tuple(route(groups[k][local], groups[(k + 1) % n_nodes][local])
                  for local in range(m) for k in range(n_nodes))
    shares = (intra_bytes / per_rank,) * len(intra) + (inter_bytes / per_rank,) * len(inter)
    latency = (f * (m - 1) * max((h.latency_s for h in intra), default=0.0)
               + f * (n_nodes - 1) * max(h.latency_s for h in inter))
    return Ring(per_rank, intra + inter, f * (m - 1 + n_nodes - 1), shares, latency)


def ring_seconds(route: Callable[[str, str], RouteResources], ranks: Sequence[str], nbytes: float, coll: str,
                 capacity: Mapping[str, float]) -> float:
    """Seconds of a collective of ``nbytes`` over ``ranks`` with the machine to itself."""
    return ring(route, ranks, nbytes, coll).seconds(capacity)
