"""``zero-infinity``: ZeRO-3 with parameters and optimizer states on CPU or NVMe (Rajbhandari et al. 2021,
arXiv 2104.07857; DeepSpeed stage 3 with ``offload_param`` and ``offload_optimizer``).

Idea: partition every model state over all data-parallel ranks (ZeRO-3) and keep it off the GPU. Each layer's fp16/bf16
parameters are fetched just before use, every rank fetching only its ``1/dp`` slice from its home (NVMe -> pinned CPU
buffer -> GPU, or CPU -> GPU), all ranks in parallel, then an all-gather over the ranks (NVLink on a DGX, PCIe on
commodity boxes) assembles the full layer on every GPU ("bandwidth-centric partitioning": the aggregate PCIe/NVMe
bandwidth of all ranks is used, not one link). A prefetcher overlaps these fetches with compute; gradients are
reduce-scattered and offloaded during the backward; the optimizer step runs on the CPU per sub-group, streaming fp32
states from NVMe.

Our reading and assumptions (see docs/reference/policies.md):
- dp = the GPU count, no tensor parallelism; ``accumulation`` micro-steps per step. One layer of the workload trace
  (embedding, each block, head) is one unit of fetch, gather, release and gradient reduction (DeepSpeed works per
  parameter tensor and bucket; we do not model its ``prefetch_bucket_size`` or ``param_persistence_threshold``: every
  layer is partitioned).
- Use order per micro-step: forward of layers 0..L-1, then recompute+backward of L-1..0; every use (forward and
  backward, the last layer included) fetches and gathers the layer again and frees it after use. DeepSpeed's
  ``max_reuse_distance`` would keep the last layer between its forward and backward; we re-fetch it (a small
  overestimate of traffic).
- Prefetch as dependencies: the fetch for use ``u`` may start once use ``u - d`` has started, i.e. it depends on the end
  of the compute of use ``u - d - 1`` (on every rank, for a collective), plus the in-order streams: NVMe->CPU reads with
  ``d = nvme_prefetch``, CPU->GPU copies with ``cpu_prefetch``, all-gathers with ``gather_prefetch``; d = 0 is
  fetch-on-demand. Uses of the next micro-step are prefetched during the end of the current one (distances reach back at
  most one micro-step). Staging memory: the pinned CPU slice (NVMe path) from the NVMe read until its CPU->GPU copy
  ends; the GPU buffer of a CPU->GPU copy is reserved on the compute stream where the copy may start (right after the
  compute of use ``u - d - 1``; at the micro-step's start for its first ``d + 1`` uses) and freed by its consumer, so
  the GPU's peak does not depend on how fast the copies run (``kit``); the gathered layer lives until its compute
  ends. DeepSpeed pins ``offload_param`` buffer_count x buffer_size (5 x 1e8 elements) per rank
  up front; we allocate only the window actually in flight and report in ``info`` whether it fits that pool. The ranks'
  NVMe reads of one layer (and their fp32 gradient writes) start together and share the drive set max-min fairly, so
  each is one flow of ``dp`` slices (same timing as ``dp`` equal flows, ``1/dp`` of the simulator's events); the
  optimizer's NVMe traffic stays per rank.
- Gradients: each layer's full gradient bucket lives on the GPU from its backward until the reduce-scatter ends (its
  slice until the copy to the CPU ends); a bucket is released on the compute stream just before the backward ``B``
  layers later, once its copy has ended, and the last ``B`` after the micro-step's last backward
  (``kit.bucket_release``: the backward waits for it; the bucket is held until then at every timing),
  ``B`` = DeepSpeed's ``max_param_reduce_events`` (2) x ``reduce_bucket_size`` (5e8 elements) over the largest
  layer's parameters, at least 2 (``states.grad_buckets_in_flight``; ``plan.info``), so a slow link stalls the
  backward instead of piling buckets up. Each rank copies its slice (``grad_bytes_per_param``) into a CPU
  accumulation buffer when one exists (knob ``cpu_grad_buffer``), else its fp32 slice (4 B/param) to the optimizer's
  fp32 gradient. DeepSpeed adds non-first micro-steps' gradients on the GPU (an extra H2D of the buffer per
  micro-step); we model the accumulation as free on the CPU. With
  ``optimizer_device=nvme``, on the last micro-step (the accumulation boundary) every rank writes its fp32 gradient
  slice (4 B/param) to NVMe as its layer's gradients arrive, where the optimizer reads it back; DeepSpeed converts to
  fp32 on the GPU and copies 4 B/param more down at the boundary, we convert on the CPU.
- Optimizer step, after every rank's last gradient (the global gradient norm needs them all) and before the next step's
  first fetch (DeepSpeed's ``step()`` is synchronous: no overlap across steps). Layers are grouped in order into
  sub-groups holding at most ``sub_group_size`` parameters of one rank's partition (DeepSpeed counts partition elements
  per rank; a layer larger than that is a group alone). Per rank and sub-group: with ``optimizer_device=cpu`` CPU Adam
  in place (the shared ``cpu.adam`` rate); with ``nvme``: read fp32 master, m, v and the fp32 gradient (16 B/param) from
  NVMe into pinned buffers, CPU Adam, write master, m, v back (12 B/param). With ``pipeline_io`` (DeepSpeed's
  pipeline_read + pipeline_write) the read of sub-group k+1 is issued when Adam of k starts, the write of k waits only
  for the write of k-1, and Adam of k+1 waits for the write of k-1: at most three sub-groups' buffers live (DeepSpeed's
  pipelined swapper then needs buffer_count 12, not the default 4; we allocate 16 B/param of the sub-group per set).
  Without it read, Adam and write of each sub-group run one after another. The updated 16-bit slice goes back to the
  parameter home: in place on the CPU (no transfer) or written to NVMe (``db`` B/param) from a pinned staging buffer.
- Where the 20 B/param of ZeRO-Infinity's count live (bf16/fp16; fp32 runs have no separate master): fp16 parameters (2)
  at ``param_device``; the 16-bit gradient accumulation buffer (``grad_bytes_per_param``) on the CPU always; fp32 master
  (4), m and v (8) and the fp32 gradient (4) at ``optimizer_device``. With ``optimizer_device=cpu`` and
  ``param_device=cpu`` the CPU holds all 20 B/param.
- Per step over ``nvme.io``: param_device=nvme reads ``2 * db`` B/param per micro-step (forward and backward fetch) and
  writes ``db`` per step; optimizer_device=nvme writes 4 (fp32 gradients) and reads 16 (master, m, v, gradient) and
  writes 12 (master, m, v) per step: 32 B/param per step, whatever the accumulation count.
  ``plan.info['nvme_bytes_per_step']`` states the figures.
- Activation checkpoints (``offload_checkpoints``, DeepSpeed ``cpu_checkpointing``): each block's saved activations are
  moved to CPU memory right after its forward (on the D2H stream) and back before its recompute (on the H2D stream, with
  the ``cpu_prefetch`` distance). Embedding and head keep theirs.
- Unified memory (DGX Spark): GPU and CPU are one pool; "cpu" placements save nothing (the pool's peak shows it) and
  every CPU<->GPU copy still costs DRAM bandwidth; only NVMe is a real extra tier.
- Not modelled: GPUDirect Storage, the aio block size and queue depth (NVMe
  runs at the preset's sustained rate), CPU-side fp16<->fp32 conversions and gradient clipping, ``max_in_cpu``,
  tied-embedding re-gathers.

Where our reading is weakest:
- the paper gives no schedule at the granularity we simulate: the prefetch distances (3/2/1) come from the paper's
  prose, and DeepSpeed's real prefetcher is driven by ``prefetch_bucket_size`` (5e7 elements) over a recorded trace of
  parameter uses, not by a layer distance;
- DeepSpeed's optimizer swapper buffer use with pipelining (we assume three sub-groups in flight) and whether pipelined
  reads/writes of one drive overlap (the topology caps read + write together at the faster of the two);
- NVMe throughput under eight concurrent ranks' small requests (we assume the RAID's sustained figure shared max-min
  fairly); the paper's own ``eff = ait*bw/(ait*bw + peak)`` model is not used;
- gradient accumulation across micro-steps: DeepSpeed's GPU round trip and fp32 conversion at the boundary are
  simplified away (above).

Knobs:
- ``param_device`` (cpu | nvme, default cpu): home of the 16-bit parameter partitions.
- ``optimizer_device`` (cpu | nvme, default cpu): home of fp32 master weights, Adam m, v and the fp32 gradients; nvme
  needs a machine with NVMe (else a KnobError naming the knob).
- ``nvme_prefetch`` (int, default 3): NVMe->CPU read of the use ``d`` ahead of the one computing.
- ``cpu_prefetch`` (int, default 2): CPU->GPU copy ``d`` uses ahead (also checkpoint reloads).
- ``gather_prefetch`` (int, default 1): all-gather ``d`` uses ahead.
- ``sub_group_size`` (int, default 1e9 as DeepSpeed): parameters of one rank's partition per optimizer sub-group.
- ``pipeline_io`` (bool, default True): overlap the NVMe read of sub-group k+1 and the write of k-1 with Adam of k.
- ``offload_checkpoints`` (bool, default False): activation checkpoints to CPU memory in the forward, back before the
  backward.
- ``grad_bytes_per_param`` (float, default 2): bytes per parameter each rank copies GPU->CPU per micro-step (4: fp32
  gradient communication), also the size of the CPU accumulation buffer.
- ``cpu_grad_buffer`` (auto | always, default auto): auto = DeepSpeed 0.3-0.4, the paper's code
  (``stage3.py`` ``partition_previous_reduced_grads``): the 16-bit CPU partition buffer exists only with gradient
  accumulation (more than one micro-step per step); otherwise each reduced slice goes to its sub-group's fp32
  gradient, on the CPU or through the optimizer swapper's pinned buffers to NVMe (bounded: 4 buffers of the largest
  sub-group, ``swap_tensor/optimizer_utils.py`` ``_swap_out_gradients``; the backward waits when they are full).
  always = later DeepSpeed (``_setup_for_real_optimizer``: one whole-model ``grad_partitions_flat_buffer``).
- ``tile_factor`` (int or auto, default auto): memory-centric tiling of every block into that many tiles
  (``policies/zero_infinity/tiling.py``; auto: the smallest factor whose working set fits the GPU, 1 when none is
  needed). ``param_device=gpu`` is refused with a pointer to ``--policy none --knob stage=3``.
"""

from __future__ import annotations

from policies.base import PolicyInfo
from policies.zero_infinity.plan import plan
from policies.zero_infinity.states import NAME, Knobs, check_fit, model_state_bytes, nvme_bytes_per_step, sub_groups

POLICY = PolicyInfo(NAME, "ZeRO-3 with parameters and optimizer states offloaded to CPU or NVMe (ZeRO-Infinity)",
                    Knobs, plan, __doc__ or "",
                    search_grid=lambda n: {"param_device": ("cpu", "nvme"), "optimizer_device": ("cpu", "nvme"),
                                           "offload_checkpoints": (False, True)},
                    replay_knobs=("tile_factor=1",))

__all__ = ["NAME", "POLICY", "Knobs", "check_fit", "model_state_bytes", "nvme_bytes_per_step", "plan", "sub_groups"]
