"""The analytic screen: a lower bound on a candidate's step-time bound from (hardware, workload, policy), before
any plan is built.

The search (``planner.search``) builds plans lazily in screen order: a candidate's plan is built only when its
screen is the lowest of everything not yet decided, and a candidate whose screen is above the best simulated
step is never built. That is exact because the screen never exceeds the plan's own time bound
(``planner.bounds.plan_bounds``), which never exceeds the simulated step (tests/test_screen.py checks
screen <= plan bound <= simulated on a sweep of policies, models and knobs, and that the screened search picks
the same best as the exhaustive one).

The bound: one measured step of any policy computes the forward and the backward of every layer for every
sequence of the global batch, on the job's GPUs. A policy may split a layer task (a tensor-parallel shard,
a chunk of the tokens) but the engine prices a task of a share ``k`` of a layer's FLOPs as the layer's
kernels scaled by ``k`` (``costs.ComputePricer``), each kernel no faster than ``k`` times the full kernel
when the efficiency curve does not fall with size (smaller kernels are less efficient) -- so the GPUs
together spend at least the sum over layers of the full layers' kernel seconds, times the micro-batches of
the step, and the busiest GPU at least that over the GPU count. Per kernel the screen charges what the
engine charges at least: ``f / (peak * eff(f))`` and, at kernel level, the operands over HBM
(``costs.compute.gemm_kernels_seconds``), plus the element-wise bytes where the spec prices them apart (the
Ampere and Hopper presets); never the launch overheads or the task's own HBM floor (a policy may fuse tasks).
Where the curve does fall somewhere (a user's curve), every kernel is charged at the curve's highest
efficiency instead (still a lower bound, looser). Policies that recompute as the workload's
``checkpointing`` says (:data:`HONOURS_CHECKPOINTING`) are charged its recomputation too; the others
(LazyTrain decides per layer) are not.

A candidate's screen is the larger of that and its policy's time terms (``planner.screen_terms``: host-link
bytes and CPU Adam of ZeRO-Offload and ZeRO-Infinity, tinypipe's busiest pipeline stage), each a lower bound of
one resource's work in the plan bound; the screened search adds them lazily (``Screener.term``).

Everything is per distinct (micro-batch, checkpointing) job and policy class, so screening every candidate
of a search costs a few hundred kernel prices (memoised), not a plan.

Memory (:func:`memory_screen`), where a sound figure is cheap (``planner.memory_screens``: ZeRO-Offload, none,
tinypipe): the bytes the busiest GPU certainly holds at some instant. Above the GPU's capacity, the candidate is
rejected ("screen: gpu memory") without building its plan: its plan would be rejected by the policy or by the
memory bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from costs.compute import elementwise_apart, elementwise_bandwidth, gemm_kernels_seconds
from hardware_models import HardwareSpec
from planner.memory_screens import SCREENS
from planner.screen_terms import TERMS, Links, links_of
from policies import Job, KnobError
from policies.base import gpu_pool
from workloads.ops import LayerOps, layer_ops

#: policies whose plans recompute each layer as ``job.config.checkpointing`` says (the trace's
#: ``recompute_flops``); tests/test_screen.py checks the claim against each one's plans
HONOURS_CHECKPOINTING = frozenset({"none", "zero-offload", "zero-infinity", "tinypipe", "synergyscale"})
#: relative margin below the exact sum, so that the summation order cannot lift the screen above the bound
SCREEN_SLACK = 1e-6
#: relative margin above a GPU's capacity before a memory figure rejects a candidate (as the search's memory bound)
MEMORY_SLACK = 1e-9


@dataclass(frozen=True)
class Screen:
    """A lower bound on a candidate's plan time bound: seconds, and what gives them."""

    time_s: float
    resource: str

    def to_dict(self) -> dict[str, object]:
        return {"time_s": self.time_s, "resource": self.resource}


def monotone_curve(hw: HardwareSpec) -> bool:
    """Whether the GEMM efficiency curve (and the attention kernel's, where the spec has one) never falls as the
    kernel grows (then splitting a kernel never makes it cheaper)."""
    g = hw.gpu
    for curve in (g.gemm_efficiency, g.attention_efficiency, g.attention_backward_efficiency):
        if curve is None:
            continue
        effs = [e for _, e in curve.points]
        if not all(b >= a for a, b in zip(effs, effs[1:], strict=False)):
            return False
    return True


def _kernel_floor(hw: HardwareSpec, ops: LayerOps, dtype: str, monotone: bool, phase: str | None = None) -> float:
    """Seconds the engine charges at least for the matmul kernels of ``ops`` (or any split of them), and for its
    element-wise bytes where the spec prices them apart (``costs.compute.elementwise_apart``: a split task's
    shares move the same bytes in all)."""
    peak = hw.peak_flops_for(dtype)
    g = hw.gpu
    apart = 0.0
    if elementwise_apart(g) and g.op_overhead_s is None:
        apart = ops.elementwise_bytes / elementwise_bandwidth(g)
    if not monotone:
        top = max(e for _, e in g.gemm_efficiency.points)
        return sum(f for f in ops.matmul_flops if f > 0) / (peak * top) + apart
    if g.op_overhead_s is not None:  # operator level: the matmuls on the curve, no operand floor
        return sum(f / (peak * g.gemm_efficiency(f)) for f in ops.matmul_flops if f > 0)
    return gemm_kernels_seconds(hw, ops, dtype, phase) + apart


def _layer_seconds(job: Job, index: int, phase: str, flops: float, monotone: bool) -> float:
    if flops <= 0:
        return 0.0
    ops = layer_ops(job.model, job.config, index, phase)
    if ops.flops <= 0:
        return 0.0
    return _kernel_floor(job.hw, ops.scaled(flops / ops.flops), job.config.precision, monotone, phase)


def layer_floors(job: Job, recompute: bool) -> list[float]:
    """Per layer of the trace, the kernel seconds of one micro-batch's forward and backward (and recomputation
    with ``recompute``) that the GPU running the whole layer is charged at least (as in ``compute_screen``)."""
    monotone = monotone_curve(job.hw)
    memo: dict[tuple[object, ...], float] = {}
    out = []
    for ly in job.trace.layers:
        phases = [("fwd", ly.fwd_flops), ("bwd", ly.bwd_flops)] + ([("recompute", ly.recompute_flops)]
                                                                  if recompute else [])
        total = 0.0
        for phase, flops in phases:
            key = (ly.kind, ly.params, ly.fwd_flops, ly.bwd_flops, phase, flops)
            if key not in memo:
                memo[key] = _layer_seconds(job, ly.index, phase, flops, monotone)
            total += memo[key]
        out.append(total)
    return out


def compute_screen(job: Job, recompute: bool) -> float:
    """Seconds of SM work the busiest GPU does at least in one step (see the module docstring)."""
    monotone = monotone_curve(job.hw)
    memo: dict[tuple[object, ...], float] = {}
    per_micro_batch = 0.0
    for ly in job.trace.layers:
        phases = [("fwd", ly.fwd_flops), ("bwd", ly.bwd_flops)] + ([("recompute", ly.recompute_flops)]
                                                                  if recompute else [])
        for phase, flops in phases:
            # identical blocks price identically: the memo key is what layer_ops reads of the layer
            key = (ly.kind, ly.params, ly.fwd_flops, ly.bwd_flops, phase, flops)
            if key not in memo:
                memo[key] = _layer_seconds(job, ly.index, phase, flops, monotone)
            per_micro_batch += memo[key]
    micro_batches = job.global_batch / job.config.micro_batch
    return per_micro_batch * micro_batches / job.n_gpus * (1 - SCREEN_SLACK)


class Screener:
    """Screens candidates of one search (one hardware and model): ``time(job, policy, knobs)``, the compute screen
    memoised per workload configuration and policy class, raised by the policy's own terms
    (``planner.screen_terms``) memoised per configuration, policy and knobs."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, bool], float] = {}
        self._terms: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._links: tuple[HardwareSpec, Links] | None = None

    def time(self, job: Job, policy: str, knobs: Mapping[str, Any] | None = None) -> Screen:
        """The screen: the compute screen, raised by the policy's terms for ``knobs``."""
        best = self.compute(job, policy)
        term = self.term(job, policy, knobs or {})
        return term if term.time_s > best.time_s else best

    def compute(self, job: Job, policy: str) -> Screen:
        """The compute screen alone (the same for every knob of the policy: cheap)."""
        recompute = policy in HONOURS_CHECKPOINTING and job.config.checkpointing != "none"
        key = (repr(job.config), recompute)
        if key not in self._memo:
            self._memo[key] = compute_screen(job, recompute)
        return Screen(self._memo[key], "gpu.sm (compute)")

    def term(self, job: Job, policy: str, knobs: Mapping[str, Any]) -> Screen:
        """The largest of the policy's terms (``planner.screen_terms``) for ``knobs``; 0 s where it has none."""
        t, r = self._term(job, policy, knobs)
        return Screen(t, r)

    def _term(self, job: Job, policy: str, knobs: Mapping[str, Any]) -> tuple[float, str]:
        terms = TERMS.get(policy)
        if terms is None:
            return 0.0, "none"
        key = (repr(job.config), policy, repr(sorted(knobs.items())))
        if key not in self._terms:
            if self._links is None or self._links[0] != job.hw:
                self._links = (job.hw, links_of(job))
            try:
                got = terms(job, knobs, self._links[1])
            except KnobError:
                got = []
            t, r = max(got, default=(0.0, "none"))
            self._terms[key] = (t * (1 - SCREEN_SLACK), r)
        return self._terms[key]


def screen_all(jobs: Iterable[tuple[Job, str]]) -> list[Screen]:
    """The compute screen of each (job, policy) pair, in order (one Screener: the jobs share hardware and model)."""
    sc = Screener()
    return [sc.time(job, policy) for job, policy in jobs]


def memory_screen(job: Job, policy: str, knobs: Mapping[str, Any]) -> tuple[float, str] | None:
    """Bytes the busiest GPU's pool holds at least at some instant, and what they are, for the policies where
    that is cheap and sound (``planner.memory_screens``); None for the others, and for knobs the policy would
    refuse (its plan says why)."""
    screen = SCREENS.get(policy)
    if screen is None:
        return None
    try:
        return screen(job, knobs, gpu_pool(job).capacity_bytes * (1 + MEMORY_SLACK))
    except KnobError:
        return None
