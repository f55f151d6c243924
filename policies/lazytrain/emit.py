"""LazyTrain's plan: the executor's facts (``policies/lazytrain/executor.py``) as streams, tensors and tasks.

Task names: ``fwd{i}``/``rc{i}``/``bwd{i}.{gpu}`` compute, ``out{i}``/``in{i}.{gpu}`` activation copies,
``up{f|b}{i}.{gpu}`` + ``ag{f|b}{i}`` streamed parameter uploads and their all-gather, ``red{i}`` (level 1) or
``rs{i}`` + ``d2h{i}.{gpu}`` gradients, ``opt.{gpu}`` GPU Adam, ``adam{i}.r{rank}`` CPU Adam with ``or``/``ow``
optimizer-state swaps and ``pw`` parameter write-back on NVMe, ``up{i}.{gpu}`` + ``ag{i}`` the updated
slices of a resident copy (level 2).
"""

from __future__ import annotations

from typing import Any

from policies import kit
from policies.base import Job
from policies.builder import PlanBuilder
from policies.lazytrain.cost_model import GRAD_BUCKETS, OPTIMIZER_STAGES
from policies.lazytrain.executor import Executor
from policies.lazytrain.knobs import HEURISTICS, NAME, Knobs
from policies.lazytrain.milp import Opt, evaluate, heuristic
from policies.lazytrain.schedule import Schedule
from simulator import Plan
from simulator.phase import Phase


def emit(job: Job, knobs: Knobs, s: Schedule) -> Plan:
    x = Executor.of(job, s, knobs.cpu_grad_bytes, knobs.prefetch_depth)
    e = _Emitter(PlanBuilder(NAME, knobs, job), job, x)
    e.streams()
    e.tensors(s.evaluation.workspace, s.costs.act_bytes)
    e.b.segment("micro-steps", s.accumulation)
    e.forward()
    e.backward()
    e.b.segment("optimizer", 1)
    if x.level == 1:
        e.gpu_optimizer()
    else:
        e.cpu_optimizer()
    return e.b.build(steps=2, notes=_notes(job, knobs, s, x), info=_info(knobs, s, x.opts))


class _Emitter:
    """Names the tasks of one executor: every decision it reads comes from ``x``, every mechanism is the kit's."""

    def __init__(self, b: PlanBuilder, job: Job, x: Executor):
        self.b = b
        self.layers = job.trace.layers
        self.x = x

    # -- streams and tensors --------------------------------------------------------------------------
    def streams(self) -> None:
        """Per GPU compute/h2d/d2h and two activation-copy streams; per rank CPU Adam and NVMe io; dp comm."""
        b, x = self.b, self.x
        kit.gpu_streams(b, x.gpus, extra=(("act_out", "d2h"), ("act_in", "h2d")))
        for r in range(x.n):
            if x.level >= 2:
                kit.cpu_streams(b, [r], [("adam", "optim")])
            if x.tier.uses_nvme:
                kit.cpu_streams(b, [r], [("io", "io")], device="nvme")
        kit.comm_streams(b, kit.Layout(x.n, flat_comm=True), order=("param", "grad"))

    def tensors(self, workspace: float, act_bytes: tuple[dict[str, float], ...]) -> None:
        b, x = self.b, self.x
        for g in x.gpus:
            self._gpu_states(g)
            b.tensor(f"ws.{g}", workspace, "buffer", home=g, persistent=True)
            for i in range(x.n_layers):
                kind = "checkpoint" if x.opts[i].mode == "ckpt" else "activation"
                b.tensor(f"act{i}.{g}", act_bytes[i][x.opts[i].mode], kind, scope="iteration", layer=i)
                self._layer_buffers(g, i)
        if x.streamed:
            for i, layer in enumerate(self.layers):
                b.tensor(f"p16.{i}", layer.params * x.db, "param16", home=x.tier.params, layer=i, persistent=True)
        if x.level >= 2:
            for r in range(x.n):
                self._cpu_states(r)

    def _gpu_states(self, g: str) -> None:
        """Level 1: every model state on each GPU; level 2: the resident fp16 parameters."""
        b, x = self.b, self.x
        if x.level > 2:
            return
        b.tensor(f"param16.{g}", x.p_total * x.db, "param16", home=g, persistent=True)
        if x.level == 1:
            b.tensor(f"grad.{g}", x.p_total * x.db, "grad", home=g, persistent=True)
            if x.master_bpp:
                b.tensor(f"param32.{g}", x.p_total * x.master_bpp, "param32", home=g, persistent=True)
            b.tensor(f"optim.{g}", x.p_total * x.optim_bpp, "optim", home=g, persistent=True)

    def _layer_buffers(self, g: str, i: int) -> None:
        """Layer i's gradient bucket (levels 2, 3) and streamed parameter copies and slices (level 3)."""
        b, x = self.b, self.x
        ub = x.unit_bytes(i)
        if x.level >= 2:
            b.tensor(f"gb{i}.{g}", ub, "grad", scope="iteration", layer=i)
        if not x.streamed:
            return
        b.tensor(f"pgf{i}.{g}", ub, "param16", scope="iteration", layer=i)
        if x.refetched(i):
            b.tensor(f"pgb{i}.{g}", ub, "param16", scope="iteration", layer=i)
        if x.n > 1:
            b.tensor(f"psf{i}.{g}", ub / x.n, "buffer", scope="iteration", layer=i)
            if x.refetched(i):
                b.tensor(f"psb{i}.{g}", ub / x.n, "buffer", scope="iteration", layer=i)

    def _cpu_states(self, r: int) -> None:
        """Rank r's slice of the CPU gradient, master weights and Adam states (and NVMe staging buffers)."""
        b, x = self.b, self.x
        n, home = x.n, x.tier.optim
        b.tensor(f"grad32.r{r}", x.p_total * x.cpu_grad_bytes / n, "grad32", home="cpu", persistent=True)
        if x.master_bpp:
            b.tensor(f"param32.r{r}", x.p_total * x.master_bpp / n, "param32", home=home, persistent=True)
        b.tensor(f"optim.r{r}", x.p_total * x.optim_bpp / n, "optim", home=home, persistent=True)
        if home == "nvme":
            for i, layer in enumerate(self.layers):
                b.tensor(f"ostage{i}.r{r}", layer.params / n * (x.master_bpp + x.optim_bpp), "buffer",
                         scope="step", layer=i)

    # -- streamed parameters ----------------------------------------------------------------------------
    def _fresh(self, i: int, r: int) -> list[str]:
        """What makes the home copy of layer i's parameters current (the previous step's update)."""
        task = "adam" if self.x.tier.params == "cpu" else "pw"
        return [f"{task}{j}.r{r}^1" for j in self.x.updated_with(i)]

    def upload(self, i: int, use: str, window: dict[str, list[str]]) -> dict[str, str]:
        """Sliced fetch of layer i's parameters for ``use`` ("f" or "b") from their home, after ``window`` and
        the last step's update; returns gpu -> the task its compute waits for."""
        x = self.x
        ub = x.unit_bytes(i)
        return kit.sliced_fetch(self.b, x.gpus, i, use, ub / x.n, ub, lambda r, g: window[g] + self._fresh(i, r),
                                src=x.tier.params, gather_use=False)

    def _param_deps(self, i: int, g: str, ready: dict[str, str]) -> list[str]:
        """What layer i's forward on g waits for: the last step's optimizer (1), the updated slice (2), the
        upload (3)."""
        x = self.x
        if x.level == 1:
            return [f"opt.{g}^1"]
        if x.level == 2:
            return [f"ag{i}^1"] if x.n > 1 else [f"up{i}.{g}^1"]
        return [ready[g]]

    # -- micro-step -------------------------------------------------------------------------------------
    def forward(self) -> None:
        """Per layer: its (prefetched) upload, then on every GPU its forward and, if offloaded, the copy-out."""
        b, x = self.b, self.x
        for i, layer in enumerate(self.layers):
            ready: dict[str, str] = {}
            if x.streamed:
                j, prev = x.fwd_upload_after(i)
                ready = self.upload(i, "f", {g: [f"bwd{j}.{g}@1" if prev else f"fwd{j}.{g}"] for g in x.gpus})
            gate = x.copy_out_gate(i)
            for r, g in enumerate(x.gpus):
                deps = self._param_deps(i, g, ready) + ([f"out{gate}.{g}"] if gate is not None else [])
                kit.forward(b, i, layer, g, r, deps, allocs=[(f"act{i}.{g}", g)],
                            frees=[(f"pgf{i}.{g}", g)] if x.refetched(i) else [])
                if x.offloaded(i):
                    kit.move_activation(b, f"out{i}.{g}", f"{g}.act_out", f"act{i}.{g}", g, x.opts[i].place,
                                        [f"fwd{i}.{g}"], phase=Phase.ACTIVATION_OFFLOAD, layer=i, rank=r)

    def backward(self) -> None:
        """Last layer first: fetch the activations back, recompute a checkpointed layer, backward, gradients."""
        x = self.x
        for i in x.backward_order:
            ready = {}
            if x.refetched(i):
                ready = self.upload(i, "b", {g: [f"bwd{x.bwd_upload_after(i)}.{g}"] for g in x.gpus})
            for r, g in enumerate(x.gpus):
                self._layer_backward(i, r, g, [ready[g]] if ready else [])
            self.grads(i)

    def _layer_backward(self, i: int, r: int, g: str, deps: list[str]) -> None:
        b, x = self.b, self.x
        layer = self.layers[i]
        if x.offloaded(i):
            gate = x.fetch_gate(i)
            fetch_deps = [f"out{i}.{g}"] + ([f"bwd{gate}.{g}"] if gate is not None else [])
            deps = deps + [kit.move_activation(b, f"in{i}.{g}", f"{g}.act_in", f"act{i}.{g}", x.opts[i].place, g,
                                               fetch_deps, phase=Phase.ACTIVATION_RELOAD, layer=i, rank=r)]
        if x.opts[i].mode == "ckpt":
            kit.recompute(b, i, layer, g, r, deps, flops=layer.fwd_flops)
            deps = []
        allocs = []
        if x.level >= 2:
            allocs = [(f"gb{i}.{g}", g)]
            deps = deps + kit.bucket_gate(x.backward_order, i, GRAD_BUCKETS, lambda o: f"d2h{o}.{g}")
        frees = [(f"act{i}.{g}", g)]
        if x.streamed:
            frees.append((f"pgb{i}.{g}" if x.refetched(i) else f"pgf{i}.{g}", g))
        kit.backward(b, i, layer, g, r, deps, allocs=allocs, frees=frees)

    def grads(self, i: int) -> None:
        """Level 1: all-reduce layer i's gradients; else reduce-scatter them and copy each slice to the CPU."""
        b, x = self.b, self.x
        gpus, n = x.gpus, x.n
        bwd = [f"bwd{i}.{g}" for g in gpus]
        if x.level == 1:
            if n > 1:
                kit.reduce(b, f"red{i}", "dp.grad", gpus, self.layers[i].params * x.db, bwd, coll="all_reduce",
                           layer=i)
            return
        ub = x.unit_bytes(i)
        red = kit.reduce(b, f"rs{i}", "dp.grad", gpus, ub, bwd, layer=i) if n > 1 else None
        for r, g in enumerate(gpus):
            kit.offload(b, f"d2h{i}.{g}", g, ub / n, [red or f"bwd{i}.{g}"], layer=i, rank=r,
                        frees=[(f"gb{i}.{g}", g)])

    # -- optimizer ----------------------------------------------------------------------------------------
    def gpu_optimizer(self) -> None:
        x = self.x
        for r, g in enumerate(x.gpus):
            kit.gpu_step(self.b, f"opt.{g}", f"{g}.compute", ["red0" if x.n > 1 else f"bwd0.{g}"], x.p_total, rank=r)

    def _swap_in(self, i: int, r: int) -> None:
        """Read layer i's optimizer states of rank r from NVMe once the write-back OPTIMIZER_STAGES layers before
        is done."""
        x = self.x
        kit.swap(self.b, f"or{i}.r{r}", f"nvme.io{r}", Phase.OPTIMIZER_SWAP_IN, "nvme", "cpu",
                 self.layers[i].params / x.n * (x.master_bpp + x.optim_bpp),
                 kit.read_ahead(i, OPTIMIZER_STAGES, f"ow{{}}.r{r}"), layer=i, rank=r,
                 allocs=[(f"ostage{i}.r{r}", "cpu")])

    def cpu_optimizer(self) -> None:
        """CPU Adam per layer and rank, behind that layer's gradient copy-down; NVMe swap of its states
        (two layers staged), NVMe write-back of the parameters, or re-upload of a resident copy."""
        x = self.x
        if x.tier.optim == "nvme":
            for r in range(x.n):
                for i in range(min(OPTIMIZER_STAGES, x.n_layers)):
                    self._swap_in(i, r)
        for i in range(x.n_layers):
            for r, g in enumerate(x.gpus):
                self._cpu_adam(i, r, g)
            if x.tier.params == "gpu" and x.n > 1:
                kit.all_gather(self.b, f"ag{i}", "dp.param", x.gpus, self.layers[i].params * x.db,
                               [f"up{i}.{g}" for g in x.gpus], layer=i)

    def _cpu_adam(self, i: int, r: int, g: str) -> None:
        b, x = self.b, self.x
        params = self.layers[i].params / x.n
        nvme_states = x.tier.optim == "nvme"
        kit.cpu_adam(b, f"adam{i}.r{r}", r, [f"d2h{i}.{g}"] + ([f"or{i}.r{r}"] if nvme_states else []), params,
                     layer=i)
        if nvme_states:
            kit.swap(b, f"ow{i}.r{r}", f"nvme.io{r}", Phase.OPTIMIZER_SWAP_OUT, "cpu", "nvme",
                     params * (x.master_bpp + x.optim_bpp), [f"adam{i}.r{r}"], layer=i, rank=r,
                     frees=[(f"ostage{i}.r{r}", "cpu")])
        if x.tier.params == "nvme":
            kit.swap(b, f"pw{i}.r{r}", f"nvme.io{r}", Phase.PARAM_SWAP_OUT, "cpu", "nvme", params * x.db,
                     [f"adam{i}.r{r}"], layer=i, rank=r)
        if nvme_states and i + OPTIMIZER_STAGES < x.n_layers:
            self._swap_in(i + OPTIMIZER_STAGES, r)
        if x.tier.params == "gpu":
            kit.upload(b, f"up{i}.{g}", g, params * x.db, [f"adam{i}.r{r}"], layer=i, rank=r)


# -- what the plan says about itself ------------------------------------------------------------------------
def _notes(job: Job, knobs: Knobs, s: Schedule, x: Executor) -> list[str]:
    ev, tier = s.evaluation, s.tiering
    counts: dict[str, int] = {}
    for o in x.opts:
        counts[str(o)] = counts.get(str(o), 0) + 1
    notes = [f"LazyTrain over {x.n} data-parallel GPU(s), {s.accumulation} micro-step(s) per step; tiering "
             f"{tier} (level {tier.level}); activations: "
             + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())),
             f"{'MILP' if s.milp else knobs.strategy}: recompute {ev.recompute_s:.4g} s + exposed transfer "
             f"{ev.exposed_s:.4g} s per micro-step (estimated step {s.estimate_s:.4g} s)"]
    if job.config.checkpointing != "none":
        notes.append(f"the workload's checkpointing={job.config.checkpointing} is not used: the MILP decides "
                     "per layer")
    if knobs.optimizer_8bit:
        notes.append("ASSUMPTION: 8-bit Adam states (1 B each for m and v + an fp32 scale per 2048 elements)")
    if tier.params == "gpu" and tier.optim == "gpu" and not x.offloaded_layers:
        notes.append("everything fits on the GPU: nothing is offloaded")
    cut = sorted({f"{r['tiering']}: {r['milp']['limit_hit']}" for r in s.candidates
                  if r.get("milp", {}).get("limit_hit")})
    if cut:
        notes.append("MILP stopped by a limit (" + "; ".join(cut) + "): the schedule may not be optimal"
                     + ("; the wall-clock safety net depends on the machine's load, so this plan may not "
                        "reproduce" if any(c.endswith(": time") for c in cut) else ""))
    return notes


def _info(knobs: Knobs, s: Schedule, opts: tuple[Opt, ...]) -> dict[str, Any]:
    inst = s.costs.instance
    ev = s.evaluation
    heur: dict[str, Any] = {}
    for h in HEURISTICS:
        e = evaluate(inst, heuristic(inst, h))
        heur[h] = {"feasible": e.feasible, "objective_s": e.objective, "pure_objective_s": e.pure_objective}
    milp_info: dict[str, Any]
    if s.milp is not None:
        milp_info = {**s.milp.to_dict(), "evaluated_objective_s": ev.objective,
                     "recompute_s": ev.recompute_s, "exposed_s": ev.exposed_s}
    else:
        milp_info = {"status": f"not run (strategy={knobs.strategy})"}
    return {
        "milp": milp_info,
        "lazytrain": {
            "tiering": {"params": s.tiering.params, "optimizer": s.tiering.optim, "level": s.tiering.level},
            "accumulation": s.accumulation,
            "choice": [str(o) for o in opts],
            "recompute_s_per_microstep": ev.recompute_s,
            "exposed_s_per_microstep": ev.exposed_s,
            "estimated_step_s": s.estimate_s,
            "workspace_bytes": ev.workspace,
            "staging_bytes": ev.staging,
            "pool_need_bytes": dict(ev.need),
            "pool_capacity_bytes": dict(inst.capacity),
            "fixed_gpu_bytes": dict(s.costs.fixed_gpu_parts),
            "candidates": list(s.candidates),
            "heuristics": heur,
        },
    }
