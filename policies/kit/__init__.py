"""The policy kit: each mechanism a plan is made of, defined once, as calls on ``policies.builder.PlanBuilder``.

Every task a kit function emits is tagged with a ``simulator.phase.Phase`` member. Functions take the task
id (or build the conventional one), the dependencies and the placements explicitly, so a policy keeps
its own names and schedule while the kit owns what a task of each kind *is* (op, stream, pricing fields,
tags). Used by every policy (none, zero-offload, zero-infinity, lazytrain, synergyscale, tinypipe):

- ``layout``: ``Layout`` (data-parallel x tensor-parallel groups, their stream and collective names),
  ``gpu``, ``dtype_bytes``, ``check_tp``, stream declarations (``declare_streams`` and its pieces
  ``gpu_streams`` / ``cpu_streams`` / ``comm_streams``), ``tags`` / ``use_of`` (every kit task's tags);
- ``tasks``: one task of each kind: compute ``forward`` / ``recompute`` / ``backward``, Megatron
  ``tp_sync``, ``move_activation``, ``upload``, ``all_gather``, ``reduce``, ``offload``, ``release``,
  ``gpu_step``, ``cpu_adam``, ``swap``; ``saved_activation_bytes`` (Korthikanti's split under TP), ``workspace``;
- ``schedule``: mechanisms of many tasks and dependency rules: ``sliced_fetch`` (ZeRO-Infinity's
  bandwidth-centric fetch), ``gather_layer`` (ZeRO-3), ``UseOrder`` (use order and prefetch windows),
  ``bucket_gate`` (gradient buckets in flight; each policy passes its own bound), ``read_ahead`` (the NVMe
  read-ahead window), ``Grads`` + ``reduce_and_offload``, ``emit_microstep`` (the data/tensor-parallel
  micro-step of none and zero-offload), ``cpu_update_by_layer`` (ZeRO-Offload's Adam, upload, all-gather).
"""

from policies.kit.layout import (
    Layout,
    check_tp,
    comm_streams,
    cpu_streams,
    declare_streams,
    dtype_bytes,
    gpu,
    gpu_streams,
    tags,
    use_of,
)
from policies.kit.schedule import (
    Grads,
    UseOrder,
    bucket_gate,
    cpu_update_by_layer,
    emit_microstep,
    gather_layer,
    read_ahead,
    reduce_and_offload,
    sliced_fetch,
)
from policies.kit.tasks import (
    REPLICATED_ACT_FRACTION,
    TP_ALLREDUCES,
    all_gather,
    backward,
    cpu_adam,
    forward,
    gpu_step,
    move_activation,
    offload,
    recompute,
    reduce,
    release,
    saved_activation_bytes,
    swap,
    tp_sync,
    upload,
    workspace,
)

__all__ = [
    "REPLICATED_ACT_FRACTION", "TP_ALLREDUCES", "Grads", "Layout", "UseOrder", "all_gather", "backward",
    "bucket_gate", "check_tp", "comm_streams", "cpu_adam", "cpu_streams", "cpu_update_by_layer",
    "declare_streams", "dtype_bytes", "emit_microstep", "forward", "gather_layer", "gpu", "gpu_step",
    "gpu_streams", "move_activation", "offload", "read_ahead", "recompute", "reduce", "reduce_and_offload", "release",
    "saved_activation_bytes", "sliced_fetch", "swap", "tags", "tp_sync", "upload", "use_of", "workspace",
]
