"""The LazyTrain optimisation problem, independent of any job: an :class:`Instance`, its MILP and its evaluation.

An instance has, per layer ``i``, its options ``o = (mode, place)`` (mode ``keep`` = the full activations,
``ckpt`` = the input only, forward recomputed in the backward; place ``gpu``, ``cpu`` or ``nvme``) with their
coefficients, and *windows*: stretches of compute that transfers can hide behind. The MILP (:func:`solve_milp`,
scipy's HiGHS) and the direct evaluation of one choice (:func:`evaluate`, used by the heuristics and the
brute-force test) implement the same model:

Variables
    ``x[i,o]`` binary, ``sum_o x[i,o] = 1``; ``e[w] >= 0`` exposed seconds of window ``w``; ``yW[k]`` binary per
    level ``T_k`` of the options' transients above the floor ``T_0`` (the largest of the layers' smallest):
    workspace ``W = T_0 + sum_k (T_k - T_{k-1}) yW[k]``; ``yS[k]`` likewise over the staged (offloaded) bytes:
    staging ``S = 2 sum_k (V_k - V_{k-1}) yS[k]`` (two in flight, each budgeted at the largest); ``N[g,o]``
    integer, how many layers of group ``g`` (identical coefficients, e.g. the blocks) take option ``o``.
Constraints
    exposure, per window ``w`` and link resource ``r`` it loads (a link direction, a duplex budget, the NVMe
    set, or ``serial`` for copies that run back to back), rows that another row of ``w`` bounds term by term
    dropped::

        e[w] >= load_const[w,r] + sum x[i,o] * load[w,r,i,o] - compute[w] - sum x[i,o] * extra_compute[w,i,o]

    single layer, per window and layer ``i`` (where the window's loads are >= 0), what its choice alone exposes:
    ``e[w] >= sum_o x[i,o] max(0, load_const[w,r] + load[w,r,i,o] - most compute of w)`` (valid on integer
    points; it lifts the root LP bound of 70b/a100x8 from 5 % of the optimum to 96 %)

    levels: ``sum_{o: transient[i,o] >= T_k} x[i,o] <= yW[k]`` per layer and level, ``yW[k+1] <= yW[k]``; likewise
    ``yS`` (the plain ``W >= x[i,o] transient[i,o]`` is exact too, but its LP relaxation left a 3 % gap HiGHS
    needed minutes to close); counts ``N[g,o] = sum_{i in g} x[i,o]``; memory per pool ``k``, over the counts
    where layers are grouped (a knapsack of a few integers, which branching closes at once)::

        fixed[k] + sum x[i,o] * bytes[k,i,o] (+ W + S for the pool the GPU allocates from) <= capacity[k]
Objective
    ``sum x[i,o] * recompute[i,o] + sum e[w] + tie * sum x[i,o] * transfer[i,o]``, ``tie`` = 1e-3 of the
    seconds an option spends on links: of two equally fast schedules the one that moves less wins.

Bytes enter the MILP in GB (1e9) to keep its coefficients near 1; the capacities already carry the caller's
safety margin. :func:`evaluate` checks memory with a tolerance of ``MEM_TOL_BYTES``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Any

import numpy as np

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

    @cached_property
    def distinct_loads(self) -> tuple[tuple[float, Terms], ...]:
        """(constant, terms) of every resource's load, each distinct pair once (a window's links of one kind
        carry equal loads on every GPU: the largest is the same over these)."""
        return tuple(dict.fromkeys((self.load_const.get(r, 0.0), tuple(self.load_var.get(r, ())))
                                   for r in set(self.load_const) | set(self.load_var)))


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


@dataclass(frozen=True)
class Evaluation:
    feasible: bool
    objective: float        # recompute + exposed + tie-break (what the MILP minimises)
    recompute_s: float
    exposed_s: float
    workspace: float
    staging: float
    need: Mapping[str, float]       # bytes per pool

    @property
    def pure_objective(self) -> float:
        """Recomputation plus exposed transfer seconds per micro-step (without the tie-break)."""
        return self.recompute_s + self.exposed_s


def evaluate(inst: Instance, choice: Sequence[int]) -> Evaluation:
    """Cost and memory of one choice (an option index per layer), computed directly from the model."""
    picked = list(enumerate(choice))
    rc = sum(inst.recompute_s[i][o] for i, o in picked)
    tie = inst.tie_break * sum(inst.transfer_s[i][o] for i, o in picked)
    ex = 0.0
    for w in inst.windows:
        comp = w.compute_s + sum(c for i, o, c in w.compute_var if choice[i] == o)
        ex += max([0.0] + [const + sum(c for i, o, c in terms if choice[i] == o) - comp
                           for const, terms in w.distinct_loads])
    ws = max(inst.transient[i][o] for i, o in picked)
    staging = 2 * max(inst.staged[i][o] for i, o in picked)
    need = {k: inst.fixed_bytes.get(k, 0.0) + sum(inst.pool_bytes[k][i][o] for i, o in picked)
            + (ws + staging if k == inst.peak_pool else 0.0) for k in inst.capacity}
    feasible = all(need[k] - inst.capacity[k] <= MEM_TOL_BYTES for k in need)
    return Evaluation(feasible, rc + ex + tie, rc, ex, ws, staging, need)


def _pick(inst: Instance, prefs: Sequence[Opt]) -> list[int]:
    """Per layer, the first of ``prefs`` it offers (else its first option)."""
    return [next((opts.index(p) for p in prefs if p in opts), 0) for opts in inst.options]


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
        return {k: v for k, v in asdict(self).items() if k not in ("choice", "solve_s")}


class _Model:
    """Sparse rows of the MILP over x (flattened options), e (windows) and the level binaries of W and S."""

    def __init__(self, inst: Instance):
        self.inst = inst
        self.xoff = list(accumulate((len(opts) for opts in inst.options), initial=0))
        self.nx = self.e0 = self.xoff[-1]
        # workspace: W = w_base + sum_k (T_k - T_{k-1}) yW_k, levels T_k over the options' transients
        self.w_base = max(min(row) for row in inst.transient)
        self.w_levels = sorted({v for row in inst.transient for v in row if v > self.w_base})
        self.yw0 = self.e0 + len(inst.windows)
        # staging: S = 2 * sum_k (V_k - V_{k-1}) yS_k, levels V_k over the options' staged bytes
        self.s_levels = sorted({v for row in inst.staged for v in row if v > 0})
        self.ys0 = self.yw0 + len(self.w_levels)
        # counts N[g,o] over groups of identical layers: the pool rows over them close at once (over the 0/1 x
        # branching would enumerate which of 120 equal blocks is kept)
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
        self.structural()

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
        for y0, levels, prev, scale in ((self.yw0, self.w_levels, self.w_base, 1), (self.ys0, self.s_levels, 0.0, 2)):
            for k, v in enumerate(levels):
                terms.append((y0 + k, scale * (v - prev) / GB))
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
        """``sum_{o: value[i,o] >= T_k} x[i,o] <= y_k`` per layer and level (the one-hot makes the sum exact, and
        its LP relaxation is tighter than one row per option); y_k >= y_{k+1} (levels are nested)."""
        for i, row in enumerate(values):
            for k, lv in enumerate(levels):
                reach = [o for o, v in enumerate(row) if v >= lv]
                if reach:
                    self.row([(self.x(i, o), 1.0) for o in reach] + [(y0 + k, -1.0)], -np.inf, 0.0)
        for k in range(len(levels) - 1):
            self.row([(y0 + k + 1, 1.0), (y0 + k, -1.0)], -np.inf, 0.0)

    def structural(self) -> None:
        """One-hot, exposure, workspace and staging rows (everything but the pool capacities)."""
        inst = self.inst
        for i, opts in enumerate(inst.options):
            self.row([(self.x(i, o), 1.0) for o in range(len(opts))], 1.0, 1.0)
        for wi, w in enumerate(inst.windows):
            comp = [(self.x(i, o), -c) for i, o, c in w.compute_var]
            most = w.compute_s + _most_extra(w.compute_var)
            single: dict[int, dict[int, float]] = {}
            for const, var in _undominated(w):
                if not var and const <= w.compute_s:
                    continue  # always hidden
                self.row([(self.x(i, o), c) for (i, o), c in var.items()] + comp + [(self.e0 + wi, -1.0)],
                         -np.inf, w.compute_s - const)
                for (i, o), c in (var.items() if min(var.values(), default=0.0) >= 0.0 else ()):
                    if (v := const + c - most) > single.setdefault(i, {}).get(o, 0.0):
                        single[i][o] = v
            # one layer's choice alone exposes at least its load above the most compute the window can have
            # (valid on integer points; the LP relaxation of the rows above spreads it over fractions)
            for i, by_o in single.items():
                if by_o:
                    self.row([(self.x(i, o), v) for o, v in by_o.items()] + [(self.e0 + wi, -1.0)], -np.inf, 0.0)
        for (gi, o), col in self.count.items():
            self.row([(self.x(i, o), 1.0) for i in self.groups[gi]] + [(col, -1.0)], 0.0, 0.0)
        self._levels(inst.transient, self.w_levels, self.yw0)
        self._levels(inst.staged, self.s_levels, self.ys0)

    def run(self, c: np.ndarray, time_limit_s: float, mip_rel_gap: float, node_limit: int) -> tuple[Any, float]:
        """HiGHS on these rows with objective ``c`` (x, yW, yS binary; N integer); scipy's result and the wall time.

        scipy is imported here, not at module level: its cold import takes seconds, and most commands that
        import this module (every ``plan``, every policy listing) never solve a LazyTrain MILP."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array

        hi = np.full(self.nvar, np.inf)
        hi[: self.nx] = 1.0
        hi[self.yw0: self.n0] = 1.0
        for (gi, _), col in self.count.items():
            hi[col] = len(self.groups[gi])
        integrality = np.zeros(self.nvar)
        integrality[: self.nx] = 1
        integrality[self.yw0:] = 1
        a = coo_array((self.vals, (self.rows, self.cols)), shape=(len(self.lb), self.nvar)).tocsr()
        t0 = time.perf_counter()
        res = milp(c, integrality=integrality, bounds=Bounds(np.zeros(self.nvar), hi),
                   constraints=[LinearConstraint(a, np.array(self.lb), np.array(self.ub))],
                   options={"time_limit": float(time_limit_s), "mip_rel_gap": float(mip_rel_gap),
                            "node_limit": int(node_limit), "disp": False})
        return res, time.perf_counter() - t0

    def choice(self, xv: np.ndarray) -> tuple[int, ...]:
        return tuple(int(np.argmax(xv[self.xoff[i]: self.xoff[i] + len(opts)]))
                     for i, opts in enumerate(self.inst.options))


def _most_extra(terms: Terms) -> float:
    """The most a sum ``sum x[i,o] c`` over one-hot layers can reach."""
    per: dict[tuple[int, int], float] = {}
    for i, o, c in terms:
        per[(i, o)] = per.get((i, o), 0.0) + c
    best: dict[int, float] = {}
    for (i, _), c in per.items():
        best[i] = max(best.get(i, 0.0), c)
    return sum(best.values())


def _undominated(w: Window) -> list[tuple[float, dict[tuple[int, int], float]]]:
    """The window's resource rows, less those another row bounds from above term by term (they never bind)."""
    rows = []
    seen: set[tuple[float, frozenset]] = set()
    raw_seen: set[tuple[float, tuple]] = set()
    for r in sorted(set(w.load_const) | set(w.load_var)):
        # a row equal to an earlier one is bounded by it (of two equal rows the first is kept), and whatever it
        # bounds the earlier one bounds too: most of a window's rows (one per GPU of a link class) go here, most
        # of them already by their terms as given
        raw = (w.load_const.get(r, 0.0), tuple(w.load_var.get(r, ())))
        if raw in raw_seen:
            continue
        raw_seen.add(raw)
        var: dict[tuple[int, int], float] = {}
        for i, o, c in raw[1]:
            var[(i, o)] = var.get((i, o), 0.0) + c
        key = (raw[0], frozenset(var.items()))
        if key not in seen:
            seen.add(key)
            rows.append((key[0], var))

    # a row b can bound row a only if its constant is no smaller and it has every term a has with a positive
    # coefficient: cheap tests that leave the exact comparison for the few pairs that pass them
    keys = [frozenset(v) for _, v in rows]
    positive = [frozenset(k for k, x in v.items() if x > 0.0) for _, v in rows]

    def bounds(b: int, a: int) -> bool:  # of two equal rows the first is kept
        (ca, va), (cb, vb) = rows[a], rows[b]
        if any(vb.get(k, 0.0) < v for k, v in va.items()):
            return False
        return b < a or cb > ca or any(vb.get(k, 0.0) > va.get(k, 0.0) for k in vb)

    # the rows holding each term: a row's possible bounders hold all its positive terms, so the rows holding its
    # rarest positive term are the only ones to test
    holding: dict[tuple[int, int], list[int]] = {}
    for b, kb in enumerate(keys):
        for k in kb:
            holding.setdefault(k, []).append(b)
    everyone = range(len(rows))
    out = []
    for a, row in enumerate(rows):
        ca, pa = row[0], positive[a]
        among = min((holding[k] for k in pa), key=len) if pa else everyone
        if not any(b != a and rows[b][0] >= ca and pa <= keys[b] and bounds(b, a) for b in among):
            out.append(row)
    return out


def limit_hit(res: Any) -> str | None:
    """Which limit stopped HiGHS: "time" (HiGHS says so in its message), "nodes" (any other limit), or None."""
    if int(res.status) != 1:
        return None
    return "time" if "time limit" in str(res.message).lower() else "nodes"


def solve_milp(inst: Instance, *, time_limit_s: float = TIME_LIMIT_S, mip_rel_gap: float = 1e-4,
               cutoff_s: float | None = None, node_limit: int = NODE_LIMIT) -> MilpResult:
    """Minimise recomputation + exposed transfer (+ tie-break) subject to every pool's capacity; ``cutoff_s``
    bounds recomputation + exposed seconds from above (no schedule under it reads as "infeasible").

    Deterministic: HiGHS stops within ``mip_rel_gap`` or after ``node_limit`` nodes, whatever the machine's load;
    ``time_limit_s`` is only a safety net, and a result it cut says so (``limit_hit == "time"``)."""
    m = _Model(inst)
    for k, cap in inst.capacity.items():
        const, terms = m.pool_terms(k)
        m.row(terms, -np.inf, (cap - const) / GB)
    if cutoff_s is not None:
        pure = [(m.x(i, o), v) for i, row in enumerate(inst.recompute_s) for o, v in enumerate(row)]
        m.row(pure + [(m.e0 + w, 1.0) for w in range(len(inst.windows))], -np.inf, cutoff_s)
    c = np.zeros(m.nvar)
    c[: m.nx] = [v + inst.tie_break * inst.transfer_s[i][o] for i, row in enumerate(inst.recompute_s)
                 for o, v in enumerate(row)]
    c[m.e0: m.e0 + len(inst.windows)] = 1.0
    res, dt = m.run(c, time_limit_s, mip_rel_gap, node_limit)
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
    c = np.zeros(m.nvar)
    const, terms = m.pool_terms(pool)
    for col, v in terms:
        c[col] += v
    res, _ = m.run(c, time_limit_s, 1e-6, node_limit)
    return float("inf") if res.x is None else const + float(res.fun) * GB


def _float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
