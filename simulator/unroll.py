"""Expand a Plan's steps x segments x iterations into concrete tasks with resolved dependencies."""

from __future__ import annotations

from typing import NamedTuple

from simulator.errors import PlanError
from simulator.plan import Placement, Plan, Ref, TaskSpec


class ConcreteTask(NamedTuple):
    """One task of the unrolled plan (a NamedTuple: made by the ten thousand)."""

    uid: str
    spec: TaskSpec
    step: int
    segment: int
    iteration: int
    deps: tuple[str, ...]
    allocs: tuple[tuple[str, str], ...]  # (tensor instance, location)
    frees: tuple[tuple[str, str], ...]
    reads: tuple[tuple[str, str], ...]
    tensor: str | None  # copied tensor instance


def task_uid(task_id: str, step: int, it: int) -> str:
    return f"{task_id}[s{step}.{it}]"


class Unroller:
    """Unrolls a plan; ``warmup_repeat`` caps the repeat count of every *repeated* segment in the
    warm-up steps (all steps but the last), which only have to leave the measured step in its steady
    state; 0 leaves such segments out of the warm-up (references into them are then satisfied)."""

    def __init__(self, plan: Plan, warmup_repeat: int | None = None):
        self.plan = plan
        self.seg_of = plan.task_segment()
        self.repeat = [s.repeat for s in plan.segments]
        self.tensors = plan.tensor_map()
        self.warmup_repeat = warmup_repeat
        # an iteration-scoped tensor belongs to the segment that first allocates it; a task of another
        # segment naming it plainly means that segment's last iteration (as for task references)
        self.tensor_seg: dict[str, int] = {}
        for si, sg in enumerate(plan.segments):
            for t in sg.tasks:
                made = [p.tensor.id for p in t.allocs] + ([t.tensor.id] if t.alloc_dst and t.tensor else [])
                for tid in made:
                    self.tensor_seg.setdefault(tid, si)

    def reps(self, step: int, seg: int) -> int:
        if self.warmup_repeat is not None and step < self.plan.steps - 1 and self.repeat[seg] > 1:
            return min(self.repeat[seg], self.warmup_repeat)
        return self.repeat[seg]

    def _back(self, step: int, seg: int, it: int, k: int) -> tuple[int, int] | None:
        """(step, iteration) k iterations of ``seg`` before (step, it), crossing steps; None before the run."""
        it -= k
        while it < 0:
            step -= 1
            if step < 0:
                return None
            it += self.reps(step, seg)
        return step, it

    def _locate(self, ref: Ref, step: int, seg: int, it: int) -> tuple[int, int, int] | None:
        """(step, segment, iteration) a reference from (step, seg, it) points at; None if before the run."""
        tseg = self.seg_of.get(ref.id, seg)
        if ref.steps_back:
            s = step - ref.steps_back
            return None if s < 0 or self.reps(s, tseg) == 0 else (s, tseg, self.reps(s, tseg) - 1)
        if tseg == seg:
            back = self._back(step, seg, it, ref.iters_back)
            return None if back is None else (back[0], seg, back[1])
        return None if self.reps(step, tseg) == 0 else (step, tseg, self.reps(step, tseg) - 1)

    def tensor_instance(self, ref: Ref, step: int, seg: int, it: int, where: str) -> str | None:
        spec = self.tensors.get(ref.id)
        if spec is None:
            raise PlanError(f"task {where!r}: references missing tensor {ref.id!r}")
        if spec.scope == "global":
            return spec.id
        if spec.scope == "step":
            s = step - ref.steps_back
            return None if s < 0 else f"{spec.id}[s{s}]"
        home = self.tensor_seg.get(spec.id, seg)
        if home != seg:
            s = step - ref.steps_back
            if s < 0 or self.reps(s, home) == 0:
                return None
            return f"{spec.id}[s{s}.{home}.{self.reps(s, home) - 1}]"
        if ref.steps_back:
            s = step - ref.steps_back
            if s < 0 or self.reps(s, seg) == 0:
                return None
            it_back = self.reps(s, seg) - 1 - ref.iters_back
            back = (s, it_back) if it_back >= 0 else self._back(s, seg, self.reps(s, seg) - 1, ref.iters_back)
        else:
            back = self._back(step, seg, it, ref.iters_back)
        if back is None:
            return None
        return f"{spec.id}[s{back[0]}.{seg}.{back[1]}]"

    def _places(self, items: tuple[Placement, ...], step: int, seg: int, it: int,
                where: str) -> tuple[tuple[str, str], ...]:
        out = []
        for p in items:
            inst = self.tensor_instance(p.tensor, step, seg, it, where)
            if inst is not None:
                out.append((inst, p.loc))
        return tuple(out)

    def unroll(self) -> list[ConcreteTask]:
        out: list[ConcreteTask] = []
        for step in range(self.plan.steps):
            for si, seg in enumerate(self.plan.segments):
                for it in range(self.reps(step, si)):
                    for t in seg.tasks:
                        deps = []
                        for r in t.deps:
                            loc = self._locate(r, step, si, it)
                            if loc is not None:
                                deps.append(task_uid(r.id, loc[0], loc[2]))
                        where = t.id
                        tensor = (self.tensor_instance(t.tensor, step, si, it, where)
                                  if t.tensor is not None else None)
                        out.append(ConcreteTask(
                            task_uid(t.id, step, it), t, step, si, it, tuple(deps),
                            self._places(t.allocs, step, si, it, where) if t.allocs else (),
                            self._places(t.frees, step, si, it, where) if t.frees else (),
                            self._places(t.reads, step, si, it, where) if t.reads else (), tensor))
        return out
