"""LazyTrain's plan: a :class:`~.schedule.Schedule` in the executor's terms, as streams, tensors and kit calls.

Task names: ``fwd{i}``/``rc{i}``/``bwd{i}.{gpu}`` compute, ``out{i}``/``in{i}.{gpu}`` activation copies,
``up{f|b}{i}.{gpu}`` + ``ag{f|b}{i}`` streamed parameter uploads and their all-gather, ``red{i}`` (level 1) or
``rs{i}`` + ``d2h{i}.{gpu}`` gradients, ``opt.{gpu}`` GPU Adam, ``adam{i}.r{rank}`` CPU Adam with ``or``/``ow``
optimizer-state swaps and ``pw`` parameter write-back on NVMe, ``up{i}.{gpu}`` + ``ag{i}`` the updated
slices of a resident copy (level 2).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from policies import kit
from policies.base import Job
from policies.builder import PlanBuilder
from policies.lazytrain.cost_model import GRAD_BUCKETS, OPTIMIZER_STAGES
from policies.lazytrain.milp import evaluate, heuristic
from policies.lazytrain.schedule import HEURISTICS, NAME, Knobs, Schedule
from simulator import Plan
from simulator.phase import Phase

#: offloaded activations on the GPU at a time: a forward waits for the copy-out of the offloaded layer this
#: many before it, a fetch for the backward of the one this many after it (the MILP budgets two, milp.evaluate)
ACTIVATION_SLOTS = 2


def emit(job: Job, knobs: Knobs, s: Schedule) -> Plan:
    e = _Emitter(job, knobs, s)
    e.streams()
    e.tensors(s.evaluation.workspace, s.costs.act_bytes)
    e.b.segment("micro-steps", s.accumulation)
    e.forward()
    e.backward()
    e.b.segment("optimizer", 1)
    if e.level == 1:
        for r, g in enumerate(e.mine):
            kit.gpu_step(e.b, f"opt.{g}", f"{g}.compute", ["red0" if e.n > 1 else f"bwd0.{g}"], e.p_total, rank=r)
    else:
        e.cpu_optimizer()
    return e.b.build(steps=2, notes=_notes(job, knobs, s, e), info=_info(knobs, s, e))


class _Emitter:
    """The executor's facts (tiering, offloaded layers, prefetch, gates) and its tasks, every mechanism the kit's."""

    def __init__(self, job: Job, knobs: Knobs, s: Schedule):
        c, t = s.costs, s.costs.tiering
        # a rank template (kit.Layout): the per-rank loops see rank 0 (``mine``, ``ranks``), the collectives every GPU
        self.lay = kit.Layout(c.n, flat_comm=True, template=kit.templated(job))
        self.b = PlanBuilder(NAME, knobs, job, template=self.lay.rank_template)
        self.layers = job.trace.layers
        self.nl = nl = len(self.layers)
        self.t, self.level, self.streamed = t, t.level, t.streamed
        self.gpus = tuple(kit.gpu(r) for r in range(c.n))
        self.mine, self.ranks = tuple(self.lay.gpus()), self.lay.ranks()
        self.n, self.db = c.n, c.db
        self.depth = min(knobs.prefetch_depth, nl - 1)       # layers of parameters uploaded ahead of use
        self.unit_b = tuple(u * c.db for u in c.unit_params)  # bytes streamed (and gradients reduced) with layer i
        self.opts = tuple(c.instance.options[i][o] for i, o in enumerate(s.choice))
        self.tied = job.model.tied_embeddings and nl > 1     # the head's streamed unit includes the embedding
        self.p_total = float(sum(layer.params for layer in self.layers))
        self.master_bpp, self.optim_bpp, self.cpu_grad_bytes = c.master_bpp, c.optim_bpp, knobs.cpu_grad_bytes
        self.order = tuple(reversed(range(nl)))               # backward order (and the gradient buckets')
        self.tail_from = nl - 1 - self.depth  # layers from here on keep their forward parameters through the turn
        self.off = tuple(i for i in range(nl) if self.opts[i].place != "gpu")

    def refetched(self, i: int) -> bool:
        """Layer i's streamed parameters are uploaded again for its backward (freed after its forward)."""
        return self.streamed and i < self.tail_from

    def copy_out_gate(self, i: int) -> int | None:
        """The offloaded layer whose copy-out must end before layer i's forward (two slots in flight)."""
        k = self.off.index(i) if i in self.off else -1
        return self.off[k - ACTIVATION_SLOTS] if k >= ACTIVATION_SLOTS else None

    def fetch_gate(self, i: int) -> int | None:
        """The offloaded layer whose backward must end before layer i's activations are fetched back."""
        k = self.off.index(i) if i in self.off else len(self.off)
        return self.off[k + ACTIVATION_SLOTS] if k + ACTIVATION_SLOTS < len(self.off) else None

    def streams(self) -> None:
        """Per GPU compute/h2d/d2h and two activation-copy streams; per rank CPU Adam and NVMe io; dp comm."""
        b = self.b
        kit.gpu_streams(b, self.mine, extra=(("act_out", "d2h"), ("act_in", "h2d")))
        for r in self.ranks:
            if self.level >= 2:
                kit.cpu_streams(b, [r], [("adam", "optim")])
            if self.t.uses_nvme:
                kit.cpu_streams(b, [r], [("io", "io")], device="nvme")
        kit.comm_streams(b, self.lay, order=("param", "grad"))

    def tensors(self, workspace: float, act_bytes: tuple[dict[str, float], ...]) -> None:
        b = self.b
        for g in self.mine:
            self._gpu_states(g)
            b.tensor(f"ws.{g}", workspace, "buffer", home=g, persistent=True)
            for i, o in enumerate(self.opts):
                kind = "checkpoint" if o.mode == "ckpt" else "activation"
                b.tensor(f"act{i}.{g}", act_bytes[i][o.mode], kind, scope="iteration", layer=i)
                self._layer_buffers(g, i)
        if self.streamed:
            for i, layer in enumerate(self.layers):
                b.tensor(f"p16.{i}", layer.params * self.db, "param16", home=self.t.params, layer=i, persistent=True)
        if self.level >= 2:
            for r in self.ranks:
                self._cpu_states(r)

    def _gpu_states(self, g: str) -> None:
        """Level 1: every model state on each GPU; level 2: the resident fp16 parameters."""
        b, p = self.b, self.p_total
        if self.level > 2:
            return
        b.tensor(f"param16.{g}", p * self.db, "param16", home=g, persistent=True)
        if self.level == 1:
            b.tensor(f"grad.{g}", p * self.db, "grad", home=g, persistent=True)
            if self.master_bpp:
                b.tensor(f"param32.{g}", p * self.master_bpp, "param32", home=g, persistent=True)
            b.tensor(f"optim.{g}", p * self.optim_bpp, "optim", home=g, persistent=True)

    def _layer_buffers(self, g: str, i: int) -> None:
        """Layer i's gradient bucket (levels 2, 3) and streamed parameter copies and slices (level 3)."""
        b, ub = self.b, self.unit_b[i]
        if self.level >= 2:
            b.tensor(f"gb{i}.{g}", ub, "grad", scope="iteration", layer=i)
        if not self.streamed:
            return
        for name, size, multi in (("pg", ub, True), ("ps", ub / self.n, self.n > 1)):
            if multi:
                kind = "param16" if name == "pg" else "buffer"
                b.tensor(f"{name}f{i}.{g}", size, kind, scope="iteration", layer=i)
                if self.refetched(i):
                    b.tensor(f"{name}b{i}.{g}", size, kind, scope="iteration", layer=i)

    def _cpu_states(self, r: int) -> None:
        """Rank r's slice of the CPU gradient, master weights and Adam states (and NVMe staging buffers)."""
        b, n, home, p = self.b, self.n, self.t.optim, self.p_total
        b.tensor(f"grad32.r{r}", p * self.cpu_grad_bytes / n, "grad32", home="cpu", persistent=True)
        if self.master_bpp:
            b.tensor(f"param32.r{r}", p * self.master_bpp / n, "param32", home=home, persistent=True)
        b.tensor(f"optim.r{r}", p * self.optim_bpp / n, "optim", home=home, persistent=True)
        if home == "nvme":
            for i, layer in enumerate(self.layers):
                b.tensor(f"ostage{i}.r{r}", layer.params / n * (self.master_bpp + self.optim_bpp), "buffer",
                         scope="step", layer=i)

    def upload(self, i: int, use: str, window: dict[str, list[str]]) -> dict[str, str]:
        """Layer i's parameters for ``use`` (f|b), after ``window`` and the last update of their home copy."""
        ub, task = self.unit_b[i], "adam" if self.t.params == "cpu" else "pw"
        updated = (i, 0) if self.tied and i == self.nl - 1 else (i,)
        return kit.sliced_fetch(self.b, self.gpus, i, use, ub / self.n, ub,
                                lambda r, g: window[g] + [f"{task}{j}.r{r}^1" for j in updated],
                                src=self.t.params, gather_use=False, mine=self.mine)

    def forward(self) -> None:
        """Per layer: its (prefetched) upload, then on every GPU its forward and, if offloaded, the copy-out."""
        b = self.b
        for i, layer in enumerate(self.layers):
            ready: dict[str, str] = {}
            if self.streamed:  # ``depth`` layers ahead of use: after layer i - depth - 1's forward (or last backward)
                j = i - self.depth - 1
                ready = self.upload(i, "f", {g: [f"fwd{j}.{g}" if j >= 0 else f"bwd{self.depth - i}.{g}@1"]
                                             for g in self.gpus})
            gate = self.copy_out_gate(i)
            for r, g in enumerate(self.mine):
                if self.level == 1:
                    deps = [f"opt.{g}^1"]
                elif self.level == 2:
                    deps = [f"ag{i}^1"] if self.n > 1 else [f"up{i}.{g}^1"]
                else:
                    deps = [ready[g]]
                kit.forward(b, i, layer, g, r, deps + ([f"out{gate}.{g}"] if gate is not None else []),
                            allocs=[(f"act{i}.{g}", g)], frees=[(f"pgf{i}.{g}", g)] if self.refetched(i) else [])
                if self.opts[i].place != "gpu":
                    kit.move_activation(b, f"out{i}.{g}", f"{g}.act_out", f"act{i}.{g}", g, self.opts[i].place,
                                        [f"fwd{i}.{g}"], phase=Phase.ACTIVATION_OFFLOAD, layer=i, rank=r)

    def backward(self) -> None:
        """Last layer first: fetch the activations back, recompute a checkpointed layer, backward, gradients."""
        for i in self.order:
            ready = {}
            if self.refetched(i):
                ready = self.upload(i, "b", {g: [f"bwd{i + self.depth + 1}.{g}"] for g in self.gpus})
            for r, g in enumerate(self.mine):
                self._layer_backward(i, r, g, [ready[g]] if ready else [])
            self.grads(i)
        for r, g in enumerate(self.mine):
            self._release_buckets(None, r, g)

    def _release_buckets(self, i: int | None, r: int, g: str) -> None:
        """Levels 2 and 3: on GPU g's compute stream, the gradient buckets ``kit.bucket_release`` releases before
        layer i's backward (None: after the micro-step's last), each once its copy to the CPU has ended, so the
        GPU's peak is the compute order's at every timing (``kit.release_buckets``; the copy freed its bucket
        before, and a replay whose copies ran slower than priced held more buckets: gpt-h2048-lazytrain's gpu0
        peak +26%, docs/calib.md)."""
        if self.level < 2:
            return
        for o in kit.bucket_release(self.order, i, GRAD_BUCKETS):
            kit.release(self.b, f"gfree{o}.{g}", g, [(f"gb{o}.{g}", g)], layer=o, rank=r, deps=[f"d2h{o}.{g}"])

    def _layer_backward(self, i: int, r: int, g: str, deps: list[str]) -> None:
        b, layer, place = self.b, self.layers[i], self.opts[i].place
        self._release_buckets(i, r, g)
        if place != "gpu":
            gate = self.fetch_gate(i)
            fetch_deps = [f"out{i}.{g}"] + ([f"bwd{gate}.{g}"] if gate is not None else [])
            deps = deps + [kit.move_activation(b, f"in{i}.{g}", f"{g}.act_in", f"act{i}.{g}", place, g, fetch_deps,
                                               phase=Phase.ACTIVATION_RELOAD, layer=i, rank=r)]
        if self.opts[i].mode == "ckpt":
            kit.recompute(b, i, layer, g, r, deps, flops=layer.fwd_flops)
            deps = []
        allocs = []
        if self.level >= 2:
            allocs = [(f"gb{i}.{g}", g)]
            deps = deps + kit.bucket_gate(self.order, i, GRAD_BUCKETS, lambda o: f"d2h{o}.{g}")
        frees = [(f"act{i}.{g}", g)]
        if self.streamed:
            frees.append((f"pgb{i}.{g}" if self.refetched(i) else f"pgf{i}.{g}", g))
        kit.backward(b, i, layer, g, r, deps, allocs=allocs, frees=frees)

    def grads(self, i: int) -> None:
        """Level 1: all-reduce layer i's gradients; else reduce-scatter them and copy each slice to the CPU."""
        b, gpus, n = self.b, self.gpus, self.n
        bwd = [f"bwd{i}.{g}" for g in self.mine]  # (a template: rank 0's)
        if self.level == 1:
            if n > 1:
                kit.reduce(b, f"red{i}", "dp.grad", gpus, self.layers[i].params * self.db, bwd, coll="all_reduce",
                           layer=i)
            return
        ub = self.unit_b[i]
        red = kit.reduce(b, f"rs{i}", "dp.grad", gpus, ub, bwd, layer=i) if n > 1 else None
        for r, g in enumerate(self.mine):
            kit.offload(b, f"d2h{i}.{g}", g, ub / n, [red or f"bwd{i}.{g}"], layer=i, rank=r)

    def _swap_in(self, i: int, r: int) -> None:
        """Read layer i's optimizer states of rank r once the write-back OPTIMIZER_STAGES layers before is done."""
        kit.swap(self.b, f"or{i}.r{r}", f"nvme.io{r}", Phase.OPTIMIZER_SWAP_IN, "nvme", "cpu",
                 self.layers[i].params / self.n * (self.master_bpp + self.optim_bpp),
                 kit.read_ahead(i, OPTIMIZER_STAGES, f"ow{{}}.r{r}"), layer=i, rank=r,
                 allocs=[(f"ostage{i}.r{r}", "cpu")])

    def cpu_optimizer(self) -> None:
        """CPU Adam per layer and rank; NVMe swap of its states, NVMe write-back, or re-upload of a resident copy."""
        if self.t.optim == "nvme":
            for r in self.ranks:
                for i in range(min(OPTIMIZER_STAGES, self.nl)):
                    self._swap_in(i, r)
        for i in range(self.nl):
            for r, g in enumerate(self.mine):
                self._cpu_adam(i, r, g)
            if self.t.params == "gpu" and self.n > 1:
                kit.all_gather(self.b, f"ag{i}", "dp.param", self.gpus, self.layers[i].params * self.db,
                               [f"up{i}.{g}" for g in self.mine], layer=i)

    def _cpu_adam(self, i: int, r: int, g: str) -> None:
        b, params, t = self.b, self.layers[i].params / self.n, self.t
        nvme_states = t.optim == "nvme"
        kit.cpu_adam(b, f"adam{i}.r{r}", r, [f"d2h{i}.{g}"] + ([f"or{i}.r{r}"] if nvme_states else []), params,
                     layer=i)
        if nvme_states:
            kit.swap(b, f"ow{i}.r{r}", f"nvme.io{r}", Phase.OPTIMIZER_SWAP_OUT, "cpu", "nvme",
                     params * (self.master_bpp + self.optim_bpp), [f"adam{i}.r{r}"], layer=i, rank=r,
                     frees=[(f"ostage{i}.r{r}", "cpu")])
        if t.params == "nvme":
            kit.swap(b, f"pw{i}.r{r}", f"nvme.io{r}", Phase.PARAM_SWAP_OUT, "cpu", "nvme", params * self.db,
                     [f"adam{i}.r{r}"], layer=i, rank=r)
        if nvme_states and i + OPTIMIZER_STAGES < self.nl:
            self._swap_in(i + OPTIMIZER_STAGES, r)
        if t.params == "gpu":
            kit.upload(b, f"up{i}.{g}", g, params * self.db, [f"adam{i}.r{r}"], layer=i, rank=r)


def _notes(job: Job, knobs: Knobs, s: Schedule, e: _Emitter) -> list[str]:
    ev, tier = s.evaluation, s.costs.tiering
    counts = Counter(str(o) for o in e.opts)
    notes = [f"LazyTrain over {e.n} data-parallel GPU(s), {s.accumulation} micro-step(s) per step; tiering "
             f"{tier} (level {tier.level}); activations: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
             f"{'MILP' if s.milp else knobs.strategy}: recompute {ev.recompute_s:.4g} s + exposed transfer "
             f"{ev.exposed_s:.4g} s per micro-step (estimated step {s.estimate_s:.4g} s)"]
    if job.config.checkpointing != "none":
        notes.append(f"the workload's checkpointing={job.config.checkpointing} is not used: the MILP decides "
                     "per layer")
    if knobs.optimizer_8bit:
        notes.append("ASSUMPTION: 8-bit Adam states (1 B each for m and v + an fp32 scale per 2048 elements)")
    if tier.level == 1 and not e.off:
        notes.append("everything fits on the GPU: nothing is offloaded")
    cut = sorted({f"{r['tiering']}: {r['milp']['limit_hit']}" for r in s.candidates
                  if r.get("milp", {}).get("limit_hit")})
    if cut:
        notes.append("MILP stopped by a limit (" + "; ".join(cut) + "): the schedule may not be optimal"
                     + ("; the wall-clock safety net depends on the machine's load, so this plan may not "
                        "reproduce" if any(c.endswith(": time") for c in cut) else ""))
    return notes


def _info(knobs: Knobs, s: Schedule, e: _Emitter) -> dict[str, Any]:
    inst, ev = s.costs.instance, s.evaluation
    heur = {h: {"feasible": he.feasible, "objective_s": he.objective, "pure_objective_s": he.pure_objective}
            for h in HEURISTICS for he in [evaluate(inst, heuristic(inst, h))]}
    milp_info: dict[str, Any] = {"status": f"not run (strategy={knobs.strategy})"}
    if s.milp is not None:
        milp_info = {**s.milp.to_dict(), "evaluated_objective_s": ev.objective,
                     "recompute_s": ev.recompute_s, "exposed_s": ev.exposed_s}
    return {
        "milp": milp_info,
        "lazytrain": {
            "tiering": {"params": e.t.params, "optimizer": e.t.optim, "level": e.level},
            "accumulation": s.accumulation, "choice": [str(o) for o in e.opts],
            "recompute_s_per_microstep": ev.recompute_s, "exposed_s_per_microstep": ev.exposed_s,
            "estimated_step_s": s.estimate_s, "workspace_bytes": ev.workspace, "staging_bytes": ev.staging,
            "pool_need_bytes": dict(ev.need), "pool_capacity_bytes": dict(inst.capacity),
            "fixed_gpu_bytes": dict(s.costs.fixed_gpu_parts), "candidates": list(s.candidates), "heuristics": heur,
        },
    }
