"""`Curve`: an efficiency over a size, piecewise linear in log10(size), clamped at both ends."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from hardware_models.errors import HardwareInputError

__all__ = ["Curve"]


@dataclass(frozen=True)
class Curve:
    """Efficiency (a fraction in (0, 1]) as a function of a positive size x.

    `points` are (x, efficiency) pairs with x > 0 strictly ascending. Between two points the
    efficiency is linear in log10(x); below the first point it is the first efficiency, above the
    last point the last one (clamped, never extrapolated). One point makes a constant.
    Errors name the offending point as ``[i]``; the loader prefixes the field path.
    """

    points: tuple[tuple[float, float], ...]
    _log_x: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        points = _as_points(self.points)
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "_log_x", tuple(math.log10(x) for x, _ in points))

    @classmethod
    def constant(cls, efficiency: float) -> Curve:
        """A curve with the same efficiency at every size."""
        return cls(((1.0, efficiency),))

    def __call__(self, x: float) -> float:
        if math.isnan(x):
            raise HardwareInputError("curve evaluated at NaN")
        points = self.points
        if x <= points[0][0]:
            return points[0][1]
        if x >= points[-1][0]:
            return points[-1][1]
        lx = math.log10(x)
        i = bisect.bisect_right(self._log_x, lx)  # points[i-1].x <= x < points[i].x
        x0, x1 = self._log_x[i - 1], self._log_x[i]
        y0, y1 = points[i - 1][1], points[i][1]
        return y0 + (y1 - y0) * (lx - x0) / (x1 - x0)


def _as_points(raw: Iterable[object]) -> tuple[tuple[float, float], ...]:
    try:
        items = list(raw)
    except TypeError:
        raise HardwareInputError(f"expected a list of [size, efficiency] pairs, got {raw!r}") from None
    if not items:
        raise HardwareInputError("a curve needs at least one [size, efficiency] point")
    out: list[tuple[float, float]] = []
    for i, item in enumerate(items):
        where = f"[{i}]"
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise HardwareInputError(f"expected a pair [size, efficiency], got {item!r}", field=where)
        numbers: list[float] = []
        for v in item:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise HardwareInputError(f"expected finite numbers, got {item!r}", field=where)
            numbers.append(float(v))
        x, y = numbers
        if x <= 0:
            raise HardwareInputError(f"size must be > 0, got {x!r}", field=where)
        if not 0 < y <= 1:
            raise HardwareInputError(f"efficiency must be in (0, 1], got {y!r}", field=where)
        if out and x <= out[-1][0]:
            raise HardwareInputError(
                f"sizes must be strictly ascending, got {x!r} after {out[-1][0]!r}", field=where
            )
        out.append((x, y))
    return tuple(out)
