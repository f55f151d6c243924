"""Small validators shared by the model and configuration loaders (no state, no I/O)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from typing import Any

from workloads.errors import WorkloadInputError

__all__ = ["positive_int", "non_negative_int", "finite_number", "boolean", "choice", "reject_unknown_keys",
           "suggest", "dataclass_kwargs"]


def suggest(word: str, candidates: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest candidate, or "" when none is close."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


def positive_int(value: object, field: str, where: str) -> int:
    """Check that ``value`` is an integer >= 1 (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadInputError(f"{where}: field '{field}' must be a positive integer (got {value!r})")
    if value < 1:
        raise WorkloadInputError(f"{where}: field '{field}' must be >= 1 (got {value}); give a positive size")
    return value


def non_negative_int(value: object, field: str, where: str) -> int:
    """Check that ``value`` is an integer >= 0 (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadInputError(f"{where}: field '{field}' must be a non-negative integer (got {value!r})")
    if value < 0:
        raise WorkloadInputError(f"{where}: field '{field}' must be >= 0 (got {value})")
    return value


def finite_number(value: object, field: str, where: str, minimum: float = 0.0) -> float:
    """Check that ``value`` is a finite number >= ``minimum`` (bools, NaN and infinities are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
        raise WorkloadInputError(
            f"{where}: field '{field}' must be a finite number >= {minimum:g} (got {value!r})"
        )
    return float(value)


def boolean(value: object, field: str, where: str) -> bool:
    """Check that ``value`` is a bool (YAML true/false, JSON true/false)."""
    if not isinstance(value, bool):
        raise WorkloadInputError(f"{where}: field '{field}' must be true or false (got {value!r})")
    return value


def choice(value: object, field: str, allowed: Iterable[str], where: str) -> str:
    """Check that ``value`` is one of ``allowed``."""
    options = list(allowed)
    if not isinstance(value, str) or value not in options:
        hint = suggest(value, options) if isinstance(value, str) else ""
        raise WorkloadInputError(
            f"{where}: field '{field}' must be one of {', '.join(options)} (got {value!r}){hint}"
        )
    return value


def reject_unknown_keys(data: Mapping[str, object], known: Iterable[str], where: str) -> None:
    """Refuse keys outside ``known``, suggesting the closest known key."""
    known_list = list(known)
    for key in data:
        if key not in known_list:
            raise WorkloadInputError(
                f"{where}: unknown key '{key}'{suggest(str(key), known_list)} "
                f"(known keys: {', '.join(known_list)})"
            )


def dataclass_kwargs(cls: type, data: object, where: str) -> dict[str, Any]:
    """Check a mapping against a dataclass: no unknown keys, every field without a default present."""
    if not isinstance(data, dict):
        raise WorkloadInputError(f"{where}: expected a mapping (got {type(data).__name__})")
    names = [f.name for f in fields(cls)]
    reject_unknown_keys(data, names, where)
    for f in fields(cls):
        if f.name not in data and f.default is MISSING and f.default_factory is MISSING:
            msg = f"{where}: missing field '{f.name}'; add it (fields: {', '.join(names)})"
            raise WorkloadInputError(msg)
    return data
