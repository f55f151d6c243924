"""``tinypipe``: heterogeneous pipeline parallelism over GPU and CPU memory (Tiny-Pipe, ACM TACO vol. 23).

Idea (abstract only, see docs/reference/policies.md; the full text was not available to us): train on
resource-constrained commodity servers with pipeline parallelism whose stages use GPU *and* CPU memory,
with (1) holistic layer packing (stage boundaries and the layers swapped together decided at once, to
cut GPU memory and keep throughput), (2) active CPU memory management (no redundant parameter copies in
DRAM, so DRAM stops being the limit), (3) layer-wise runtime swapping (weights move between DRAM and the
GPU pack by pack, prefetched and overlapped with compute). Neighbours with the same shape: Mobius (stages
kept in DRAM and prefetched to the GPU just before they run), STRONGHOLD (a sliding window of layers on
the GPU).

Our reading, as planned here:

- Pipeline: the layers (embedding, blocks, head) are split into ``stages`` contiguous stages, one per GPU;
  with fewer stages than GPUs there are ``gpus / stages`` data-parallel pipeline replicas (replica r runs
  stage s on ``gpu{r * stages + s}``). A step is every micro-batch of the global batch through the pipe
  (1F1B, PipeDream-flush, or GPipe) and then the optimizer; stage s sends its last layer's output to
  stage s+1 (NVLink, or PCIe and possibly a bounce through DRAM) and receives the gradient of it back.
- Stage modes, by a rule in this order (``policies/tinypipe/packing.py``): ``gpu`` when the stage's
  weights, gradients, fp32 master, Adam m and v, activations in flight and workspace all fit (nothing is
  offloaded that need not be; GPU Adam); else ``resident`` when 16-bit weights and gradients fit (CPU
  Adam; gradients accumulate on the GPU and go down once per step, layer by layer, then the updated
  16-bit weights are uploaded); else ``swap`` (where it needs less GPU memory than ``resident``; with one
  or two layers the swap buffers can outweigh the stage): the stage's 16-bit weights live in DRAM and are fetched
  pack by pack into GPU buffers, ``prefetch_packs`` packs ahead of the one computing, in the forward and
  again in the backward (in a forward-backward pair of 1F1B the last pack stays for the backward); a pack's
  buffer is reserved on the compute stream where its fetch may start (after the last use of the pack
  ``prefetch_packs + 1`` fetches back, or at the op's start) until its last use; each backward pack's
  gradient goes down to DRAM (the CPU accumulates micro-batches, cost not modelled), at most two gradient
  packs live, each released on the compute stream once its copy ended (before the backward two packs
  later, or at the op's end), so the GPU's peak does not depend on copy speed (``kit``); CPU Adam per
  pack after the last micro-batch writes the 16-bit weights in place in DRAM.
- Holistic packing: an exact search (``policies/tinypipe/packing.py``) picks the stage boundaries and the
  packs together, minimising the peak GPU memory of the worst stage subject to every stage's estimated
  time per micro-batch being within ``balance_tolerance`` of the best balanced partition's bottleneck;
  among equal peaks, the least bottleneck. If no partition within the tolerance fits the GPU, the tolerance is
  dropped (a note says so); if none fits at all, PlanInfeasible names the stage, its GPU and the overshoot.
- Active CPU memory management (``active_cpu_mm``): on, the 16-bit copy a stage swaps from is the buffer
  CPU Adam writes, shared by the data-parallel replicas, and no DRAM copy of GPU-resident layers exists.
  Off, every GPU process also keeps a DRAM 16-bit copy of its whole stage (for resident layers: the model
  as loaded, never released; for swapped layers: the optimizer's separate fp16 output, copied into the
  swap buffer afterwards - that CPU memcpy is not timed). ``plan.info["cpu_bytes_saved"]`` is their sum;
  both plans run the same tasks, so their peak DRAM differs by exactly that.
- CPU-side model states per stage with a CPU optimizer: fp32 master (4 B/param, none in fp32 training),
  Adam m and v (8), an fp32 gradient accumulator (4); ``resident`` uploads go through a pinned bounce
  buffer per layer, at most two per GPU.
- Tied embeddings with S > 1: the head's stage keeps its own copy of the table (weights and states,
  as Megatron does) and the two copies' gradients are summed once per step (an all-reduce between the
  two GPUs, or on the CPU when a side swaps). With one stage the head reads the embedding's table.
- Unified memory (DGX Spark): moving to the CPU frees nothing, so only ``gpu`` mode is planned, no
  swapping, and no savings are reported (``cpu_bytes_saved`` = 0, ``active_cpu_mm`` changes nothing).
- Stage modes are all-or-nothing: a stage that does not fit swaps all its packs, even where the GPU could
  keep some of them (STRONGHOLD's window would); e.g. 13b on a100-40g swaps everything and uses ~5 GB.
- NVMe is not used.

Where our reading is weakest (the paper's text would settle these; each is a knob or stated here):
- the packing objective and cost model are ours: Tiny-Pipe may optimise throughput under a memory budget
  rather than memory under a throughput tolerance, and its pack cost is unknown (we use
  ``max(compute, transfer)`` per pack plus copy latency); the three-mode rule (notably keeping the
  optimizer on the GPU when everything fits) is ours;
- which copies "active CPU memory management" removes is a guess (one fp16 copy per GPU process, i.e.
  2 B/param per replica); real frameworks may also hold pinned staging pools or fp32 gradient copies;
- we swap weights only, never activations, and do not swap gradients of resident stages per micro-batch;
- the 1F1B schedule, per-micro-batch gradient offload with CPU-side accumulation, replica placement
  and the tied-embedding handling are assumptions; so is the stage-time estimate, which ignores the
  activation sends and the once-per-step optimizer when balancing.

Knobs:
- ``stages`` (int, default 0 = auto: the fewest stages with which every stage keeps everything on its
  GPU, else the GPU count, or its largest divisor not above the layer count): pipeline stages; must
  divide the GPU count.
- ``schedule`` (1f1b | gpipe, default 1f1b): micro-batch schedule.
- ``balance_tolerance`` (float, default 0.05): how far a stage's estimated time may exceed the best
  balanced partition's bottleneck when trading time for GPU memory.
- ``prefetch_packs`` (int, default 1): packs fetched ahead of the one computing (0: fetch on demand).
- ``active_cpu_mm`` (bool, default True): no redundant 16-bit copies in DRAM.

Where each part lives: ``pipeline`` (the knobs, the cost model, stage count, partition, dropping the
tolerance, the bytes each piece holds), ``packing`` (the exact search), ``build`` (``plan``: streams, persistent
tensors, DRAM, notes and ``info``), ``emit`` (1F1B and GPipe as segments; a step recorded concretely through
kit-compatible sinks, then folded into them), ``tasks`` (per-layer compute, uploads, gradient offload and
reduction, optimizer steps: ``policies.kit`` calls; the pipeline's sends, the tied-table sum and GPipe's stash
are tinypipe's own). ``packing.solve`` keeps a bounded memo (``functools.lru_cache``) of a pure function of its
frozen ``Problem``, ``pipeline.machine_swap_rates`` one of the machine's swap rates (of its frozen
``HardwareSpec``): they change no result, only how often the same work runs.
"""

from __future__ import annotations

from policies.base import PolicyInfo, gpu_pool, pow2_divisors
from policies.tinypipe.build import plan
from policies.tinypipe.pipeline import NAME, Knobs, all_gpu_need, search, stage_count

POLICY = PolicyInfo(NAME, "pipeline over GPUs with layer packs swapped from CPU DRAM (Tiny-Pipe)", Knobs, plan,
                    __doc__ or "", search_grid=lambda n: {"stages": (0, *pow2_divisors(n))})

__all__ = ["NAME", "POLICY", "Knobs", "all_gpu_need", "gpu_pool", "plan", "search", "stage_count"]
