"""Saved activations leaving the GPU after a layer's forward and coming back for its backward.

A saved activation tensor (a layer's full activations, or only its input under checkpointing) is moved
off the GPU right after the layer's forward, on the GPU's D2H engine (or a dedicated stream, so that it
does not queue behind gradient copies), and brought back before the layer's recomputation or backward on
the H2D engine. The copy moves the tensor itself: it is allocated at the destination and freed at the
source. Used by lazytrain (CPU or NVMe per layer, as its MILP chose), zero-infinity
(``offload_checkpoints``) and synergyscale (activation offload).

(A module added beside the kit by the lazytrain port: the kit had no activation mechanism yet.)
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.builder import PlanBuilder
from policies.kit.tags import tags
from simulator.phase import Phase


def offload_activation(b: PlanBuilder, tid: str, g: str, tensor: str, deps: Sequence[str], *, layer: int,
                       rank: int | None, dst: str = "cpu", stream: str | None = None) -> str:
    """Move ``tensor`` from GPU g to ``dst`` (``cpu`` or ``nvme``) on ``stream`` (default its D2H stream)."""
    return b.task(tid, "copy", stream or f"{g}.d2h", deps, tensor=tensor, src=g, dst=dst, alloc_dst=True,
                  free_src=True, tags=tags(Phase.ACTIVATION_OFFLOAD, layer=layer, rank=rank))


def reload_activation(b: PlanBuilder, tid: str, g: str, tensor: str, deps: Sequence[str], *, layer: int,
                      rank: int | None, src: str = "cpu", stream: str | None = None) -> str:
    """Bring ``tensor`` back from ``src`` to GPU g on ``stream`` (default its H2D stream)."""
    return b.task(tid, "copy", stream or f"{g}.h2d", deps, tensor=tensor, src=src, dst=g, alloc_dst=True,
                  free_src=True, tags=tags(Phase.ACTIVATION_RELOAD, layer=layer, rank=rank))
