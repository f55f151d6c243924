"""Per-GPU transfer seconds of LazyTrain's data-parallel executor, per link resource."""

from __future__ import annotations

from collections import defaultdict

from hardware_models import build_topology
from policies.base import Job
from simulator.engine import link_resources


class Links:
    """Per-GPU transfer costs when every GPU moves the same bytes at the same time (data parallelism)."""

    def __init__(self, job: Job):
        self.topo = build_topology(job.hw)
        self.caps = link_resources(self.topo)
        self.gpus = list(self.topo.gpu_locations())
        self._unit: dict[tuple[str, str], dict[str, float]] = {}

    def _resources(self, src: str, dst: str) -> list[str]:
        out = []
        for h in self.topo.route(src, dst):
            ln = self.topo.links[h.link]
            out.append(f"{h.link}:{'fwd' if h.forward else 'rev'}")
            if ln.duplex_bw is not None:
                out.append(f"{h.link}:duplex")
        return out

    def unit(self, src: str, dst: str) -> dict[str, float]:
        """Seconds per byte moved by each GPU, per resource, from ``src`` to ``dst`` ("gpu" = each GPU)."""
        key = (src, dst)
        if key not in self._unit:
            load: dict[str, float] = defaultdict(float)
            for g in self.gpus:
                for r in self._resources(g if src == "gpu" else src, g if dst == "gpu" else dst):
                    load[r] += 1.0
            self._unit[key] = {r: n / self.caps[r] for r, n in load.items()}
        return self._unit[key]

    def latency(self, src: str, dst: str) -> float:
        g = self.gpus[0]
        return self.topo.route_latency(g if src == "gpu" else src, g if dst == "gpu" else dst)

    def copy(self, src: str, dst: str, nbytes: float) -> dict[str, float]:
        """Seconds each resource needs for every GPU's copy of ``nbytes`` (latency added to each)."""
        if nbytes <= 0:
            return {}
        lat = self.latency(src, dst)
        return {r: nbytes * s + lat for r, s in self.unit(src, dst).items()}

    def copy_time(self, src: str, dst: str, nbytes: float) -> float:
        return max(self.copy(src, dst, nbytes).values(), default=0.0)

    def ring(self, nbytes: float, coll: str) -> dict[str, float]:
        """Seconds per resource of a ring collective of ``nbytes`` over all GPUs (as the engine runs it)."""
        n = len(self.gpus)
        if n <= 1 or nbytes <= 0:
            return {}
        per_rank = nbytes * (n - 1) / n * (2.0 if coll == "all_reduce" else 1.0)
        steps = (n - 1) * (2 if coll == "all_reduce" else 1)
        load: dict[str, float] = defaultdict(float)
        lat = 0.0
        for i, g in enumerate(self.gpus):
            nxt = self.gpus[(i + 1) % n]
            for r in self._resources(g, nxt):
                load[r] += per_rank
            lat = max(lat, self.topo.route_latency(g, nxt))
        return {r: b / self.caps[r] + lat * steps for r, b in load.items()}


def add_into(dst: dict[str, float], src: dict[str, float]) -> None:
    """Add ``src``'s seconds per resource to ``dst``'s."""
    for r, s in src.items():
        dst[r] = dst.get(r, 0.0) + s
