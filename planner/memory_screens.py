"""Memory screens: bytes the busiest GPU certainly holds at some instant, per policy, from (hardware, workload,
knobs) alone -- before any plan is built (``planner.screen.memory_screen`` dispatches here).

A screen above the GPU's capacity rejects the candidate unbuilt ("screen: gpu memory"). Each one is sound in the
sense that matters for the search: when it exceeds the capacity, building the plan would end in the policy's own
``PlanInfeasible`` for the GPU or in ``planner.bounds``' memory bound above the capacity (tests/test_screen.py checks
both on sweeps of models, knobs and machines). Each is the larger of two figures, either of which may reject:

- the policy's own pre-check, computed the way the policy computes it (its figures as the GPU's allocator holds
  them): when that is over, so is the policy's verdict;
- what the plan holds together at the forward/backward turn as ``planner.bounds.memory_lower_bound`` counts it
  (tensors homed on the GPU and never freed, plus every layer's saved activations of one micro-batch, which the
  forward allocates and the backward frees on the same compute stream): raw bytes, as the bound counts them.

Per policy:

- ``zero-offload``: fp16 parameter share (1/tp) and workspace, plus one micro-batch's saved activations.
- ``none``: the ZeRO stage's model states per GPU (the policy's own check, allocator-rounded), and raw: those
  states, the workspace and one micro-batch's saved activations.
- ``tinypipe``: the packing search's own infeasibility verdict, without its time-balanced search: the least
  peak over every partition into the stages of the plan (tolerance dropped, so any partition may be chosen), a
  swapped stage charged with its smallest possible pack (its largest layer), exactly the figure the policy's
  retry computes before it raises ``PlanInfeasible``. Only where the stage count is decided without a solve
  (``stages`` given, or auto where no stage count can keep everything on its GPU).

Knobs the policy refuses get no screen (the plan says why), and the other policies none (their residency is
decided by their own searches: ZeRO-Infinity's devices, SynergyScale's placement, LazyTrain's MILP; their
rejections on the 70b/a100x8 space cost a few milliseconds each).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from typing import Any

from policies import Job, KnobError, get_policy, kit, parse_knobs
from policies.base import gpu_pool
from policies.none import model_state_bytes
from policies.tinypipe.packing import _REL, Model
from policies.tinypipe.pipeline import all_gpu_need, packing_problem
from policies.zero_offload import auto_tp

Screen = tuple[float, str]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _knobs(policy: str, knobs: Mapping[str, Any]) -> Any:
    k = parse_knobs(get_policy(policy), dict(knobs))
    k.validate()
    return k


def _saved(job: Job, tp: int) -> float:
    """One micro-batch's saved activations of every layer on one GPU (the kit's per-layer tensors)."""
    return sum(kit.saved_activation_bytes(job, ly.activation_bytes, ly.kind, tp) for ly in job.trace.layers)


def _workspace(job: Job, tp: int) -> float:
    return max(ly.peak_transient_bytes for ly in job.trace.layers) / tp


def zero_offload(job: Job, knobs: Mapping[str, Any], threshold: float) -> Screen:
    k = _knobs("zero-offload", knobs)
    tp = k.tp or auto_tp(job)
    kit.check_tp(job, tp, "zero-offload")
    job.accumulation(job.n_gpus // tp)
    params = kit.dtype_bytes(job) * float(job.trace.params) / tp
    need = params + _workspace(job, tp) + _saved(job, tp)
    return need, (f"the fp16 parameters (tp={tp}), the workspace and one micro-batch's saved activations need "
                  f"{_gb(need)}")


def no_offload(job: Job, knobs: Mapping[str, Any], threshold: float) -> Screen:
    k = _knobs("none", knobs)
    kit.check_tp(job, k.tp, "none")
    dp = job.n_gpus // k.tp
    stage = k.stage if dp > 1 else 0
    job.accumulation(dp)
    states = model_state_bytes(job, stage, dp, k.tp)
    held = kit.gpu_held_bytes(job, states.values())  # the policy's own check
    raw = sum(states.values()) + _workspace(job, k.tp) + _saved(job, k.tp)
    return max(held, raw), (f"ZeRO-{stage} model states (tp={k.tp}) need {_gb(held)} as allocated; with the "
                            f"workspace and one micro-batch's saved activations {_gb(raw)}")


def tinypipe_stages(job: Job, stages: int) -> int | None:
    """The plan's stage count when it is decided without a packing solve; None when auto would have to solve."""
    n, L = job.n_gpus, len(job.trace.layers)
    if stages:
        if n % stages or stages > L:
            return None  # refused: the plan says why
        return stages
    fits = [d for d in range(1, n + 1) if n % d == 0 and d <= L]
    cap = gpu_pool(job).capacity_bytes
    need = all_gpu_need(job)
    for d in fits[:-1]:
        try:
            job.accumulation(n // d)
        except KnobError:
            continue
        if need / d <= cap * (1 + 1e-9):
            return None  # auto would probe this stage count with a full packing solve
    return fits[-1]


def least_mode_memory(model: Model) -> Callable[[int, int, int], float]:
    """A stage's least GPU memory over the modes the problem allows, a swapped stage with its smallest possible
    pack buffer (the least pack size the search can pick: its largest layer). At most the memory of the mode the
    policy's rule picks, and equal to it when nothing fits (then the rule picks the least hungry); it never falls
    as the range grows (every part is a sum, a max or a rounding of sizes of the range)."""
    caps, modes = model.caps, model.p.modes

    def memory(i: int, j: int, s: int) -> float:
        base = model.fixed(i, j, s) + 2 * model.held(model.weights(i, j))  # ``Model.mode_memory``'s common part
        out = []
        for m in modes:
            if m == "swap":
                cap = caps[bisect.bisect_left(caps, model.largest_layer(i, j) * (1 - _REL))]
                out.append(model.swap_memory(i, j, s, cap))
            else:
                out.append(base + model.held_states(i, j) if m == "gpu" else base)
        return min(out)

    return memory


def partition_fits(n: int, stages: int, memory: Callable[[int, int, int], float], limit: float) -> bool:
    """Is there a partition of layers 0..n-1 into ``stages`` contiguous non-empty stages with every stage's
    ``memory(first, last, stage)`` at most ``limit``? Exact when ``memory`` never falls as a range grows: stage s
    can end at j iff, with e the latest feasible end of stage s-1 before j, ``memory(e + 1, j, s) <= limit``
    (a later start only shrinks the range). O(stages x n) evaluations. One stage is the whole range, asked
    directly (a tied table is held once by a range holding both ends, so that range alone may need less than a
    shorter one: the monotony holds for every range but the whole)."""
    if stages == 1:
        return memory(0, n - 1, 0) <= limit
    ends = []
    for j in range(0, n - stages + 1):
        if memory(0, j, 0) > limit:
            break  # longer ranges need no less
        ends.append(j)
    for s in range(1, stages):
        cur: list[int] = []
        p = -1
        for j in range(s, n - (stages - 1 - s)):
            while p + 1 < len(ends) and ends[p + 1] < j:
                p += 1
            if p >= 0 and memory(ends[p] + 1, j, s) <= limit:
                cur.append(j)
        ends = cur
        if not ends:
            return False
    return bool(ends) and ends[-1] == n - 1


def least_peak(model: Model, threshold: float) -> tuple[float, bool]:
    """A lower bound of the least peak over every partition (the packing search with its tolerance dropped,
    ``tinypipe.pipeline.decide``'s retry), and whether it is above ``threshold``: when no partition fits within
    it, the least float above it (one sweep; the peak itself would take a bisection); else the least memory of
    any single layer on the stage holding the fewest micro-batches (every layer is on some stage)."""
    n, S = model.n, model.p.stages
    memory = least_mode_memory(model)
    if partition_fits(n, S, memory, threshold):
        fewest = min(range(S), key=lambda s: model.p.inflight[s])  # a stage's memory grows with what it holds
        return max(memory(x, x, fewest) for x in range(n)), False
    return math.nextafter(threshold, math.inf), True


def tinypipe(job: Job, knobs: Mapping[str, Any], threshold: float) -> Screen | None:
    k = _knobs("tinypipe", knobs)
    S = tinypipe_stages(job, k.stages)
    if S is None:
        return None
    dp = job.n_gpus // S
    job.accumulation(dp)
    peak, over = least_peak(Model(packing_problem(job, k, S, dp, None)), threshold)
    if over:
        return peak, (f"every partition into {S} stages needs more than the capacity on some stage (its activations "
                      "in flight, workspace and weights, or its smallest swap buffers)")
    return peak, f"the largest layer's least need on a {S}-stage pipeline: {_gb(peak)}"


#: per policy: (job, knobs, threshold) -> (bytes, what they are, with the figure) or None; ``threshold`` is the
#: capacity the search rejects above (tinypipe's figure above it is only "more than the threshold")
SCREENS: dict[str, Callable[[Job, Mapping[str, Any], float], Screen | None]] = {
    "zero-offload": zero_offload, "none": no_offload, "tinypipe": tinypipe}
