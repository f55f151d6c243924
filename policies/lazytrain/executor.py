"""What a LazyTrain schedule decided, in the executor's terms: no task is named here.

:class:`Executor` turns a :class:`~policies.lazytrain.schedule.Schedule` into the facts the emission reads:
which tiering (level), which layers are offloaded and where, which layers keep their forward parameter copy
through the turn, how far ahead parameters are prefetched, and the two-slot gates that bound the offloaded
activations in flight. ``policies/lazytrain/emit.py`` turns these facts into tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from policies.base import Job
from policies.kit import gpu
from policies.lazytrain.milp import Opt
from policies.lazytrain.schedule import Schedule
from policies.lazytrain.tiering import Tiering

#: offloaded activations on the GPU at a time: a forward waits for the copy-out of the offloaded layer this
#: many before it, a fetch for the backward of the one this many after it (the MILP budgets two, milp.evaluate)
ACTIVATION_SLOTS = 2


@dataclass(frozen=True)
class Executor:
    tier: Tiering
    gpus: tuple[str, ...]
    n_layers: int
    db: int                        # bytes per parameter of the fp16/bf16 copy
    depth: int                     # layers of parameters uploaded ahead of use
    unit: tuple[float, ...]        # parameters streamed (and gradients reduced) with layer i
    opts: tuple[Opt, ...]          # per layer: activation mode and place
    tied: bool                     # the head's streamed unit includes the embedding table
    p_total: float
    master_bpp: float
    optim_bpp: float
    cpu_grad_bytes: float

    @classmethod
    def of(cls, job: Job, s: Schedule, cpu_grad_bytes: float, prefetch_depth: int) -> Executor:
        c = s.costs
        layers = job.trace.layers
        nl = len(layers)
        return cls(
            tier=s.tiering, gpus=tuple(gpu(r) for r in range(c.n)), n_layers=nl, db=c.db,
            depth=min(prefetch_depth, nl - 1), unit=c.unit_params,
            opts=tuple(c.instance.options[i][o] for i, o in enumerate(s.choice)),
            tied=job.model.tied_embeddings and nl > 1, p_total=float(sum(layer.params for layer in layers)),
            master_bpp=c.master_bpp, optim_bpp=c.optim_bpp, cpu_grad_bytes=cpu_grad_bytes)

    # -- tiering --------------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.gpus)

    @property
    def level(self) -> int:
        return self.tier.level

    @property
    def streamed(self) -> bool:
        return self.tier.streamed

    @property
    def backward_order(self) -> tuple[int, ...]:
        """The layers in the order their backward runs (and their gradient buckets fill): last first."""
        return tuple(reversed(range(self.n_layers)))

    # -- parameters -----------------------------------------------------------------------------------
    @property
    def tail_from(self) -> int:
        """Layers from here on keep their forward parameter copy through the forward/backward turn."""
        return self.n_layers - 1 - self.depth

    def refetched(self, i: int) -> bool:
        """Layer i's streamed parameters are uploaded again for its backward (freed after its forward)."""
        return self.streamed and i < self.tail_from

    def fwd_upload_after(self, i: int) -> tuple[int, bool]:
        """(layer, of the previous micro-step's backward?) whose compute must end before layer i's forward
        upload starts: ``depth`` layers ahead of use."""
        j = i - self.depth - 1
        return (j, False) if j >= 0 else (self.depth - i, True)

    def bwd_upload_after(self, i: int) -> int:
        """The backward whose end lets layer i's backward upload start."""
        return i + self.depth + 1

    def updated_with(self, i: int) -> tuple[int, ...]:
        """The layers whose optimizer step makes layer i's home parameters current (a tied head: the embedding)."""
        return (i, 0) if self.tied and i == self.n_layers - 1 else (i,)

    def unit_bytes(self, i: int) -> float:
        return self.unit[i] * self.db

    # -- activations ----------------------------------------------------------------------------------
    def offloaded(self, i: int) -> bool:
        return self.opts[i].place != "gpu"

    @cached_property
    def offloaded_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.offloaded(i))

    def copy_out_gate(self, i: int) -> int | None:
        """The offloaded layer whose copy-out must end before layer i's forward (two slots in flight)."""
        off = self.offloaded_layers
        k = off.index(i) if i in off else -1
        return off[k - ACTIVATION_SLOTS] if k >= ACTIVATION_SLOTS else None

    def fetch_gate(self, i: int) -> int | None:
        """The offloaded layer whose backward must end before layer i's activations are fetched back."""
        off = self.offloaded_layers
        k = off.index(i) if i in off else len(off)
        return off[k + ACTIVATION_SLOTS] if k + ACTIVATION_SLOTS < len(off) else None
