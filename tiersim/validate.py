"""``tiersim validate``: the simulator against published figures, each cited, with a stated tolerance.

Every case runs the real pipeline (hardware preset -> workload trace -> policy -> plan -> SimPy engine)
and reads the figure off the simulated Result, so a change anywhere in that chain that moves a figure
away from its published value fails the check. Three kinds of case:

- *figures*: one mechanism against its published number (bytes per parameter, seconds of CPU Adam, GB/s);
- *throughput* of a published training run (:mod:`tiersim.validate_runs`: the source's machine, model
  shape, batch and parallelism), compared in the FLOP convention the source used and shown in both
  (model FLOPs / MFU and hardware FLOPs / HFU);
- *verdicts*: a configuration a published system trained must fit here, one it reports as impossible
  must not (exact).

A case the simulator is known to miss carries ``known_gap`` (why, in one line): it is printed as such,
it does not fail the command, and the suite checks that it still misses, so a fix has to retire the mark
and keep the table honest. Nothing is fitted per case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from hardware_models import load_hardware
from simulator import Plan, Result, Segment, StreamSpec, TaskSpec, simulate_plan
from simulator.plan_workload import PlanWorkload
from tiersim.api import JobRequest, make_job, make_plan
from tiersim.validate_runs import RUNS, Run, Throughput, run_feasible, run_figures
from workloads import WorkloadConfig, load_model

THROUGHPUT_TOLERANCE = 0.15  # the bar for throughput against a published run


@dataclass(frozen=True)
class Case:
    name: str
    source: str            # citation of the published figure
    published: float
    unit: str
    tolerance: float       # relative
    measure: Callable[[], float]
    note: str = ""
    known_gap: str = ""    # why the simulator misses this case today ("" = it must be within tolerance)
    run: Run | None = None  # a published training run (throughput or verdict case)

    @property
    def kind(self) -> str:
        if self.run is None:
            return "figure"
        return "throughput" if self.run.flops is not None else "verdict"


@dataclass(frozen=True)
class Outcome:
    case: Case
    simulated: float
    figures: Throughput | None = None  # throughput cases: the simulated run in both conventions
    why: str = ""                      # verdict cases: what did not fit

    @property
    def error(self) -> float:
        if self.case.kind == "verdict":
            return 0.0 if self.simulated == self.case.published else 1.0
        return (self.simulated - self.case.published) / self.case.published

    @property
    def ok(self) -> bool:
        return abs(self.error) <= self.case.tolerance

    @property
    def expected(self) -> bool:
        """Within tolerance, or outside it as its ``known_gap`` says."""
        return self.ok != bool(self.case.known_gap)


def initial_bytes(result: Result, pool: str, kinds: tuple[str, ...]) -> float:
    """The floor of the given kinds' bytes in ``pool`` once the run is going: the persistent model states
    without the transient buffers (gathered parameters, gradient buckets) that come and go on top."""
    latest: dict[str, float] = {}
    floor = float("inf")
    for t, kind, v in result.memory_series[pool]:
        latest[kind] = v
        if t > 0:
            floor = min(floor, sum(latest.get(k, 0.0) for k in kinds))
    return floor if floor != float("inf") else sum(latest.get(k, 0.0) for k in kinds)


STATES = ("param16", "grad", "param32", "optim")


def _zero_stage_bytes_per_param(stage: int) -> float:
    job, _ = make_job("a100x8", "gpt2-xl", JobRequest(global_batch=8, seq_len=1024))
    res = simulate_plan(make_plan(job, "none", {"stage": stage}), job.hw)
    return initial_bytes(res, "gpu0", STATES) / job.trace.params


def _zero_offload_gpu_bytes_per_param() -> float:
    job, _ = make_job("a100x8", "7b", JobRequest(global_batch=8, seq_len=1024))
    res = simulate_plan(make_plan(job, "zero-offload", {"tp": 1}), job.hw)
    return initial_bytes(res, "gpu0", ("param16",)) / job.trace.params


def _zero_offload_cpu_bytes_per_param() -> float:
    job, _ = make_job("a100x8", "7b", JobRequest(global_batch=8, seq_len=1024))
    res = simulate_plan(make_plan(job, "zero-offload", {"tp": 1, "cpu_param_copy_per_rank": True}), job.hw)
    return initial_bytes(res, "cpu", ("param32", "optim", "grad32", "buffer")) / job.trace.params


def _bench_workload(precision: str) -> PlanWorkload:
    """The workload named by a one-task benchmark plan (its task carries no layer tag: priced by its size)."""
    return PlanWorkload(load_model("gpt2"), WorkloadConfig(seq_len=1024, precision=precision),
                        "validate: one-task benchmark plan")


def _cpu_adam_seconds(params: float) -> float:
    hw = load_hardware("dgx2")
    plan = Plan(policy="validate", knobs={}, hardware=hw, workload=_bench_workload("fp16"), tensors=(),
                streams=(StreamSpec("cpu.adam0", "cpu", "optim"),),
                segments=(Segment("opt", 1, (TaskSpec("adam", "optimizer", "cpu.adam0", params=params),)),),
                steps=1, metrics={"n_gpus": 1.0})
    return simulate_plan(plan, hw).step_time_s


def _copy_gbps(both: bool) -> float:
    hw = load_hardware("a100")
    hw = replace(hw, pcie=replace(hw.pcie, latency_s=0.0))
    n = 1 << 30
    tasks = [TaskSpec("h2d", "copy", "h2d", src="cpu", dst="gpu0", bytes=float(n))]
    if both:
        tasks.append(TaskSpec("d2h", "copy", "d2h", src="gpu0", dst="cpu", bytes=float(n)))
    plan = Plan(policy="validate", knobs={}, hardware=hw, workload=_bench_workload("bf16"), tensors=(),
                streams=(StreamSpec("h2d", "gpu0", "h2d"), StreamSpec("d2h", "gpu0", "d2h")),
                segments=(Segment("copy", 1, tuple(tasks)),), steps=1, metrics={"n_gpus": 1.0})
    res = simulate_plan(plan, hw)
    return n * len(tasks) / res.step_time_s / 1e9


def _korthikanti_gpt3_block_ratio() -> float:
    """Simulated activation bytes of one GPT-3 175B block / s*b*h*(34 + 5*a*s/h) (no ckpt, no flash)."""
    two_blocks = replace(load_model("175b"), n_layers=2)  # the per-block figure does not depend on depth
    job, _ = make_job("a100", two_blocks, JobRequest(global_batch=1, seq_len=2048, checkpointing="none",
                                                     flash_attention=False))
    plan = make_plan(job, "none")
    act = plan.tensor_map()["act1.gpu0"].bytes  # block0 is layer 1 (layer 0 is the embedding)
    m = job.model
    s, b, h, a = 2048, 1, m.hidden, m.n_heads
    return act / (s * b * h * (34 + 5 * a * s / h))


def _mfu_llama7b_8xa100() -> float:
    job, _ = make_job("a100x8", "7b", JobRequest(micro_batch=4, seq_len=2048, global_batch=256,
                                                checkpointing="none"))
    return simulate_plan(make_plan(job, "none", {"stage": 3}), job.hw).mfu


CASES: tuple[Case, ...] = (
    Case("ZeRO stage 0 model states per GPU", "ZeRO arXiv 1910.02054 §3.1/§5: 16 B/param", 16.0, "B/param", 0.005,
         lambda: _zero_stage_bytes_per_param(0)),
    Case("ZeRO stage 1, Nd=8", "ZeRO §5: 4 + 12/Nd B/param", 4 + 12 / 8, "B/param", 0.005,
         lambda: _zero_stage_bytes_per_param(1)),
    Case("ZeRO stage 2, Nd=8", "ZeRO §5: 2 + 14/Nd B/param", 2 + 14 / 8, "B/param", 0.005,
         lambda: _zero_stage_bytes_per_param(2)),
    Case("ZeRO stage 3, Nd=8", "ZeRO §5: 16/Nd B/param", 16 / 8, "B/param", 0.005,
         lambda: _zero_stage_bytes_per_param(3)),
    Case("ZeRO-Offload GPU model states", "DeepSpeed estimate_zero2_model_states_mem_needs (offload): 2*P per GPU",
         2.0, "B/param", 0.005, _zero_offload_gpu_bytes_per_param),
    Case("ZeRO-Offload CPU model states, 8 GPUs", "DeepSpeed estimator: P*max(4*N_gpu,16)*1.5 = 48*P for N=8",
         48.0, "B/param", 0.005, _zero_offload_cpu_bytes_per_param,
         "with knob cpu_param_copy_per_rank=true (16 B/param of states + 4 B/param per rank's fp32 copy); "
         "by default tiersim counts 16 B/param, as after initialisation"),
    Case("CPU Adam, 1B params, DGX-2 host", "ZeRO-Offload arXiv 2101.06840 Table 4: 0.22 s", 0.22, "s", 0.25,
         lambda: _cpu_adam_seconds(1e9), "the preset's rate is fitted to Table 4's 10B figure (2.57 s)"),
    Case("CPU Adam, 10B params, DGX-2 host", "ZeRO-Offload Table 4: 2.57 s", 2.57, "s", 0.02,
         lambda: _cpu_adam_seconds(1e10)),
    Case("A100 pinned H2D, 1 GiB", "nvbandwidth issue #53/#42: 24.8-25.1 GB/s", 24.9, "GB/s", 0.03,
         lambda: _copy_gbps(False)),
    Case("A100 H2D+D2H together, sum", "nvbandwidth issue #53: D2H ~24 + H2D ~11 GB/s", 35.0, "GB/s", 0.05,
         lambda: _copy_gbps(True), "the split differs: max-min sharing gives 17.5 each, the hardware 24 + 11"),
    Case("GPT-3 175B block activations", "Korthikanti arXiv 2205.05198 Table 2: sbh(34+5as/h)", 1.0, "ratio", 0.001,
         _korthikanti_gpt3_block_ratio),
    Case("MFU, 7B on 8x A100-80GB, seq 2048, FSDP", "llm-foundry benchmarks (MPT-7B): 64%", 0.64, "fraction",
         0.20, _mfu_llama7b_8xa100, "LLaMA-2-7B stands in for MPT-7B; ZeRO-3 stands in for FSDP"),
)


def _run_case(run: Run, known_gap: str = "") -> Case:
    if run.flops is None:
        assert run.feasible is not None
        return Case(run.name, run.source, 1.0 if run.feasible else 0.0, "verdict", 0.0, lambda: 0.0, run.note,
                    known_gap, run)
    published: float | None = run.tflops
    unit = f"TFLOP/s ({run.convention})"
    if published is None:
        published = run.mfu if run.convention == "model" else run.hfu
        unit = "MFU" if run.convention == "model" else "HFU"
    assert published is not None
    return Case(run.name, run.source, published, unit, THROUGHPUT_TOLERANCE, lambda: 0.0, run.note, known_gap, run)


# why the simulator misses a published run today (one line each; the suite checks that each still misses)
KNOWN_GAPS: dict[str, str] = {}

RUN_CASES: tuple[Case, ...] = tuple(_run_case(r, KNOWN_GAPS.get(r.name, "")) for r in RUNS)
ALL_CASES: tuple[Case, ...] = CASES + RUN_CASES


def _compared(case: Case, t: Throughput) -> float:
    run = case.run
    assert run is not None
    if run.tflops is not None:
        return t.model_tflops if run.convention == "model" else t.hw_tflops
    return t.mfu if run.convention == "model" else t.hfu


def run_case(case: Case) -> Outcome:
    run = case.run
    if run is None:
        return Outcome(case, case.measure())
    if run.flops is None:
        fits, why = run_feasible(run)
        return Outcome(case, 1.0 if fits else 0.0, why=why)
    t = run_figures(run)
    return Outcome(case, _compared(case, t), figures=t)


def run_cases(cases: tuple[Case, ...] = ALL_CASES) -> list[Outcome]:
    return [run_case(c) for c in cases]
