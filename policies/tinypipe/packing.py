"""Holistic layer packing for ``tinypipe``: stage boundaries and packs chosen together by an exact search.

The problem (our reading, see the package docstring): split layers ``0..L-1`` into ``S`` contiguous stages and
each swapped stage into contiguous *packs*, minimising the worst stage's peak GPU memory subject to every stage's
time within ``(1 + tolerance) T*`` (``T*``: the best balanced bottleneck). Modes come from a rule (``Model.mode``).

Costs per stage (a model for the search; the simulator is the judge of the chosen plan): time per micro-batch:
``gpu``/``resident``: the sum of the layers' compute; ``swap``: ``sum over packs of max(compute, transfer) +
overhead`` (a pack's transfers overlap its neighbours' compute, so packing a compute-heavy with a transfer-heavy
layer lets them hide each other). GPU memory: ``in_flight * activations + workspace`` plus ``2 * weights``
(+ ``states`` for ``gpu``), or for ``swap`` ``(prefetch + 1) * largest pack`` of weights (fetched packs resident
at once) ``+ 2 * largest pack`` of gradient buffers (one being written, one going down). Each of these is a
tensor of the plan, and each is charged as the simulator charges it (``Problem.allocator``: PyTorch's caching
allocator rounds every GPU tensor, ``hardware_models.allocator``): the workspace, each layer's activations per
micro-batch (one stash of all of them with ``stash``), the stage's weights and gradients, each part of its states
(``state_split``), each pack buffer. The rounding only grows with the size, so the search stays exact.

The search is exact for this model: a min-max dynamic programme over stage boundaries (three passes: ``T*`` by
time; the least peak memory with every stage time <= ``(1 + tol) T*``; then, among partitions with that peak,
the least bottleneck), where a swapped stage's best packing comes from an inner dynamic programme over pack
boundaries (least time under a cap on the pack size; the least cap meeting a time bound by bisection over the
finitely many pack sizes). Packs hold at most ``max_pack_layers`` layers. ``tests/test_policy_tinypipe.py``
checks it against brute force on small instances.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

from hardware_models.allocator import allocator_overhead

MODES = ("gpu", "resident", "swap")
MAX_PACK_LAYERS = 16
SOLVE_CACHE = 128  # solved problems kept (each holds one small Solution)
_REL = 1e-12
INF = math.inf


@dataclass(frozen=True)
class LayerCost:
    """What the search needs of one layer (per micro-batch)."""

    compute_s: float          # forward + recompute + backward, launches included
    swap_s: float             # transfer time when swapped: two fetches and the gradient going down
    param_bytes: float        # 16-bit weights the GPU holds for the layer (gradients are the same size)
    state_bytes: float        # fp32 master + Adam m, v: extra GPU bytes in ``gpu`` mode
    act_bytes: float          # activations saved for the backward, per micro-batch in flight
    transient_bytes: float    # working memory of the layer's kernels (workspace)


@dataclass(frozen=True)
class Problem:
    layers: tuple[LayerCost, ...]
    stages: int
    inflight: tuple[int, ...]          # micro-batches whose activations a stage holds at most, per stage index
    capacity: float                    # usable bytes of one GPU
    prefetch: int = 1
    pack_overhead_s: float = 0.0       # per pack per micro-batch (copy setup latencies)
    tolerance: float = 0.05
    modes: tuple[str, ...] = MODES     # allowed modes, in order of preference
    shared_param_bytes: float = 0.0    # tied embedding table: in the first and the last layer's figures,
    shared_state_bytes: float = 0.0    # but held once by a range (or pack) that has both
    max_pack_layers: int = MAX_PACK_LAYERS
    allocator: str = "exact"           # how the GPU's allocator rounds a tensor ("caching": PyTorch's; "exact": none)
    stash: bool = False                # a stage's activations are one tensor for every micro-batch (GPipe)
    state_split: tuple[float, ...] = (1.0,)  # shares of ``state_bytes`` held as separate tensors (master; Adam m+v)

    def __post_init__(self) -> None:
        if not 1 <= self.stages <= len(self.layers):
            raise ValueError(f"stages must be within 1..{len(self.layers)}, got {self.stages}")
        if len(self.inflight) != self.stages:
            raise ValueError("inflight needs one entry per stage")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must be a non-empty subset of {MODES}")


@dataclass(frozen=True)
class StagePlan:
    index: int
    first: int
    last: int                          # inclusive
    mode: str
    packs: tuple[tuple[int, int], ...]  # inclusive layer ranges, in forward order
    time_s: float
    mem_bytes: float


@dataclass(frozen=True)
class Solution:
    stages: tuple[StagePlan, ...]
    t_star: float                      # bottleneck stage time of the best balanced partition
    bound: float                       # (1 + tolerance) * t_star
    peak_bytes: float                  # least peak GPU memory within the bound
    bottleneck_s: float                # the chosen partition's slowest stage
    evaluations: dict[str, int] = field(default_factory=dict)


class Model:
    """Evaluation of stages and packs (also used by brute-force checks), and the exact search."""

    def __init__(self, prob: Problem):
        self.p, self.n, ls = prob, len(prob.layers), prob.layers
        self._c, self._x, self._w, self._st, self._a = ([*accumulate((getattr(x, f) for x in ls), initial=0.0)]
                                                        for f in ("compute_s", "swap_s", "param_bytes", "state_bytes",
                                                                  "act_bytes"))
        self._allocator = prob.allocator
        self._held: dict[float, float] = {}
        self._fixed: dict[tuple[int, int, int], float] = {}
        self._ah = [*accumulate((self.held(x.act_bytes) for x in ls), initial=0.0)]  # each layer's activations
        self._t1 = [x.transient_bytes for x in ls]
        self._w1 = [self.weights(x, x) for x in range(self.n)]
        self._tmax: dict[tuple[int, int], float] = {}
        self._wmax: dict[tuple[int, int], float] = {}
        self._mode: dict[tuple[int, int, int], str] = {}
        self._rows: dict[tuple[int, float], tuple[list[float], list[int]]] = {}
        self.evals = {"stage": 0, "pack_dp": 0}

    def compute(self, i: int, j: int) -> float:
        return self._c[j + 1] - self._c[i]

    def weights(self, i: int, j: int) -> float:
        w = self._w[j + 1] - self._w[i]
        return w - self.p.shared_param_bytes if i == 0 and j == self.n - 1 else w

    def states(self, i: int, j: int) -> float:
        s = self._st[j + 1] - self._st[i]
        return s - self.p.shared_state_bytes if i == 0 and j == self.n - 1 else s

    def workspace(self, i: int, j: int) -> float:
        return _range_max(self._tmax, self._t1, i, j)

    def largest_layer(self, i: int, j: int) -> float:
        return _range_max(self._wmax, self._w1, i, j)

    def held(self, nbytes: float) -> float:
        """Bytes a GPU tensor of ``nbytes`` holds under the problem's allocator (memoised: sizes repeat)."""
        v = self._held.get(nbytes)
        if v is None:
            v = self._held[nbytes] = nbytes + allocator_overhead(nbytes, self._allocator) if nbytes > 0 else 0.0
        return v

    def fixed(self, i: int, j: int, s: int) -> float:
        """Activations in flight and workspace: in every mode (as the allocator holds them)."""
        key = (i, j, s)
        v = self._fixed.get(key)
        if v is None:
            k = self.p.inflight[s]
            acts = (self.held(k * (self._a[j + 1] - self._a[i])) if self.p.stash
                    else k * (self._ah[j + 1] - self._ah[i]))
            v = self._fixed[key] = acts + self.held(self.workspace(i, j))
        return v

    def held_states(self, i: int, j: int) -> float:
        st = self.states(i, j)
        return sum(self.held(f * st) for f in self.p.state_split)

    def mode_memory(self, i: int, j: int, s: int, mode: str) -> float:
        base = self.fixed(i, j, s) + 2 * self.held(self.weights(i, j))
        return base + self.held_states(i, j) if mode == "gpu" else base

    def mode(self, i: int, j: int, s: int) -> str:
        """The first allowed mode that fits, in order; ``swap`` only where it needs less memory than every
        allowed alternative (with few layers, prefetch and gradient buffers can outweigh the stage);
        when nothing fits, the least hungry allowed mode."""
        key = (i, j, s)
        hit = self._mode.get(key)
        if hit is None:
            base = self.fixed(i, j, s) + 2 * self.held(self.weights(i, j))   # mode_memory, the common part once
            other = {m: base + self.held_states(i, j) if m == "gpu" else base for m in self.p.modes if m != "swap"}
            hit = min(other, key=other.__getitem__) if other else "swap"
            for m in self.p.modes:
                if m == "swap":
                    if not other or self.swap_memory(i, j, s, self.largest_layer(i, j)) < min(other.values()):
                        hit = m
                        break
                elif other[m] <= self.p.capacity:
                    hit = m
                    break
            self._mode[key] = hit
        return hit

    def pack_time(self, u: int, t: int) -> float:
        return max(self.compute(u, t), self._x[t + 1] - self._x[u]) + self.p.pack_overhead_s

    def swap_memory(self, i: int, j: int, s: int, largest_pack: float) -> float:
        return (self.p.prefetch + 3) * self.held(largest_pack) + self.fixed(i, j, s)

    def stage_time(self, i: int, j: int, s: int, packs: tuple[tuple[int, int], ...]) -> float:
        if self.mode(i, j, s) != "swap":
            return self.compute(i, j)
        return sum(self.pack_time(u, t) for u, t in packs)

    def stage_memory(self, i: int, j: int, s: int, packs: tuple[tuple[int, int], ...]) -> float:
        m = self.mode(i, j, s)
        if m != "swap":
            return self.mode_memory(i, j, s, m)
        return self.swap_memory(i, j, s, max(self.weights(u, t) for u, t in packs))

    @functools.cached_property
    def caps(self) -> list[float]:
        """Every size a pack can have (runs of at most ``max_pack_layers`` layers), ascending: the least feasible
        cap of any range is one of its own pack sizes, so bisecting this list finds it exactly."""
        k = self.p.max_pack_layers
        return sorted({self.weights(u, t) for u in range(self.n) for t in range(u, min(self.n - 1, u + k - 1) + 1)})

    @functools.cached_property
    def held_caps(self) -> list[float]:
        """What a pack buffer of each of :attr:`caps` holds (ascending too: the rounding never shrinks a tensor)."""
        return [self.held(c) for c in self.caps]

    def _row(self, i: int, cap: float, j: int) -> tuple[list[float], list[int]]:
        """Least swapped time of layers i..t for t up to j (packs <= cap), extended on demand."""
        key = (i, cap)
        row = self._rows.get(key)
        if row is None:
            row = ([0.0], [0])
            self._rows[key] = row
        best, cut = row
        if len(best) - 1 + i > j:
            return row
        self.evals["pack_dp"] += 1
        k, limit, over = self.p.max_pack_layers, cap * (1 + _REL), self.p.pack_overhead_s
        cc, xx, ww, shared, last = self._c, self._x, self._w, self.p.shared_param_bytes, self.n - 1
        for t in range(len(best) - 1 + i, j + 1):
            b, arg = INF, -1
            for u in range(t, max(i, t - k + 1) - 1, -1):
                w = ww[t + 1] - ww[u]
                if u == 0 and t == last:
                    w -= shared
                if w > limit:
                    break
                prev = best[u - i]
                if prev == INF:
                    continue
                v = prev + max(cc[t + 1] - cc[u], xx[t + 1] - xx[u]) + over
                if v < b:
                    b, arg = v, u
            best.append(b)
            cut.append(arg)
        return row

    def min_time(self, i: int, j: int, cap: float) -> tuple[float, tuple[tuple[int, int], ...]]:
        """Least swapped-stage time of i..j with every pack <= cap bytes, and that packing."""
        best, cut = self._row(i, cap, j)
        packs: list[tuple[int, int]] = []
        if best[j - i + 1] < INF:
            t = j
            while t >= i:
                u = cut[t - i + 1]
                packs.append((u, t))
                t = u - 1
            packs.reverse()
        return best[j - i + 1], tuple(packs)

    def least_time(self, i: int, j: int, cap: float) -> float:
        """The time of :meth:`min_time` alone (the search asks for it far more often than for a packing)."""
        return self._row(i, cap, j)[0][j - i + 1]

    def min_cap(self, i: int, j: int, bound: float) -> float | None:
        """Least largest-pack size whose best packing of i..j meets the time bound (None: none does)."""
        caps, limit = self.caps, bound * (1 + _REL)
        if self.least_time(i, j, INF) > limit:
            return None
        lo = bisect.bisect_left(caps, self.largest_layer(i, j) * (1 - _REL))
        hi = len(caps) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.least_time(i, j, caps[mid]) <= limit:
                hi = mid
            else:
                lo = mid + 1
        return caps[lo]

    def best_time(self, i: int, j: int, s: int) -> float:
        self.evals["stage"] += 1
        if self.mode(i, j, s) != "swap":
            return self.compute(i, j)
        return self.least_time(i, j, INF)

    def mem_within(self, i: int, j: int, s: int, bound: float) -> float:
        self.evals["stage"] += 1
        if self.compute(i, j) > bound * (1 + _REL):
            return INF   # no mode is faster than its compute
        m = self.mode(i, j, s)
        if m != "swap":
            return self.mode_memory(i, j, s, m)
        cap = self.min_cap(i, j, bound)
        return INF if cap is None else self.swap_memory(i, j, s, cap)

    def _swap_cap(self, i: int, j: int, s: int, peak: float) -> float | None:
        room = (peak * (1 + _REL) - self.fixed(i, j, s)) / (self.p.prefetch + 3)  # for one held pack buffer
        k = bisect.bisect_right(self.held_caps, room * (1 + _REL)) - 1
        if k < 0 or self.caps[k] < self.largest_layer(i, j) * (1 - _REL):
            return None
        return self.caps[k]

    def time_within(self, i: int, j: int, s: int, peak: float) -> float:
        self.evals["stage"] += 1
        m = self.mode(i, j, s)
        if m != "swap":
            return self.compute(i, j) if self.mode_memory(i, j, s, m) <= peak * (1 + _REL) else INF
        cap = self._swap_cap(i, j, s, peak)
        return INF if cap is None else self.least_time(i, j, cap)

    def minmax(self, cost: Callable[[int, int, int], float],
               lower: Callable[[int, int, int], float]) -> tuple[float, list[int]]:
        """min over partitions into S contiguous stages of max_s cost(first, last, s); and the firsts.

        ``lower(i, j, s)`` <= ``cost(i, j, s)`` must not decrease as the range grows to the left: once it
        reaches the best value found, no longer range can do better and the scan stops (exactness kept).
        """
        n, S = self.n, self.p.stages
        f = [[INF] * n for _ in range(S)]
        arg = [[-1] * n for _ in range(S)]
        for j in range(0, n - S + 1):
            f[0][j] = cost(0, j, 0)
            arg[0][j] = 0
        for s in range(1, S):
            for j in range(s, n - (S - 1 - s)):
                best, at = INF, -1
                for i in range(j, s - 1, -1):
                    if lower(i, j, s) >= best:
                        break
                    prev = f[s - 1][i - 1]
                    if prev >= best:
                        continue
                    v = max(prev, cost(i, j, s))
                    if v < best:
                        best, at = v, i
                f[s][j], arg[s][j] = best, at
        firsts = [0] * S
        j = n - 1
        for s in range(S - 1, -1, -1):
            i = arg[s][j]
            firsts[s] = max(i, 0)
            j = i - 1
        return f[S - 1][n - 1], firsts

    def solve(self) -> Solution:
        by_compute = lambda i, j, s: self.compute(i, j)  # noqa: E731  (every mode's time >= its compute)

        def by_fixed(i: int, j: int, s: int) -> float:
            return INF if self.compute(i, j) > bound * (1 + _REL) else self.fixed(i, j, s)

        t_star, _ = self.minmax(self.best_time, by_compute)
        bound = t_star * (1 + self.p.tolerance) if math.isfinite(self.p.tolerance) else INF
        peak, _ = self.minmax(lambda i, j, s: self.mem_within(i, j, s, bound), by_fixed)
        _, firsts = self.minmax(lambda i, j, s: self.time_within(i, j, s, peak), by_compute)
        stages = []
        lasts = [*firsts[1:], self.n]
        for s, (i, nxt) in enumerate(zip(firsts, lasts, strict=True)):
            j = nxt - 1
            m = self.mode(i, j, s)
            if m == "swap":
                cap = self._swap_cap(i, j, s, peak)
                assert cap is not None
                packs = self.min_time(i, j, cap)[1]
            else:
                packs = tuple((x, x) for x in range(i, j + 1))
            stages.append(StagePlan(s, i, j, m, packs, self.stage_time(i, j, s, packs),
                                    self.stage_memory(i, j, s, packs)))
        return Solution(tuple(stages), t_star, bound, peak, max(st.time_s for st in stages), dict(self.evals))


@functools.lru_cache(maxsize=SOLVE_CACHE)
def solve(prob: Problem) -> Solution:
    """The exact search's answer; memoised on the (frozen, hashable) problem: a plan with ``stages`` = auto
    solves the stage counts it probes again for its relaxed retry, and a planner's candidates that differ
    only in knobs the problem does not see (or an auto knob and its explicit twin) share the answer. A pure
    function of ``prob``, so the cache changes no result."""
    return Model(prob).solve()


def _range_max(memo: dict[tuple[int, int], float], values: list[float], i: int, j: int) -> float:
    """max(values[i..j]), memoised per (i, j) in ``memo`` (the packing search asks for the same ranges often)."""
    v = memo.get((i, j))
    if v is None:
        v = memo[(i, j)] = max(values[i:j + 1])
    return v
