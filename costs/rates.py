"""Shared rates: how concurrent flows divide capacitated resources, max-min fairly.

A flow's *usage* maps each resource it crosses to the units of that resource one unit of the flow uses
(1 for a copy's every hop; a ring collective crosses some links more than once). Rates are in units of
the flow per second; capacities in units of the resource per second.

:func:`max_min_rates` is progressive filling (Bertsekas & Gallager, Data Networks, §6.5.2): raise every
unfrozen flow's rate together until a resource saturates, freeze the flows on it, repeat. It is the
algorithm the engine's ``FlowNetwork`` runs whenever a flow starts or ends, so an estimate priced with it
is the engine's figure for flows that run side by side from start to end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from costs.routes import RouteTable
from hardware_models import Topology

__all__ = [
    "Usage", "both_ways_transfer_rate", "bottleneck_share", "max_min_rates", "resource_load", "slowest_transfer_rate",
    "solo_rate", "transfer_rates", "usage",
]

Usage = Mapping[str, float]  # resource -> units of it per unit of flow
_EPS = 1e-12


def usage(resources: Sequence[str], weights: Sequence[float] | None = None) -> dict[str, float]:
    """The usage of a flow over ``resources``: each resource's weight is the sum of the ``weights`` listed for
    it (one per listed resource, default 1 each), so a resource listed twice (a route that crosses a link's
    duplex budget on the way up and again on the way down) is used twice."""
    acc: dict[str, float] = {}
    if weights is None:
        for r in resources:
            acc[r] = acc.get(r, 0.0) + 1.0
        return acc
    for r, x in zip(resources, weights, strict=True):
        acc[r] = acc.get(r, 0.0) + float(x)
    return acc


def solo_rate(flow: Usage, capacity: Mapping[str, float]) -> float:
    """Rate of a flow that has its resources to itself: the narrowest of them."""
    return min(capacity[r] / x for r, x in flow.items())


def max_min_rates(flows: Sequence[Usage], capacity: Mapping[str, float]) -> list[float]:
    """Max-min fair rates of ``flows`` running together over resources of ``capacity`` (one rate per flow,
    in its order). Every flow must use at least one resource with a positive weight.

    Ties between equally narrow resources are broken by resource name, and flows on one resource are
    frozen in their order, so the figures are deterministic."""
    cap: dict[str, float] = {}
    count: dict[str, float] = {}
    on: dict[str, list[int]] = {}
    for i, f in enumerate(flows):
        for r, x in f.items():
            if r not in cap:
                cap[r] = capacity[r]
                count[r] = 0.0
                on[r] = []
            count[r] += x
            on[r].append(i)
    active = {r: len(ids) for r, ids in on.items()}  # flows not yet frozen on each resource
    rates = [0.0] * len(flows)
    frozen = [False] * len(flows)
    left = len(flows)
    while left:
        # a resource whose flows are all frozen is done, whatever rounding left in its count (weights of ~1e10,
        # as bytes/s, leave residues far above _EPS: picking it again froze nothing, for ever)
        r_star = min((r for r in cap if active[r] and count[r] > _EPS), key=lambda r: (cap[r] / count[r], r))
        share = max(cap[r_star], 0.0) / count[r_star]
        for i in on[r_star]:
            if frozen[i]:
                continue
            frozen[i] = True
            left -= 1
            rates[i] = share
            for r, x in flows[i].items():
                cap[r] -= share * x
                count[r] -= x
                active[r] -= 1
    return rates


def bottleneck_share(flows: Sequence[Usage], capacity: Mapping[str, float]) -> float:
    """The smallest of the max-min rates of ``flows``: min over resources of capacity / total usage
    (the first resource progressive filling saturates). inf where there are no flows."""
    count: dict[str, float] = {}
    for f in flows:
        for r, x in f.items():
            count[r] = count.get(r, 0.0) + x
    return min((capacity[r] / n for r, n in count.items() if n > 0), default=float("inf"))


def _transfer_usages(routes: RouteTable, pairs: Iterable[tuple[str, str]]) -> list[dict[str, float]]:
    return [usage(routes(src, dst).resources) for src, dst in pairs if src != dst]


def transfer_rates(topo: Topology, pairs: Sequence[tuple[str, str]],
                   capacity: Mapping[str, float]) -> list[float]:
    """Bytes/s each transfer of ``pairs`` (src, dst) gets while all of them run at once (max-min fair over
    their routes' resources, ``capacity`` as :func:`costs.link_capacities` gives). A pair with
    src == dst moves nothing: its rate is inf."""
    routes = RouteTable(topo)
    rates = iter(max_min_rates(_transfer_usages(routes, pairs), capacity))
    return [next(rates) if s != d else float("inf") for s, d in pairs]


def slowest_transfer_rate(topo: Topology, pairs: Sequence[tuple[str, str]],
                          capacity: Mapping[str, float]) -> tuple[float, float]:
    """(bytes/s of the slowest of ``pairs`` while all run at once, the largest of their route latencies).

    Equal concurrent transfers, e.g. every GPU's upload: the rate is the :func:`bottleneck_share` of their
    routes; (inf, 0) where no pair moves anything."""
    routes = RouteTable(topo)
    moving = [(s, d) for s, d in pairs if s != d]
    lat = max((routes(s, d).latency_s for s, d in moving), default=0.0)
    return bottleneck_share(_transfer_usages(routes, moving), capacity), lat


def both_ways_transfer_rate(topo: Topology, pairs: Sequence[tuple[str, str]],
                            capacity: Mapping[str, float]) -> float:
    """Bytes/s both directions together of the slowest of ``pairs`` while every pair moves data both ways at
    once (each pair's transfer and its reverse all running): twice the :func:`slowest_transfer_rate` of the
    pairs and their reverses. On one link that is its :func:`costs.both_ways_bw` split among its users."""
    both = [*pairs, *((d, s) for s, d in pairs)]
    return 2 * slowest_transfer_rate(topo, both, capacity)[0]


def resource_load(topo: Topology, transfers: Iterable[tuple[str, str, float]]) -> dict[str, float]:
    """Bytes each link resource carries for ``transfers`` (src, dst, bytes); divide by the capacities
    (:func:`costs.busy_seconds`) for each resource's minimum busy time."""
    routes = RouteTable(topo)
    load: dict[str, float] = {}
    for src, dst, nbytes in transfers:
        for r in routes(src, dst).resources:
            load[r] = load.get(r, 0.0) + nbytes
    return load
