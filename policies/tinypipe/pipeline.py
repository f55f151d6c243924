"""The decided pipeline of ``tinypipe``: stages, replicas, schedule, and the bytes each piece holds.

Replica r runs stage s on ``gpu{r * S + s}``. With tied embeddings and S > 1 the head's stage keeps its own
copy of the table (weights and states); with S = 1 the head reads the embedding's.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.tinypipe.packing import StagePlan
from policies.tinypipe.schedule import Schedule
from workloads.trace import LayerTrace


@dataclass(frozen=True)
class Pipeline:
    """What emission needs besides the job: the decisions and the sizes that follow from them."""

    layers: tuple[LayerTrace, ...]
    stages: tuple[StagePlan, ...]
    dp: int
    M: int
    schedule: Schedule
    prefetch: int
    gpipe: bool
    tied: bool
    table_params: float
    db: int
    active_cpu_mm: bool
    unified: bool

    @property
    def S(self) -> int:
        return len(self.stages)

    def rank(self, r: int, s: int) -> int:
        """The GPU rank that runs stage s of replica r."""
        return r * len(self.stages) + s

    def gpu(self, r: int, s: int) -> str:
        return f"gpu{self.rank(r, s)}"

    def head_copy(self, s: int) -> bool:
        """Does stage s hold its own copy of the tied embedding table (the head's stage, S > 1)?"""
        S = len(self.stages)
        return self.tied and S > 1 and s == S - 1

    # -- sizes ----------------------------------------------------------------------------------------
    def layer_params(self, s: int, x: int) -> float:
        p = float(self.layers[x].params)
        if self.head_copy(s) and x == len(self.layers) - 1:
            p += self.table_params
        return p

    def layer_bytes(self, s: int, x: int) -> float:
        """16-bit bytes the GPU holds for layer x (the head also needs the tied table to compute)."""
        w = float(self.layers[x].param_bytes)
        if self.tied and x == len(self.layers) - 1:
            w += self.table_params * self.db
        return w

    def pack_bytes(self, s: int, u: int, t: int) -> float:
        w = sum(self.layer_bytes(s, x) for x in range(u, t + 1))
        if self.tied and u == 0 and t == len(self.layers) - 1:
            w -= self.table_params * self.db
        return w

    def pack_home_bytes(self, s: int, u: int, t: int) -> float:
        """DRAM home of a swapped pack: without the table when the stage also holds the embedding (S = 1)."""
        w = self.pack_bytes(s, u, t)
        if self.tied and t == len(self.layers) - 1 and not self.head_copy(s) and u > 0:
            w -= self.table_params * self.db
        return w

    def stage_params(self, st: StagePlan) -> float:
        return sum(self.layer_params(st.index, x) for x in range(st.first, st.last + 1))

    def stage_bytes(self, st: StagePlan) -> float:
        return self.pack_bytes(st.index, st.first, st.last)

    def workspace(self, st: StagePlan) -> float:
        return max(self.layers[x].peak_transient_bytes for x in range(st.first, st.last + 1))

    def describe(self, st: StagePlan) -> str:
        return stage_names(self.layers, st)


def stage_names(layers: tuple[LayerTrace, ...], st: StagePlan) -> str:
    """``first..last`` layer names of a stage."""
    return f"{layers[st.first].name}..{layers[st.last].name}"
