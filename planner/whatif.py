"""What-if grids: plan a job on every combination of hardware changes and rank the single changes.

``--vary host.dram=512GB,1TB,2TB --vary pcie.gen=4,5`` is a list of :class:`Axis`; the grid is their
cartesian product (first axis varies slowest). Every scenario is the user's hardware (with its ``--set``
overrides) plus that scenario's changes, planned by ``planner.search.search`` exactly as ``tiersim plan
--set ...`` would plan it, so a what-if with no change is the plan. Scenarios that describe the same
machine (a value equal to the base's) are planned once.

The sensitivity table takes each single change from the base (every value of every axis that differs
from the base's) and reports the throughput it buys and whether it makes an infeasible job feasible.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hardware_models import HardwareInputError, HardwareSpec
from planner.deadline import Deadline
from planner.job import JobRequest, resolve_hardware
from planner.search import SearchOutcome, search
from planner.workers import Workers
from workloads import ModelSpec, load_model

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Axis:
    """One ``--vary PATH=V1,V2,...``: a hardware field path and the values it takes."""

    path: str
    values: tuple[str, ...]

    def label(self, value: str) -> str:
        return f"{self.path}={value}"


def parse_vary(text: str) -> Axis:
    """``"host.dram=512GB,1TB"`` -> Axis; malformed text is one HardwareInputError naming the flag."""
    where = f"--vary {text!r}"
    if "=" not in text:
        raise HardwareInputError("expected PATH=V1,V2,..., e.g. --vary host.dram=512GB,1TB", file=where)
    path, _, rest = text.partition("=")
    path = path.strip()
    if not path:
        raise HardwareInputError("missing the field path before '=', e.g. host.dram=512GB,1TB", file=where)
    values = tuple(v.strip() for v in rest.split(","))
    if not rest.strip() or any(not v for v in values):
        raise HardwareInputError("give one or more comma-separated values, none empty, e.g. pcie.gen=4,5",
                                 field=path, file=where)
    dupes = sorted({v for v in values if values.count(v) > 1})
    if dupes:
        raise HardwareInputError(f"value {dupes[0]!r} is given twice; list each value once", field=path,
                                 file=where)
    return Axis(path, values)


def check_axes(axes: Sequence[Axis]) -> None:
    """Each path at most once (a scenario sets a field to one value)."""
    seen: set[str] = set()
    for axis in axes:
        if axis.path in seen:
            raise HardwareInputError("is varied twice; give all its values in one --vary PATH=V1,V2,...",
                                     field=axis.path, file="--vary")
        seen.add(axis.path)


def machine_key(spec: HardwareSpec) -> str:
    """The machine a spec describes, ignoring where its figures came from (``sources``)."""
    d = {k: v for k, v in spec.to_dict().items() if k != "sources"}
    return json.dumps(d, sort_keys=True, default=str)


def field_value(spec: HardwareSpec, path: str) -> Any:
    """The value at a dotted YAML path of ``spec.to_dict()`` (None where the section is absent)."""
    node: Any = spec.to_dict()
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def scenario_grid(axes: Sequence[Axis]) -> list[dict[str, str]]:
    """The cartesian product of the axes' values, as {path: value} dicts (one empty dict for no axes)."""
    return [dict(zip([a.path for a in axes], combo, strict=True))
            for combo in itertools.product(*(a.values for a in axes))]


def layered(base: Sequence[str], changes: Sequence[str]) -> list[str]:
    """The base ``--set`` overrides with a scenario's changes on top: a path the scenario sets replaces the
    base's value for that scenario (``--set gpu.memory=8GB --vary gpu.memory=8GB,80GB``), so no path is given
    twice to the hardware loader, which refuses that in a user's own overrides."""
    paths = {c.split("=", 1)[0].strip() for c in changes}
    return [o for o in base if o.split("=", 1)[0].strip() not in paths] + list(changes)


def overrides_for(changes: Mapping[str, str]) -> list[str]:
    return [f"{path}={value}" for path, value in changes.items()]


@dataclass(frozen=True)
class Best:
    """What a search found: its best plan, or why nothing fits (``binding``: the pool that overflows,
    or "budget" when the search was cut short before it found a feasible plan or proof of none)."""

    feasible: bool
    policy: str | None
    knobs: dict[str, Any]
    micro_batch: int | None
    checkpointing: str | None
    tokens_per_s: float | None
    tflops_per_gpu: float | None
    step_time_s: float | None
    binding: str | None
    n_candidates: int
    n_simulated: int
    cut_short: str | None = None

    @classmethod
    def of(cls, outcome: SearchOutcome) -> Best:
        b = outcome.best
        cut = cut_short(outcome)
        if b is None:
            return cls(False, None, {}, None, None, None, None, None, outcome_binding(outcome),
                       outcome.n_candidates, outcome.n_simulated, cut)
        return cls(True, b.policy, dict(b.knobs), b.micro_batch, b.checkpointing, b.tokens_per_s, b.tflops_per_gpu,
                   b.step_time_s, None, outcome.n_candidates, outcome.n_simulated, cut)

    def verdict(self) -> str:
        """For people: the throughput, the binding pool, or that the bounds left it open."""
        if self.feasible:
            return f"{self.tokens_per_s or 0.0:,.0f} tokens/s"
        return "not settled (budget)" if self.binding == "budget" else f"infeasible ({self.binding})"

    def to_dict(self) -> dict[str, Any]:
        return {"best_policy": self.policy, "feasible": self.feasible, "tokens_per_s": self.tokens_per_s,
                "tflops_per_gpu": self.tflops_per_gpu, "step_time_s": self.step_time_s, "knobs": self.knobs,
                "micro_batch": self.micro_batch, "checkpointing": self.checkpointing, "binding": self.binding,
                "cut_short": self.cut_short}


def cut_short(outcome: SearchOutcome) -> str | None:
    """Why the search stopped before it was complete, or None. Besides ``outcome.cut_short`` this counts
    candidates skipped for a bound (a first-feasible search that hit ``max_candidates`` skips the rest
    without saying so in ``cut_short``); stopping at the first feasible plan is the request, not a cut."""
    if outcome.cut_short:
        return outcome.cut_short
    skipped = {r: n for r, n in outcome.rejected.items()
               if r.startswith("skipped") and r != "skipped: first feasible found"}
    return "; ".join(f"{n} candidates {r}" for r, n in sorted(skipped.items())) or None


def outcome_binding(outcome: SearchOutcome) -> str | None:
    """Why no candidate fits: the pool that overflows in the most rejected candidates (a policy's verdict,
    a memory bound or a simulated OOM; ties: by name); "budget" when the search was cut short before
    it found a feasible plan (nothing is proven); else the most frequent rejection reason (e.g. "knobs:
    invalid"); None when there were no candidates."""
    if cut_short(outcome):
        return "budget"
    pools: dict[str, int] = {}
    for e in outcome.evaluated:
        if not e.feasible and e.binding and e.reason and not e.reason.startswith(("skipped", "knobs", "workload")):
            pools[e.binding] = pools.get(e.binding, 0) + 1
    if pools:
        return min(pools.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    if not outcome.rejected:
        return None
    return min(outcome.rejected.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def best_within(hw: str | HardwareSpec, model: str | ModelSpec, *, hw_overrides: Sequence[str] = (),
                request: JobRequest | None = None, objective: str = "tokens_per_s",
                policies: Sequence[str] | None = None, budget_s: float | None = None,
                max_candidates: int | None = None, cache: Any = None, workers: int = 1,
                knobs: Sequence[str] = (), deadline: Deadline | None = None) -> Best:
    """The best plan of a job, as ``plan`` finds it. Unbounded: one full search.

    Under a wall-clock ``deadline`` (or ``budget_s``; whichever ends first), exact answers first: the full
    search runs with FULL_SHARE of the time; when it finishes, its answer is the exact one. When it is cut
    short without a feasible plan, a first-feasible search (frugal candidates first) gets the rest to settle
    feasibility, and its plan stands, flagged ``cut_short``.

    Bounded by ``max_candidates`` alone: a first-feasible search settles feasibility cheaply, and the full
    search follows for the best throughput; when that one is cut short without a feasible plan, the first
    feasible plan stands, flagged ``cut_short``."""
    opts: dict[str, Any] = {"hw_overrides": hw_overrides, "request": request, "policies": policies,
                            "cache": cache, "workers": workers, "max_candidates": max_candidates, "knobs": knobs}
    limit = deadline.within(budget_s) if deadline is not None else Deadline.after(budget_s)
    if limit.bounded:
        return _exact_first(hw, model, objective, limit, opts)
    if max_candidates is None:
        return Best.of(search(hw, model, objective=objective, **opts))
    t0 = time.perf_counter()
    first = Best.of(search(hw, model, first_feasible=True, budget_s=budget_s, **opts))
    left = None if budget_s is None else budget_s - (time.perf_counter() - t0)
    if not first.feasible:
        return first
    if left is not None and left <= 0:
        return replace(first, cut_short="no time left for the full search; the first feasible plan stands")
    full = Best.of(search(hw, model, objective=objective, budget_s=left, **opts))
    if full.feasible:
        return full
    return replace(first, cut_short=full.cut_short or "the full search found no plan within its bounds")


FULL_SHARE = 0.75  # of a bounded job's time, for the exact search (the rest settles feasibility if it is cut)


def _exact_first(hw: str | HardwareSpec, model: str | ModelSpec, objective: str, limit: Deadline,
                 opts: dict[str, Any]) -> Best:
    """:func:`best_within` under a deadline: the full search first, a first-feasible one in what is left."""
    full = Best.of(search(hw, model, objective=objective, deadline=limit.within(limit.left() * FULL_SHARE), **opts))
    if full.feasible or full.binding != "budget" or limit.expired():
        return full
    first = Best.of(search(hw, model, first_feasible=True, deadline=limit, **opts))
    if not first.feasible:
        return first
    return replace(first, cut_short=full.cut_short or "the full search found no plan within its bounds")


def exact_again(hw: str | HardwareSpec, model: str | ModelSpec, objective: str, deadline: Deadline,
                opts: dict[str, Any]) -> Best | None:
    """The second pass of a bounded what-if or coverage over a job whose first search the wall-time budget cut:
    the exact search once more, within ``deadline`` (what the others left), no first-feasible fallback. It resumes
    from what the first one evaluated where there is an evaluation cache. Its answer when it is complete (the exact
    one), else None (the first answer stands)."""
    if deadline.expired():
        return None
    again = Best.of(search(hw, model, objective=objective, deadline=deadline, **opts))
    return again if again.cut_short is None else None


def retried(bests: Sequence[Best], max_candidates: int | None) -> list[int]:
    """The positions of the answers a second pass may settle: cut short while only the wall-time budget bounded
    the search (a cap on the candidates would cut it again)."""
    return [i for i, b in enumerate(bests) if b.cut_short is not None] if max_candidates is None else []


@dataclass(frozen=True)
class Scenario:
    changes: dict[str, str]
    best: Best

    def to_dict(self) -> dict[str, Any]:
        return {"changes": dict(self.changes), **self.best.to_dict()}


@dataclass(frozen=True)
class Sensitivity:
    """One single change from the base and what it does to the best throughput."""

    change: str
    base: Best
    best: Best

    @property
    def gain(self) -> float | None:
        """Relative throughput change (0.25 = 25% more tokens/s); None unless both sides are feasible."""
        if self.base.tokens_per_s and self.best.tokens_per_s is not None:
            return self.best.tokens_per_s / self.base.tokens_per_s - 1.0
        return None

    @property
    def makes_feasible(self) -> bool:
        return self.best.feasible and not self.base.feasible

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "base_tokens_per_s": self.base.tokens_per_s,
                "tokens_per_s": self.best.tokens_per_s, "gain": self.gain, "makes_feasible": self.makes_feasible,
                "feasible": self.best.feasible, "best_policy": self.best.policy}


@dataclass
class WhatIfOutcome:
    hardware: str
    model: str
    axes: list[Axis]
    base: Best
    scenarios: list[Scenario]
    sensitivity: list[Sensitivity]
    n_searches: int
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tiersim.whatif", "hardware": self.hardware, "model": self.model,
                "vary": {a.path: list(a.values) for a in self.axes},
                "base": self.base.to_dict(),
                "scenarios": [s.to_dict() for s in self.scenarios],
                "sensitivity": [s.to_dict() for s in self.sensitivity],
                "n_searches": self.n_searches, "notes": list(self.notes)}


def _sensitivity_order(s: Sensitivity) -> tuple[Any, ...]:
    """Changes that make the job feasible first, then by gain (largest first), then by name."""
    gain = s.gain
    return (not s.makes_feasible, gain is None, -(gain or 0.0), s.change)


def whatif(hw: str | HardwareSpec, model: str | ModelSpec, axes: Sequence[Axis], *,
           request: JobRequest | None = None, hw_overrides: Sequence[str] = (),
           objective: str = "tokens_per_s", policies: Sequence[str] | None = None, budget_s: float | None = None,
           max_candidates: int | None = None, progress: Progress | None = None, cache: Any = None,
           workers: int = 1, deadline: Deadline | None = None) -> WhatIfOutcome:
    """Plan the base and every scenario of the grid; the sensitivity of each single change.

    ``budget_s`` (or ``deadline``) bounds the whole what-if by wall time: each machine still to plan gets an
    equal share of what is left (time a machine does not use goes to the next); then the machines whose search
    the budget cut are searched exactly once more, each with an equal share of what is left then
    (:func:`exact_again`), so a slow machine early in the grid uses the time the quick ones left;
    ``max_candidates`` bounds each search (see :func:`best_within`); ``cache`` is passed to each search.
    ``workers`` > 1 with several machines plans that many machines at a time, one process each
    (:func:`best_within_each`; the answers are the serial loop's); with one machine, its search gets the workers.
    """
    t0 = time.perf_counter()
    limit = deadline.within(budget_s) if deadline is not None else Deadline.after(budget_s)
    check_axes(axes)
    spec_model = model if isinstance(model, ModelSpec) else load_model(model)
    base_spec = resolve_hardware(hw, hw_overrides)
    base_key = machine_key(base_spec)
    # validate every value once, up front: a bad one is one line naming its path before any search
    specs: dict[tuple[str, str], HardwareSpec] = {}
    for axis in axes:
        for value in axis.values:
            specs[(axis.path, value)] = resolve_hardware(hw, layered(hw_overrides, [axis.label(value)]))
    grid = scenario_grid(axes)
    singles = [(axis, v) for axis in axes for v in axis.values if machine_key(specs[(axis.path, v)]) != base_key]
    # the machines to plan, each once, in the order they are first needed: base, grid, single changes
    keys: dict[tuple[tuple[str, str], ...], str] = {(): base_key}
    for changes in [*grid, *({axis.path: v} for axis, v in singles)]:
        keys[tuple(changes.items())] = machine_key(resolve_hardware(hw, layered(hw_overrides,
                                                                                 overrides_for(changes))))
    total = len(set(keys.values()))
    done: dict[str, Best] = {}
    labels: dict[str, tuple[str, list[str]]] = {}  # machine -> (label, its overrides)

    def say(i: int, label: str, b: Best) -> None:
        if progress:
            what = f"{b.policy} {b.verdict()}" if b.feasible else b.verdict()
            progress(f"[{i}/{total}] {label}: {what} ({time.perf_counter() - t0:.1f} s)")

    opts: dict[str, Any] = {"request": request, "objective": objective, "policies": policies,
                            "max_candidates": max_candidates, "cache": cache}
    for changes in [{}, *grid, *({axis.path: v} for axis, v in singles)]:
        key = keys[tuple(changes.items())]
        if key not in labels:
            labels[key] = (", ".join(overrides_for(changes)) or "base (no change)",
                           layered(hw_overrides, overrides_for(changes)))
    todo = list(labels)  # the machines, each once, in the order they are first needed: base, grid, single changes
    if workers > 1 and len(todo) > 1:
        def started(i: int) -> None:
            if progress:
                progress(f"[{i + 1}/{total}] planning {labels[todo[i]][0]} ...")

        answers = best_within_each([{"hw": hw, "model": spec_model, "hw_overrides": labels[key][1], **opts}
                                    for key in todo], limit, workers, started=started,
                                   finished=lambda i, b, _s: say(i + 1, labels[todo[i]][0], b))
        done.update((key, best) for key, (best, _) in zip(todo, answers, strict=True))
    else:
        for key in todo:
            label, overrides = labels[key]
            if progress:
                progress(f"[{len(done) + 1}/{total}] planning {label} ...")
            done[key] = best_within(hw, spec_model, hw_overrides=overrides, workers=workers,
                                    deadline=limit.share(total - len(done)), **opts)
            say(len(done), label, done[key])

    def plan(changes: Mapping[str, str]) -> Best:
        return done[keys[tuple(changes.items())]]

    order = list(done)
    again = retried([done[k] for k in order], max_candidates)
    for n, i in enumerate(again):
        label, overrides = labels[order[i]]
        if progress and not limit.expired():
            progress(f"[{i + 1}/{total}] cut by its share of the budget; planning {label} again ...")
        got = exact_again(hw, spec_model, objective, limit.share(len(again) - n),
                          {"request": request, "hw_overrides": overrides, "policies": policies, "cache": cache,
                           "workers": workers})
        if got is not None:
            done[order[i]] = got
            say(i + 1, label, got)
    base = plan({})
    scenarios = [Scenario(changes, plan(changes)) for changes in grid]
    sens = [Sensitivity(axis.label(v), base, plan({axis.path: v})) for axis, v in singles]
    sens.sort(key=_sensitivity_order)
    notes = [f"{axis.label(v)} is the base's value (no change)" for axis in axes for v in axis.values
             if machine_key(specs[(axis.path, v)]) == base_key]
    return WhatIfOutcome(hardware=base_spec.name, model=spec_model.name,
                         axes=list(axes), base=base, scenarios=scenarios, sensitivity=sens, n_searches=len(done),
                         wall_s=time.perf_counter() - t0, notes=notes)


def _timed_best(kwargs: dict[str, Any], deadline: Deadline) -> tuple[Best, float]:
    """:func:`best_within` of one job in a worker process of :func:`best_within_each`, with one worker of its own
    (``workers=1``), and its wall seconds."""
    t0 = time.perf_counter()
    return best_within(**kwargs, workers=1, deadline=deadline), time.perf_counter() - t0


def best_within_each(jobs: Sequence[dict[str, Any]], limit: Deadline, n: int, *, cap_s: float | None = None,
                     started: Callable[[int], None] | None = None,
                     finished: Callable[[int, Best, float], None] | None = None) -> list[tuple[Best, float]]:
    """Independent searches (``best_within(**job)``: the what-if's machines, the coverage's cells), ``n`` at a time
    in worker processes, each with one worker; their answers and wall seconds, in the jobs' order.

    Each search is the one a serial loop runs, so the answers are the same; the jobs are independent, so this is
    where parallelism pays (a search's own workers share one job's candidates, which mostly wait on each other).
    A job starts with an equal share of what is left of ``limit`` among the rounds still to run (``n`` jobs a
    round), at most ``cap_s``; time it does not use goes to the ones after it. ``started(i)`` is called as job
    ``i`` is handed to a worker, ``finished(i, best, wall_s)`` as its answer comes back."""
    done: dict[int, tuple[Best, float]] = {}
    nxt = 0
    with Workers(max(1, min(n, len(jobs))), daemon=False) as pool:
        while len(done) < len(jobs):
            while nxt < len(jobs) and len(pool.pending()) < n:
                unfinished = len(jobs) - len(done)
                share = limit.within(limit.left() * min(n, unfinished) / unfinished if limit.bounded else None)
                if started:
                    started(nxt)
                pool.submit(nxt, _timed_best, dict(jobs[nxt]), share.within(cap_s))
                nxt += 1
            for i, got in pool.wait():
                done[i] = got
                if finished:
                    finished(i, *got)
    return [done[i] for i in range(len(jobs))]
