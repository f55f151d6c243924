"""Route resources: what a transfer from ``src`` to ``dst`` on a Topology crosses.

For each hop of ``Topology.route(src, dst)``: the resource of the direction it is crossed in and, where the
link has a duplex budget, that budget too (so H2D and D2H share it). The route's latency is the sum of its
links' latencies.
"""

from __future__ import annotations

from typing import NamedTuple

from costs.resources import direction_key, duplex_key
from hardware_models import Topology

__all__ = ["RouteResources", "RouteTable", "route_resources"]


class RouteResources(NamedTuple):
    """The flow resources of one route, its latency (s) and the names of the links it crosses."""

    resources: tuple[str, ...]
    latency_s: float
    links: tuple[str, ...]


def route_resources(topo: Topology, src: str, dst: str) -> RouteResources:
    """Resources, latency and links of a transfer from ``src`` to ``dst`` (empty where src == dst)."""
    res: list[str] = []
    links: list[str] = []
    lat = 0.0
    for h in topo.route(src, dst):
        ln = topo.links[h.link]
        res.append(direction_key(h.link, h.forward))
        if ln.duplex_bw is not None:
            res.append(duplex_key(h.link))
        links.append(h.link)
        lat += ln.latency_s
    return RouteResources(tuple(res), lat, tuple(links))


class RouteTable:
    """:func:`route_resources` of one topology, each (src, dst) worked out once."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._memo: dict[tuple[str, str], RouteResources] = {}

    def __call__(self, src: str, dst: str) -> RouteResources:
        key = (src, dst)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = route_resources(self.topo, src, dst)
        return got
