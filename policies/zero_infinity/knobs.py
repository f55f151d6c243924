"""``zero-infinity``'s knobs and their validation (the package docstring documents each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policies.base import Job, KnobError

NAME = "zero-infinity"


@dataclass(frozen=True)
class Knobs:
    param_device: Literal["cpu", "nvme"] = "cpu"
    optimizer_device: Literal["cpu", "nvme"] = "cpu"
    nvme_prefetch: int = 3
    cpu_prefetch: int = 2
    gather_prefetch: int = 1
    sub_group_size: int = 1_000_000_000
    pipeline_io: bool = True
    offload_checkpoints: bool = False
    grad_bytes_per_param: float = 2.0

    def validate(self) -> None:
        for name in ("param_device", "optimizer_device"):
            if getattr(self, name) not in ("cpu", "nvme"):
                raise KnobError(f"{NAME}: knob '{name}' must be cpu or nvme, got {getattr(self, name)!r}")
        for name in ("nvme_prefetch", "cpu_prefetch", "gather_prefetch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise KnobError(f"{NAME}: knob '{name}' must be an integer >= 0 (0 = fetch on demand), got {v!r}")
        if isinstance(self.sub_group_size, bool) or not isinstance(self.sub_group_size, int) \
                or self.sub_group_size < 1:
            raise KnobError(f"{NAME}: knob 'sub_group_size' must be a positive number of parameters, "
                            f"got {self.sub_group_size!r}")
        if self.grad_bytes_per_param not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'grad_bytes_per_param' must be 2 (fp16/bf16) or 4 (fp32), "
                            f"got {self.grad_bytes_per_param!r}")

    @property
    def param_nvme(self) -> bool:
        return self.param_device == "nvme"

    @property
    def optimizer_nvme(self) -> bool:
        return self.optimizer_device == "nvme"

    def check_devices(self, job: Job) -> None:
        """KnobError naming the knob when an NVMe home is asked of a machine without a drive."""
        for name in ("param_device", "optimizer_device"):
            if getattr(self, name) == "nvme" and job.hw.nvme is None:
                raise KnobError(f"{NAME}: knob '{name}' = nvme but {job.hw.name} has no NVMe drive; use cpu")
