"""Ring collectives, the engine's collective model.

A collective of ``nbytes`` over ``n`` ranks runs as a ring: rank i sends ``(n-1)/n`` of the bytes to rank
i+1 (twice that for an all-reduce: reduce-scatter then all-gather) over its route. The n transfers move in
lockstep, so the engine runs them as ONE flow of ``per_rank`` bytes that uses every hop's resources (a
resource on two hops of the ring is used twice). Before it, the ring pays the largest hop latency once per
ring step: ``n - 1`` steps (``2 (n - 1)`` for an all-reduce).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from costs.rates import solo_rate, usage
from costs.routes import RouteResources

__all__ = ["Ring", "ring", "ring_factor", "ring_per_rank_bytes", "ring_seconds", "ring_steps"]


def ring_factor(coll: str) -> int:
    """How many times a ring passes the data: 2 for ``all_reduce``, 1 for all-gather / reduce-scatter."""
    return 2 if coll == "all_reduce" else 1


def ring_per_rank_bytes(nbytes: float, n: int, coll: str) -> float:
    """Bytes each of ``n`` ranks sends to the next in a ring collective of ``nbytes``."""
    return nbytes * (n - 1) / n * (2.0 if coll == "all_reduce" else 1.0)


def ring_steps(n: int, coll: str) -> int:
    """Ring steps of a collective over ``n`` ranks, each paying the largest hop latency once."""
    return (n - 1) * ring_factor(coll)


class Ring(NamedTuple):
    """One ring collective: bytes per rank, its hops (rank i -> rank i+1) and its ring steps."""

    per_rank: float
    hops: tuple[RouteResources, ...]
    steps: int

    @property
    def resources(self) -> tuple[str, ...]:
        """Every hop's resources, in ring order (a resource on two hops is listed twice)."""
        return tuple(r for h in self.hops for r in h.resources)

    @property
    def latency_s(self) -> float:
        """The latency the ring pays: the largest hop latency once per ring step."""
        return max((h.latency_s for h in self.hops), default=0.0) * self.steps

    @property
    def links(self) -> tuple[str, ...]:
        """The links the ring crosses, each once, in ring order."""
        return tuple(dict.fromkeys(ln for h in self.hops for ln in h.links))

    def resource_bytes(self) -> dict[str, float]:
        """Bytes the ring puts on each resource: ``per_rank`` per hop that crosses it (added hop by hop)."""
        acc: dict[str, float] = {}
        for r in self.resources:
            acc[r] = acc.get(r, 0.0) + self.per_rank
        return acc

    def seconds(self, capacity: Mapping[str, float]) -> float:
        """Seconds with the machine to itself: latency, then ``per_rank`` bytes at the ring's narrowest
        resource (capacity over the number of hops on it). 0 for fewer than two ranks or nothing to move."""
        if not self.hops or self.per_rank <= 0:
            return 0.0
        return self.latency_s + self.per_rank / solo_rate(usage(self.resources), capacity)


def ring(route: Callable[[str, str], RouteResources], ranks: Sequence[str], nbytes: float, coll: str) -> Ring:
    """The ring of a ``coll`` collective of ``nbytes`` over ``ranks``; ``route`` gives each hop's route
    resources (a :class:`costs.RouteTable`). Fewer than two ranks: no hops, nothing to move."""
    n = len(ranks)
    if n <= 1:
        return Ring(0.0, (), 0)
    hops = tuple(route(r, ranks[(i + 1) % n]) for i, r in enumerate(ranks))
    return Ring(ring_per_rank_bytes(nbytes, n, coll), hops, ring_steps(n, coll))


def ring_seconds(route: Callable[[str, str], RouteResources], ranks: Sequence[str], nbytes: float, coll: str,
                 capacity: Mapping[str, float]) -> float:
    """Seconds of a ring collective of ``nbytes`` over ``ranks`` with the machine to itself."""
    return ring(route, ranks, nbytes, coll).seconds(capacity)
