"""Copies: the bytes a transfer puts on each resource of its route and its seconds when it runs alone.

The engine charges a copy of ``nbytes`` from ``src`` to ``dst`` as the route's latency, then a flow of
``nbytes`` over the route's resources (:mod:`costs.routes`) at its max-min fair rate; alone, that is the
narrowest resource of the route (a resource crossed twice counts twice).
"""

from __future__ import annotations

from collections.abc import Mapping

from costs.rates import solo_rate, usage
from costs.routes import RouteResources

__all__ = ["busy_seconds", "copy_resource_bytes", "copy_seconds"]


def copy_resource_bytes(route: RouteResources, nbytes: float) -> dict[str, float]:
    """Bytes a copy of ``nbytes`` over ``route`` puts on each of its resources."""
    return {r: nbytes * x for r, x in usage(route.resources).items()}


def copy_seconds(route: RouteResources, nbytes: float, capacity: Mapping[str, float]) -> float:
    """Seconds of a copy of ``nbytes`` over ``route`` with the machine to itself: latency + bytes at the
    route's narrowest resource (0 for nothing to move or an empty route)."""
    if nbytes <= 0 or not route.resources:
        return 0.0 if nbytes <= 0 else route.latency_s
    return route.latency_s + nbytes / solo_rate(usage(route.resources), capacity)


def busy_seconds(resource_units: Mapping[str, float], capacity: Mapping[str, float]) -> dict[str, float]:
    """Seconds each resource needs for the units put on it (bytes on a link resource): units / capacity."""
    return {r: u / capacity[r] for r, u in resource_units.items()}
