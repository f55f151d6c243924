"""``tinypipe``'s knobs (the package docstring says what each one means) and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from policies.base import KnobError

NAME = "tinypipe"
SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Knobs:
    stages: int = 0
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    balance_tolerance: float = 0.05
    prefetch_packs: int = 1
    active_cpu_mm: bool = True

    def validate(self) -> None:
        if self.stages < 0:
            raise KnobError(f"{NAME}: knob 'stages' must be 0 (= GPU count) or a divisor of the GPU count")
        if self.schedule not in SCHEDULES:
            raise KnobError(f"{NAME}: knob 'schedule' must be one of {', '.join(SCHEDULES)}, "
                            f"got {self.schedule!r}")
        if not (math.isfinite(self.balance_tolerance) and self.balance_tolerance >= 0):
            raise KnobError(f"{NAME}: knob 'balance_tolerance' must be a finite number >= 0")
        if self.prefetch_packs < 0:
            raise KnobError(f"{NAME}: knob 'prefetch_packs' must be an integer >= 0")

    @property
    def gpipe(self) -> bool:
        return self.schedule == "gpipe"
