"""The Pareto front of simulated candidates: throughput (higher is better) vs GPU and CPU memory (lower)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a`` is no worse than ``b`` in every coordinate (all minimised) and better in one."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def pareto_front(items: Sequence[T], costs: Callable[[T], tuple[float, ...]]) -> list[T]:
    """Items no other item dominates, in their given order; of items with equal costs the first is kept."""
    pts = [costs(x) for x in items]
    out: list[T] = []
    seen: set[tuple[float, ...]] = set()
    for i, x in enumerate(items):
        if pts[i] in seen or any(dominates(pts[j], pts[i]) for j in range(len(items)) if j != i):
            continue
        seen.add(pts[i])
        out.append(x)
    return out
