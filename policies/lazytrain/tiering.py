"""LazyTrain's tierings: where the fp16 parameters and the optimizer (master weights, Adam states) live."""

from __future__ import annotations

from dataclasses import dataclass

from hardware_models import build_topology
from policies.base import Job

TIERS = ("gpu", "cpu", "nvme")


@dataclass(frozen=True)
class Tiering:
    """Where the fp16 parameters live (``gpu`` = resident, else streamed from ``cpu``/``nvme``) and where the
    fp32 master weights and Adam states live (``gpu`` = GPU Adam, else CPU Adam with states in DRAM or on
    NVMe)."""

    params: str
    optim: str

    @property
    def level(self) -> int:
        """1: everything on the GPU; 2: parameters resident, optimizer on the CPU; 3: parameters streamed."""
        if self.params == "gpu":
            return 1 if self.optim == "gpu" else 2
        return 3

    @property
    def streamed(self) -> bool:
        """Parameters live off the GPU and are uploaded layer by layer for every use (level 3)."""
        return self.level == 3

    @property
    def uses_nvme(self) -> bool:
        """The CPU optimizer reads or writes NVMe: its states live there, or the streamed parameters do."""
        return self.level >= 2 and "nvme" in (self.optim, self.params if self.streamed else "")

    def __str__(self) -> str:
        return f"params={self.params},optimizer={self.optim}"


def _allowed(t: Tiering, has_nvme: bool, unified: bool) -> bool:
    if t.params != "gpu" and t.optim == "gpu":
        return False  # streamed parameters with a GPU optimizer is not an executor we model
    if "nvme" in (t.params, t.optim) and not has_nvme:
        return False
    # on a unified machine the CPU tier is the GPU's own pool: moving to it frees nothing
    return not (unified and "cpu" in (t.params, t.optim))


def tierings(job: Job, param_home: str, optimizer_home: str) -> list[Tiering]:
    """Every valid tiering the hardware and the knobs allow."""
    topo = build_topology(job.hw)
    unified = topo.pool_of["gpu0"] == topo.pool_of["cpu"]
    has_nvme = "nvme" in topo.locations
    return [t for t in (Tiering(p, o) for p in TIERS for o in TIERS)
            if _allowed(t, has_nvme, unified) and param_home in ("auto", t.params)
            and optimizer_home in ("auto", t.optim)]
