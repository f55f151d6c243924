"""Task recording for ``tinypipe``: a step built concretely, then folded into the plan's segments.

A step's schedule is built concretely (every op of every stage of every replica, every micro-batch), then
folded into the plan's segments: ops of a repeated segment (the 1F1B steady state, GPipe's forward and
backward phases) share one task id per position in the iteration; every dependency is computed on the
concrete schedule and written relative to the iteration (``x@k``), or as a plain reference into an
earlier segment. A repeated task gets the union of the references its iterations need; the extra ones
point to tasks that are already over by then, or (the first iterations' references into the warm-up
segment, or a cool-down reference into the steady segment, which resolves to its last iteration) only
ever to a later instance of the same thing, which can delay a prefetch but never breaks an ordering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.builder import PlanBuilder
from policies.tinypipe.schedule import Schedule

Key = tuple[Any, ...]
Dep = Any   # Ev | Key (resolved when folding) | str (a raw reference, e.g. ``x^1``)


@dataclass(slots=True)
class Ev:
    """One concrete task instance of the step (a template task has one per iteration)."""

    tid: str
    seg: int
    it: int
    op: str
    stream: str
    deps: list[Dep] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    allocs: list[tuple[str, str]] = field(default_factory=list)
    frees: list[tuple[str, str]] = field(default_factory=list)
    reads: list[tuple[str, str]] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)


class Sink(PlanBuilder):
    """What ``policies.kit`` functions emit into: each task they build becomes an :class:`Ev` of the recorder
    at one position of the concrete step (segment, iteration), its dependencies left as given (Ev, Key or
    raw reference) for the fold; ``last`` is the latest. Only ``task`` is used: tensors are declared on the
    real builder through the recorder."""

    def __init__(self, rec: Recorder, seg: int, it: int):  # no PlanBuilder state: nothing is built here
        self.rec, self.seg, self.it = rec, seg, it
        self.last: Ev | None = None

    def task(self, tid: str, op: str, stream: str, deps: Sequence[Dep] = (), *,
             allocs: Sequence[tuple[str, str]] = (), frees: Sequence[tuple[str, str]] = (),
             reads: Sequence[tuple[str, str]] = (), tensor: str | None = None, **fields: Any) -> str:
        if tensor is not None:
            fields["tensor"] = tensor
        tags = fields.pop("tags", {})
        self.last = self.rec.add(Ev(tid, self.seg, self.it, op, stream, list(deps), fields, list(allocs),
                                    list(frees), list(reads), tags))
        return tid

    def ev(self) -> Ev:
        """The task the last kit call emitted."""
        assert self.last is not None
        return self.last


class Recorder:
    """Concrete task instances of one step, with keyed look-ups, then written to the builder as segments."""

    def __init__(self, b: PlanBuilder, schedule: Schedule):
        self.b = b
        self.schedule = schedule
        self.events: list[Ev] = []
        self.declared: set[str] = set()
        self.keyed: dict[Key, Ev] = {}
        self.opt_seg = len(schedule.segments)
        self._sinks: dict[tuple[int, int], Sink] = {}

    def ev(self, tid: str, seg: int, it: int, op: str, stream: str, deps: list[Dep] | None = None,
           key: Key | None = None, **fields: Any) -> Ev:
        tags = fields.pop("tags", {})
        allocs = fields.pop("allocs", [])
        frees = fields.pop("frees", [])
        reads = fields.pop("reads", [])
        e = self.add(Ev(tid, seg, it, op, stream, list(deps or []), fields, list(allocs), list(frees), list(reads),
                        tags))
        if key is not None:
            self.keyed[key] = e
        return e

    def add(self, e: Ev) -> Ev:
        self.events.append(e)
        return e

    def at(self, seg: int, it: int) -> Sink:
        """A builder for kit calls whose tasks go at (segment, iteration) of the step (one per position)."""
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

    # -- folding into segments ---------------------------------------------------------------------------
    def repeated(self, seg: int) -> bool:
        return seg < self.opt_seg and self.schedule.repeated(seg)

    def ref(self, src: Ev, dst: Ev) -> str:
        if dst.seg == src.seg and self.repeated(src.seg):
            back = src.it - dst.it
            if back < 0:
                raise AssertionError(f"{src.tid} depends on a later iteration's {dst.tid}")
            return dst.tid + (f"@{back}" if back else "")
        if dst.seg > src.seg:
            raise AssertionError(f"{src.tid} depends on {dst.tid} of a later segment")
        return dst.tid

    def _refs(self, e: Ev, refs: dict[str, None]) -> None:
        for d in e.deps:
            if isinstance(d, str):
                refs[d] = None
                continue
            tgt = self.keyed[d] if isinstance(d, tuple) else d
            if tgt is not e:
                refs[self.ref(e, tgt)] = None

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
            self._refs(e, refs)
        names = [*self.schedule.segments, ("optimizer", 1)]
        for seg, (name, repeat) in enumerate(names):
            if not order[seg]:
                continue
            self.b.segment(name, repeat)
            for tid in order[seg]:
                e = merged[tid]
                self.b.task(tid, e.op, e.stream, list(deps[tid]), allocs=e.allocs, frees=e.frees,
                            reads=e.reads, tags=e.tags, **e.fields)
