"""``tinypipe``'s tasks: each stage of each replica through the step's schedule, then the optimizer segment.

Activations (one micro-batch's saved tensors per layer) are relabelled: within a steady iteration the backward
frees the instance its own forward allocated (the bytes of micro-batch k, freed by B(k), equal those of the
micro-batch allocated by the same iteration's forward), so live bytes at every instant are exact. GPipe holds
all M micro-batches' activations at its peak, allocated once per step as a stash. Optimizer: ``gpu``: each
layer's gradient all-reduced across the replicas as soon as its last backward ends (as DDP/DeepSpeed bucketing
does), then GPU Adam; ``resident``: per layer, in backward order, reduce-scatter, the rank's share down, CPU Adam
into a bounce buffer, the share up, all-gather; ``swap``: CPU Adam per pack.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies import kit
from policies.tinypipe.emit import Dep, Ev, Key, Recorder
from policies.tinypipe.packing import StagePlan
from policies.tinypipe.pipeline import BOUNCE_BUFFERS, Pipeline
from simulator.phase import Phase

GRAD_PACKS_HELD = 2  # gradient packs a swapping stage's GPU holds before a backward waits for the oldest's copy


@dataclass
class Fetched:   # a swapped pack on the GPU: its buffer, the index of its fetch, the fetch task (None: carried)
    buf: str
    j: int
    task: Ev | None


class StageRun:
    """Emits the schedule's ops of stage ``st`` on replica ``r``; records each layer's last backward and each
    pack's last gradient copy for the optimizer. ``run`` sets the current op's position (``sink``), id suffix,
    tensor scope and tags (``extra``) before emitting it."""

    def __init__(self, rec: Recorder, pipe: Pipeline, r: int, st: StagePlan, final_bwd: dict[Key, Ev],
                 final_d2h: dict[Key, Ev]):
        self.rec, self.pipe, self.r, self.st, self.s = rec, pipe, r, st, st.index
        self.g = pipe.gpu(r, st.index)
        self.swap = st.mode == "swap"
        self.final_bwd, self.final_d2h = final_bwd, final_d2h
        self.fetches = 0                      # the stage's fetches so far (residency ends keyed ("res", r, s, j))
        self.stack: list[int] = []            # live explicit activation micro-batches (LIFO relabelling)
        self.carry: Fetched | None = None     # the pack a forward keeps for the backward right after it
        self.fresh_done: set[int] = set()     # layers (resident, gpu) or packs (swap) already refreshed

    def run(self) -> None:
        ops = self.pipe.schedule.ops[self.s]
        for n, op in enumerate(ops):
            self.op, self.rep = op, self.pipe.schedule.repeated(op.seg)
            self.sfx = f".t{op.slot}{op.kind}" if self.rep else f".m{op.mb}{op.kind}"
            self.scope = "iteration" if self.rep else "step"
            # a repeated op's micro-batch is its iteration plus a constant (1F1B's steady forward leads its
            # backward by the stage's warm-up forwards): the replay numbers its micro-steps from it
            self.extra = ({"stage": self.s, "mb_from_it": op.mb - op.it} if self.rep
                          else {"stage": self.s, "mb": op.mb})
            self.sink = self.rec.at(op.seg, op.it)
            if self.swap:
                self.plan_fetches(op.kind)
            if op.kind == "F":
                nxt = ops[n + 1] if n + 1 < len(ops) else None
                self.forward(nxt is not None and nxt.kind == "B" and nxt.seg == op.seg and nxt.it == op.it)
            else:
                self.backward()

    def _refresh(self, unit: int) -> list[str]:
        """The previous step's tasks that leave layer (resident) or pack (swap) ``unit`` updated, the first time
        the stage uses it in the step (gpu mode: the optimizer runs on the same stream, before the next forward)."""
        if unit in self.fresh_done:
            return []
        self.fresh_done.add(unit)
        pipe, s = self.pipe, self.s
        if self.st.mode == "resident":
            return [f"ag{unit}.s{s}^1"] if pipe.dp > 1 else [f"up{unit}.{pipe.gpu(0, s)}^1"]
        return [f"adam{unit}.{pipe.gpu(r, s)}^1" for r in range(pipe.dp)] if self.swap else []

    def plan_fetches(self, kind: str) -> None:
        """The fetches the current op will make (fetch index -> pack), and the reservation of the buffers of those
        whose prefetch window opened before the op: here, at the op's start on the compute stream."""
        packs = list(range(len(self.st.packs)))
        if kind == "B":
            packs = packs[::-1][1 if self.carry is not None else 0:]
        self.op_fetches = {self.fetches + k: p for k, p in enumerate(packs)}
        self.reserved: dict[int, Ev] = {}
        for j in self.op_fetches:
            if j - self.pipe.prefetch - 1 < self.fetches:
                self.reserve(j)

    def reserve(self, j: int) -> None:
        """Fetch j's buffer allocated here on the compute stream (``kit``: peaks that do not depend on timing)."""
        if j not in self.op_fetches or j in self.reserved:
            return
        p = self.op_fetches[j]
        u, t = self.st.packs[p]
        buf = self.rec.tensor(f"buf{p}.{self.g}{self.sfx}", self.pipe.pack_bytes(u, t), "param16", self.scope, u)
        kit.reserve(self.sink, f"rsv{p}.{self.g}{self.sfx}", self.g, [(buf, self.g)], layer=None, rank=self.r,
                    extra={**self.extra, "pack": p})
        self.reserved[j] = self.sink.ev()

    def resident_until(self, j: int, last: Ev) -> None:
        """Fetch j's pack is no longer needed after ``last``: the fetch ``prefetch`` later may start then, so its
        buffer is reserved right after ``last`` when it belongs to this op."""
        self.rec.keyed[("res", self.r, self.s, j)] = last
        self.reserve(j + self.pipe.prefetch + 1)

    def fetch(self, p: int, use: str) -> Fetched:
        """Upload pack p into its reserved buffer, ``prefetch`` fetches ahead of the pack computing."""
        u, t = self.st.packs[p]
        nbytes = self.pipe.pack_bytes(u, t)
        buf = f"buf{p}.{self.g}{self.sfx}"
        j, pf = self.fetches, self.pipe.prefetch
        deps: list[Dep] = [("res", self.r, self.s, j - pf - 1)] if j > pf else []
        kit.upload(self.sink, f"ld{p}.{self.g}{self.sfx}", self.g, nbytes, deps + self._refresh(p) + [self.reserved[j]],
                   layer=None, rank=self.r, use=use, reads=[(f"home.s{self.s}.p{p}", "cpu")],
                   extra={**self.extra, "pack": p, "layers": list(range(u, t + 1))})
        self.fetches += 1
        return Fetched(buf, j, self.sink.ev())

    def send(self, kind: str, last: Ev | None, peer: int, layer: int, phase: Phase) -> None:
        """The stage's output to the next stage (``kind`` f) or its input gradient to the previous one (b)."""
        self.rec.keyed[(f"{kind}s", self.r, self.s, self.op.mb)] = self.sink.add(
            f"s{kind}.{self.g}{self.sfx}", "copy", f"{self.g}.{kind}send", [last], src=self.g,
            dst=self.pipe.gpu(self.r, peer), bytes=float(self.pipe.layers[layer].output_bytes),
            tags={**self.extra, "rank": self.r, "phase": phase})

    def forward(self, keep_last: bool) -> None:
        """Forward of one micro-batch; ``keep_last``: a backward of the same iteration follows directly."""
        s, packs, gpipe = self.s, self.st.packs, self.pipe.gpipe
        recv: list[Dep] = [("fs", self.r, s - 1, self.op.mb)] if s > 0 else []
        last: Ev | None = None
        for p, (u, t) in enumerate(packs):
            f = self.fetch(p, "fwd") if self.swap else None
            keep = f is not None and keep_last and p == len(packs) - 1
            for x in range(u, t + 1):
                deps = list(recv) if x == self.st.first else []
                if f is not None and x == u:
                    deps.append(f.task)
                if not self.swap:
                    deps += self._refresh(x)
                acts = [] if gpipe else [(self.rec.tensor(f"a{x}.{self.g}{'.t' if self.rep else f'.m{self.op.mb}'}",
                                                          self.pipe.layers[x].activation_bytes, "activation",
                                                          self.scope, x), self.g)]
                frees = [(f.buf, self.g)] if f is not None and x == t and not keep else []
                kit.forward(self.sink, x, self.pipe.layers[x], self.g, self.r, deps, tid=f"f{x}.{self.g}{self.sfx}",
                            allocs=acts, frees=frees, extra=self.extra)
                last = self.sink.ev()
            if f is not None:
                if keep:
                    self.carry = Fetched(f.buf, f.j, None)
                else:
                    assert last is not None
                    self.resident_until(f.j, last)
        if not gpipe and not self.rep:
            self.stack.append(self.op.mb)
        if s < self.pipe.S - 1:
            self.send("f", last, s + 1, self.st.last, Phase.SEND_ACT)

    def backward(self) -> None:
        """Backward of one micro-batch, packs in reverse; each swapped pack's gradient goes down."""
        s = self.s
        recv: list[Dep] = [("bs", self.r, s + 1, self.op.mb)] if s < self.pipe.S - 1 else []
        amb = self.stack.pop() if not self.pipe.gpipe and not self.rep else None
        d2hs: list[Ev] = []
        last: Ev | None = None
        for pos, p in enumerate(reversed(range(len(self.st.packs)))):
            last = self.backward_pack(p, pos, recv, ".t" if self.rep else f".m{amb}", d2hs)
        for pos in range(max(len(d2hs) - GRAD_PACKS_HELD, 0), len(d2hs)):  # the op's last gradient packs
            self.release_grads(pos, d2hs)
        if s > 0:
            self.send("b", last, s - 1, self.st.first - 1, Phase.SEND_GRAD)

    def backward_pack(self, p: int, pos: int, recv: list[Dep], acts: str, d2hs: list[Ev]) -> Ev:
        """Pack p (the ``pos``-th from the end): recompute and backward of its layers, its gradient down."""
        u, t = self.st.packs[p]
        f = gb = None
        if self.swap:
            f = self.carry if pos == 0 and self.carry is not None else self.fetch(p, "bwd")
            self.carry = None
            gb = self.rec.tensor(f"gb{p}.{self.g}{self.sfx}", self.pipe.pack_bytes(u, t), "grad", self.scope, u)
        last: Ev | None = None
        for x in range(t, u - 1, -1):
            lay, top = self.pipe.layers[x], x == t
            deps: list[Dep] = list(recv) if x == self.st.last else []
            if f is not None and f.task is not None and top:
                deps.append(f.task)
            if gb is not None and top and pos >= GRAD_PACKS_HELD:   # at most two gradient packs live
                self.release_grads(pos - GRAD_PACKS_HELD, d2hs)
            frees = [] if self.pipe.gpipe else [(f"a{x}.{self.g}{acts}", self.g)]
            if f is not None and x == u:
                frees.append((f.buf, self.g))
            if lay.recompute_flops > 0:   # the recomputation takes the data dependencies, the backward the gate
                kit.recompute(self.sink, x, lay, self.g, self.r, deps, tid=f"r{x}.{self.g}{self.sfx}", extra=self.extra)
                deps = []
            kit.backward(self.sink, x, lay, self.g, self.r, deps, tid=f"b{x}.{self.g}{self.sfx}",
                         allocs=[(gb, self.g)] if gb is not None and top else [], frees=frees, extra=self.extra)
            self.final_bwd[(self.r, self.s, x)] = last = self.sink.ev()
        assert last is not None
        if f is not None and gb is not None:
            self.resident_until(f.j, last)
            after: list[Dep] = [last]
            kit.offload(self.sink, f"dn{p}.{self.g}{self.sfx}", self.g, self.pipe.pack_bytes(u, t), after,
                        layer=None, rank=self.r, reads=[(gb, self.g)],
                        extra={**self.extra, "pack": p, "layers": list(range(u, t + 1))})
            self.final_d2h[(self.r, self.s, p)] = dn = self.sink.ev()
            d2hs.append(dn)
        return last


    def release_grads(self, pos: int, d2hs: list[Ev]) -> None:
        """The gradient pack of the op's ``pos``-th backward pack released on the compute stream once its copy down
        has ended: before the backward ``GRAD_PACKS_HELD`` packs later (its gate), or at the op's end."""
        p = len(self.st.packs) - 1 - pos
        gb = f"gb{p}.{self.g}{self.sfx}"
        deps: list[Dep] = [d2hs[pos]]
        kit.release(self.sink, f"gfree{p}.{self.g}{self.sfx}", self.g, [(gb, self.g)], layer=None, rank=self.r,
                    deps=deps, extra={**self.extra, "pack": p})


class OptimizerSegment:
    """Emits the optimizer segment, after ``final_bwd`` (each layer's last backward per replica and stage) and
    ``final_d2h`` (each swapped pack's last gradient copy)."""

    def __init__(self, rec: Recorder, pipe: Pipeline, final_bwd: dict[Key, Ev], final_d2h: dict[Key, Ev]):
        self.rec, self.pipe, self.final_bwd, self.final_d2h = rec, pipe, final_bwd, final_d2h
        self.sink = rec.at(rec.opt_seg, 0)
        self.tie: dict[int, Ev] = {}

    def run(self) -> None:
        pipe = self.pipe
        if pipe.tied and pipe.S > 1:
            for r in pipe.replicas():
                self.tie[r] = self.tied_sync(r)
        for st in pipe.stages:
            if pipe.gpipe:
                for r in pipe.replicas():
                    g = pipe.gpu(r, st.index)
                    self.sink.add(f"stfree.{g}", "free", f"{g}.compute", frees=[(f"stash.{g}", g)])
            {"gpu": self.gpu_stage, "resident": self.resident_stage, "swap": self.swap_stage}[st.mode](st)

    def tied_sync(self, r: int) -> Ev:
        """The tied table's two gradient copies summed: an all-reduce, or on the CPU when a side swaps."""
        pipe, L = self.pipe, len(self.pipe.layers)
        first, last = pipe.stages[0], pipe.stages[-1]
        deps: list[Dep] = [self._final(r, first, 0), self._final(r, last, L - 1)]
        if first.mode != "swap" and last.mode != "swap":
            return self.sink.add(f"tie.r{r}", "collective", f"tie{r}", deps, coll="all_reduce",
                                 bytes=pipe.table_bytes, ranks=(pipe.gpu(r, 0), pipe.gpu(r, pipe.S - 1)),
                                 tags={"phase": Phase.TIED_GRAD_SYNC, "rank": r})
        return self.sink.add(f"tie.r{r}", "noop", f"tie{r}", deps,
                             tags={"phase": Phase.TIED_GRAD_SYNC, "on": "cpu", "rank": r})

    def _final(self, r: int, st: StagePlan, layer: int) -> Ev:
        """The task after which the gradient of ``layer`` is complete where the optimizer reads it."""
        if st.mode == "swap":
            p = next(k for k, (u, t) in enumerate(st.packs) if u <= layer <= t)
            return self.final_d2h[(r, st.index, p)]
        return self.final_bwd[(r, st.index, layer)]

    def tied_dep(self, r: int, s: int, layers: range) -> list[Dep]:
        """The tied-gradient sum, when ``layers`` of stage s hold one end of the table."""
        L = len(self.pipe.layers)
        if r in self.tie and ((s == 0 and 0 in layers) or (s == self.pipe.S - 1 and L - 1 in layers)):
            return [self.tie[r]]
        return []

    def _grads_of(self, s: int, x: int) -> list[Dep]:
        """Every replica's last backward of layer x, and the tied sum where it applies (a template: replica 0's)."""
        reps = self.pipe.replicas()
        return ([self.final_bwd[(r, s, x)] for r in reps]
                + [y for r in reps for y in self.tied_dep(r, s, range(x, x + 1))])

    def gpu_stage(self, st: StagePlan) -> None:
        pipe, s = self.pipe, st.index
        gpus = [pipe.gpu(r, s) for r in range(pipe.dp)]
        layers = range(st.first, st.last + 1)
        ars: list[Ev] = []
        if pipe.dp > 1:
            for x in reversed(layers):
                kit.reduce(self.sink, f"ar{x}.s{s}", f"dp{s}", gpus, pipe.layer_bytes(x), self._grads_of(s, x),
                           coll="all_reduce", layer=x, extra={"stage": s})
                ars.append(self.sink.ev())
        for r in pipe.replicas():
            g = gpus[r]
            deps: list[Dep] = list(ars[-1:]) if ars else self.tied_dep(r, s, layers)
            kit.gpu_step(self.sink, f"opt.{g}", f"{g}.compute", deps, pipe.stage_params(st), rank=r, extra={"stage": s})

    def resident_stage(self, st: StagePlan) -> None:
        pipe, s, dp = self.pipe, st.index, self.pipe.dp
        gpus, reps = [pipe.gpu(r, s) for r in range(dp)], pipe.replicas()
        ups: list[list[Dep]] = [[] for _ in reps]
        for n, x in enumerate(reversed(range(st.first, st.last + 1))):
            wb = pipe.layer_bytes(x)
            rs = None
            if dp > 1:
                kit.reduce(self.sink, f"rs{x}.s{s}", f"dp{s}", gpus, wb, self._grads_of(s, x), coll="reduce_scatter",
                           layer=x, extra={"stage": s})
                rs = self.sink.ev()
            for r in reps:
                deps: list[Dep] = [rs] if rs else [self.final_bwd[(r, s, x)], *self.tied_dep(r, s, range(x, x + 1))]
                if n >= BOUNCE_BUFFERS:
                    self.release_bounce(st, r, x + BOUNCE_BUFFERS, ups[r][n - BOUNCE_BUFFERS])
                ups[r].append(self.cpu_update(st, r, x, deps))
            if dp > 1:
                kit.all_gather(self.sink, f"ag{x}.s{s}", f"dp{s}", gpus, wb, [ups[r][n] for r in reps], layer=x,
                               extra={"stage": s})
        for r in reps:  # the last bounce buffers, once their uploads have ended
            for n, x in list(enumerate(reversed(range(st.first, st.last + 1))))[-BOUNCE_BUFFERS:]:
                self.release_bounce(st, r, x, ups[r][n])

    def release_bounce(self, st: StagePlan, r: int, x: int, up: Ev) -> None:
        """Rank r's bounce buffer of layer x released on its CPU Adam stream once the upload ``up`` has read it:
        CPU Adam of the layer ``BOUNCE_BUFFERS`` later waits for it (at most that many buffers), and the buffer is
        freed at one point of the Adam stream's order whatever the copy's speed (``kit``: peaks that do not depend
        on timing)."""
        g = self.pipe.gpu(r, st.index)
        deps: list[Dep] = [up]
        kit.release(self.sink, f"bfree{x}.{g}", g, [(f"bounce{x}.{g}", "cpu")], layer=x, rank=r, deps=deps,
                    phase=Phase.BUFFER_RELEASE, stream=f"cpu.adam{self.pipe.rank(r, st.index)}",
                    extra={"stage": st.index})

    def cpu_update(self, st: StagePlan, r: int, x: int, deps: list[Dep]) -> Ev:
        """Rank r's share of layer x: gradient down, CPU Adam into a bounce buffer (after the release of the one
        ``BOUNCE_BUFFERS`` layers back, ``release_bounce``), the 16-bit share up. Returns the upload."""
        pipe, s = self.pipe, st.index
        g, dp, wb = pipe.gpu(r, s), pipe.dp, pipe.layer_bytes(x)
        kit.offload(self.sink, f"dn{x}.{g}", g, wb / dp, deps, layer=x, rank=r, extra={"stage": s})
        dn = self.sink.ev()
        bounce = self.rec.tensor(f"bounce{x}.{g}", wb / dp, "buffer", "step", x)
        # kit.cpu_adam's task, plus the bounce buffer it writes the 16-bit update into (kit.cpu_adam takes no allocs)
        ad: Dep = self.sink.add(f"adam{x}.{g}", "optimizer", f"cpu.adam{pipe.rank(r, s)}", [dn],
                                params=pipe.layer_params(s, x) / dp, allocs=[(bounce, "cpu")],
                                tags=kit.tags(Phase.OPTIMIZER, layer=x, rank=r, extra={"stage": s}))
        kit.upload(self.sink, f"up{x}.{g}", g, wb / dp, [ad], layer=x, rank=r, reads=[(bounce, "cpu")],
                   extra={"stage": s})
        return self.sink.ev()

    def swap_stage(self, st: StagePlan) -> None:
        pipe, s, dp = self.pipe, st.index, self.pipe.dp
        for p in reversed(range(len(st.packs))):
            u, t = st.packs[p]
            prm = sum(pipe.layer_params(s, x) for x in range(u, t + 1))
            deps: list[Dep] = [self.final_d2h[(rr, s, p)] for rr in range(dp)]
            deps += [y for rr in range(dp) for y in self.tied_dep(rr, s, range(u, t + 1))]
            for r in range(dp):
                kit.cpu_adam(self.sink, f"adam{p}.{self.pipe.gpu(r, s)}", pipe.rank(r, s), deps, prm / dp, rank=r,
                             extra={"stage": s, "pack": p, "layers": list(range(u, t + 1))})
