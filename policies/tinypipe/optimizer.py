"""The optimizer segment of ``tinypipe``, after the last micro-batch, per stage mode.

- ``gpu``: each layer's gradient all-reduced across the replicas as soon as its last backward ends
  (overlapping the backward of the layers before it, as DDP/DeepSpeed bucketing does), then GPU Adam.
- ``resident``: per layer, in backward order: reduce-scatter across replicas, the rank's share of the
  gradient down to DRAM, CPU Adam on it (through a pinned bounce buffer, at most two per GPU), the updated
  16-bit share up again, then an all-gather of the layer's weights.
- ``swap``: the gradients are already in DRAM; CPU Adam per pack writes the 16-bit weights in place.
- Tied embeddings with S > 1: the two copies' gradients are summed once per step (an all-reduce between
  the two GPUs, or on the CPU when a side swaps) before either side's update.
- GPipe: each GPU's activation stash is freed.
"""

from __future__ import annotations

from typing import Any

from policies import kit
from policies.tinypipe.emit import Dep, Ev, Key, Recorder, Sink
from policies.tinypipe.packing import StagePlan
from policies.tinypipe.pipeline import Pipeline
from simulator.phase import Phase


class OptimizerSegment:
    """Emits the optimizer segment, after ``final_bwd`` (each layer's last backward per replica and stage)
    and ``final_d2h`` (each swapped pack's last gradient copy)."""

    def __init__(self, rec: Recorder, pipe: Pipeline, final_bwd: dict[Key, Ev], final_d2h: dict[Key, Ev]):
        self.rec, self.pipe = rec, pipe
        self.final_bwd, self.final_d2h = final_bwd, final_d2h
        self.seg = rec.opt_seg
        self.sink: Sink = rec.at(rec.opt_seg, 0)
        self.tie: dict[int, Ev] = {}

    def _ev(self, tid: str, op: str, stream: str, deps: list[Dep] | None = None, **fields: Any) -> Ev:
        return self.rec.ev(tid, self.seg, 0, op, stream, deps, **fields)

    def run(self) -> None:
        pipe = self.pipe
        if pipe.tied and pipe.S > 1:
            for r in range(pipe.dp):
                self.tie[r] = self.tied_sync(r)
        for st in pipe.stages:
            if pipe.gpipe:
                for r in range(pipe.dp):
                    g = pipe.gpu(r, st.index)
                    self._ev(f"stfree.{g}", "free", f"{g}.compute", frees=[(f"stash.{g}", g)])
            if st.mode == "gpu":
                self.gpu_stage(st)
            elif st.mode == "resident":
                self.resident_stage(st)
            else:
                self.swap_stage(st)

    # -- the tied table ---------------------------------------------------------------------------------
    def tied_sync(self, r: int) -> Ev:
        pipe, L = self.pipe, len(self.pipe.layers)
        first, last = pipe.stages[0], pipe.stages[-1]
        tags = {"phase": Phase.TIED_GRAD_SYNC, "rank": r}
        if first.mode != "swap" and last.mode != "swap":
            g0, gl = pipe.gpu(r, 0), pipe.gpu(r, pipe.S - 1)
            return self._ev(f"tie.r{r}", "collective", f"tie{r}",
                            [self.final_bwd[(r, 0, 0)], self.final_bwd[(r, pipe.S - 1, L - 1)]],
                            coll="all_reduce", bytes=pipe.table_params * pipe.db, ranks=(g0, gl), tags=tags)
        deps: list[Dep] = [self._final(r, first, 0), self._final(r, last, L - 1)]
        return self._ev(f"tie.r{r}", "noop", f"tie{r}", deps,
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
        """Every replica's last backward of layer x, and the tied sum where it applies."""
        dp = self.pipe.dp
        return ([self.final_bwd[(r, s, x)] for r in range(dp)]
                + [y for r in range(dp) for y in self.tied_dep(r, s, range(x, x + 1))])

    # -- per stage mode ---------------------------------------------------------------------------------
    def gpu_stage(self, st: StagePlan) -> None:
        pipe, s = self.pipe, st.index
        gpus = [pipe.gpu(r, s) for r in range(pipe.dp)]
        layers = range(st.first, st.last + 1)
        ars: list[Ev] = []
        if pipe.dp > 1:
            for x in reversed(layers):
                kit.reduce(self.sink, f"ar{x}.s{s}", f"dp{s}", gpus, pipe.layer_bytes(s, x), self._grads_of(s, x),
                           coll="all_reduce", layer=x, extra={"stage": s})
                ars.append(self.sink.ev())
        for r, g in enumerate(gpus):
            deps: list[Dep] = list(ars[-1:]) if ars else self.tied_dep(r, s, layers)
            kit.gpu_step(self.sink, f"opt.{g}", f"{g}.compute", deps, pipe.stage_params(st), rank=r,
                         extra={"stage": s})

    def resident_stage(self, st: StagePlan) -> None:
        pipe, s, dp = self.pipe, st.index, self.pipe.dp
        gpus = [pipe.gpu(r, s) for r in range(dp)]
        ups: list[list[Ev]] = [[] for _ in range(dp)]
        for n, x in enumerate(reversed(range(st.first, st.last + 1))):
            wb = pipe.layer_bytes(s, x)
            rs = None
            if dp > 1:
                kit.reduce(self.sink, f"rs{x}.s{s}", f"dp{s}", gpus, wb, self._grads_of(s, x), coll="reduce_scatter",
                           layer=x, extra={"stage": s})
                rs = self.sink.ev()
            for r in range(dp):
                deps: list[Dep] = [rs] if rs else [self.final_bwd[(r, s, x)], *self.tied_dep(r, s, range(x, x + 1))]
                gate = ups[r][n - 2] if n >= 2 else None
                ups[r].append(self.cpu_update(st, r, x, deps, gate))
            if dp > 1:
                uploaded: list[Dep] = [ups[r][n] for r in range(dp)]
                kit.all_gather(self.sink, f"ag{x}.s{s}", f"dp{s}", gpus, wb, uploaded, layer=x, extra={"stage": s})

    def cpu_update(self, st: StagePlan, r: int, x: int, deps: list[Dep], gate: Ev | None) -> Ev:
        """Rank r's share of layer x: gradient down, CPU Adam into a bounce buffer (``gate``: the upload
        that frees the buffer two layers back), the 16-bit share up. Returns the upload."""
        pipe, s = self.pipe, st.index
        g, dp = pipe.gpu(r, s), pipe.dp
        wb = pipe.layer_bytes(s, x)
        kit.offload(self.sink, f"dn{x}.{g}", g, wb / dp, deps, layer=x, rank=r, extra={"stage": s})
        dn = self.sink.ev()
        bounce = self.rec.tensor(f"bounce{x}.{g}", wb / dp, "buffer", "step", x)
        # kit.cpu_adam's task, plus the bounce buffer it writes the 16-bit update into (kit.cpu_adam takes no allocs)
        ad = self._ev(f"adam{x}.{g}", "optimizer", f"cpu.adam{pipe.rank(r, s)}", [dn] if gate is None else [dn, gate],
                      params=pipe.layer_params(s, x) / dp, allocs=[(bounce, "cpu")],
                      tags=kit.tags(Phase.OPTIMIZER, layer=x, rank=r, extra={"stage": s}))
        updated: list[Dep] = [ad]
        kit.upload(self.sink, f"up{x}.{g}", g, wb / dp, updated, layer=x, rank=r, frees=[(bounce, "cpu")],
                   extra={"stage": s})
        return self.sink.ev()

    def swap_stage(self, st: StagePlan) -> None:
        pipe, s, dp = self.pipe, st.index, self.pipe.dp
        for p in reversed(range(len(st.packs))):
            u, t = st.packs[p]
            prm = sum(pipe.layer_params(s, x) for x in range(u, t + 1))
            for r in range(dp):
                g = pipe.gpu(r, s)
                deps: list[Dep] = [self.final_d2h[(rr, s, p)] for rr in range(dp)]
                deps += [y for rr in range(dp) for y in self.tied_dep(rr, s, range(u, t + 1))]
                kit.cpu_adam(self.sink, f"adam{p}.{g}", pipe.rank(r, s), deps, prm / dp, rank=r,
                             extra={"stage": s, "pack": p, "layers": list(range(u, t + 1))})
