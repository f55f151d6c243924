"""The data/tensor-parallel layout of a machine's GPUs, their names, stream declarations and task tags.

The GPUs form ``tp``-wide tensor-parallel groups of neighbouring GPUs (Megatron-LM, Shoeybi et al. 2019,
arXiv 1909.08053), and GPUs at the same position of every group form a data-parallel group of
``dp = n / tp`` ranks. Collectives are single tasks over the ranks of their group on that group's
communication stream: ``dp{j}.grad`` / ``dp{j}.param`` per data-parallel group j and ``tp{k}`` per
tensor-parallel group k, or, with ``flat_comm`` (one data-parallel group), ``dp.grad`` / ``dp.param``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.base import Job, KnobError
from policies.builder import PlanBuilder
from simulator.phase import Phase

GPU_STREAMS: tuple[tuple[str, str], ...] = (("compute", "compute"), ("h2d", "h2d"), ("d2h", "d2h"))
Places = Sequence[tuple[str, str]]


def tags(phase: Phase, *, layer: int | None = None, rank: int | None = None, use: str | None = None,
         extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A kit task's tags: ``phase``, then layer / rank / use (``"fwd"`` or ``"bwd"``) where given, then ``extra``."""
    out: dict[str, Any] = {"phase": phase}
    for key, v in (("layer", layer), ("rank", rank), ("use", use)):
        if v is not None:
            out[key] = v
    out.update(extra or {})
    return out


def use_of(phase: str) -> str:
    """``"fwd"`` for the forward use of a layer (``"f"``), ``"bwd"`` otherwise."""
    return "fwd" if phase == "f" else "bwd"


def gpu(r: int) -> str:
    return f"gpu{r}"


def dtype_bytes(job: Job) -> int:
    """Bytes per element of the training precision (the 16-bit parameters and gradients)."""
    return {"bf16": 2, "fp16": 2, "fp32": 4}[job.config.precision]


@dataclass(frozen=True)
class Layout:
    """n GPUs as dp data-parallel groups x tp tensor-parallel groups; ``flat_comm`` (tp = 1 only): name the
    data-parallel streams and collectives without a group index (``dp.grad``, ``red{i}``)."""

    n: int
    tp: int = 1
    flat_comm: bool = False

    @property
    def dp(self) -> int:
        return self.n // self.tp

    def gpus(self) -> list[str]:
        return [gpu(r) for r in range(self.n)]

    def tp_group(self, k: int) -> list[str]:
        return [gpu(k * self.tp + j) for j in range(self.tp)]

    def dp_group(self, j: int) -> list[str]:
        return [gpu(k * self.tp + j) for k in range(self.dp)]

    def tp_index(self, r: int) -> tuple[int, int]:
        """(tensor-parallel group k, position j) of GPU r."""
        return r // self.tp, r % self.tp

    def dp_stream(self, j: int, what: str) -> str:
        """The communication stream of data-parallel group j for ``what`` (``grad`` or ``param``)."""
        return f"dp.{what}" if self.flat_comm else f"dp{j}.{what}"

    def dp_suffix(self, j: int) -> str:
        """The suffix of a data-parallel collective's task id for group j (``.d{j}``, or none when flat)."""
        return "" if self.flat_comm else f".d{j}"


def check_tp(job: Job, tp: int, policy: str) -> None:
    """KnobError unless ``tp`` divides the GPU count and the model's attention heads."""
    n = job.n_gpus
    if tp < 1 or n % tp:
        raise KnobError(f"{policy}: knob 'tp' must divide the GPU count {n}, got {tp}")
    m = job.model
    if m.n_heads % tp or m.n_kv_heads % tp and tp % m.n_kv_heads:
        raise KnobError(f"{policy}: knob 'tp' = {tp} does not divide the model's {m.n_heads} attention heads")


def gpu_streams(b: PlanBuilder, gpus: Iterable[str], extra: Sequence[tuple[str, str]] = ()) -> None:
    """Per GPU: ``{g}.compute``, ``{g}.h2d``, ``{g}.d2h`` and each ``(name, kind)`` of ``extra``."""
    for g in gpus:
        for name, kind in (*GPU_STREAMS, *extra):
            b.stream(f"{g}.{name}", g, kind)


def cpu_streams(b: PlanBuilder, ranks: Iterable[int], per_rank: Sequence[tuple[str, str]],
                device: str = "cpu") -> None:
    """Per rank r: ``{device}.{name}{r}`` of each ``(name, kind)``, e.g. ``("adam", "optim")``."""
    for r in ranks:
        for name, kind in per_rank:
            b.stream(f"{device}.{name}{r}", device, kind)


def comm_streams(b: PlanBuilder, lay: Layout, order: Sequence[str] = ("grad", "param")) -> None:
    """The data-parallel streams (``order``: which of grad / param first), then the tensor-parallel ones."""
    if lay.dp > 1:
        for j in range(lay.tp):
            for what in order:
                b.stream(lay.dp_stream(j, what), lay.dp_group(j)[0], "comm")
    if lay.tp > 1:
        for k in range(lay.dp):
            b.stream(f"tp{k}", lay.tp_group(k)[0], "comm")


def declare_streams(b: PlanBuilder, lay: Layout, *, cpu_adam: bool = False,
                    cpu_per_rank: Sequence[tuple[str, str]] = (), shared: Sequence[tuple[str, str, str]] = (),
                    comm_order: Sequence[str] = ("grad", "param")) -> None:
    """The streams of a data-parallel plan, in one order for every policy: per rank the GPU's compute / h2d /
    d2h, ``cpu.adam{r}`` (``cpu_adam``) and ``cpu_per_rank``; then ``shared`` (id, device, kind); then comm."""
    per_rank = ((("adam", "optim"),) if cpu_adam else ()) + tuple(cpu_per_rank)
    for r in range(lay.n):
        gpu_streams(b, [gpu(r)])
        cpu_streams(b, [r], per_rank)
    for sid, device, kind in shared:
        b.stream(sid, device, kind)
    comm_streams(b, lay, comm_order)
