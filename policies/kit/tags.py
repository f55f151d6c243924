"""Task tags: every kit task carries its ``Phase`` and, where it has them, its layer, rank and use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.phase import Phase


def tags(phase: Phase, *, layer: int | None = None, rank: int | None = None, use: str | None = None,
         extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The tags dict of a task: ``phase`` plus those of layer / rank / use that are given, plus ``extra``.

    ``use`` is ``"fwd"`` or ``"bwd"`` for an event that happens for both (a parameter fetch).
    """
    out: dict[str, Any] = {"phase": phase}
    if layer is not None:
        out["layer"] = layer
    if rank is not None:
        out["rank"] = rank
    if use is not None:
        out["use"] = use
    if extra:
        out.update(extra)
    return out


def use_of(phase: str) -> str:
    """``"fwd"`` for the forward use of a layer (``"f"``), ``"bwd"`` otherwise."""
    return "fwd" if phase == "f" else "bwd"
