"""Per-GPU transfer seconds of LazyTrain's data-parallel executor, per link resource, priced by ``costs``.

Every GPU moves the same bytes at the same time (data parallelism), so each resource carries the sum of
the GPUs' routes over it: the MILP charges a window with each resource's busy seconds, not a single rate.
Routes, resource keys, capacities and the ring collective are ``costs``'s, as the engine prices them.
"""

from __future__ import annotations

import costs
from hardware_models import build_topology
from policies.base import Job


class Links:
    """Seconds per resource of an operation every GPU performs at once."""

    def __init__(self, job: Job):
        self.topo = build_topology(job.hw)
        self.caps = costs.link_capacities(self.topo)
        self.routes = costs.RouteTable(self.topo)
        self.gpus = list(self.topo.gpu_locations())
        self._unit: dict[tuple[str, str], dict[str, float]] = {}

    def _ends(self, src: str, dst: str, g: str) -> tuple[str, str]:
        """The route of GPU g's copy from ``src`` to ``dst`` ("gpu" = the GPU itself)."""
        return g if src == "gpu" else src, g if dst == "gpu" else dst

    def unit(self, src: str, dst: str) -> dict[str, float]:
        """Seconds per byte moved by each GPU, per resource, from ``src`` to ``dst`` ("gpu" = each GPU)."""
        key = (src, dst)
        if key not in self._unit:
            load = costs.resource_load(self.topo, [(*self._ends(src, dst, g), 1.0) for g in self.gpus])
            self._unit[key] = costs.busy_seconds(load, self.caps)
        return self._unit[key]

    def latency(self, src: str, dst: str) -> float:
        return self.routes(*self._ends(src, dst, self.gpus[0])).latency_s

    def copy(self, src: str, dst: str, nbytes: float) -> dict[str, float]:
        """Seconds each resource needs for every GPU's copy of ``nbytes`` (latency added to each)."""
        if nbytes <= 0:
            return {}
        lat = self.latency(src, dst)
        return {r: nbytes * s + lat for r, s in self.unit(src, dst).items()}

    def ring(self, nbytes: float, coll: str) -> dict[str, float]:
        """Seconds per resource of a ring collective of ``nbytes`` over all GPUs (as the engine runs it)."""
        if len(self.gpus) <= 1 or nbytes <= 0:
            return {}
        ring = costs.ring(self.routes, self.gpus, nbytes, coll)
        return {r: b / self.caps[r] + ring.latency_s for r, b in ring.resource_bytes().items()}


def add_into(dst: dict[str, float], src: dict[str, float]) -> None:
    """Add ``src``'s seconds per resource to ``dst``'s."""
    for r, s in src.items():
        dst[r] = dst.get(r, 0.0) + s
