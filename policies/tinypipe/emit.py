"""``tinypipe``'s micro-batch schedules as segments, and a step recorded concretely then folded into them.

1F1B (PipeDream-flush): stage s runs ``S - 1 - s`` warm-up forwards, then pairs (forward, backward), then the
remaining backwards; segments ``warmup`` (explicit), ``steady`` (``M - S`` uniform pairs, one per iteration),
``cooldown`` (explicit: the remaining ``s + 1`` pairs and ``S - 1 - s`` backwards of stage s). GPipe:
``gpipe-stash``, ``forward`` (M), ``backward`` (M). The optimizer segment follows either.

The step is built concretely (every op of every stage of every replica, every micro-batch), then folded: ops of
a repeated segment share one task id per position in the iteration; every dependency is computed on the
concrete schedule and written relative to the iteration (``x@k``), or as a plain reference into an earlier
segment. A repeated task gets the union of the references its iterations need; the extra ones point to tasks
that are already over by then, or (the first iterations' references into the warm-up segment, or a cool-down
reference into the steady segment, which resolves to its last iteration) only ever to a later instance of the
same thing, which can delay a prefetch but never breaks an ordering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.builder import PlanBuilder

Key = tuple[Any, ...]
Dep = Any   # Ev | Key (resolved when folding) | str (a raw reference, e.g. ``x^1``)


@dataclass(frozen=True)
class Op:
    kind: str   # "F" | "B"
    mb: int
    seg: int
    it: int
    slot: int   # position of the op in its iteration (template ops)


@dataclass(frozen=True)
class Schedule:
    segments: tuple[tuple[str, int], ...]   # (name, repeat), the optimizer excluded
    ops: tuple[tuple[Op, ...], ...]         # per stage, in execution order

    def repeated(self, seg: int) -> bool:
        return self.segments[seg][1] > 1 or self.segments[seg][0] in ("steady", "forward", "backward")


def one_f_one_b(S: int, M: int) -> Schedule:
    R = max(0, M - S)
    names = ([("warmup", 1)] if min(S - 1, M) > 0 else []) + ([("steady", R)] if R else []) + [("cooldown", 1)]
    seg = {n: i for i, (n, _) in enumerate(names)}
    ops = []
    for s in range(S):
        w = min(S - 1 - s, M)
        out = [Op("F", m, 0, 0, 0) for m in range(w)]
        for f in range(w, M):   # pair k = f - w: steady (one per iteration) for the first R, then cool-down
            k = f - w
            out += ([Op("F", f, seg["steady"], k, 0), Op("B", k, seg["steady"], k, 1)] if k < R
                    else [Op("F", f, seg["cooldown"], 0, 0), Op("B", k, seg["cooldown"], 0, 0)])
        ops.append(tuple(out + [Op("B", k, seg["cooldown"], 0, 0) for k in range(M - w, M)]))
    return Schedule(tuple(names), tuple(ops))


def make_schedule(name: str, S: int, M: int) -> Schedule:
    """1F1B, or GPipe: all forwards (one micro-batch per iteration), then all backwards. Nothing holds stage 0's
    GPipe forwards back, so the phase is not in lockstep and the simulator rightly simulates GPipe plans whole."""
    if name != "gpipe":
        return one_f_one_b(S, M)
    ops = tuple(tuple([Op("F", m, 1, m, 0) for m in range(M)] + [Op("B", m, 2, m, 0) for m in range(M)])
                for _ in range(S))
    return Schedule((("gpipe-stash", 1), ("forward", M), ("backward", M)), ops)


@dataclass(slots=True)
class Ev:
    """One concrete task instance of the step (a template task has one per iteration); ``kw``: the rest of its
    ``PlanBuilder.task`` arguments."""

    tid: str
    seg: int
    it: int
    op: str
    stream: str
    deps: list[Dep]
    kw: dict[str, Any]


class Sink(PlanBuilder):
    """What tasks (``policies.kit`` calls' included) are emitted into: each becomes an :class:`Ev` at one position
    of the concrete step (segment, iteration), its dependencies left as given (Ev, Key or raw reference) for the
    fold. Only ``task`` is used: tensors are declared on the real builder through the recorder."""

    def __init__(self, rec: Recorder, seg: int, it: int):  # no PlanBuilder state: nothing is built here
        self.rec, self.seg, self.it = rec, seg, it
        self.last: Ev | None = None

    def task(self, tid: str, op: str, stream: str, deps: Sequence[Dep] = (), **kw: Any) -> str:
        self.last = Ev(tid, self.seg, self.it, op, stream, list(deps), kw)
        self.rec.events.append(self.last)
        return tid

    def add(self, tid: str, op: str, stream: str, deps: Sequence[Dep] = (), **fields: Any) -> Ev:
        """``task``, returning its :class:`Ev`."""
        self.task(tid, op, stream, deps, **fields)
        return self.ev()

    def ev(self) -> Ev:
        """The task emitted last."""
        assert self.last is not None
        return self.last


class Recorder:
    """Concrete task instances of one step, with keyed look-ups, then written to the builder as segments."""

    def __init__(self, b: PlanBuilder, schedule: Schedule):
        self.b, self.schedule = b, schedule
        self.events: list[Ev] = []
        self.declared: set[str] = set()
        self.keyed: dict[Key, Ev] = {}
        self.opt_seg = len(schedule.segments)
        self._sinks: dict[tuple[int, int], Sink] = {}

    def at(self, seg: int, it: int) -> Sink:
        """The sink of (segment, iteration) of the step (one per position)."""
        sink = self._sinks.get((seg, it))
        if sink is None:
            sink = self._sinks[(seg, it)] = Sink(self, seg, it)
        return sink

    def tensor(self, tid: str, nbytes: float, kind: str, scope: str, layer: int | None = None) -> str:
        """Declare a scoped tensor once (its first use); later uses return the id."""
        if tid not in self.declared:
            self.declared.add(tid)
            self.b.tensor(tid, nbytes, kind, scope=scope, layer=layer)
        return tid

    def ref(self, src: Ev, dst: Ev) -> str:
        if dst.seg == src.seg and src.seg < self.opt_seg and self.schedule.repeated(src.seg):
            back = src.it - dst.it
            if back < 0:
                raise AssertionError(f"{src.tid} depends on a later iteration's {dst.tid}")
            return dst.tid + (f"@{back}" if back else "")
        if dst.seg > src.seg:
            raise AssertionError(f"{src.tid} depends on {dst.tid} of a later segment")
        return dst.tid

    def emit(self) -> None:
        """Write every segment (the schedule's, then the optimizer's) to the builder."""
        merged: dict[str, Ev] = {}
        deps: dict[str, dict[str, None]] = {}
        order: list[list[str]] = [[] for _ in range(self.opt_seg + 1)]
        for e in self.events:
            refs = deps.setdefault(e.tid, {})
            if e.tid not in merged:
                merged[e.tid] = e
                order[e.seg].append(e.tid)
            for d in e.deps:
                if isinstance(d, str):
                    refs[d] = None
                elif (tgt := self.keyed[d] if isinstance(d, tuple) else d) is not e:
                    refs[self.ref(e, tgt)] = None
        for seg, (name, repeat) in enumerate([*self.schedule.segments, ("optimizer", 1)]):
            if order[seg]:
                self.b.segment(name, repeat)
                for tid in order[seg]:
                    e = merged[tid]
                    self.b.task(tid, e.op, e.stream, list(deps[tid]), **e.kw)
