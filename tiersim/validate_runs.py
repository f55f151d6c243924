"""Published training runs for ``tiersim validate``: the paper's machine, model shape, batch and policy, its
figure in its own FLOP convention, and the simulated run converted with that same convention.

Two FLOP conventions are in use (both are printed for every throughput case):

- *model* FLOPs (MFU; PaLM, Megatron-LM's MFU in Korthikanti et al. 2022, llm-foundry's ``mfu``): the FLOPs
  of one forward and one backward pass, no recomputation. llm-foundry counts ``(6*P*s + 12*l*d*s^2)`` per sequence
  (``scripts/train/benchmarking/README.md``); tiersim's ``tflops_per_gpu`` / ``mfu`` count the model's
  matmuls exactly (:meth:`workloads.trace.WorkloadTrace.model_flops_per_token`).
- *hardware* FLOPs (HFU): what the GPU executes, activation-checkpointing recompute included.
  DeepSpeed's papers and Megatron-DeepSpeed count ``8*B*s*P`` per step with full checkpointing
  (``4`` passes of ``2*P`` per token: forward, recompute, backward x2); Megatron-LM (Narayanan et al. 2021,
  arXiv 2104.04473, eq. 3) counts ``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))``, recompute included;
  llm-foundry's ``hfu`` uses ``8*P*s + 16*l*d*s^2`` when it checkpoints. tiersim's ``hw_tflops_per_gpu`` /
  ``hfu`` sum the compute tasks the plan runs, recompute included.

A case compares in the convention its source published; the other convention is shown as the source
published it where it did, else converted from the published figure with the source's own formula
(marked ``*``). The simulated figures of a throughput case are converted from the simulated step time with
the source's formula (the sequences per second a run achieves do not depend on how one counts FLOPs), so
a FLOP-counting difference cannot pass for a throughput error. Nothing here is fitted: every hardware
figure comes from the preset (and the ``--set`` overrides a case names, with their source), every model
shape from the source.

Cases not here: ZeRO-Offload's scaling runs (128 GPUs with model parallelism), the rows of Megatron-LM's Table 1
with tensor or pipeline parallelism, and the Tiny-Pipe and LazyTrain abstracts, which publish no figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hardware_models import load_hardware
from policies import PlanInfeasible
from policies.base import Job
from simulator import Result, simulate_plan
from tiersim.api import JobRequest, make_job, make_plan
from workloads import ModelSpec

__all__ = ["MEGATRON", "MPT_SHAPES", "RUNS", "Run", "Throughput", "ThroughputSource", "foundry_run", "gpt_like",
           "run_feasible", "run_figures", "run_job"]

# the published machines tiersim has no preset for, as overrides of the nearest preset (each cited)
H100_SXM = ("gpu.model=H100-SXM5-80GB", "gpu.memory=81559MiB", "gpu.hbm_bw=3350GB/s")
H100_SXM_WHY = ("H100 SXM 80GB = the h200x8 node (same Hopper die, clocks and NVLink 900 GB/s) with 80 GB HBM3 at "
                "3.35 TB/s (klockwood_h100); 81559 MiB is its nvidia-smi memory.total")
A100_40GB = ("gpu.model=A100-SXM4-40GB", "gpu.memory=40960MiB", "gpu.hbm_bw=1555GB/s")
A100_40GB_WHY = "A100-40GB = the a100x8 node with the a100-40g preset's GPU memory and bandwidth"
ONE_DGX2_GPU = ("gpu.count=1",)
ONE_DGX2_GPU_WHY = ("one GPU of a DGX-2 (the ZeRO papers' machine): its 1.5 TB host and both Xeon 8168 sockets "
                    "serve the one training process")


def gpt_like(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int, *,
             dropout: bool = True) -> ModelSpec:
    """A GPT-2-style block stack (GELU MLP of 4*hidden, LayerNorm, biases, learned positions, tied embeddings):
    the Megatron-LM GPT-2 of the DeepSpeed papers and llm-foundry's MPT benchmark models. Built from its
    dimensions alone (no preset read: this module is imported with the CLI)."""
    return ModelSpec(name=name, family="gpt2", n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=heads,
                     ffn=4 * hidden, vocab=vocab, max_pos=seq, tied_embeddings=True, mlp="gelu", norm="layernorm",
                     bias=True, learned_pos=True, dropout=dropout, source=name)


@dataclass(frozen=True)
class ThroughputSource:
    """How a source counts FLOPs: ``model(P, l, h, s, V)`` and ``hardware(P, l, h, s, V, checkpointed)`` give
    FLOPs per sequence of ``s`` tokens."""

    name: str
    model: Callable[[float, int, int, int, int], float]
    hardware: Callable[[float, int, int, int, int, bool], float]


def _foundry_model(p: float, l_: int, h: int, s: int, v: int) -> float:
    return 6 * p * s + 12 * l_ * h * s * s


def _foundry_hw(p: float, l_: int, h: int, s: int, v: int, ckpt: bool) -> float:
    return (8 * p * s + 16 * l_ * h * s * s) if ckpt else _foundry_model(p, l_, h, s, v)


def _deepspeed_model(p: float, l_: int, h: int, s: int, v: int) -> float:
    return 6 * p * s


def _deepspeed_hw(p: float, l_: int, h: int, s: int, v: int, ckpt: bool) -> float:
    return (8 if ckpt else 6) * p * s


LLM_FOUNDRY = ThroughputSource("llm-foundry (6Ps + 12lds^2 per sequence; HFU 8Ps + 16lds^2 with checkpointing)",
                               _foundry_model, _foundry_hw)
def _megatron_model(p: float, l_: int, h: int, s: int, v: int) -> float:
    return 72 * l_ * h * h * s * (1 + s / (6 * h) + v / (12 * l_ * h))


def _megatron_hw(p: float, l_: int, h: int, s: int, v: int, ckpt: bool) -> float:
    return 96 * l_ * h * h * s * (1 + s / (6 * h) + v / (16 * l_ * h)) if ckpt else _megatron_model(p, l_, h, s, v)


MEGATRON = ThroughputSource("Megatron-LM (Narayanan 2021 eq. 3: 96*B*s*l*h^2*(1 + s/6h + V/16lh) per step with "
                            "recompute; MFU, Korthikanti 2022: 72*B*s*l*h^2*(1 + s/6h + V/12lh))",
                            _megatron_model, _megatron_hw)
DEEPSPEED = ThroughputSource("DeepSpeed (8*B*s*P per step with checkpointing; 6*B*s*P without recompute)",
                             _deepspeed_model, _deepspeed_hw)


@dataclass(frozen=True)
class Throughput:
    """One run's figures: model and hardware TFLOP/s per GPU and utilisation (of the dtype's dense peak)."""

    model_tflops: float
    hw_tflops: float
    mfu: float
    hfu: float
    result: Result | None = None


def peak_of(hw: str, overrides: Sequence[str], precision: str) -> float:
    return load_hardware(hw, overrides).peak_flops_for(precision)


@dataclass(frozen=True)
class Run:
    """A published training run: where it ran, what it trained, how, and what the source reports."""

    name: str
    source: str                         # citation: the table/row or sentence the figures come from
    hw: str                             # the preset
    overrides: tuple[str, ...]          # --set overrides making the preset the published machine
    hw_note: str                        # why those overrides (their source)
    model: ModelSpec
    micro: int
    global_batch: int
    seq: int
    precision: str
    ckpt: str                           # none | full
    flash: bool
    policy: str
    knobs: tuple[tuple[str, object], ...] = ()
    flops: ThroughputSource | None = None   # throughput runs: the source's FLOP convention
    convention: str = ""                # model | hardware: the one the source's headline figure uses
    mfu: float | None = None            # published, fraction of the dense peak (None: not published)
    hfu: float | None = None
    tflops: float | None = None         # published TFLOP/s per GPU in ``convention`` (when given that way)
    feasible: bool | None = None        # verdict runs: what the source trained (True) or could not (False)
    published_params: int | None = None  # the source's parameter count, which the shape must reproduce
    note: str = ""
    early_stop: bool = False            # full checkpointing as torch's non-reentrant early stop runs it


# llm-foundry's benchmark tables (scripts/train/benchmarking/README.md) come from two software stacks: the A100-80GB
# and H100 tables were measured for mosaicml/llm-foundry PR #543 (commit b2a43a1, Oct 2023) on the image
# mosaicml/pytorch:2.1.0_cu121 (its sweep.sh), the A100-40GB table before it on mosaicml/pytorch:1.13.1_cu117 (the
# previous sweep.sh). submit_benchmarks.py sets fsdp_config.activation_checkpointing_reentrant False, and torch
# 2.1 made early stop the default of its non-reentrant checkpoint (pytorch/pytorch PR #96866); torch 1.13 has none.
FOUNDRY_TORCH_2_1 = ("a100_80gb", "h100_80gb")


def _foundry(size: str, layers: int, hidden: int, heads: int, params: int, gpu: str, seq: int, micro: int,
             accum: int, ckpt: bool, mfu: float, hfu: float, *, torch_2_1: bool | None = None) -> Run:
    """An llm-foundry benchmark row; ``torch_2_1``: whether its table ran torch 2.1 (None: by ``gpu``, as the
    README's tables today, ``FOUNDRY_TORCH_2_1``)."""
    early = ckpt and (gpu in FOUNDRY_TORCH_2_1 if torch_2_1 is None else torch_2_1)
    hw, overrides, note = {"a100_80gb": ("a100x8", (), "the a100x8 preset (DGX A100 80GB)"),
                           "a100_40gb": ("a100x8", A100_40GB, A100_40GB_WHY),
                           "h100_80gb": ("h200x8", H100_SXM, H100_SXM_WHY)}[gpu]
    model = gpt_like(f"mpt-{size} (llm-foundry benchmark, {params:,} params)", layers, hidden, heads, 50368, seq,
                     dropout=False)
    return Run(
        name=f"MPT-{size} 8x {gpu.replace('_', '-').upper()} seq {seq}" + (" ckpt" if ckpt else ""),
        source=(f"llm-foundry scripts/train/benchmarking/README.md, {gpu} table, row {size} / {seq} / 8 GPUs: "
                f"MFU {mfu:.2%}, HFU {hfu:.2%}, micro-batch {micro}, accumulation {accum}, FSDP FULL_SHARD"),
        hw=hw, overrides=overrides, hw_note=note, model=model, micro=micro, global_batch=8 * micro * accum, seq=seq,
        precision="bf16", ckpt="full" if ckpt else "none", flash=True, policy="none", knobs=(("stage", 3),),
        flops=LLM_FOUNDRY, convention="model", mfu=mfu, hfu=hfu, published_params=params,
        early_stop=early,
        note="ZeRO-3 stands in for FSDP FULL_SHARD; MPT shape from the row's NumParams (GELU 4d MLP, biases, "
             "learned positions, tied 50368 vocabulary)" + (
                 "; checkpointed with torch 2.1's non-reentrant early stop (the table's image, "
                 "mosaicml/pytorch:2.1.0_cu121; its MLP down projection is not recomputed)" if early else
                 "; checkpointed on torch 1.13 (the table's image): whole blocks recomputed" if ckpt else ""))


# (layers, d_model, heads) of llm-foundry's MPT benchmark models (scripts/train/yamls/pretrain/mpt-*.yaml); each
# reproduces its table rows' NumParams exactly (tests/test_validate_table.py)
MPT_SHAPES = {"125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
              "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 64)}


def foundry_run(size: str, params: int, gpu: str, seq: int, micro: int, accum: int, ckpt: bool, mfu: float,
                hfu: float, *, torch_2_1: bool | None = None) -> Run:
    """One row of llm-foundry's benchmark tables as a throughput run (MPT shape by ``size``)."""
    layers, hidden, heads = MPT_SHAPES[size]
    return _foundry(size, layers, hidden, heads, params, gpu, seq, micro, accum, ckpt, mfu, hfu, torch_2_1=torch_2_1)


def _zero_offload_10b(published: bool) -> Run:
    return Run(
        name="ZeRO-Offload GPT-2 10B, 1x V100 (DGX-2), micro 10" + ("" if published else " (verdict)"),
        source=("ZeRO-Offload arXiv 2101.06840 abstract: 40 TFlops/GPU on a single V100 for a 10B model; shape "
                "and batch: DeepSpeed ZeRO-Offload tutorial (docs/_tutorials/zero-offload.md): 50 layers, hidden "
                "4096, 32 heads, batch 10, --checkpoint-activations, 1 GPU, V100 32GB"),
        hw="dgx2", overrides=ONE_DGX2_GPU, hw_note=ONE_DGX2_GPU_WHY,
        model=gpt_like("gpt2-10b (ZeRO-Offload tutorial)", 50, 4096, 32, 50304, 1024),
        micro=10, global_batch=10, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-offload",
        flops=DEEPSPEED if published else None, convention="hardware" if published else "",
        tflops=40.0 if published else None, feasible=None if published else True,
        note="Megatron-LM GPT-2, sequence 1024 (its default), vocabulary 50257 padded to 50304")


RUNS: tuple[Run, ...] = (
    _foundry("1b", 24, 2048, 16, 1315950592, "a100_80gb", 2048, 14, 4, False, 0.5986, 0.5986),
    _foundry("7b", 32, 4096, 32, 6658859008, "a100_80gb", 2048, 6, 2, False, 0.6423, 0.6423),
    _foundry("13b", 40, 5120, 40, 12853954560, "a100_80gb", 2048, 2, 3, False, 0.5957, 0.5957),
    _foundry("30b", 48, 7168, 64, 29975214080, "a100_80gb", 2048, 3, 21, True, 0.5530, 0.7374),
    _foundry("7b", 32, 4096, 32, 6658859008, "a100_40gb", 2048, 12, 4, True, 0.5092, 0.6789),
    _foundry("7b", 32, 4096, 32, 6658859008, "h100_80gb", 2048, 6, 1, False, 0.4644, 0.4644),
    _foundry("13b", 40, 5120, 40, 12853954560, "h100_80gb", 2048, 2, 1, False, 0.3979, 0.3979),
    _foundry("30b", 48, 7168, 64, 29975214080, "h100_80gb", 2048, 3, 21, True, 0.3811, 0.5082),
    _zero_offload_10b(published=True),
    _zero_offload_10b(published=False),
    Run(name="ZeRO-2 Offload GPT-2 40B, 1x V100 (DGX-2): does not fit",
        source=("DeepSpeed ZeRO-3 Offload post (docs/_posts/2021-03-08-zero3-offload.md): ZeRO-3 Offload "
                "'increases the size of models trainable on a single V100 from 13B to 40B' (ZeRO-2 Offload "
                "keeps the 16-bit parameters on the GPU)"),
        hw="dgx2", overrides=ONE_DGX2_GPU, hw_note=ONE_DGX2_GPU_WHY,
        model=gpt_like("gpt2-40b (shape assumed: hidden 8192, 50 layers)", 50, 8192, 64, 50304, 1024),
        micro=1, global_batch=1, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-offload",
        feasible=False, note="the post gives no shape; hidden 8192 x 50 layers = 40.3B is ours"),
    Run(name="ZeRO-3 Offload GPT-2 40B, 1x V100 + 1.5 TB CPU: fits",
        source=("DeepSpeed ZeRO-3 Offload post: 'can train models with over 40B parameters efficiently on a "
                "single GPU (e.g., 32GB V100 GPU + 1.5TB CPU memory)'"),
        hw="dgx2", overrides=ONE_DGX2_GPU, hw_note=ONE_DGX2_GPU_WHY,
        model=gpt_like("gpt2-40b (shape assumed: hidden 8192, 50 layers)", 50, 8192, 64, 50304, 1024),
        micro=1, global_batch=1, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-infinity",
        knobs=(("param_device", "cpu"), ("optimizer_device", "cpu")), feasible=True,
        note="the post gives no shape; hidden 8192 x 50 layers = 40.3B is ours"),
    Run(name="ZeRO-Offload GPT-2 13B, 1x V100 (DGX-2), micro 4: fits",
        source=("ZeRO-Offload arXiv 2101.06840: 'over 13 billion parameters on a single GPU' (abstract); Table 3: "
                "13B = 65 layers x hidden 4096, micro-batch 4 per GPU, seq 1024, fp16, checkpointing"),
        hw="dgx2", overrides=ONE_DGX2_GPU, hw_note=ONE_DGX2_GPU_WHY,
        model=gpt_like("gpt2-13b (ZeRO-Offload Table 3)", 65, 4096, 32, 50304, 1024),
        micro=4, global_batch=4, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-offload",
        feasible=True, note="heads = hidden / 128 as in the 10B tutorial run"),
    Run(name="ZeRO-Offload GPT-2 15B, 1x V100 (DGX-2): does not fit",
        source=("ZeRO-Offload arXiv 2101.06840 Table 3: the 15B model (78 layers x 4096, micro-batch 8) ran with "
                "model parallelism 2; 13B is the single-GPU maximum"),
        hw="dgx2", overrides=ONE_DGX2_GPU, hw_note=ONE_DGX2_GPU_WHY,
        model=gpt_like("gpt2-15b (ZeRO-Offload Table 3)", 78, 4096, 32, 50304, 1024),
        micro=8, global_batch=8, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-offload",
        knobs=(("tp", 1),), feasible=False, note="on one GPU (tp=1): the paper needed two"),
    Run(name="ZeRO-Infinity 100B on one DGX-2 node (params CPU, optimizer NVMe): fits",
        source=("ZeRO-Infinity arXiv 2104.07857 Fig. 5a (model size on one DGX-2 node): 100B with parameters "
                "on CPU and optimizer states on NVMe; shape from its model table: 125 layers x hidden 8192"),
        hw="dgx2", overrides=(), hw_note="the dgx2 preset (16x V100-32GB, 1.5 TB DRAM, NVMe)",
        model=gpt_like("gpt-100b (ZeRO-Infinity)", 125, 8192, 64, 50304, 1024),
        micro=1, global_batch=16, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-infinity",
        knobs=(("param_device", "cpu"), ("optimizer_device", "nvme")), feasible=True),
    Run(name="ZeRO-Infinity 1T on one DGX-2 node (NVMe): fits",
        source=("ZeRO-Infinity arXiv 2104.07857 Fig. 5a and SC21 slides (DeepSpeed "
                "docs/assets/files/SC21-ZeRO-Infinity.pdf: '1T params on a single node', NVMe+CPU+GPU); shape "
                "from its model table: 128 layers x hidden 25600"),
        hw="dgx2", overrides=(), hw_note="the dgx2 preset (16x V100-32GB, 1.5 TB DRAM, NVMe)",
        model=gpt_like("gpt-1t (ZeRO-Infinity)", 128, 25600, 200, 50304, 1024),
        micro=1, global_batch=16, seq=1024, precision="fp16", ckpt="full", flash=False, policy="zero-infinity",
        knobs=(("param_device", "nvme"), ("optimizer_device", "nvme")), feasible=True),
    Run(name="SynergyScale 114.41B on one A100-80GB: fits",
        source=("SynergyScale abstract (seed): 'can train a 114.41B-parameter model on a single 80 GB NVIDIA "
                "A100 GPU'"),
        hw="a100", overrides=(), hw_note="the a100 preset: the abstract names no host and none was found (searched: "
                                         "no full text, no public code); the preset's 256 GB DRAM and one 3.84 TB "
                                         "NVMe drive are its own assumptions, kept (the verdict does not hinge on "
                                         "DRAM: 188 GB peak)",
        model=gpt_like("gpt-114b (shape assumed: hidden 12288, 63 layers)", 63, 12288, 96, 50304, 1024),
        micro=1, global_batch=1, seq=1024, precision="bf16", ckpt="full", flash=True, policy="synergyscale",
        feasible=True, note="the abstract gives no shape; hidden 12288 x 63 layers = 114.8B is ours"),
    Run(name="SynergyScale 547.77B on 8x A100-80GB: fits",
        source="SynergyScale abstract (seed): 'a 547.77B-parameter model on eight A100 GPUs'",
        hw="a100x8", overrides=(), hw_note=("the a100x8 preset (DGX A100 80GB: 2 TB DRAM, 8 x 3.84 TB NVMe; the "
                                            "abstract names no host and none was found, so the product's own is "
                                            "assumed)"),
        model=gpt_like("gpt-548b (shape assumed: hidden 20480, 109 layers)", 109, 20480, 160, 50304, 1024),
        micro=1, global_batch=8, seq=1024, precision="bf16", ckpt="full", flash=True, policy="synergyscale",
        feasible=True, note="the abstract gives no shape; hidden 20480 x 109 layers = 548.6B is ours"),
)


def run_job(run: Run) -> Job:
    """The job of ``run``: its machine (preset and overrides), model and workload as published."""
    job, _ = make_job(run.hw, run.model, JobRequest(micro_batch=run.micro, global_batch=run.global_batch,
                                                    seq_len=run.seq, precision=run.precision, checkpointing=run.ckpt,
                                                    flash_attention=run.flash, checkpoint_early_stop=run.early_stop),
                      hw_overrides=run.overrides)
    return job


def run_figures(run: Run) -> Throughput:
    """Simulate a throughput run and express its throughput in its source's convention (model and hardware)."""
    source = run.flops
    assert source is not None
    job = run_job(run)
    res = simulate_plan(make_plan(job, run.policy, dict(run.knobs)), job.hw)
    if res.step_time_s <= 0:  # the timing of a run that does not fit is still reported (the verdict is its own case)
        return Throughput(0.0, 0.0, 0.0, 0.0, res)
    seqs_per_s_per_gpu = res.tokens_per_s / run.seq / res.n_gpus
    m = run.model
    args = (float(m.params()), m.n_layers, m.hidden, run.seq, m.vocab)
    model_flops = source.model(*args) * seqs_per_s_per_gpu
    hw_flops = source.hardware(*args, run.ckpt == "full") * seqs_per_s_per_gpu
    peak = job.hw.peak_flops_for(run.precision)
    return Throughput(model_flops / 1e12, hw_flops / 1e12, model_flops / peak, hw_flops / peak, res)


def run_feasible(run: Run) -> tuple[bool, str]:
    """The verdict on a run (fits or not) and, when it does not, what is over and by how much."""
    job = run_job(run)
    try:
        res = simulate_plan(make_plan(job, run.policy, dict(run.knobs)), job.hw)
    except PlanInfeasible as e:
        return False, str(e)
    if res.oom is None:
        return True, ""
    o = res.oom
    return False, f"{o.pool} over by {o.over_by_bytes / 1e9:,.1f} GB"


def published_both(run: Run) -> tuple[float, float, str]:
    """(MFU, HFU) as the source published them; one it did not publish is converted from the other with the
    source's own formula. The third item names the converted one ("mfu", "hfu" or "")."""
    assert run.flops is not None
    args = (float(run.model.params()), run.model.n_layers, run.model.hidden, run.seq, run.model.vocab)
    ratio = run.flops.model(*args) / run.flops.hardware(*args, run.ckpt == "full")  # model / hardware FLOPs
    mfu, hfu = run.mfu, run.hfu
    if run.tflops is not None:
        util = run.tflops * 1e12 / peak_of(run.hw, run.overrides, run.precision)
        mfu, hfu = (util, None) if run.convention == "model" else (None, util)
    if mfu is None and hfu is not None:
        return hfu * ratio, hfu, "mfu"
    if hfu is None and mfu is not None:
        return mfu, mfu / ratio, "hfu"
    assert mfu is not None and hfu is not None
    return mfu, hfu, ""


# --- multi-node runs (issue 13, added by the `nodes` work): machines joined by the preset's inter-node network ---
def _foundry_two_nodes() -> Run:
    """llm-foundry's MPT-1B on 16x A100-40GB, two DGX A100 nodes "with 1600 Gbps node-node interconnect (RoCE)",
    i.e. 8x 200 Gb/s per node: the a100x8 preset's network (naddod_gpu_nic)."""
    model = gpt_like("mpt-1b (llm-foundry benchmark, 1,315,950,592 params)", 24, 2048, 16, 50368, 2048,
                     dropout=False)
    return Run(
        name="MPT-1b 16x A100-40GB (2 nodes) seq 2048",
        source=("llm-foundry scripts/train/benchmarking/README.md, 'A100 40GB with 1600 Gbps node-node interconnect "
                "(RoCE)' table, row 1b / 2048 / 16 GPUs: MFU 55.69%, HFU 55.69%, micro-batch 8, accumulation 1, "
                "global batch 128, FSDP FULL_SHARD, no activation checkpointing"),
        hw="a100x8", overrides=(*A100_40GB, "nodes=2"),
        hw_note=A100_40GB_WHY + "; two such nodes on the preset's 8x 200 Gb/s network (1600 Gbps per node)",
        model=model, micro=8, global_batch=128, seq=2048, precision="bf16", ckpt="none", flash=True, policy="none",
        knobs=(("stage", 3),), flops=LLM_FOUNDRY, convention="model", mfu=0.5569, hfu=0.5569,
        published_params=1315950592,
        note="ZeRO-3 stands in for FSDP FULL_SHARD over all 16 GPUs (its collectives hierarchical: NVLink inside a "
             "node, the NICs between the two); MPT shape from the row's NumParams")


RUNS = (*RUNS, _foundry_two_nodes())


# --- PatrickStar (github.com/Tencent/PatrickStar) -------------------------------------------------------------------
PATRICKSTAR_SOURCE = ("Tencent/PatrickStar README.md ('train 68B model on 8xA100 with 1TB CPU memory', a single node "
                      "of A100 SuperPod) and doc/one_node_perf_a100.png ('Evaluation on 8xA100 1TB Memory SuperPod "
                      "Node': pstar-8-gpu up to 68B, pstar-1-gpu up to 50B); shapes: examples/model_builder.py")
PATRICKSTAR_HOST = ("host.dram=1TB",)
PATRICKSTAR_HOST_WHY = ("the a100x8 preset with the README's 1 TB of CPU memory; the figure does not say the GPUs' "
                        "memory, so the preset's A100-80GB is kept (with A100-40GB GPUs both verdicts are the same: "
                        "checked)")
PATRICKSTAR_NOTE = ("synergyscale without its NVMe tier (nvme_fraction=0) stands in for PatrickStar's chunk placement: "
                    "model states partitioned over the GPUs' spare HBM and the host, each updated where it lives; it "
                    "keeps a gradient apart (16-18 B/param) where PatrickStar's fp16 gradient overwrites its "
                    "parameter's fp16 chunk (patrickstar/core/hook.py; chunk types fp16, fp32, momentum, variance in "
                    "core/const.py: 14 B/param), so it is the stricter of the two. The micro-batch of these points is "
                    "not published; 4 is the smallest the benchmark scripts (examples/benchmark) sweep")


def _patrickstar(size: str, layers: int, hidden: int, gpus: int) -> Run:
    return Run(
        name=f"PatrickStar GPT {size} on {gpus}x A100 + 1 TB DRAM: fits",
        source=PATRICKSTAR_SOURCE + f" GPT_DS_{size}: {layers} layers x hidden {hidden}, 16 heads, seq 1024",
        hw="a100x8", overrides=PATRICKSTAR_HOST if gpus == 8 else (f"gpu.count={gpus}", *PATRICKSTAR_HOST),
        hw_note=PATRICKSTAR_HOST_WHY + ("" if gpus == 8 else f"; {gpus} GPU(s) of that node"),
        model=gpt_like(f"gpt-ds-{size.lower()} (PatrickStar GPT_DS_{size})", layers, hidden, 16, 50304, 1024),
        micro=4, global_batch=4 * gpus, seq=1024, precision="fp16", ckpt="full", flash=False, policy="synergyscale",
        knobs=(("nvme_fraction", "0"),), feasible=True, note=PATRICKSTAR_NOTE)


RUNS = (*RUNS, _patrickstar("68B", 66, 9216, 8), _patrickstar("50B", 62, 8192, 1))


# --- Megatron-LM (Narayanan et al. 2021, arXiv 2104.04473) ----------------------------------------------------------
def _megatron_1_7b() -> Run:
    """Table 1's first row: the one without tensor or pipeline parallelism (data parallelism over 32 GPUs)."""
    return Run(
        name="Megatron-LM GPT 1.7B 32x A100-80GB (4 nodes), batch 512",
        source=("Narayanan et al. 2021 (Megatron-LM, arXiv 2104.04473) Table 1, first row: 1.7B, 24 heads, hidden "
                "2304, 24 layers, tensor parallel 1, pipeline parallel 1, 32 GPUs, batch 512, 137 teraFLOP/s per GPU "
                "(44% of peak), activation recomputation, seq 2048, vocabulary 51200, Selene (DGX A100 80GB, "
                "8x 200 Gb/s HDR InfiniBand per node)"),
        hw="a100x8", overrides=("nodes=4",),
        hw_note="four a100x8 nodes (DGX A100 80GB) on the preset's 8x 200 Gb/s network, as Selene's",
        model=gpt_like("gpt-1.7b (Megatron-LM Table 1)", 24, 2304, 24, 51200, 2048),
        micro=16, global_batch=512, seq=2048, precision="fp16", ckpt="full", flash=False, policy="none",
        knobs=(("stage", 0),), flops=MEGATRON, convention="hardware", tflops=137.0,
        note="plain data parallelism (ZeRO stage 0) as Megatron-LM's DDP; the micro-batch is not in Table 1: 16 = "
             "the batch over 32 replicas without accumulation (4 and 8 give the same verdict: +9.0% and +11.0%). No "
             "FlashAttention (2021): the a*s^2*b attention scores are materialised and their softmax/dropout "
             "traffic priced (workloads.ops), which moved this row from +36.8% to +12.4%")


RUNS = (*RUNS, _megatron_1_7b())
