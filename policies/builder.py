"""A small helper that policies use to assemble a Plan (tensors, streams, segments, tasks)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from policies.base import Job
from simulator import Placement, Plan, Ref, Segment, StreamSpec, TaskSpec, TensorSpec
from simulator.plan import task_spec
from simulator.plan_workload import PlanWorkload
from simulator.rank_template import RankTemplate, canonical


class PlanBuilder:
    def __init__(self, policy: str, knobs: Any, job: Job, *, template: RankTemplate | None = None):
        self.policy = policy
        self.knobs = knobs
        self.job = job
        # set: the policy emits rank 0's tasks only (policies.kit.Layout(template=True), simulator.rank_template)
        self.template = template
        self._tensors: dict[str, TensorSpec] = {}
        self._streams: dict[str, StreamSpec] = {}
        self._segments: list[tuple[str, int, list[TaskSpec]]] = []
        # every reference text parsed once: a plan of N ranks names each rank's barrier tasks N times
        # (O(N^2) texts, most of them repeats), and parsing them was most of a 128-GPU plan's build time
        self._parsed: dict[str, Ref] = {}
        self._placed: dict[tuple[str, str], Placement] = {}

    # -- declarations ---------------------------------------------------------------------------------
    def tensor(self, tid: str, nbytes: float, kind: str, *, scope: str = "global", home: str | None = None,
               layer: int | None = None, persistent: bool = False) -> str:
        if tid in self._tensors:
            raise ValueError(f"duplicate tensor {tid!r}")
        self._tensors[tid] = TensorSpec(tid, float(nbytes), kind, scope, home, layer, persistent)
        return tid

    def stream(self, sid: str, device: str, kind: str) -> str:
        if sid not in self._streams:
            self._streams[sid] = StreamSpec(sid, device, kind)
        return sid

    def segment(self, name: str, repeat: int) -> None:
        self._segments.append((name, repeat, []))

    def task(self, tid: str, op: str, stream: str, deps: Sequence[str] = (), *,
             allocs: Sequence[tuple[str, str]] = (), frees: Sequence[tuple[str, str]] = (),
             reads: Sequence[tuple[str, str]] = (), tensor: str | None = None, **fields: Any) -> str:
        if not self._segments:
            raise ValueError("declare a segment before adding tasks")
        ref = self._ref
        self._segments[-1][2].append(task_spec(
            tid, op, stream, deps=tuple([ref(d) for d in deps if d]),
            allocs=self._places(allocs) if allocs else (), frees=self._places(frees) if frees else (),
            reads=self._places(reads) if reads else (), tensor=ref(tensor) if tensor else None, **fields))
        return tid

    def _ref(self, text: str) -> Ref:
        got = self._parsed.get(text)
        if got is None:
            got = self._parsed[text] = Ref.parse(text, "builder")
        return got

    def _places(self, items: Iterable[tuple[str, str]]) -> tuple[Placement, ...]:
        """The placements, each made once per (tensor, location) text pair and shared (they are immutable)."""
        made = self._placed
        out = []
        for t, loc in items:
            p = made.get((t, loc))
            if p is None:
                p = made[(t, loc)] = Placement(self._ref(t), loc)
            out.append(p)
        return tuple(out)

    # -- output ---------------------------------------------------------------------------------------
    def build(self, *, steps: int = 2, notes: Sequence[str] = (), info: dict[str, Any] | None = None) -> Plan:
        job = self.job
        trace = job.trace
        metrics = {
            "n_gpus": float(job.n_gpus),
            "tokens_per_step": float(job.tokens_per_step),
            "model_flops_per_step": float(trace.model_flops_per_token() * job.tokens_per_step),
        }
        return Plan(
            policy=self.policy,
            knobs=dataclasses.asdict(self.knobs),
            hardware=job.hw,
            workload=PlanWorkload(job.model, job.config, trace.provenance, tuple(job.assumed)),
            tensors=tuple(self._tensors.values()),
            streams=tuple(self._streams.values()),
            segments=self._template_segments() if self.template is not None else
            tuple(Segment(n, r, tuple(ts)) for n, r, ts in self._segments),
            steps=steps,
            metrics=metrics,
            notes=tuple(notes),
            info=dict(info or {}),
            template=self.template,
        )

    def _template_segments(self) -> tuple[Segment, ...]:
        """The segments of a rank template: a collective names every rank's tasks and tensors, the template holds
        rank 0's; the references to another rank's copy of a rank-0 task or tensor are dropped (what the
        symmetric simulation drops from the full plan, ``simulator.symmetry.Symmetry.reduce``). Any other
        unknown reference stays, for the plan's validation to name."""
        tasks = {t.id for _, _, ts in self._segments for t in ts}
        tensors = set(self._tensors)

        assert self.template is not None
        width = self.template.width

        def other_rank(name: str, known: set[str]) -> bool:
            return name not in known and (c := canonical(name, width=width)) != name and c in known

        out = []
        for name, repeat, ts in self._segments:
            kept = []
            for t in ts:
                deps = tuple(d for d in t.deps if not other_rank(d.id, tasks))
                places = [tuple(p for p in ps if not other_rank(p.tensor.id, tensors))
                          for ps in (t.allocs, t.frees, t.reads)]
                if len(deps) != len(t.deps) or any(len(a) != len(b) for a, b in
                                                   zip(places, (t.allocs, t.frees, t.reads), strict=True)):
                    t = dataclasses.replace(t, deps=deps, allocs=places[0], frees=places[1], reads=places[2])
                kept.append(t)
            out.append(Segment(name, repeat, tuple(kept)))
        return tuple(out)
