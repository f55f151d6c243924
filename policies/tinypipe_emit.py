"""Task emission for ``tinypipe``: pipeline schedules as segments, swapping, gradients and the optimizer.

A step's schedule is built concretely (every op of every stage of every replica, every micro-batch), then
folded into the plan's segments: ops of a repeated segment (the 1F1B steady state, GPipe's forward and
backward phases) share one task id per position in the iteration; every dependency is computed on the
concrete schedule and written relative to the iteration (``x@k``), or as a plain reference into an
earlier segment. A repeated task gets the union of the references its iterations need; the extra ones
point to tasks that are already over by then, or (the first iterations' references into the warm-up
segment, or a cool-down reference into the steady segment, which resolves to its last iteration) only
ever to a later instance of the same thing, which can delay a prefetch but never breaks an ordering.

1F1B (PipeDream-flush): stage s runs ``S - 1 - s`` warm-up forwards, then pairs (forward, backward),
then the remaining backwards. Segments: ``warmup`` (explicit), ``steady`` (``M - S`` uniform pairs, one
per iteration), ``cooldown`` (explicit: the remaining ``s + 1`` pairs and ``S - 1 - s`` backwards of
stage s), ``optimizer``. GPipe: ``gpipe-stash``, ``forward`` (M), ``backward`` (M), ``optimizer``.

Activations (one micro-batch's saved tensors per layer) are relabelled: within a steady iteration the
backward frees the instance its own forward allocated (the bytes of micro-batch k, freed by B(k), equal
those of the micro-batch allocated by the same iteration's forward), so live bytes at every instant are
exact. GPipe holds all M micro-batches' activations at its peak; we allocate that stash once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policies.base import Job
from policies.builder import PlanBuilder
from policies.tinypipe_search import StagePlan
from simulator.phase import Phase

Key = tuple[Any, ...]


@dataclass
class Ev:
    """One concrete task instance of the step (a template task has one per iteration)."""

    tid: str
    seg: int
    it: int
    op: str
    stream: str
    deps: list[Any] = field(default_factory=list)   # Ev | Key (resolved later) | str (raw ref, e.g. x^1)
    fields: dict[str, Any] = field(default_factory=dict)
    allocs: list[tuple[str, str]] = field(default_factory=list)
    frees: list[tuple[str, str]] = field(default_factory=list)
    reads: list[tuple[str, str]] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    kind: str   # "F" | "B"
    mb: int
    seg: int
    it: int
    slot: int   # position of the op in its iteration (template ops)


@dataclass(frozen=True)
class Schedule:
    segments: tuple[tuple[str, int], ...]   # (name, repeat), the optimizer excluded
    ops: tuple[tuple[Op, ...], ...]         # per stage, in execution order

    def repeated(self, seg: int) -> bool:
        return self.segments[seg][1] > 1 or self.segments[seg][0] in ("steady", "forward", "backward")


def one_f_one_b(S: int, M: int) -> Schedule:
    R = max(0, M - S)
    per: list[list[tuple[str, int, str]]] = []   # (kind, mb, part)
    for s in range(S):
        w = min(S - 1 - s, M)
        seq = [("F", m, "W") for m in range(w)]
        f, b, pairs = w, 0, 0
        while f < M:
            part = "S" if pairs < R else "C"
            seq += [("F", f, part), ("B", b, part)]
            f, b, pairs = f + 1, b + 1, pairs + 1
        seq += [("B", k, "C") for k in range(b, M)]
        per.append(seq)
    names = []
    if any(p == "W" for seq in per for _, _, p in seq):
        names.append(("warmup", "W", 1))
    if R:
        names.append(("steady", "S", R))
    names.append(("cooldown", "C", 1))
    index = {part: i for i, (_, part, _) in enumerate(names)}
    ops = []
    for seq in per:
        out = []
        steady_pos = 0
        for kind, mb, part in seq:
            if part == "S":
                out.append(Op(kind, mb, index[part], steady_pos // 2, steady_pos % 2))
                steady_pos += 1
            else:
                out.append(Op(kind, mb, index[part], 0, 0))
        ops.append(tuple(out))
    return Schedule(tuple((n, r) for n, _, r in names), tuple(ops))


def gpipe(S: int, M: int) -> Schedule:
    """All forwards (one micro-batch per iteration), then all backwards. Nothing holds stage 0's forwards
    back, so the phase is not in lockstep and the simulator rightly simulates GPipe plans whole."""
    ops = tuple(tuple([Op("F", m, 1, m, 0) for m in range(M)] + [Op("B", m, 2, m, 0) for m in range(M)])
                for _ in range(S))
    return Schedule((("gpipe-stash", 1), ("forward", M), ("backward", M)), ops)


@dataclass(frozen=True)
class Ctx:
    """What emission needs besides the job."""

    stages: tuple[StagePlan, ...]
    dp: int
    M: int
    schedule: Schedule
    prefetch: int
    gpipe: bool
    tied: bool
    table_params: float
    db: int
    active_cpu_mm: bool
    unified: bool

    def gpu(self, r: int, s: int) -> str:
        return f"gpu{r * len(self.stages) + s}"

    def head_copy(self, s: int) -> bool:
        """Does stage s hold its own copy of the tied embedding table (the head's stage, S > 1)?"""
        S = len(self.stages)
        return self.tied and S > 1 and s == S - 1


class Emitter:
    def __init__(self, b: PlanBuilder, job: Job, ctx: Ctx):
        self.b, self.job, self.c = b, job, ctx
        self.L = job.trace.layers
        self.S = len(ctx.stages)
        self.events: list[Ev] = []
        self.declared: set[str] = set()
        self.keyed: dict[Key, Ev] = {}
        self.final_bwd: dict[tuple[int, int, int], Ev] = {}   # (r, s, layer) -> last backward of the step
        self.final_d2h: dict[tuple[int, int, int], Ev] = {}   # (r, s, pack)
        self.opt_seg = len(ctx.schedule.segments)

    # -- sizes ----------------------------------------------------------------------------------------
    def layer_params(self, s: int, x: int) -> float:
        p = float(self.L[x].params)
        if self.c.head_copy(s) and x == len(self.L) - 1:
            p += self.c.table_params
        return p

    def layer_bytes(self, s: int, x: int) -> float:
        """16-bit bytes the GPU holds for layer x (the head also needs the tied table to compute)."""
        w = float(self.L[x].param_bytes)
        if self.c.tied and x == len(self.L) - 1:
            w += self.c.table_params * self.c.db
        return w

    def pack_bytes(self, s: int, u: int, t: int) -> float:
        w = sum(self.layer_bytes(s, x) for x in range(u, t + 1))
        if self.c.tied and u == 0 and t == len(self.L) - 1:
            w -= self.c.table_params * self.c.db
        return w

    def pack_home_bytes(self, s: int, u: int, t: int) -> float:
        """DRAM home of a swapped pack: without the table when the stage also holds the embedding (S = 1)."""
        w = self.pack_bytes(s, u, t)
        if self.c.tied and t == len(self.L) - 1 and not self.c.head_copy(s) and u > 0:
            w -= self.c.table_params * self.c.db
        return w

    def stage_params(self, st: StagePlan) -> float:
        return sum(self.layer_params(st.index, x) for x in range(st.first, st.last + 1))

    def stage_bytes(self, st: StagePlan) -> float:
        return self.pack_bytes(st.index, st.first, st.last)

    # -- events ---------------------------------------------------------------------------------------
    def ev(self, tid: str, seg: int, it: int, op: str, stream: str, deps: list[Any] | None = None,
           key: Key | None = None, **fields: Any) -> Ev:
        tags = fields.pop("tags", {})
        allocs = fields.pop("allocs", [])
        frees = fields.pop("frees", [])
        reads = fields.pop("reads", [])
        e = Ev(tid, seg, it, op, stream, list(deps or []), fields, list(allocs), list(frees), list(reads), tags)
        self.events.append(e)
        if key is not None:
            self.keyed[key] = e
        return e

    def tensor(self, tid: str, nbytes: float, kind: str, scope: str, layer: int | None = None) -> str:
        if tid not in self.declared:
            self.declared.add(tid)
            self.b.tensor(tid, nbytes, kind, scope=scope, layer=layer)
        return tid

    # -- one stage of one replica ---------------------------------------------------------------------
    def stage_ops(self, r: int, st: StagePlan) -> None:
        c, s, S = self.c, st.index, self.S
        g = c.gpu(r, s)
        sched = c.schedule
        ops = sched.ops[s]
        swap = st.mode == "swap"
        packs = st.packs
        fetches: list[Key] = []          # residency-end keys of the stage's fetches, in order
        stack: list[int] = []            # live explicit activation micro-batches (LIFO relabelling)
        carry: tuple[str, int] | None = None   # (buffer id, fetch index) kept from a forward for the backward
        last_b_d2h: Ev | None = None
        fresh_done: set[int] = set()
        comp, h2d, d2h = f"{g}.compute", f"{g}.h2d", f"{g}.d2h"

        def fetch(p: int, phase: str, op: Op, suf: str, scope: str, tg: dict[str, Any]) -> tuple[str, Ev]:
            u, t = packs[p]
            buf = self.tensor(f"buf{p}.{g}{suf}", self.pack_bytes(s, u, t), "param16", scope, u)
            deps: list[Any] = []
            j = len(fetches)
            if j - c.prefetch - 1 >= 0:
                deps.append(fetches[j - c.prefetch - 1])
            if p not in fresh_done:
                fresh_done.add(p)
                deps += self.refresh_refs(s, p)
            e = self.ev(f"ld{p}.{g}{suf}", op.seg, op.it, "copy", h2d, deps, src="cpu", dst=g,
                        bytes=self.pack_bytes(s, u, t), allocs=[(buf, g)], reads=[(f"home.s{s}.p{p}", "cpu")],
                        tags={**tg, "pack": p, "layers": list(range(u, t + 1)),
                              "phase": Phase.PARAM_UPLOAD, "use": phase})
            fetches.append(("res", r, s, j))
            return buf, e

        for n, op in enumerate(ops):
            rep = sched.repeated(op.seg)
            suf = f".t{op.slot}{op.kind}" if rep else f".m{op.mb}{op.kind}"
            scope = "iteration" if rep else "step"
            nxt = ops[n + 1] if n + 1 < len(ops) else None
            tg = {"stage": s, "rank": r} if rep else {"stage": s, "rank": r, "mb": op.mb}

            if op.kind == "F":
                recv: list[Any] = [("fs", r, s - 1, op.mb)] if s > 0 else []
                order = list(range(len(packs)))
                last_ev = None
                for p in order:
                    u, t = packs[p]
                    fe = None
                    if swap:
                        buf, fe = fetch(p, "fwd", op, suf, scope, tg)
                        j = len(fetches) - 1
                    for x in range(u, t + 1):
                        lay = self.L[x]
                        deps = list(recv) if x == st.first else []
                        if fe is not None and x == u:
                            deps.append(fe)
                        if not swap and x not in fresh_done:
                            fresh_done.add(x)
                            deps += self.refresh_refs(s, x)
                        allocs = []
                        if not c.gpipe:
                            allocs.append((self.tensor(f"a{x}.{g}" + (".t" if rep else f".m{op.mb}"),
                                                       lay.activation_bytes, "activation", scope, x), g))
                        frees = []
                        keep = swap and x == t and p == len(packs) - 1 and nxt is not None \
                            and nxt.kind == "B" and nxt.seg == op.seg and nxt.it == op.it
                        if swap and x == t and not keep:
                            frees.append((buf, g))
                        last_ev = self.ev(f"f{x}.{g}{suf}", op.seg, op.it, "compute", comp, deps,
                                          flops=lay.fwd_flops, hbm_bytes=lay.fwd_hbm_bytes, allocs=allocs,
                                          frees=frees, tags={**tg, "layer": x, "phase": Phase.FWD})
                        if swap and x == t:
                            if keep:
                                carry = (buf, j)
                            else:
                                self.keyed[("res", r, s, j)] = last_ev
                if not c.gpipe and not rep:
                    stack.append(op.mb)
                if s < S - 1:
                    self.ev(f"sf.{g}{suf}", op.seg, op.it, "copy", f"{g}.fsend", [last_ev],
                            key=("fs", r, s, op.mb), src=g, dst=c.gpu(r, s + 1),
                            bytes=float(self.L[st.last].output_bytes), tags={**tg, "phase": Phase.SEND_ACT})
            else:
                recv = [("bs", r, s + 1, op.mb)] if s < S - 1 else []
                amb = None
                if not c.gpipe and not rep:
                    amb = stack.pop()
                d2hs: list[Ev] = []
                last_ev = None
                for pos, p in enumerate(reversed(range(len(packs)))):
                    u, t = packs[p]
                    fe = None
                    if swap:
                        if pos == 0 and carry is not None:
                            buf, j = carry
                            carry = None
                        else:
                            buf, fe = fetch(p, "bwd", op, suf, scope, tg)
                            j = len(fetches) - 1
                        gb = self.tensor(f"gb{p}.{g}{suf}", self.pack_bytes(s, u, t), "grad", scope, u)
                    for x in range(t, u - 1, -1):
                        lay = self.L[x]
                        deps = list(recv) if x == st.last else []
                        if fe is not None and x == t:
                            deps.append(fe)
                        if lay.recompute_flops > 0:
                            self.ev(f"r{x}.{g}{suf}", op.seg, op.it, "compute", comp, deps,
                                    flops=lay.recompute_flops, hbm_bytes=lay.fwd_hbm_bytes,
                                    tags={**tg, "layer": x, "phase": Phase.RECOMPUTE})
                            deps = []
                        allocs = []
                        frees = []
                        if not c.gpipe:
                            frees.append((f"a{x}.{g}" + (".t" if rep else f".m{amb}"), g))
                        if swap and x == t:
                            allocs.append((gb, g))
                            if pos >= 2:
                                deps.append(d2hs[pos - 2])
                            elif pos == 0 and last_b_d2h is not None:
                                deps.append(last_b_d2h)
                        if swap and x == u:
                            frees.append((buf, g))
                        last_ev = self.ev(f"b{x}.{g}{suf}", op.seg, op.it, "compute", comp, deps,
                                          flops=lay.bwd_flops, hbm_bytes=lay.bwd_hbm_bytes, allocs=allocs,
                                          frees=frees, tags={**tg, "layer": x, "phase": Phase.BWD})
                        self.final_bwd[(r, s, x)] = last_ev
                    if swap:
                        self.keyed[("res", r, s, j)] = last_ev
                        dn = self.ev(f"dn{p}.{g}{suf}", op.seg, op.it, "copy", d2h, [last_ev], src=g, dst="cpu",
                                     bytes=self.pack_bytes(s, u, t), frees=[(gb, g)],
                                     tags={**tg, "pack": p, "layers": list(range(u, t + 1)),
                                           "phase": Phase.GRAD_OFFLOAD})
                        d2hs.append(dn)
                        self.final_d2h[(r, s, p)] = dn
                if d2hs:
                    last_b_d2h = d2hs[-1]
                if s > 0:
                    self.ev(f"sb.{g}{suf}", op.seg, op.it, "copy", f"{g}.bsend", [last_ev],
                            key=("bs", r, s, op.mb), src=g, dst=c.gpu(r, s - 1),
                            bytes=float(self.L[st.first - 1].output_bytes), tags={**tg, "phase": Phase.SEND_GRAD})

    def refresh_refs(self, s: int, unit: int) -> list[str]:
        """The previous step's tasks that leave layer (resident) or pack (swap) ``unit`` of stage s updated."""
        st, c = self.c.stages[s], self.c
        if st.mode == "resident":
            return [f"ag{unit}.s{s}^1"] if c.dp > 1 else [f"up{unit}.{c.gpu(0, s)}^1"]
        if st.mode == "swap":
            return [f"adam{unit}.{c.gpu(r, s)}^1" for r in range(c.dp)]
        return []   # gpu mode: the optimizer runs on the same compute stream, before the next forward

    # -- the optimizer ------------------------------------------------------------------------------
    def optimizer(self) -> None:
        c, S, dp = self.c, self.S, self.c.dp
        seg = self.opt_seg
        L = len(self.L)
        tie: dict[int, Ev] = {}
        if c.tied and S > 1:
            for r in range(dp):
                g0, gl = c.gpu(r, 0), c.gpu(r, S - 1)
                first, last = c.stages[0], c.stages[-1]
                if first.mode != "swap" and last.mode != "swap":
                    tie[r] = self.ev(f"tie.r{r}", seg, 0, "collective", f"tie{r}",
                                     [self.final_bwd[(r, 0, 0)], self.final_bwd[(r, S - 1, L - 1)]],
                                     coll="all_reduce", bytes=c.table_params * c.db, ranks=(g0, gl),
                                     tags={"phase": Phase.TIED_GRAD_SYNC, "rank": r})
                else:
                    deps = [self._final(r, first, 0), self._final(r, last, L - 1)]
                    tie[r] = self.ev(f"tie.r{r}", seg, 0, "noop", f"tie{r}", deps,
                                     tags={"phase": Phase.TIED_GRAD_SYNC, "on": "cpu", "rank": r})

        def tied_dep(r: int, s: int, layers: range) -> list[Any]:
            if r in tie and ((s == 0 and 0 in layers) or (s == S - 1 and L - 1 in layers)):
                return [tie[r]]
            return []

        for st in c.stages:
            s = st.index
            gpus = [c.gpu(r, s) for r in range(dp)]
            if c.gpipe:
                for g in gpus:
                    self.ev(f"stfree.{g}", seg, 0, "free", f"{g}.compute", frees=[(f"stash.{g}", g)])
            layers = range(st.first, st.last + 1)
            if st.mode == "gpu":
                # gradients all-reduced per layer as soon as the last micro-batch's backward of that layer
                # ends, overlapping the backward of the layers before it (DDP/DeepSpeed bucketing)
                ars: list[Ev] = []
                if dp > 1:
                    for x in reversed(layers):
                        ars.append(self.ev(f"ar{x}.s{s}", seg, 0, "collective", f"dp{s}",
                                           [self.final_bwd[(r, s, x)] for r in range(dp)]
                                           + [y for r in range(dp) for y in tied_dep(r, s, range(x, x + 1))],
                                           coll="all_reduce", bytes=self.layer_bytes(s, x), ranks=tuple(gpus),
                                           tags={"stage": s, "layer": x, "phase": Phase.GRAD_REDUCE}))
                for r, g in enumerate(gpus):
                    self.ev(f"opt.{g}", seg, 0, "optimizer", f"{g}.compute",
                            ars[-1:] if ars else tied_dep(r, s, layers), params=self.stage_params(st),
                            tags={"stage": s, "rank": r, "phase": Phase.OPTIMIZER})
            elif st.mode == "resident":
                ups: list[list[Ev]] = [[] for _ in range(dp)]
                for n, x in enumerate(reversed(layers)):
                    wb = self.layer_bytes(s, x)
                    rs = None
                    if dp > 1:
                        rs = self.ev(f"rs{x}.s{s}", seg, 0, "collective", f"dp{s}",
                                     [self.final_bwd[(r, s, x)] for r in range(dp)]
                                     + [y for r in range(dp) for y in tied_dep(r, s, range(x, x + 1))],
                                     coll="reduce_scatter", bytes=wb, ranks=tuple(gpus),
                                     tags={"stage": s, "layer": x, "phase": Phase.GRAD_REDUCE})
                    for r, g in enumerate(gpus):
                        deps = [rs] if rs else [self.final_bwd[(r, s, x)], *tied_dep(r, s, range(x, x + 1))]
                        dn = self.ev(f"dn{x}.{g}", seg, 0, "copy", f"{g}.d2h", deps, src=g, dst="cpu",
                                     bytes=wb / dp,
                                     tags={"stage": s, "rank": r, "layer": x, "phase": Phase.GRAD_OFFLOAD})
                        bounce = self.tensor(f"bounce{x}.{g}", wb / dp, "buffer", "step", x)
                        adeps: list[Any] = [dn]
                        if n >= 2:
                            adeps.append(ups[r][n - 2])
                        ad = self.ev(f"adam{x}.{g}", seg, 0, "optimizer", f"cpu.adam{g}", adeps,
                                     params=self.layer_params(s, x) / dp, allocs=[(bounce, "cpu")],
                                     tags={"stage": s, "rank": r, "layer": x, "phase": Phase.OPTIMIZER})
                        up = self.ev(f"up{x}.{g}", seg, 0, "copy", f"{g}.h2d", [ad], src="cpu", dst=g,
                                     bytes=wb / dp, frees=[(bounce, "cpu")],
                                     tags={"stage": s, "rank": r, "layer": x, "phase": Phase.PARAM_UPLOAD})
                        ups[r].append(up)
                    if dp > 1:
                        self.ev(f"ag{x}.s{s}", seg, 0, "collective", f"dp{s}", [ups[r][n] for r in range(dp)],
                                coll="all_gather", bytes=wb, ranks=tuple(gpus),
                                tags={"stage": s, "layer": x, "phase": Phase.PARAM_GATHER})
            else:  # swap: gradients are already in DRAM; Adam writes the 16-bit weights in place
                for p in reversed(range(len(st.packs))):
                    u, t = st.packs[p]
                    prm = sum(self.layer_params(s, x) for x in range(u, t + 1))
                    for r, g in enumerate(gpus):
                        deps = [self.final_d2h[(rr, s, p)] for rr in range(dp)]
                        deps += [y for rr in range(dp) for y in tied_dep(rr, s, range(u, t + 1))]
                        self.ev(f"adam{p}.{g}", seg, 0, "optimizer", f"cpu.adam{g}", deps, params=prm / dp,
                                tags={"stage": s, "rank": r, "pack": p, "layers": list(range(u, t + 1)),
                                      "phase": Phase.OPTIMIZER})

    def _final(self, r: int, st: StagePlan, layer: int) -> Ev:
        if st.mode == "swap":
            p = next(k for k, (u, t) in enumerate(st.packs) if u <= layer <= t)
            return self.final_d2h[(r, st.index, p)]
        return self.final_bwd[(r, st.index, layer)]

    # -- the whole step ---------------------------------------------------------------------------------
    def run(self) -> None:
        c = self.c
        if c.gpipe:
            for r in range(c.dp):
                for st in c.stages:
                    g = c.gpu(r, st.index)
                    act = sum(self.L[x].activation_bytes for x in range(st.first, st.last + 1))
                    self.tensor(f"stash.{g}", act * c.M, "activation", "step")
                    self.ev(f"stalloc.{g}", 0, 0, "alloc", f"{g}.compute", allocs=[(f"stash.{g}", g)],
                            tags={"stage": st.index, "rank": r, "phase": Phase.ACTIVATION_STASH})
        for r in range(c.dp):
            for st in c.stages:
                self.stage_ops(r, st)
        self.optimizer()
        self.emit()

    def ref(self, src: Ev, dst: Ev) -> str:
        if dst.seg == src.seg and self.repeated(src.seg):
            back = src.it - dst.it
            if back < 0:
                raise AssertionError(f"{src.tid} depends on a later iteration's {dst.tid}")
            return dst.tid + (f"@{back}" if back else "")
        if dst.seg > src.seg:
            raise AssertionError(f"{src.tid} depends on {dst.tid} of a later segment")
        return dst.tid

    def repeated(self, seg: int) -> bool:
        return seg < self.opt_seg and self.c.schedule.repeated(seg)

    def emit(self) -> None:
        merged: dict[str, Ev] = {}
        deps: dict[str, dict[str, None]] = {}
        order: list[list[str]] = [[] for _ in range(self.opt_seg + 1)]
        for e in self.events:
            refs = deps.setdefault(e.tid, {})
            if e.tid not in merged:
                merged[e.tid] = e
                order[e.seg].append(e.tid)
            for d in e.deps:
                if isinstance(d, str):
                    refs[d] = None
                    continue
                tgt = self.keyed[d] if isinstance(d, tuple) else d
                if tgt is e:
                    continue
                refs[self.ref(e, tgt)] = None
        names = [*self.c.schedule.segments, ("optimizer", 1)]
        for seg, (name, repeat) in enumerate(names):
            if not order[seg]:
                continue
            self.b.segment(name, repeat)
            for tid in order[seg]:
                e = merged[tid]
                self.b.task(tid, e.op, e.stream, list(deps[tid]), allocs=e.allocs, frees=e.frees,
                            reads=e.reads, tags=e.tags, **e.fields)
