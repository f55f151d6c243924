"""The LazyTrain optimisation problem, independent of any job: an :class:`Instance`, its MILP and its evaluation.

An instance has, per layer ``i``, a list of allowed options ``o = (mode, place)`` (mode ``keep`` = save the
full activations, ``ckpt`` = save only the layer input and recompute the forward in the backward; place
``gpu``, ``cpu`` or ``nvme``) with per-option coefficients, and a list of *windows*: stretches of compute
(a layer's forward, or its recompute + backward) that transfers can hide behind. The MILP
(:func:`solve_milp`, scipy's HiGHS) and the direct evaluation of one choice (:func:`evaluate`, which the
heuristics and the brute-force test use) implement the same model:

Variables
    ``x[i,o]`` binary, ``sum_o x[i,o] = 1`` (one mode and one place per layer);
    ``e[w] >= 0`` exposed transfer seconds of window ``w``;
    ``yW[k]`` binary per level ``T_k`` of the options' transients above the floor ``T_0`` (the largest of the
    layers' smallest transients): the workspace is ``W = T_0 + sum_k (T_k - T_{k-1}) yW[k]``;
    ``yS[k]`` binary per level ``V_k`` of the options' staged (offloaded) bytes: the staging budget is
    ``S = 2 sum_k (V_k - V_{k-1}) yS[k]`` (two in-flight offloaded activations, each budgeted at the
    largest one);
    ``N[g,o]`` integer: how many layers of group ``g`` (layers with identical coefficients, e.g. the
    transformer blocks) take option ``o`` (redundant, see below).
Constraints
    exposure, for every window ``w`` and every link resource ``r`` it loads (a direction of a link, a link's
    duplex budget, the NVMe drive set, or ``serial`` for copies that must run back to back)::

        e[w] >= load_const[w,r] + sum x[i,o] * load[w,r,i,o] - compute[w] - sum x[i,o] * extra_compute[w,i,o]

    (so ``e[w] = max(0, max_r load_r - compute)`` at the optimum: a transfer hides behind the window's
    compute, recomputation included, and what is left is exposed); rows another row of the same window
    bounds term by term are dropped;
    levels: ``x[i,o] <= yW[k]`` for the highest level ``T_k <= transient[i,o]``, ``yW[k+1] <= yW[k]``;
    likewise ``yS``. (The plain ``W >= sum_o x[i,o] transient[i,o]`` is exact too but its LP relaxation
    lets fractional layers shrink the workspace, which left a 3 % gap HiGHS needed minutes to close.);
    counts: ``N[g,o] = sum_{i in g} x[i,o]``;
    memory, for every pool ``k`` (written over the counts ``N`` where layers are grouped, so that the
    knapsack of 80 equal blocks is a knapsack of a few integers that branching closes at once)::

        fixed[k] + sum x[i,o] * bytes[k,i,o] (+ W + S for the pool the GPU allocates from) <= capacity[k]
Objective
    ``sum x[i,o] * recompute[i,o] + sum e[w] + tie * sum x[i,o] * transfer[i,o]``: recomputation plus
    exposed transfer seconds per micro-step, plus a tie-break (``tie`` = 1e-3 of the seconds an option spends
    on links, hidden or not) so that of two equally fast schedules the one that moves less is chosen
    ("offload nothing it need not").

Bytes enter the MILP in GB (1e9) to keep its coefficients near 1; the instance's capacities already carry
the caller's safety margin. :func:`evaluate` checks memory with a tolerance of ``MEM_TOL_BYTES``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

GB = 1e9
MEM_TOL_BYTES = 1024.0
TIE_BREAK = 1e-3
NODE_LIMIT = 20_000     # branch-and-bound nodes per solve: the deterministic limit (70b and 405b close at the root)
TIME_LIMIT_S = 300.0    # wall-clock safety net only (a result it cuts is reported as such)
STATUS = {0: "optimal", 1: "time or iteration limit", 2: "infeasible", 3: "unbounded", 4: "other"}

Terms = tuple[tuple[int, int, float], ...]  # (layer, option index, coefficient)


@dataclass(frozen=True)
class Opt:
    mode: str   # "keep" | "ckpt"
    place: str  # "gpu" | "cpu" | "nvme"

    def __str__(self) -> str:
        return f"{self.mode}@{self.place}"


@dataclass(frozen=True)
class Window:
    """Compute that transfers can hide behind, and the transfers that must fit in it."""

    name: str
    compute_s: float
    compute_var: Terms = ()                       # extra overlappable compute (recomputation) by choice
    load_const: Mapping[str, float] = field(default_factory=dict)   # resource -> seconds, always there
    load_var: Mapping[str, Terms] = field(default_factory=dict)     # resource -> seconds by choice


@dataclass(frozen=True)
class Instance:
    options: tuple[tuple[Opt, ...], ...]
    recompute_s: tuple[tuple[float, ...], ...]
    transfer_s: tuple[tuple[float, ...], ...]     # seconds on links of the option (tie-break only)
    transient: tuple[tuple[float, ...], ...]      # workspace bytes while the layer computes
    staged: tuple[tuple[float, ...], ...]         # bytes staged on the GPU while an offloaded copy is in flight
    pool_bytes: Mapping[str, tuple[tuple[float, ...], ...]]  # pool -> bytes per layer and option
    fixed_bytes: Mapping[str, float]
    capacity: Mapping[str, float]
    peak_pool: str                                # the pool the GPU allocates from (gets W and staging)
    windows: tuple[Window, ...]
    tie_break: float = TIE_BREAK

    @property
    def n_layers(self) -> int:
        return len(self.options)

    def index(self, layer: int, opt: Opt) -> int | None:
        try:
            return self.options[layer].index(opt)
        except ValueError:
            return None


@dataclass(frozen=True)
class Evaluation:
    feasible: bool
    objective: float        # recompute + exposed + tie-break (what the MILP minimises)
    recompute_s: float
    exposed_s: float
    tie_s: float
    workspace: float
    staging: float
    need: Mapping[str, float]       # bytes per pool
    overshoot: Mapping[str, float]  # need - capacity per pool (positive = over)
    exposed_by_window: Mapping[str, float]

    @property
    def pure_objective(self) -> float:
        """Recomputation plus exposed transfer seconds per micro-step (without the tie-break)."""
        return self.recompute_s + self.exposed_s


def evaluate(inst: Instance, choice: Sequence[int]) -> Evaluation:
    """Cost and memory of one choice (an option index per layer), computed directly from the model."""
    rc = sum(inst.recompute_s[i][o] for i, o in enumerate(choice))
    tie = inst.tie_break * sum(inst.transfer_s[i][o] for i, o in enumerate(choice))
    exposed: dict[str, float] = {}
    for w in inst.windows:
        comp = w.compute_s + sum(c for i, o, c in w.compute_var if choice[i] == o)
        worst = 0.0
        for r in set(w.load_const) | set(w.load_var):
            load = w.load_const.get(r, 0.0) + sum(c for i, o, c in w.load_var.get(r, ()) if choice[i] == o)
            worst = max(worst, load - comp)
        exposed[w.name] = worst
    ws = max(inst.transient[i][o] for i, o in enumerate(choice))
    staging = 2 * max(inst.staged[i][o] for i, o in enumerate(choice))
    need: dict[str, float] = {}
    for k in inst.capacity:
        v = inst.fixed_bytes.get(k, 0.0) + sum(inst.pool_bytes[k][i][o] for i, o in enumerate(choice))
        if k == inst.peak_pool:
            v += ws + staging
        need[k] = v
    over = {k: need[k] - inst.capacity[k] for k in need}
    feasible = all(v <= MEM_TOL_BYTES for v in over.values())
    ex = sum(exposed.values())
    return Evaluation(feasible, rc + ex + tie, rc, ex, tie, ws, staging, need, over, exposed)


# -- heuristics ----------------------------------------------------------------------------------------
def _pick(inst: Instance, prefs: Sequence[Opt]) -> list[int]:
    out = []
    for i in range(inst.n_layers):
        for p in prefs:
            k = inst.index(i, p)
            if k is not None:
                out.append(k)
                break
        else:
            out.append(0)
    return out


def heuristic(inst: Instance, name: str) -> list[int]:
    """``keep_all`` (full activations on the GPU), ``checkpoint_all`` (every checkpointable layer keeps
    only its input, on the GPU), ``offload_all`` (full activations to the CPU, or to NVMe where the CPU
    tier does not exist or does not hold them)."""
    keep_gpu = Opt("keep", "gpu")
    if name == "keep_all":
        return _pick(inst, [keep_gpu])
    if name == "checkpoint_all":
        return _pick(inst, [Opt("ckpt", "gpu"), keep_gpu])
    if name == "offload_all":
        cpu = _pick(inst, [Opt("keep", "cpu"), Opt("keep", "nvme"), keep_gpu])
        if evaluate(inst, cpu).feasible:
            return cpu
        nvme = _pick(inst, [Opt("keep", "nvme"), Opt("keep", "cpu"), keep_gpu])
        return nvme if evaluate(inst, nvme).feasible else cpu
    raise ValueError(f"unknown heuristic {name!r}")


# -- the MILP ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MilpResult:
    choice: tuple[int, ...] | None
    status: str
    status_code: int
    message: str
    objective: float | None   # HiGHS's objective value
    dual_bound: float | None
    mip_gap: float | None
    solve_s: float            # wall time: an attribute for benchmarks, never in to_dict() (plans reproduce)
    n_vars: int
    n_binaries: int
    n_constraints: int
    limit_hit: str | None = None  # "nodes" (deterministic) or "time" (the safety net: load-dependent)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "status_code": self.status_code, "message": self.message,
                "objective": self.objective, "dual_bound": self.dual_bound, "mip_gap": self.mip_gap,
                "limit_hit": self.limit_hit, "n_vars": self.n_vars, "n_binaries": self.n_binaries,
                "n_constraints": self.n_constraints}


class _Model:
    """Sparse rows of the MILP over x (flattened options), e (windows) and the level binaries of W and S."""

    def __init__(self, inst: Instance):
        self.inst = inst
        self.xoff: list[int] = []
        n = 0
        for opts in inst.options:
            self.xoff.append(n)
            n += len(opts)
        self.nx = n
        self.e0 = n
        # workspace: W = w_base + sum_k (T_k - T_{k-1}) yW_k, levels T_k over the options' transients
        self.w_base = max(min(row) for row in inst.transient)
        self.w_levels = sorted({v for row in inst.transient for v in row if v > self.w_base})
        self.yw0 = self.e0 + len(inst.windows)
        # staging: S = 2 * sum_k (V_k - V_{k-1}) yS_k, levels V_k over the options' staged bytes
        self.s_levels = sorted({v for row in inst.staged for v in row if v > 0})
        self.ys0 = self.yw0 + len(self.w_levels)
        # counts: layers with identical coefficients form a group; N[g,o] = how many of group g take option o.
        # The pool rows are written over the counts, so that the knapsack of equal blocks is a knapsack of
        # a few integers, which branching closes at once (over the 0/1 x it would enumerate which of
        # 120 equal blocks is kept).
        groups: dict[tuple, list[int]] = {}
        for i in range(inst.n_layers):
            key = (inst.options[i], inst.transient[i], inst.staged[i],
                   tuple(inst.pool_bytes[k][i] for k in sorted(inst.pool_bytes)))
            groups.setdefault(key, []).append(i)
        self.groups = list(groups.values())
        self.n0 = self.ys0 + len(self.s_levels)
        self.count: dict[tuple[int, int], int] = {}
        col = self.n0
        for gi, members in enumerate(self.groups):
            if len(members) > 1:
                for o in range(len(inst.options[members[0]])):
                    self.count[(gi, o)] = col
                    col += 1
        self.nvar = col
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def x(self, i: int, o: int) -> int:
        return self.xoff[i] + o

    def row(self, terms: Sequence[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(self.lb)
        for c, v in terms:
            if v != 0.0:
                self.rows.append(r)
                self.cols.append(c)
                self.vals.append(v)
        self.lb.append(lb)
        self.ub.append(ub)

    def peak_terms(self) -> tuple[float, list[tuple[int, float]]]:
        """(constant bytes, terms in GB) of workspace + staging."""
        terms = []
        prev = self.w_base
        for k, v in enumerate(self.w_levels):
            terms.append((self.yw0 + k, (v - prev) / GB))
            prev = v
        prev = 0.0
        for k, v in enumerate(self.s_levels):
            terms.append((self.ys0 + k, 2 * (v - prev) / GB))
            prev = v
        return self.w_base, terms

    def pool_terms(self, k: str) -> tuple[float, list[tuple[int, float]]]:
        inst = self.inst
        terms = []
        for gi, members in enumerate(self.groups):
            row = inst.pool_bytes[k][members[0]]
            for o, b in enumerate(row):
                if (gi, o) in self.count:
                    terms.append((self.count[(gi, o)], b / GB))
                else:
                    terms += [(self.x(i, o), b / GB) for i in members]
        const = inst.fixed_bytes.get(k, 0.0)
        if k == inst.peak_pool:
            base, extra = self.peak_terms()
            const += base
            terms += extra
        return const, terms

    def _levels(self, values: tuple[tuple[float, ...], ...], levels: list[float], y0: int) -> None:
        """x[i,o] <= y_k for the highest level k its value reaches; y_k >= y_{k+1} (levels are nested)."""
        for i, row in enumerate(values):
            for o, v in enumerate(row):
                ks = [k for k, lv in enumerate(levels) if lv <= v]
                if ks:
                    self.row([(self.x(i, o), 1.0), (y0 + ks[-1], -1.0)], -np.inf, 0.0)
        for k in range(len(levels) - 1):
            self.row([(y0 + k + 1, 1.0), (y0 + k, -1.0)], -np.inf, 0.0)

    def structural(self) -> None:
        """One-hot, exposure, workspace and staging rows (everything but the pool capacities)."""
        inst = self.inst
        for i, opts in enumerate(inst.options):
            self.row([(self.x(i, o), 1.0) for o in range(len(opts))], 1.0, 1.0)
        for wi, w in enumerate(inst.windows):
            comp = [(self.x(i, o), -c) for i, o, c in w.compute_var]
            for const, var in _undominated(w):
                if not var and const <= w.compute_s:
                    continue  # always hidden
                self.row([(self.x(i, o), c) for (i, o), c in var.items()] + comp + [(self.e0 + wi, -1.0)],
                         -np.inf, w.compute_s - const)
        for (gi, o), col in self.count.items():
            self.row([(self.x(i, o), 1.0) for i in self.groups[gi]] + [(col, -1.0)], 0.0, 0.0)
        self._levels(inst.transient, self.w_levels, self.yw0)
        self._levels(inst.staged, self.s_levels, self.ys0)

    def bounds(self) -> Bounds:
        lo = np.zeros(self.nvar)
        hi = np.full(self.nvar, np.inf)
        hi[: self.nx] = 1.0
        hi[self.yw0: self.n0] = 1.0
        for (gi, _), col in self.count.items():
            hi[col] = len(self.groups[gi])
        return Bounds(lo, hi)

    def integrality(self) -> np.ndarray:
        out = np.zeros(self.nvar)
        out[: self.nx] = 1
        out[self.yw0:] = 1
        return out

    def constraint(self) -> LinearConstraint:
        a = coo_array((self.vals, (self.rows, self.cols)), shape=(len(self.lb), self.nvar)).tocsr()
        return LinearConstraint(a, np.array(self.lb), np.array(self.ub))

    def choice(self, xv: np.ndarray) -> tuple[int, ...]:
        return tuple(int(np.argmax(xv[self.xoff[i]: self.xoff[i] + len(opts)]))
                     for i, opts in enumerate(self.inst.options))


def _undominated(w: Window) -> list[tuple[float, dict[tuple[int, int], float]]]:
    """The window's resource rows, less those another row bounds from above term by term (they never bind)."""
    rows = []
    for r in sorted(set(w.load_const) | set(w.load_var)):
        var: dict[tuple[int, int], float] = {}
        for i, o, c in w.load_var.get(r, ()):
            var[(i, o)] = var.get((i, o), 0.0) + c
        rows.append((w.load_const.get(r, 0.0), var))
    keep = []
    for a, (ca, va) in enumerate(rows):
        dominated = False
        for b2, (cb, vb) in enumerate(rows):
            if a == b2 or cb < ca or any(vb.get(k, 0.0) < v for k, v in va.items()):
                continue
            # b bounds a; of two equal rows keep the first
            if b2 < a or cb > ca or any(vb.get(k, 0.0) > va.get(k, 0.0) for k in vb):
                dominated = True
                break
        if not dominated:
            keep.append((ca, va))
    return keep


def _run(model: _Model, c: np.ndarray, time_limit_s: float, mip_rel_gap: float,
         node_limit: int = NODE_LIMIT) -> tuple[Any, float]:
    t0 = time.perf_counter()
    res = milp(c, integrality=model.integrality(), bounds=model.bounds(), constraints=[model.constraint()],
               options={"time_limit": float(time_limit_s), "mip_rel_gap": float(mip_rel_gap),
                        "node_limit": int(node_limit), "disp": False})
    return res, time.perf_counter() - t0


def limit_hit(res: Any) -> str | None:
    """Which limit stopped HiGHS: "time" (HiGHS says so in its message), "nodes" (any other limit), or None."""
    if int(res.status) != 1:
        return None
    return "time" if "time limit" in str(res.message).lower() else "nodes"


def solve_milp(inst: Instance, *, time_limit_s: float = TIME_LIMIT_S, mip_rel_gap: float = 1e-4,
               cutoff_s: float | None = None, node_limit: int = NODE_LIMIT) -> MilpResult:
    """Minimise recomputation + exposed transfer (+ tie-break) subject to every pool's capacity.

    ``cutoff_s`` bounds recomputation + exposed seconds from above (a caller that only wants schedules
    better than one it has): no schedule under it reads as status "infeasible".

    Deterministic: HiGHS stops at the optimum within ``mip_rel_gap`` or after ``node_limit`` branch-and-bound
    nodes, both independent of the machine's speed and load; ``time_limit_s`` is only a safety net, and a
    result it cut says so (``limit_hit == "time"``): such a result may differ from run to run.
    """
    m = _Model(inst)
    m.structural()
    for k, cap in inst.capacity.items():
        const, terms = m.pool_terms(k)
        m.row(terms, -np.inf, (cap - const) / GB)
    if cutoff_s is not None:
        pure = [(m.x(i, o), v) for i, row in enumerate(inst.recompute_s) for o, v in enumerate(row)]
        m.row(pure + [(m.e0 + w, 1.0) for w in range(len(inst.windows))], -np.inf, cutoff_s)
    c = np.zeros(m.nvar)
    for i, opts in enumerate(inst.options):
        for o in range(len(opts)):
            c[m.x(i, o)] = inst.recompute_s[i][o] + inst.tie_break * inst.transfer_s[i][o]
    c[m.e0: m.e0 + len(inst.windows)] = 1.0
    res, dt = _run(m, c, time_limit_s, mip_rel_gap, node_limit)
    ok = res.x is not None
    return MilpResult(
        choice=m.choice(res.x) if ok else None, status=STATUS.get(res.status, str(res.status)),
        status_code=int(res.status), message=str(res.message), objective=float(res.fun) if ok else None,
        dual_bound=_float(getattr(res, "mip_dual_bound", None)), mip_gap=_float(getattr(res, "mip_gap", None)),
        solve_s=dt, n_vars=m.nvar, n_binaries=m.nx, n_constraints=len(m.lb), limit_hit=limit_hit(res))


def min_pool_need(inst: Instance, pool: str, *, time_limit_s: float = TIME_LIMIT_S,
                  node_limit: int = NODE_LIMIT) -> float:
    """The fewest bytes ``pool`` can need over all choices, ignoring every capacity (for PlanInfeasible)."""
    m = _Model(inst)
    m.structural()
    c = np.zeros(m.nvar)
    const, terms = m.pool_terms(pool)
    for col, v in terms:
        c[col] += v
    res, _ = _run(m, c, time_limit_s, 1e-6, node_limit)
    if res.x is None:
        return float("inf")
    return const + float(res.fun) * GB


def _float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
