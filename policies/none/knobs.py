"""``none``'s knobs and their validation (the package docstring documents each)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import KnobError

NAME = "none"


@dataclass(frozen=True)
class Knobs:
    stage: int = 0
    tp: int = 1

    def validate(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise KnobError(f"{NAME}: knob 'stage' must be 0, 1, 2 or 3, got {self.stage}")
