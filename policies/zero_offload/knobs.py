"""``zero-offload``'s knobs and their validation (the package docstring documents each)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import KnobError

NAME = "zero-offload"


@dataclass(frozen=True)
class Knobs:
    delayed_update: bool = False
    upload_bytes_per_param: float = 2.0
    grad_offload_bytes_per_param: float = 2.0
    cpu_grad_bytes: float = 4.0
    cpu_param_copy_per_rank: bool = False
    tp: int = 0

    def validate(self) -> None:
        for name in ("upload_bytes_per_param", "grad_offload_bytes_per_param"):
            if getattr(self, name) not in (2.0, 4.0):
                raise KnobError(f"{NAME}: knob '{name}' must be 2 (fp16/bf16) or 4 (fp32)")
        if self.cpu_grad_bytes not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'cpu_grad_bytes' must be 2 or 4")
        if self.tp < 0:
            raise KnobError(f"{NAME}: knob 'tp' must be 0 (auto) or a positive divisor of the GPU count")
