"""One stage of one replica through the step's schedule: per-layer compute, pack fetches, gradients down.

Forward of a micro-batch: the stage's layers in order (a ``swap`` stage fetches each pack into a fresh GPU
buffer first, ``prefetch`` fetches ahead; the last pack of a forward directly followed by its backward
stays for it), then the output goes to the next stage. Backward: the layers in reverse (recompute, then
backward), a ``swap`` stage fetching each pack again and sending each pack's gradient down to DRAM (at
most two gradient packs live), then the input gradient goes to the previous stage.

Activations (one micro-batch's saved tensors per layer) are relabelled: within a steady iteration the
backward frees the instance its own forward allocated (the bytes of micro-batch k, freed by B(k), equal
those of the micro-batch allocated by the same iteration's forward), so live bytes at every instant are
exact. GPipe holds all M micro-batches' activations at its peak, allocated once per step as a stash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies import kit
from policies.tinypipe.emit import Dep, Ev, Key, Recorder, Sink
from policies.tinypipe.packing import StagePlan
from policies.tinypipe.pipeline import Pipeline
from policies.tinypipe.schedule import Op
from simulator.phase import Phase


@dataclass(frozen=True)
class At:
    """Where an op's tasks go: its segment and iteration, id suffix, tensor scope and tags beside the rank's
    (``extra``: the stage, and the micro-batch of an op outside a repeated segment)."""

    op: Op
    suffix: str
    scope: str
    rank: int
    extra: dict[str, Any]
    repeated: bool

    @property
    def mb_label(self) -> str:
        return ".t" if self.repeated else f".m{self.op.mb}"

    @property
    def tags(self) -> dict[str, Any]:
        return {**self.extra, "rank": self.rank}


@dataclass
class Fetched:
    """A swapped pack on the GPU: its buffer, the index of its fetch, and the fetch task (None: carried)."""

    buf: str
    j: int
    task: Ev | None


def refresh_refs(pipe: Pipeline, s: int, unit: int) -> list[str]:
    """The previous step's tasks that leave layer (resident) or pack (swap) ``unit`` of stage s updated."""
    st = pipe.stages[s]
    if st.mode == "resident":
        return [f"ag{unit}.s{s}^1"] if pipe.dp > 1 else [f"up{unit}.{pipe.gpu(0, s)}^1"]
    if st.mode == "swap":
        return [f"adam{unit}.{pipe.gpu(r, s)}^1" for r in range(pipe.dp)]
    return []   # gpu mode: the optimizer runs on the same compute stream, before the next forward


class StageRun:
    """Emits the schedule's ops of stage ``st`` on replica ``r``; records each layer's last backward and
    each pack's last gradient copy for the optimizer."""

    def __init__(self, rec: Recorder, pipe: Pipeline, r: int, st: StagePlan, final_bwd: dict[Key, Ev],
                 final_d2h: dict[Key, Ev]):
        self.rec, self.pipe, self.r, self.st = rec, pipe, r, st
        self.s = st.index
        self.g = pipe.gpu(r, st.index)
        self.swap = st.mode == "swap"
        self.final_bwd, self.final_d2h = final_bwd, final_d2h
        self.fetches: list[Key] = []          # residency-end keys of the stage's fetches, in order
        self.stack: list[int] = []            # live explicit activation micro-batches (LIFO relabelling)
        self.carry: Fetched | None = None     # the pack a forward keeps for the backward right after it
        self.last_b_d2h: Ev | None = None
        self.fresh_done: set[int] = set()     # layers (resident, gpu) or packs (swap) already refreshed

    def run(self) -> None:
        ops = self.pipe.schedule.ops[self.s]
        for n, op in enumerate(ops):
            at = self._at(op)
            if op.kind == "F":
                nxt = ops[n + 1] if n + 1 < len(ops) else None
                keep = nxt is not None and nxt.kind == "B" and nxt.seg == op.seg and nxt.it == op.it
                self.forward(at, keep)
            else:
                self.backward(at)

    def _at(self, op: Op) -> At:
        rep = self.pipe.schedule.repeated(op.seg)
        extra: dict[str, Any] = {"stage": self.s} if rep else {"stage": self.s, "mb": op.mb}
        return At(op, f".t{op.slot}{op.kind}" if rep else f".m{op.mb}{op.kind}", "iteration" if rep else "step",
                  self.r, extra, rep)

    def _sink(self, at: At) -> Sink:
        return self.rec.at(at.op.seg, at.op.it)

    def _tid(self, name: str, at: At) -> str:
        return f"{name}.{self.g}{at.suffix}"

    def _refresh(self, unit: int) -> list[str]:
        """The previous step's update of ``unit``, the first time this stage uses it in the step."""
        if unit in self.fresh_done:
            return []
        self.fresh_done.add(unit)
        return refresh_refs(self.pipe, self.s, unit)

    # -- swapping ---------------------------------------------------------------------------------------
    def fetch(self, p: int, use: str, at: At) -> Fetched:
        """Upload pack p into a fresh buffer, ``prefetch`` fetches ahead of the pack computing."""
        u, t = self.st.packs[p]
        nbytes = self.pipe.pack_bytes(self.s, u, t)
        buf = self.rec.tensor(f"buf{p}.{self.g}{at.suffix}", nbytes, "param16", at.scope, u)
        deps: list[Dep] = []
        j = len(self.fetches)
        if j - self.pipe.prefetch - 1 >= 0:
            deps.append(self.fetches[j - self.pipe.prefetch - 1])
        deps += self._refresh(p)
        sink = self._sink(at)
        kit.upload(sink, self._tid(f"ld{p}", at), self.g, nbytes, deps, layer=None, rank=self.r, use=use,
                   allocs=[(buf, self.g)], reads=[(f"home.s{self.s}.p{p}", "cpu")],
                   extra={**at.extra, "pack": p, "layers": list(range(u, t + 1))})
        self.fetches.append(("res", self.r, self.s, j))
        return Fetched(buf, j, sink.ev())

    def _resident_until(self, f: Fetched, last: Ev) -> None:
        self.rec.keyed[("res", self.r, self.s, f.j)] = last

    # -- forward ----------------------------------------------------------------------------------------
    def forward(self, at: At, keep_last: bool) -> None:
        """Forward of one micro-batch; ``keep_last``: a backward of the same iteration follows directly."""
        s, packs = self.s, self.st.packs
        recv: list[Dep] = [("fs", self.r, s - 1, at.op.mb)] if s > 0 else []
        last: Ev | None = None
        for p, (u, t) in enumerate(packs):
            f = self.fetch(p, "fwd", at) if self.swap else None
            keep = f is not None and keep_last and p == len(packs) - 1
            for x in range(u, t + 1):
                deps = list(recv) if x == self.st.first else []
                if f is not None and x == u:
                    deps.append(f.task)
                if not self.swap:
                    deps += self._refresh(x)
                last = self.forward_layer(at, x, deps, f if f is not None and x == t and not keep else None)
            if f is not None:
                if keep:
                    self.carry = Fetched(f.buf, f.j, None)
                else:
                    self._resident_until(f, last)  # type: ignore[arg-type]
        if not self.pipe.gpipe and not at.repeated:
            self.stack.append(at.op.mb)
        if s < self.pipe.S - 1:
            self.rec.ev(f"sf.{self.g}{at.suffix}", at.op.seg, at.op.it, "copy", f"{self.g}.fsend", [last],
                        key=("fs", self.r, s, at.op.mb), src=self.g, dst=self.pipe.gpu(self.r, s + 1),
                        bytes=float(self.pipe.layers[self.st.last].output_bytes),
                        tags={**at.tags, "phase": Phase.SEND_ACT})

    def forward_layer(self, at: At, x: int, deps: list[Dep], release: Fetched | None) -> Ev:
        """Layer x's forward, saving its activations (1F1B); ``release``: the pack buffer it frees."""
        lay = self.pipe.layers[x]
        allocs = []
        if not self.pipe.gpipe:
            allocs.append((self.rec.tensor(f"a{x}.{self.g}{at.mb_label}", lay.activation_bytes, "activation",
                                           at.scope, x), self.g))
        frees = [(release.buf, self.g)] if release is not None else []
        sink = self._sink(at)
        kit.forward(sink, x, lay, self.g, self.r, deps, tid=self._tid(f"f{x}", at), allocs=allocs, frees=frees,
                    extra=at.extra)
        return sink.ev()

    # -- backward ---------------------------------------------------------------------------------------
    def backward(self, at: At) -> None:
        """Backward of one micro-batch, packs in reverse; each swapped pack's gradient goes down."""
        s = self.s
        recv: list[Dep] = [("bs", self.r, s + 1, at.op.mb)] if s < self.pipe.S - 1 else []
        amb = self.stack.pop() if not self.pipe.gpipe and not at.repeated else None
        acts = ".t" if at.repeated else f".m{amb}"
        d2hs: list[Ev] = []
        last: Ev | None = None
        for pos, p in enumerate(reversed(range(len(self.st.packs)))):
            last = self.backward_pack(at, p, pos, recv, acts, d2hs)
        if d2hs:
            self.last_b_d2h = d2hs[-1]
        if s > 0:
            self.rec.ev(f"sb.{self.g}{at.suffix}", at.op.seg, at.op.it, "copy", f"{self.g}.bsend", [last],
                        key=("bs", self.r, s, at.op.mb), src=self.g, dst=self.pipe.gpu(self.r, s - 1),
                        bytes=float(self.pipe.layers[self.st.first - 1].output_bytes),
                        tags={**at.tags, "phase": Phase.SEND_GRAD})

    def _backward_fetch(self, at: At, p: int, pos: int) -> Fetched:
        if pos == 0 and self.carry is not None:
            f, self.carry = self.carry, None
            return f
        return self.fetch(p, "bwd", at)

    def backward_pack(self, at: At, p: int, pos: int, recv: list[Dep], acts: str, d2hs: list[Ev]) -> Ev:
        """Pack p (the ``pos``-th from the end): recompute and backward of its layers, its gradient down."""
        u, t = self.st.packs[p]
        f = self._backward_fetch(at, p, pos) if self.swap else None
        gb = None
        if f is not None:
            gb = self.rec.tensor(f"gb{p}.{self.g}{at.suffix}", self.pipe.pack_bytes(self.s, u, t), "grad",
                                 at.scope, u)
        last: Ev | None = None
        for x in range(t, u - 1, -1):
            deps = list(recv) if x == self.st.last else []
            if f is not None and f.task is not None and x == t:
                deps.append(f.task)
            allocs: list[tuple[str, str]] = []
            gate: list[Dep] = []
            frees = [] if self.pipe.gpipe else [(f"a{x}.{self.g}{acts}", self.g)]
            if gb is not None and x == t:
                allocs.append((gb, self.g))
                gate = self._grad_buffer_gate(pos, d2hs)
            if f is not None and x == u:
                frees.append((f.buf, self.g))
            last = self.backward_layer(at, x, deps, gate, allocs, frees)
        assert last is not None
        if f is not None and gb is not None:
            self._resident_until(f, last)
            d2hs.append(self.grad_down(at, p, last, gb))
        return last

    def _grad_buffer_gate(self, pos: int, d2hs: list[Ev]) -> list[Dep]:
        """At most two gradient packs live: a pack's buffer waits for the copy two packs back."""
        if pos >= 2:
            return [d2hs[pos - 2]]
        if pos == 0 and self.last_b_d2h is not None:
            return [self.last_b_d2h]
        return []

    def backward_layer(self, at: At, x: int, deps: list[Dep], gate: list[Dep], allocs: list[tuple[str, str]],
                       frees: list[tuple[str, str]]) -> Ev:
        """Layer x's recomputation (when checkpointing; it takes ``deps``) and backward (``gate`` too)."""
        lay = self.pipe.layers[x]
        sink = self._sink(at)
        if lay.recompute_flops > 0:
            kit.recompute(sink, x, lay, self.g, self.r, deps, tid=self._tid(f"r{x}", at), extra=at.extra)
            deps = []
        kit.backward(sink, x, lay, self.g, self.r, deps + gate, tid=self._tid(f"b{x}", at), allocs=allocs,
                     frees=frees, extra=at.extra)
        self.final_bwd[(self.r, self.s, x)] = e = sink.ev()
        return e

    def grad_down(self, at: At, p: int, last: Ev, gb: str) -> Ev:
        """Pack p's gradient to DRAM after its last backward (the CPU accumulates micro-batches)."""
        u, t = self.st.packs[p]
        sink = self._sink(at)
        after: list[Dep] = [last]
        kit.offload(sink, self._tid(f"dn{p}", at), self.g, self.pipe.pack_bytes(self.s, u, t), after, layer=None,
                    rank=self.r, frees=[(gb, self.g)], extra={**at.extra, "pack": p, "layers": list(range(u, t + 1))})
        self.final_d2h[(self.r, self.s, p)] = dn = sink.ev()
        return dn
