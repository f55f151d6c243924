"""The policy kit: each mechanism a plan is made of, defined once, as calls on ``policies.builder.PlanBuilder``.

Every task a kit function emits is tagged with a ``simulator.phase.Phase`` member. Functions take the task
id (or build the conventional one), the dependencies and the placements explicitly, so a policy keeps
its own names and schedule while the kit owns what a task of each kind *is* (op, stream, pricing fields,
tags). Mechanisms, who uses them, and their parameters:

- ``layout``: ``Layout(n, tp, flat_comm)`` (data-parallel x tensor-parallel groups of GPUs, the names of
  their communication streams and collectives), ``gpu(r)``, ``dtype_bytes(job)``, ``check_tp(job, tp,
  policy)``; stream declarations ``declare_streams`` (per-rank GPU compute/h2d/d2h, ``cpu.adam{r}`` and
  other per-rank CPU streams, shared streams, communication streams in ``comm_order``), and the pieces
  ``gpu_streams`` / ``cpu_streams`` / ``comm_streams``. Used by none, zero-offload, zero-infinity (and
  the ports of lazytrain, synergyscale, tinypipe).
- ``layers``: per-layer compute ``forward`` / ``recompute`` / ``backward`` (``share``: TP degree or chunk
  count; ``flops`` / ``hbm_bytes`` overrides; ``tid``, ``stream``, ``allocs``, ``frees``, ``extra`` tags),
  ``move_activation`` (saved activations to the CPU and back), Megatron ``tp_sync``,
  ``saved_activation_bytes`` (Korthikanti's split under TP), ``workspace``. Used by none, zero-offload
  (through ``microstep``), zero-infinity.
- ``fetch``: ``upload`` (a parameter copy to a GPU: ``src``, ``use``, ``allocs`` / ``frees`` / ``reads``),
  ``all_gather`` (a parameter all-gather over ranks), ``sliced_fetch`` (every rank uploads its slice of a
  layer, then one all-gather assembles it: ZeRO-Infinity's bandwidth-centric fetch), ``gather_layer``
  (ZeRO-3: every data-parallel group gathers layer i, with the caller's prefetch bound), ``UseOrder``
  (forward-then-backward use order and the prefetch-distance window ``window(u, d, gpus)``). Used by
  none (stage 3), zero-offload, zero-infinity.
- ``grads``: ``bucket_gate(order, i, buckets_in_flight, drained)`` (the one bound on gradient buckets in
  flight; each policy passes its own: zero-offload 2, lazytrain 2, synergyscale 3), ``reduce`` (all-reduce
  / reduce-scatter), ``offload`` (GPU -> CPU copy), ``release`` (a free: ``GRAD_RELEASE``,
  ``GRAD_ACCUMULATE`` or a staging buffer's phase), ``Grads`` + ``reduce_and_offload`` (the data/tensor-
  parallel path). Used by none, zero-offload, zero-infinity.
- ``optimizer``: ``gpu_step`` (GPU optimizer over a partition), ``cpu_adam`` (per rank, layer or
  sub-group), ``swap`` (CPU <-> NVMe of optimizer states, parameters, gradients), ``read_ahead(k, window,
  written)`` (the NVMe read-ahead window), ``cpu_update_by_layer`` (ZeRO-Offload's Adam + upload +
  all-gather per layer). Used by none (GPU step), zero-offload, zero-infinity.
- ``microstep``: ``emit_microstep`` (forward, recompute, backward and gradient path of one data/tensor-
  parallel micro-step, ZeRO-3 gathers with a one-layer prefetch) built from the above. Used by none,
  zero-offload.
- ``tags``: ``tags(phase, layer=, rank=, use=, extra=)``, the tag dict of every kit task.
"""

from policies.kit.fetch import UseOrder, all_gather, gather_layer, sliced_fetch, upload
from policies.kit.grads import Grads, bucket_gate, offload, reduce, reduce_and_offload, release
from policies.kit.layers import (
    REPLICATED_ACT_FRACTION,
    TP_ALLREDUCES,
    backward,
    forward,
    move_activation,
    recompute,
    saved_activation_bytes,
    tp_sync,
    workspace,
)
from policies.kit.layout import (
    Layout,
    check_tp,
    comm_streams,
    cpu_streams,
    declare_streams,
    dtype_bytes,
    gpu,
    gpu_streams,
)
from policies.kit.microstep import emit_microstep
from policies.kit.optimizer import cpu_adam, cpu_update_by_layer, gpu_step, read_ahead, swap
from policies.kit.tags import tags, use_of

__all__ = [
    "REPLICATED_ACT_FRACTION", "TP_ALLREDUCES", "Grads", "Layout", "UseOrder", "all_gather", "backward",
    "bucket_gate", "check_tp", "comm_streams", "cpu_adam", "cpu_streams", "cpu_update_by_layer",
    "declare_streams", "dtype_bytes", "emit_microstep", "forward", "gather_layer", "gpu", "gpu_step",
    "gpu_streams", "move_activation", "offload", "read_ahead", "recompute", "reduce", "reduce_and_offload", "release",
    "saved_activation_bytes", "sliced_fetch", "swap", "tags", "tp_sync", "upload", "use_of", "workspace",
]
