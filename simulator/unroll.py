"""Expand a Plan's steps x segments x iterations into concrete tasks with resolved dependencies."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import PlanError
from simulator.plan import Placement, Plan, Ref, TaskSpec


@dataclass(frozen=True)
class ConcreteTask:
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
    def __init__(self, plan: Plan):
        self.plan = plan
        self.seg_of = plan.task_segment()
        self.repeat = [s.repeat for s in plan.segments]
        self.tensors = plan.tensor_map()

    def _locate(self, ref: Ref, step: int, seg: int, it: int) -> tuple[int, int, int] | None:
        """(step, segment, iteration) a reference from (step, seg, it) points at; None if before the run."""
        tseg = self.seg_of.get(ref.id, seg)
        if ref.steps_back:
            s = step - ref.steps_back
            return None if s < 0 else (s, tseg, self.repeat[tseg] - 1)
        if tseg == seg:
            lin = step * self.repeat[seg] + it - ref.iters_back
            if lin < 0:
                return None
            return lin // self.repeat[seg], seg, lin % self.repeat[seg]
        return step, tseg, self.repeat[tseg] - 1

    def tensor_instance(self, ref: Ref, step: int, seg: int, it: int, where: str) -> str | None:
        spec = self.tensors.get(ref.id)
        if spec is None:
            raise PlanError(f"{where}: references missing tensor {ref.id!r}")
        if spec.scope == "global":
            return spec.id
        if spec.scope == "step":
            s = step - ref.steps_back
            return None if s < 0 else f"{spec.id}[s{s}]"
        lin = step * self.repeat[seg] + it - ref.iters_back - ref.steps_back * self.repeat[seg]
        if lin < 0:
            return None
        return f"{spec.id}[s{lin // self.repeat[seg]}.{seg}.{lin % self.repeat[seg]}]"

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
                for it in range(seg.repeat):
                    for t in seg.tasks:
                        deps = []
                        for r in t.deps:
                            loc = self._locate(r, step, si, it)
                            if loc is not None:
                                deps.append(task_uid(r.id, loc[0], loc[2]))
                        where = f"task {t.id!r}"
                        tensor = (self.tensor_instance(t.tensor, step, si, it, where)
                                  if t.tensor is not None else None)
                        out.append(ConcreteTask(
                            uid=task_uid(t.id, step, it), spec=t, step=step, segment=si, iteration=it,
                            deps=tuple(deps), allocs=self._places(t.allocs, step, si, it, where),
                            frees=self._places(t.frees, step, si, it, where),
                            reads=self._places(t.reads, step, si, it, where), tensor=tensor))
        return out
