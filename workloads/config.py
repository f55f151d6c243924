"""What is run per optimizer step: :class:`WorkloadConfig` (micro-batch, sequence, precision, ...)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from workloads.checks import boolean, choice, dataclass_kwargs, positive_int
from workloads.errors import WorkloadInputError

__all__ = ["CHECKPOINTING_MODES", "DTYPE_BYTES", "WorkloadConfig"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
CHECKPOINTING_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class WorkloadConfig:
    """Batch geometry and numerics of one training job.

    ``micro_batch``: sequences per micro-batch per GPU; ``seq_len``: tokens per sequence (2048 when the
    user gives none); ``global_batch``: sequences per optimizer step over all GPUs (``None`` means "equal
    to micro_batch" and is replaced by that int on construction; whether it divides evenly is the
    caller's concern); ``precision``: dtype of parameters, gradients and activations (mixed precision
    keeps fp32 master weights and Adam moments for bf16/fp16); ``checkpointing``: activation
    recomputation mode (Korthikanti 2022: none, selective = attention core only, full = whole block);
    ``checkpoint_early_stop`` (checkpointing full; no effect with none or selective): the recomputation
    stops once the last tensor that the block saves for its backward is rebuilt, as PyTorch's non-reentrant
    checkpoint does by default since torch 2.1 (``torch.utils.checkpoint``, ``set_checkpoint_early_stop``):
    the block's last linear (the MLP's down projection, where nothing after it saves a tensor) and its
    residual add are not rerun. False (default): the whole block forward is rerun, as Megatron-LM's and
    DeepSpeed's checkpointing and PyTorch's reentrant checkpoint do
    (:func:`workloads.flops.early_stop_skipped_flops`);
    ``flash_attention``: fused attention that never stores the s x s score matrix;
    ``causal_attention_factor``: fraction of the s^2 attention FLOPs counted. 1.0 (default) is the
    Narayanan 2021 convention (full non-causal count, used for MFU); 0.5 is roughly what a causal kernel
    executes (see :data:`workloads.flops.CAUSAL_ATTENTION_FACTOR`).
    """

    micro_batch: int = 1
    seq_len: int = 2048
    global_batch: int | None = None
    precision: str = "bf16"
    checkpointing: str = "full"
    flash_attention: bool = True
    causal_attention_factor: float = 1.0
    checkpoint_early_stop: bool = False

    def __post_init__(self) -> None:
        where = "workload config"
        positive_int(self.micro_batch, "micro_batch", where)
        positive_int(self.seq_len, "seq_len", where)
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.micro_batch)
        positive_int(self.global_batch, "global_batch", where)
        choice(self.precision, "precision", DTYPE_BYTES, where)
        choice(self.checkpointing, "checkpointing", CHECKPOINTING_MODES, where)
        boolean(self.flash_attention, "flash_attention", where)
        boolean(self.checkpoint_early_stop, "checkpoint_early_stop", where)
        factor = self.causal_attention_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
            raise WorkloadInputError(
                f"{where}: field 'causal_attention_factor' must be in (0, 1] (got {factor!r}); "
                "use 1.0 (Narayanan convention) or 0.5 (causal kernels)"
            )

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of parameters, gradients and 16-bit (or fp32) activations."""
        return DTYPE_BYTES[self.precision]

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> WorkloadConfig:
        return cls(**dataclass_kwargs(cls, data, "workload config"))
