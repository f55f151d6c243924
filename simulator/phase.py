"""The phase of a plan's task: one documented spelling per event, for every policy.

A task's ``tags["phase"]`` says what the task does in the training step. The engine prices compute by
phase (``opcost``), the torch runner keys what it moves and runs on it (``replay``), and reports group the
timeline by it, so the vocabulary is closed: a plan whose phase tag is not a member of ``Phase`` is
refused on load. Where one event happens for two uses (a parameter fetched for the forward and again for
the backward) the phase stays the same and a ``use`` tag (``fwd`` | ``bwd``) says which.

``Phase`` is a ``StrEnum``: a member is its spelling, so plans serialise to the same JSON strings and
``tags["phase"] == Phase.FWD`` holds for tags read back from a file.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """What a task does (its ``group``: compute, collective, transfer, nvme, memory or optimizer)."""

    FWD = "fwd"                                  #: a layer's forward on the GPU
    RECOMPUTE = "recompute"                      #: a checkpointed layer's forward recomputed in the backward
    BWD = "bwd"                                  #: a layer's backward on the GPU
    TP_FWD = "tp-fwd"                            #: Megatron tensor-parallel all-reduces closing a forward
    TP_RECOMPUTE = "tp-recompute"                #: the same, closing a recomputation
    TP_BWD = "tp-bwd"                            #: the same, closing a backward
    PARAM_GATHER = "param-gather"                #: all-gather of parameters across data-parallel ranks
    PARAM_UPLOAD = "param-upload"                #: a layer's parameters copied to a GPU (from CPU, NVMe or a peer)
    PARAM_SWAP_IN = "param-swap-in"              #: parameters read from NVMe into CPU memory
    PARAM_SWAP_OUT = "param-swap-out"            #: updated parameters written from CPU memory to NVMe
    ACTIVATION_OFFLOAD = "activation-offload"    #: saved activations / checkpoints moved off the GPU
    ACTIVATION_RELOAD = "activation-reload"      #: saved activations / checkpoints moved back for the backward
    ACTIVATION_STASH = "activation-stash"        #: a pipeline stage's activation stash allocated (GPipe)
    SEND_ACT = "send-act"                        #: a pipeline stage sends its output activations to the next
    SEND_GRAD = "send-grad"                      #: a pipeline stage sends input gradients to the previous one
    GRAD_REDUCE = "grad-reduce"                  #: gradients reduced (all-reduce or reduce-scatter) across ranks
    GRAD_OFFLOAD = "grad-offload"                #: gradients copied from a GPU to CPU memory
    GRAD_ACCUMULATE = "grad-accumulate"          #: a gradient bucket folded into the resident gradient buffer
    GRAD_RELEASE = "grad-release"                #: a gradient buffer released once its copy or reduction is done
    GRAD_SWAP_OUT = "grad-swap-out"              #: gradients written from CPU memory to NVMe
    BUFFER_RESERVE = "buffer-reserve"            #: a buffer a copy will fill, allocated in its GPU's compute order
    BUFFER_RELEASE = "buffer-release"            #: a staging buffer released in its stream's order once its copy ended
    TIED_GRAD_SYNC = "tied-grad-sync"            #: tied embedding/head gradients summed (``on: cpu`` when on the host)
    OPTIMIZER = "optimizer"                      #: an optimizer step (on a GPU or the CPU)
    OPTIMIZER_SWAP_IN = "optimizer-swap-in"      #: optimizer states read from NVMe for the CPU optimizer
    OPTIMIZER_SWAP_OUT = "optimizer-swap-out"    #: optimizer states written back to NVMe after the update

    @property
    def group(self) -> str:
        return _GROUP[self]

    @classmethod
    def parse(cls, value: object) -> Phase | None:
        """The member spelled ``value``, or None."""
        if not isinstance(value, str):
            return None
        return _BY_VALUE.get(value)  # (a dict look-up: validation parses every task's phase)


_BY_VALUE: dict[str, Phase] = {p.value: p for p in Phase}

_GROUP: dict[Phase, str] = {
    Phase.FWD: "compute", Phase.RECOMPUTE: "compute", Phase.BWD: "compute",
    Phase.TP_FWD: "collective", Phase.TP_RECOMPUTE: "collective", Phase.TP_BWD: "collective",
    Phase.PARAM_GATHER: "collective", Phase.GRAD_REDUCE: "collective", Phase.TIED_GRAD_SYNC: "collective",
    Phase.PARAM_UPLOAD: "transfer", Phase.ACTIVATION_OFFLOAD: "transfer", Phase.ACTIVATION_RELOAD: "transfer",
    Phase.SEND_ACT: "transfer", Phase.SEND_GRAD: "transfer", Phase.GRAD_OFFLOAD: "transfer",
    Phase.PARAM_SWAP_IN: "nvme", Phase.PARAM_SWAP_OUT: "nvme", Phase.GRAD_SWAP_OUT: "nvme",
    Phase.OPTIMIZER_SWAP_IN: "nvme", Phase.OPTIMIZER_SWAP_OUT: "nvme",
    Phase.ACTIVATION_STASH: "memory", Phase.GRAD_ACCUMULATE: "memory", Phase.GRAD_RELEASE: "memory",
    Phase.BUFFER_RESERVE: "memory", Phase.BUFFER_RELEASE: "memory",
    Phase.OPTIMIZER: "optimizer",
}

#: the phases whose compute the workload's operators describe (``workloads.ops.PHASES``)
COMPUTE_PHASES: tuple[Phase, ...] = (Phase.FWD, Phase.BWD, Phase.RECOMPUTE)
#: copies that bring a layer's parameters to a GPU (the runner moves real weights for these)
UPLOAD_PHASES: tuple[Phase, ...] = (Phase.PARAM_UPLOAD,)
