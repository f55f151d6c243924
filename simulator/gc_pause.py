"""A pause of Python's cyclic garbage collector around bulk construction of acyclic objects.

Building a 1024-GPU plan makes about a million small immutable objects (tasks, references, placements) and
proving its symmetry as many dict and tuple entries; none of them forms a reference cycle, yet every
allocation counts towards the collector's thresholds, and each full collection walks every live object:
about an eighth of a 1024-GPU plan + simulate was spent there (docs/scale.md). Inside :func:`no_cyclic_gc`
the collector is paused; on leaving it is re-enabled if it was on (nested pauses leave it paused), and any
cyclic garbage made meanwhile is collected by its next regular run. Reference counting still frees
everything else at once. For bounded, allocation-heavy work that makes no cycles of note: plan construction,
the plan's validation and symmetry proof, and the engine's event loop (which frees its events itself)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
