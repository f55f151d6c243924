"""``tinypipe.plan``: the decisions (``decide``), the DRAM check, then the plan's streams, persistent tensors
and tasks (``stage``, ``optimizer``), and what the plan reports of itself (notes and ``info``)."""

from __future__ import annotations

from typing import Any

from hardware_models import build_topology
from policies import kit
from policies.base import Job, PlanInfeasible, unified
from policies.builder import PlanBuilder
from policies.tinypipe.cost_model import ADAM_BYTES, GRAD32_BYTES, dram_bytes, master_bytes, table_params
from policies.tinypipe.decide import Decision, decide
from policies.tinypipe.emit import Ev, Key, Recorder
from policies.tinypipe.knobs import NAME, Knobs
from policies.tinypipe.optimizer import OptimizerSegment
from policies.tinypipe.packing import MODES, StagePlan
from policies.tinypipe.pipeline import Pipeline
from policies.tinypipe.schedule import make_schedule
from policies.tinypipe.stage import StageRun
from simulator import Plan
from simulator.phase import Phase

PIPE_STREAMS = (("fsend", "copy"), ("bsend", "copy"))   # activations to the next stage, gradients back
CPU_STREAMS = (("adam", "optim"),)                       # a CPU-optimised stage's Adam, per GPU rank


def plan(job: Job, knobs: Knobs) -> Plan:
    knobs.validate()
    d = decide(job, knobs)
    pipe = Pipeline(job.trace.layers, d.solution.stages, d.dp, d.accumulation,
                    make_schedule(knobs.schedule, d.stages, d.accumulation), knobs.prefetch_packs, knobs.gpipe,
                    job.model.tied_embeddings, table_params(job), kit.dtype_bytes(job), knobs.active_cpu_mm,
                    unified(job))
    dram = dram_bytes(pipe, job)
    if not pipe.unified:
        check_dram(job, dram)
    b = PlanBuilder(NAME, knobs, job)
    declare_gpu_side(b, pipe, master_bytes(job))
    declare_cpu_side(b, pipe, master_bytes(job))
    emit_step(b, pipe)
    return b.build(steps=2, notes=notes(job, knobs, d), info=info(pipe, knobs, d, dram))


def check_dram(job: Job, dram: dict[str, float]) -> None:
    """PlanInfeasible when the CPU-side model states overflow DRAM (before anything is simulated)."""
    topo = build_topology(job.hw)
    cap = topo.pools[topo.pool_of["cpu"]].capacity_bytes
    need = sum(dram.values())
    if need > cap:
        raise PlanInfeasible(NAME, topo.pool_of["cpu"], need, cap,
                             "the CPU-side model states (fp32 master, Adam m/v, fp32 gradients, swapped "
                             "16-bit weights" + (", redundant 16-bit copies" if dram["naive16"] else "") + ")")


# -- streams and persistent tensors -------------------------------------------------------------------------
def declare_gpu_side(b: PlanBuilder, pipe: Pipeline, master: float) -> None:
    """Per GPU: its streams (the kit's compute, h2d, d2h and the pipeline's sends), workspace, the stage's
    resident weights, gradients and (``gpu`` mode) states."""
    for r in range(pipe.dp):
        for st in pipe.stages:
            g = pipe.gpu(r, st.index)
            kit.gpu_streams(b, [g], extra=PIPE_STREAMS)
            if st.mode != "gpu":
                kit.cpu_streams(b, [pipe.rank(r, st.index)], CPU_STREAMS)
            b.tensor(f"ws.{g}", pipe.workspace(st), "buffer", home=g, persistent=True)
            if st.mode != "swap":
                b.tensor(f"p16.{g}", pipe.stage_bytes(st), "param16", home=g, persistent=True)
                b.tensor(f"g16.{g}", pipe.stage_bytes(st), "grad", home=g, persistent=True)
            if st.mode == "gpu":
                p = pipe.stage_params(st)
                if master:
                    b.tensor(f"m32.{g}", master * p, "param32", home=g, persistent=True)
                b.tensor(f"adam.{g}", ADAM_BYTES * p, "optim", home=g, persistent=True)
            if not pipe.active_cpu_mm and not pipe.unified:
                b.tensor(f"naive16.{g}", pipe.stage_bytes(st), "param16", home="cpu", persistent=True)


def declare_cpu_side(b: PlanBuilder, pipe: Pipeline, master: float) -> None:
    """Per stage: its data-parallel stream, and the CPU-side states and pack homes of a CPU optimizer."""
    for st in pipe.stages:
        s = st.index
        if pipe.dp > 1:
            b.stream(f"dp{s}", pipe.gpu(0, s), "comm")
        if st.mode == "gpu":
            continue
        p = pipe.stage_params(st)
        if master:
            b.tensor(f"m32.s{s}", master * p, "param32", home="cpu", persistent=True)
        b.tensor(f"adam.s{s}", ADAM_BYTES * p, "optim", home="cpu", persistent=True)
        b.tensor(f"gr32.s{s}", GRAD32_BYTES * p, "grad32", home="cpu", persistent=True)
        if st.mode == "swap":
            for k, (u, t) in enumerate(st.packs):
                b.tensor(f"home.s{s}.p{k}", pipe.pack_home_bytes(s, u, t), "param16", home="cpu", persistent=True)
    if pipe.tied and pipe.S > 1:
        for r in range(pipe.dp):
            b.stream(f"tie{r}", pipe.gpu(r, 0), "comm")


# -- the step -------------------------------------------------------------------------------------------------
def emit_step(b: PlanBuilder, pipe: Pipeline) -> None:
    """GPipe's stash, every stage of every replica through the schedule, the optimizer; then the segments."""
    rec = Recorder(b, pipe.schedule)
    if pipe.gpipe:
        for r in range(pipe.dp):
            for st in pipe.stages:
                stash(rec, pipe, r, st)
    final_bwd: dict[Key, Ev] = {}
    final_d2h: dict[Key, Ev] = {}
    for r in range(pipe.dp):
        for st in pipe.stages:
            StageRun(rec, pipe, r, st, final_bwd, final_d2h).run()
    OptimizerSegment(rec, pipe, final_bwd, final_d2h).run()
    rec.emit()


def stash(rec: Recorder, pipe: Pipeline, r: int, st: StagePlan) -> None:
    """GPipe: all M micro-batches' activations of the stage, allocated once per step."""
    g = pipe.gpu(r, st.index)
    act = sum(pipe.layers[x].activation_bytes for x in range(st.first, st.last + 1))
    rec.tensor(f"stash.{g}", act * pipe.M, "activation", "step")
    rec.ev(f"stalloc.{g}", 0, 0, "alloc", f"{g}.compute", allocs=[(f"stash.{g}", g)],
           tags={"stage": st.index, "rank": r, "phase": Phase.ACTIVATION_STASH})


# -- what the plan says of itself ------------------------------------------------------------------------------
def notes(job: Job, knobs: Knobs, d: Decision) -> list[str]:
    stages = d.solution.stages
    modes = [st.mode for st in stages]
    swapped = sum(st.last - st.first + 1 for st in stages if st.mode == "swap")
    out = [f"{d.stages} pipeline stage(s) x {d.dp} data-parallel replica(s), {knobs.schedule}, "
           f"{d.accumulation} micro-batch(es) per step; stage modes "
           f"{', '.join(f'{m}={modes.count(m)}' for m in MODES if m in modes)}; "
           f"{swapped} of {len(job.trace.layers)} layers swapped from DRAM", *d.notes]
    all_gpu = all(m == "gpu" for m in modes)
    if not knobs.stages and job.n_gpus > d.stages:
        out.append(f"stages=auto: {d.stages} stage(s) x {d.dp} data-parallel replica(s): "
                   + ("every stage fits on its GPU with fewer stages than GPUs" if all_gpu else
                      f"the model has {len(job.trace.layers)} layers for {job.n_gpus} GPUs"))
    if unified(job):
        out.append("unified memory: GPU and CPU share one pool, so moving anything to the CPU frees nothing; "
                   "everything stays GPU-side (no swapping, GPU Adam) and no CPU savings are reported")
    elif all_gpu:
        out.append("every stage fits the GPU with its optimizer states: nothing is offloaded")
    return out


def info(pipe: Pipeline, knobs: Knobs, d: Decision, dram: dict[str, float]) -> dict[str, Any]:
    sol = d.solution
    if pipe.unified:
        saved = 0.0
    elif not pipe.active_cpu_mm:
        saved = dram["naive16"]
    else:
        saved = pipe.dp * sum(pipe.stage_bytes(st) for st in sol.stages)
    partition = [{
        "stage": st.index, "gpus": [pipe.gpu(r, st.index) for r in range(pipe.dp)],
        "layers": [st.first, st.last], "names": pipe.describe(st), "mode": st.mode,
        "packs": [[u, t] for u, t in st.packs] if st.mode == "swap" else [],
        "est_time_s": st.time_s, "est_gpu_bytes": st.mem_bytes,
    } for st in sol.stages]
    return {
        "stages": d.stages, "dp": d.dp, "accumulation": d.accumulation, "schedule": knobs.schedule,
        "partition": partition, "t_star_s": sol.t_star, "time_bound_s": sol.bound,
        "bottleneck_s": sol.bottleneck_s, "est_peak_gpu_bytes": sol.peak_bytes,
        "tolerance_dropped": d.tolerance_dropped, "cpu_bytes_saved": saved, "cpu_bytes": dram,
        "swapped_layers": sum(st.last - st.first + 1 for st in sol.stages if st.mode == "swap"),
        "search_evaluations": sol.evaluations,
    }
