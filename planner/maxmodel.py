"""The largest trainable model per policy: grow a model family along one dimension and bisect.

A :class:`Scaler` turns a step count ``n`` into a :class:`~workloads.ModelSpec`:

- ``shape_scaler("gpt"|"llama", hidden)``: a fixed width, ``n`` layers (GPT-3-like or LLaMA-like blocks);
- ``preset_scaler(preset, "layers")``: a preset's blocks, ``n`` of them;
- ``preset_scaler(preset, "width")``: a preset's layer count and head size, ``n`` KV-head groups wide
  (hidden = n x head_dim x heads-per-KV-head; the FFN keeps the preset's ratio to hidden).

:func:`max_model` finds the largest ``n`` a policy can train: it gallops from a start point (doubling
up while feasible, halving down while not) and then bisects, keeping ``lo`` feasible and ``hi``
infeasible until ``hi == lo + 1``, so the answer is feasible and one step larger is not by construction.
Cheapest route first: the sizes are bisected on a screen that simulates nothing (:func:`screen_model`:
some candidate survives the policy's own PlanInfeasible check and the analytic memory bounds), which is
a necessary condition (its rejection of ``s + 1`` is a proof: every candidate is rejected by the same
sound checks a search applies first); its answer ``s`` is then confirmed by a full check, and only if
``s`` does not fit after all does a bisection with full checks continue below it. A full check is one
``planner.search.search`` restricted to the policy: with ``first_feasible=True`` (it stops at the first
plan whose simulation fits), or, with a step-time limit, a full search whose fastest plan must meet the
limit. Checks and screens are memoised per ``n``.

``budget_s`` (or ``deadline``) bounds the whole bisection by wall time, a promise: every check and screen
runs under it (in worker processes stopped at the deadline), and when it passes the bisection stops with
what it has proven: the largest size known to fit and the smallest known not to, said in ``cut_short``
(a check cut by the deadline is never taken for a verdict).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hardware_models import HardwareInputError, HardwareSpec, build_topology
from planner.candidates import enumerate_candidates, memory_frugal
from planner.deadline import Deadline, run_bounded
from planner.job import JobRequest, make_job, resolve_hardware
from planner.search import plan_summary, search
from planner.whatif import Best, Progress
from policies import KnobError
from workloads import ModelSpec, WorkloadInputError, load_model
from workloads.custom_model import llama_ffn
from workloads.presets import preset_table, shorthands

SHAPES = ("gpt", "llama")
SCALE_DIMS = ("layers", "width")
HEAD_DIM = 128  # GPT-3 175B and LLaMA use 128-wide heads
MAX_LAYERS = 4096
MAX_HIDDEN = 131072


@dataclass(frozen=True)
class Scaler:
    """How a step count becomes a model: ``build(n)`` for ``lo <= n <= hi_cap``; ``start`` is a first guess."""

    family: str  # what is scaled, for people: "gpt, hidden 8192" or "llama3-8b"
    dimension: str  # "layers" or "width"
    build: Callable[[int], ModelSpec]
    start: int
    hi_cap: int
    lo: int = 1

    def describe(self, n: int) -> str:
        m = self.build(n)
        return f"{m.n_layers} layers x hidden {m.hidden}"


def shape_model(shape: str, hidden: int, layers: int, *, heads: int | None = None, kv_heads: int | None = None,
                vocab: int | None = None, ffn: int | None = None, max_pos: int | None = None) -> ModelSpec:
    """A GPT-3-like (gelu, LayerNorm, biases, learned positions, tied embeddings) or LLaMA-like (SwiGLU,
    RMSNorm, rotary, untied) model of the given width and depth; heads default to hidden/128."""
    if shape not in SHAPES:
        raise WorkloadInputError(f"field 'shape': unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if heads is None and (hidden < HEAD_DIM or hidden % HEAD_DIM):
        raise WorkloadInputError(f"field 'hidden' ({hidden}) must be a positive multiple of {HEAD_DIM} "
                                 "(128-wide heads) or give --heads")
    n_heads = heads or hidden // HEAD_DIM
    gpt = shape == "gpt"
    return ModelSpec(
        name=f"{shape}-h{hidden}-L{layers}", family="gpt3" if gpt else "llama", n_layers=layers, hidden=hidden,
        n_heads=n_heads, n_kv_heads=kv_heads or n_heads,
        ffn=ffn or (4 * hidden if gpt else llama_ffn(hidden)), vocab=vocab or (50257 if gpt else 32000),
        max_pos=max_pos or (2048 if gpt else 4096), tied_embeddings=gpt, mlp="gelu" if gpt else "swiglu",
        norm="layernorm" if gpt else "rmsnorm", bias=gpt, learned_pos=gpt, dropout=gpt,
        source=f"tiersim max-model --shape {shape} --hidden {hidden}")


def shape_scaler(shape: str, hidden: int, *, hi_cap: int | None = None, **dims: Any) -> Scaler:
    shape_model(shape, hidden, 1, **dims)  # validates the dimensions before any search
    return Scaler(family=f"{shape}, hidden {hidden}", dimension="layers",
                  build=lambda n: shape_model(shape, hidden, n, **dims), start=32, hi_cap=hi_cap or MAX_LAYERS)


def resolve_preset(name: str) -> ModelSpec:
    """A preset or shorthand; a family prefix (``llama3``, ``gpt3``, ``opt``) picks its first preset."""
    key = name.strip().lower()
    table = preset_table()
    if key in table or key in shorthands():
        return load_model(key)
    matches = [p for p in table if p.startswith(key + "-") or p.startswith(key + ".")]
    if not matches:
        raise WorkloadInputError(f"field 'family': no model preset or family {name!r}; give a preset "
                                 f"({', '.join(table)}), a shorthand or a family prefix such as llama3")
    return load_model(matches[0])


def _width_model(base: ModelSpec, groups: int) -> ModelSpec:
    per_group = base.n_heads // base.n_kv_heads
    heads = groups * per_group
    hidden = heads * base.head_dim
    raw_ffn = base.ffn * hidden / base.hidden
    ffn = 256 * -(-int(raw_ffn) // 256) if base.mlp == "swiglu" else max(1, round(raw_ffn))
    return base.with_shape(name=f"{base.name}-h{hidden}", hidden=hidden, n_heads=heads, n_kv_heads=groups, ffn=ffn,
                           source=f"{base.name} scaled to hidden {hidden}")


def preset_scaler(preset: str, dimension: str, *, hi_cap: int | None = None) -> Scaler:
    if dimension not in SCALE_DIMS:
        raise WorkloadInputError(f"field 'scale': unknown {dimension!r}; choose one of {', '.join(SCALE_DIMS)}")
    base = resolve_preset(preset)
    if base.is_moe:
        raise WorkloadInputError(f"field 'family': {base.name} is a mixture of experts; scale a dense model")
    if dimension == "layers":
        return Scaler(family=base.name, dimension="layers", start=base.n_layers, hi_cap=hi_cap or MAX_LAYERS,
                      build=lambda n: replace(base, name=f"{base.name}-L{n}", n_layers=n,
                                              source=f"{base.name} with {n} layers"))
    group_width = base.head_dim * (base.n_heads // base.n_kv_heads)
    return Scaler(family=base.name, dimension="width", start=base.n_kv_heads,
                  hi_cap=hi_cap or MAX_HIDDEN // group_width,
                  build=lambda n: _width_model(base, n))


@dataclass(frozen=True)
class Check:
    """One feasibility check of ``n`` steps: the model, the verdict and what bound it."""

    n: int
    model: ModelSpec
    best: Best
    feasible: bool
    binding: str | None  # pool / reason when infeasible, "time" when only the step-time limit failed
    wall_s: float
    screened: bool = False  # decided by the screen (every candidate rejected before simulation), no search

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "model": self.model.name, "params": self.model.params(), "feasible": self.feasible,
                "binding": self.binding, "tokens_per_s": self.best.tokens_per_s,
                "step_time_s": self.best.step_time_s, "knobs": self.best.knobs, "screened": self.screened}


@dataclass
class MaxModelOutcome:
    policy: str
    dimension: str
    family: str
    largest: Check | None  # None: not even the smallest model fits
    first_infeasible: Check | None  # one step above largest (the smallest when nothing fits); None: cap fits
    checks: list[Check] = field(default_factory=list)
    n_screened: int = 0  # sizes judged by the cheap screen (no simulation)
    wall_s: float = 0.0
    cut_short: str | None = None  # the deadline stopped the bisection: largest / first_infeasible bracket it

    @property
    def binding(self) -> str | None:
        if self.first_infeasible is not None:
            return self.first_infeasible.binding
        return None

    def to_dict(self) -> dict[str, Any]:
        def model_dict(c: Check | None) -> dict[str, Any] | None:
            if c is None:
                return None
            m = c.model
            return {"name": m.name, "params": m.params(), "n_layers": m.n_layers, "hidden": m.hidden,
                    "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads, "ffn": m.ffn}

        return {"policy": self.policy, "dimension": self.dimension, "family": self.family,
                "largest": model_dict(self.largest), "params": self.largest.model.params() if self.largest else None,
                "tokens_per_s": self.largest.best.tokens_per_s if self.largest else None,
                "knobs": self.largest.best.knobs if self.largest else {},
                "first_infeasible": model_dict(self.first_infeasible), "binding": self.binding,
                "cap_reached": self.largest is not None and self.first_infeasible is None,
                "checks": [c.to_dict() for c in self.checks], "n_screened": self.n_screened,
                "cut_short": self.cut_short}


@dataclass(frozen=True)
class Screen:
    """The cheap verdict on a model: does some candidate of the policy survive its own PlanInfeasible check
    and the analytic memory bounds? Nothing is simulated. ``passes=False`` is a proof that no plan fits
    (both rejections are sound); ``passes=True`` is only a maybe. ``binding``: the pool rejected most often."""

    n: int
    passes: bool
    binding: str | None
    n_planned: int
    wall_s: float


def screen_model(hw: HardwareSpec, model: ModelSpec, policy: str, *, request: JobRequest | None = None,
                 n: int = 0, knobs: Sequence[str] = ()) -> Screen:
    """Plan the policy's candidates most memory-frugal first (full checkpointing, small micro-batches), as
    ``search`` enumerates them, until one survives the plan-level checks; see :class:`Screen`."""
    t0 = time.perf_counter()
    req = request or JobRequest()
    job0, _ = make_job(hw, model, replace(req, micro_batch=req.micro_batch or 1,
                                          checkpointing=req.checkpointing or "full"))
    c0 = job0.config
    assert c0.global_batch is not None  # WorkloadConfig fills it in on construction
    base = replace(req, seq_len=c0.seq_len, global_batch=c0.global_batch, precision=c0.precision,
                   flash_attention=c0.flash_attention)
    cands = sorted(enumerate_candidates([policy], hw.gpu.count, c0.global_batch, micro_batch=req.micro_batch,
                                        checkpointing=req.checkpointing, knobs=knobs), key=memory_frugal)
    topo = build_topology(hw)
    pools: dict[str, int] = {}
    for k, cand in enumerate(cands):
        try:
            job = make_job(hw, model, replace(base, micro_batch=cand.micro_batch,
                                              checkpointing=cand.checkpointing))[0]
        except (WorkloadInputError, KnobError, HardwareInputError):
            continue
        summary, _ = plan_summary(job, cand, topo)
        if summary.verdict != "rejected":
            return Screen(n, True, None, k + 1, time.perf_counter() - t0)
        if summary.binding:
            pools[summary.binding] = pools.get(summary.binding, 0) + 1
    binding = min(pools.items(), key=lambda kv: (-kv[1], kv[0]))[0] if pools else None
    return Screen(n, False, binding, len(cands), time.perf_counter() - t0)


def _screen_task(hw: HardwareSpec, model: ModelSpec, policy: str, request: JobRequest | None, n: int,
                 knobs: tuple[str, ...]) -> Screen:
    """:func:`screen_model` with positional arguments (run in a worker process under a deadline)."""
    return screen_model(hw, model, policy, request=request, n=n, knobs=knobs)


def check_model(hw: str | HardwareSpec, model: ModelSpec, policy: str, *, request: JobRequest | None = None,
                max_step_time_s: float | None = None, budget_s: float | None = None,
                max_candidates: int | None = None, cache: Any = None, workers: int = 1, n: int = 0,
                knobs: Sequence[str] = (), deadline: Deadline | None = None) -> Check:
    """Can ``policy`` train ``model``? Cheapest route first; with a step-time limit, the fastest plan counts."""
    t0 = time.perf_counter()
    outcome = search(hw, model, request=request, policies=[policy], first_feasible=max_step_time_s is None,
                     budget_s=budget_s, max_candidates=max_candidates, cache=cache, workers=workers, knobs=knobs,
                     deadline=deadline)
    best = Best.of(outcome)
    feasible, binding = best.feasible, best.binding
    if feasible and max_step_time_s is not None and (best.step_time_s or 0.0) > max_step_time_s:
        feasible, binding = False, "time"
    return Check(n, model, best, feasible, binding, time.perf_counter() - t0)


def max_model(hw: str | HardwareSpec, scaler: Scaler, policy: str, *, request: JobRequest | None = None,
              hw_overrides: Sequence[str] = (), max_step_time_s: float | None = None, budget_s: float | None = None,
              max_candidates: int | None = None, progress: Progress | None = None,
              cache: Any = None, workers: int = 1, screen: bool = True,
              knobs: Sequence[str] = (), deadline: Deadline | None = None) -> MaxModelOutcome:
    """The largest ``n`` (and its model) that ``policy`` trains: feasible, and ``n + 1`` is not.

    With ``screen`` (default) the sizes are first bisected on the cheap :func:`screen_model` verdict, whose
    rejections stand as proofs, and a full check (a search that simulates) confirms its answer ``s`` (a
    bisection below ``s`` with full checks follows when ``s`` does not fit after all); without it every
    probe is a full check. ``knobs`` (``name=value``) fix the policy's knobs in every check (e.g.
    ``param_device=nvme``: the largest model with parameters on NVMe).
    """
    t0 = time.perf_counter()
    limit = deadline.within(budget_s) if deadline is not None else Deadline.after(budget_s)
    spec = resolve_hardware(hw, hw_overrides)
    checks: dict[int, Check] = {}
    screens: dict[int, Screen] = {}

    def ok(n: int) -> bool:
        sc = screens.get(n)
        if n not in checks and sc is not None and not sc.passes:  # the screen's rejection is already a proof
            nothing = Best(False, None, {}, None, None, None, None, None, sc.binding, sc.n_planned, 0)
            checks[n] = Check(n, scaler.build(n), nothing, False, sc.binding, sc.wall_s, screened=True)
        if n not in checks:
            if limit.expired():
                raise _OutOfTime
            c = check_model(spec, scaler.build(n), policy, request=request, max_step_time_s=max_step_time_s,
                            max_candidates=max_candidates, cache=cache, workers=workers, n=n, knobs=knobs,
                            deadline=limit)
            if not c.feasible and c.binding == "budget" and limit.expired():
                raise _OutOfTime  # the deadline cut this check: no verdict
            checks[n] = c
            if progress:
                c = checks[n]
                verdict = "fits" if c.feasible else f"does not fit ({c.binding})"
                progress(f"{policy}: {scaler.describe(n)} ({c.model.params() / 1e9:.2f}B) {verdict} "
                         f"[{c.wall_s:.1f} s]")
        return checks[n].feasible

    def may_fit(n: int) -> bool:
        if n not in screens:
            done, sc = run_bounded(limit, _screen_task, spec, scaler.build(n), policy, request, n, tuple(knobs))
            if not done:
                raise _OutOfTime
            screens[n] = sc
            if progress:
                sc = screens[n]
                verdict = "passes (to be simulated)" if sc.passes else f"rejected without simulating ({sc.binding})"
                progress(f"{policy}: screen {scaler.describe(n)}: {verdict} [{sc.wall_s:.1f} s]")
        return screens[n].passes

    cut: str | None = None
    try:
        lo, hi = _search_sizes(ok, may_fit if screen else None, scaler)
    except _OutOfTime:
        lo, hi, cut = _bracket(checks, screens, scaler)
        for n in (hi,) if hi is not None and hi not in checks else ():
            ok(n)  # a screened-out size: recorded from its screen (no search)
    ordered = [checks[n] for n in sorted(checks)]
    return MaxModelOutcome(policy=policy, dimension=scaler.dimension, family=scaler.family,
                           largest=checks[lo] if lo is not None else None,
                           first_infeasible=checks[hi] if hi is not None else None,
                           checks=ordered, n_screened=len(screens), wall_s=time.perf_counter() - t0, cut_short=cut)


class _OutOfTime(Exception):
    """The deadline passed during the bisection (internal: :func:`max_model` answers with what it proved)."""


def _bracket(checks: dict[int, Check], screens: dict[int, Screen],
             scaler: Scaler) -> tuple[int | None, int | None, str]:
    """What a cut bisection has proven: the largest size known to fit, the smallest above it known not to
    (a full check or a screen's rejection), and the sentence that says so."""
    fits = [n for n, c in checks.items() if c.feasible]
    lo = max(fits) if fits else None
    above = [n for n, c in checks.items() if not c.feasible and (lo is None or n > lo)]
    above += [n for n, sc in screens.items() if not sc.passes and (lo is None or n > lo)]
    hi = min(above) if above else None
    if lo is not None and hi is not None:
        where = f"the largest fitting size is from {lo} to {hi - 1} ({scaler.dimension})"
    elif lo is not None:
        where = f"{lo} fits ({scaler.dimension}); larger sizes were not settled"
    elif hi is not None:
        where = f"no size below {hi} was shown to fit ({scaler.dimension})"
    else:
        where = "no size was settled"
    return lo, hi, f"wall-time budget reached during the bisection: {where}"


def _search_sizes(ok: Callable[[int], bool], may_fit: Callable[[int], bool] | None,
                  scaler: Scaler) -> tuple[int | None, int | None]:
    """(largest n with ok(n), the n + 1 above it); ``may_fit`` (a necessary condition of ok) narrows first."""
    if may_fit is None:
        return largest_true(ok, lo=scaler.lo, start=scaler.start, hi_cap=scaler.hi_cap)
    s_lo, s_hi = largest_true(may_fit, lo=scaler.lo, start=scaler.start, hi_cap=scaler.hi_cap)
    if s_lo is None:  # even the smallest is rejected: confirm with a full check (gallops up if it fits)
        return largest_true(ok, lo=scaler.lo, start=scaler.lo, hi_cap=scaler.hi_cap)
    if s_hi is not None and ok(s_hi):  # (ok of a screened-out size is the screen's verdict, so not taken)
        return largest_true(ok, lo=scaler.lo, start=s_hi, hi_cap=scaler.hi_cap)
    # s_hi (if any) is confirmed infeasible: the answer is s_lo or below
    return largest_true(ok, lo=scaler.lo, start=s_lo, hi_cap=s_hi if s_hi is not None else s_lo)


def largest_true(ok: Callable[[int], bool], *, lo: int, start: int, hi_cap: int) -> tuple[int | None, int | None]:
    """For a predicate true up to some n and false above: (largest n with ok(n), n + 1) within [lo, hi_cap].

    The first element is None when ``ok(lo)`` is false (the second is then ``lo``), the second None when
    ``ok(hi_cap)`` is true. Gallops from ``start`` (doubling up while true, halving down while false),
    then bisects keeping the lower end true and the upper end false, so the answer is exact: ok(answer)
    and not ok(answer + 1) were both evaluated. O(log n) calls of ``ok``.
    """
    start = min(max(start, lo), hi_cap)
    good: int | None
    bad: int | None
    if ok(start):
        good, bad = start, None
        while bad is None and good < hi_cap:
            probe = min(2 * good, hi_cap)
            if ok(probe):
                good = probe
            else:
                bad = probe
    else:
        good, bad = None, start
        while good is None and bad > lo:
            probe = max(bad // 2, lo)
            if ok(probe):
                good = probe
            else:
                bad = probe
    while good is not None and bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, bad
