"""Bringing a layer's parameters to the GPUs: sliced uploads, all-gathers, and prefetch distances.

A *sliced fetch* (ZeRO-3, ZeRO-Infinity's bandwidth-centric partitioning) has every rank upload only its
``1/dp`` slice of a layer from its home (CPU, or NVMe through a pinned CPU buffer) on its H2D engine,
then an all-gather over the data-parallel group assembles the full layer on every GPU. ZeRO-3 without
offload only gathers (the slices are resident). A prefetch distance ``d`` bounds how far ahead a fetch
runs: the fetch for use ``u`` may start once use ``u - d`` has started, i.e. it depends on the end of
the compute of use ``u - d - 1`` (``UseOrder``); d = 0 is fetch-on-demand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.builder import PlanBuilder
from policies.kit.layout import Layout
from policies.kit.tags import tags, use_of
from simulator.phase import Phase

Places = Sequence[tuple[str, str]]


def upload(b: PlanBuilder, tid: str, g: str, nbytes: float, deps: Sequence[str], *, layer: int | None,
           rank: int | None, src: str = "cpu", use: str | None = None, stream: str | None = None,
           allocs: Places = (), frees: Places = (), reads: Places = (), phase: Phase = Phase.PARAM_UPLOAD,
           extra: Mapping[str, Any] | None = None) -> str:
    """A copy of ``nbytes`` of parameters from ``src`` to GPU g on its H2D stream."""
    return b.task(tid, "copy", stream or f"{g}.h2d", deps, src=src, dst=g, bytes=nbytes, allocs=allocs,
                  frees=frees, reads=reads, tags=tags(phase, layer=layer, rank=rank, use=use, extra=extra))


def all_gather(b: PlanBuilder, tid: str, stream: str, ranks: Sequence[str], nbytes: float, deps: Sequence[str], *,
               layer: int | None = None, use: str | None = None, allocs: Places = (), frees: Places = (),
               phase: Phase = Phase.PARAM_GATHER, extra: Mapping[str, Any] | None = None) -> str:
    """An all-gather of ``nbytes`` (the full tensor) over ``ranks`` on a communication stream."""
    return b.task(tid, "collective", stream, deps, coll="all_gather", bytes=nbytes, ranks=tuple(ranks),
                  allocs=allocs, frees=frees, tags=tags(phase, layer=layer, use=use, extra=extra))


def gather_layer(b: PlanBuilder, lay: Layout, i: int, phase: str, nbytes: float,
                 deps_of: Mapping[int, Sequence[str]]) -> dict[int, str]:
    """ZeRO-3: all-gather layer i (``nbytes`` per GPU) in every data-parallel group into a transient
    ``pg{i}.{g}`` before its use ``phase`` (``f`` or ``b``); ``deps_of[j]``: what group j's gather waits
    for (the prefetch bound). Returns group j -> task id."""
    out = {}
    for j in range(lay.tp):
        grp = lay.dp_group(j)
        out[j] = all_gather(b, f"ag{phase}{i}{lay.dp_suffix(j)}", lay.dp_stream(j, "param"), grp, nbytes,
                            deps_of.get(j, []), layer=i, use=use_of(phase), allocs=[(f"pg{i}.{g}", g) for g in grp])
    return out


@dataclass(frozen=True)
class UseOrder:
    """The order in which a micro-step uses its layers: forward 0..L-1, then backward L-1..0.

    A use ends with its compute task (``fwd{i}`` or ``bwd{i}``); ``sfx`` is appended to ids of this
    micro-step, and ``prev(id)`` names a task of the previous micro-step (None when this step has none).
    """

    n_layers: int
    sfx: str = ""
    prev: Callable[[str], str | None] = lambda x: f"{x}@1"

    @property
    def uses(self) -> list[tuple[int, str]]:
        L = self.n_layers
        return [(i, "f") for i in range(L)] + [(i, "b") for i in reversed(range(L))]

    def end_id(self, u: int) -> str:
        i, ph = self.uses[u]
        return f"fwd{i}" if ph == "f" else f"bwd{i}"

    def ended(self, u: int, g: str) -> list[str]:
        """The end of use u on GPU g (u < 0: a use of the previous micro-step)."""
        if u >= 0:
            return [f"{self.end_id(u)}{self.sfx}.{g}"]
        ref = self.prev(f"{self.end_id(max(u + 2 * self.n_layers, 0))}.{g}")  # previous step: no suffix
        return [ref] if ref else []

    def window(self, u: int, distance: int, gpus: Sequence[str]) -> list[str]:
        """What a fetch for use u waits for with prefetch ``distance``, over ``gpus``: the end of use
        ``u - distance - 1`` on each of them."""
        return [d for g in gpus for d in self.ended(u - distance - 1, g)]
