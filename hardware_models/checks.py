"""Range checks shared by the value objects; each failure names the dotted YAML field."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hardware_models.errors import HardwareInputError
from hardware_models.frozen import FrozenDict

__all__ = [
    "check_fraction",
    "check_int",
    "check_mapping",
    "check_non_negative",
    "check_positive",
    "check_text",
]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: object, fmt: Callable[[float], str] | None) -> str:
    if fmt is not None and _is_number(value):
        return fmt(value)  # type: ignore[arg-type]
    return repr(value)


def check_positive(
    value: object, field: str, what: str = "a positive number", fmt: Callable[[float], str] | None = None
) -> None:
    """`value` is a finite number > 0."""
    if not _is_number(value) or value <= 0:  # type: ignore[operator]
        raise HardwareInputError(f"must be {what} (> 0), got {_show(value, fmt)}", field=field)


def check_non_negative(
    value: object, field: str, what: str = "a number", fmt: Callable[[float], str] | None = None
) -> None:
    """`value` is a finite number >= 0."""
    if not _is_number(value) or value < 0:  # type: ignore[operator]
        raise HardwareInputError(f"must be {what} >= 0, got {_show(value, fmt)}", field=field)


def check_fraction(
    value: object,
    field: str,
    low: float = 0.0,
    low_inclusive: bool = False,
    high: float = 1.0,
    high_inclusive: bool = True,
) -> None:
    """`value` lies in the interval given by low/high and their inclusivity (default (0, 1])."""
    ok = _is_number(value)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = (v >= low if low_inclusive else v > low) and (v <= high if high_inclusive else v < high)
    if not ok:
        interval = f"{'[' if low_inclusive else '('}{low:g}, {high:g}{']' if high_inclusive else ')'}"
        raise HardwareInputError(f"must be a fraction in {interval}, got {value!r}", field=field)


def check_int(value: object, field: str, minimum: int = 1, allowed: tuple[int, ...] | None = None) -> None:
    """`value` is an int >= `minimum` (and among `allowed` when given)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise HardwareInputError(f"must be a whole number, got {value!r}", field=field)
    if allowed is not None and value not in allowed:
        choices = ", ".join(str(a) for a in allowed)
        raise HardwareInputError(f"must be one of {choices}, got {value!r}", field=field)
    if value < minimum:
        raise HardwareInputError(f"must be >= {minimum}, got {value!r}", field=field)


def check_text(value: object, field: str) -> None:
    """`value` is a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise HardwareInputError(f"must be a non-empty text, got {value!r}", field=field)


def check_mapping(
    value: object, field: str, check: Callable[[object, str], None], keys: tuple[str, ...] | None = None
) -> FrozenDict[str, float]:
    """A frozen copy of a name -> number mapping whose every value passes `check(value, path)`."""
    if not isinstance(value, Mapping):
        raise HardwareInputError(f"must be a mapping of name: value, got {value!r}", field=field)
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise HardwareInputError(f"keys must be non-empty names, got {key!r}", field=field)
        if keys is not None and key not in keys:
            raise HardwareInputError(f"unknown key {key!r}; known: {', '.join(keys)}", field=f"{field}.{key}")
        check(item, f"{field}.{key}")
    return FrozenDict({k: float(v) for k, v in value.items()})
