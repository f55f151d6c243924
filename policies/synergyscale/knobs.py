"""SynergyScale's knobs: their defaults, the fixed values ``auto=False`` uses, and their validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.base import KnobError

NAME = "synergyscale"
TIERS = ("gpu", "peer", "cpu", "nvme")
FETCHED = ("peer", "cpu", "nvme")      # tiers whose parameters are brought to the GPU before each use
DEFAULT_CHUNKS = 2
DEFAULT_STREAMS = 2
DEFAULT_PREFETCH = 2.0
DEFAULT_ORDER = "tail"


@dataclass(frozen=True)
class Fractions:
    """Explicit placement fractions (of parameters) per tier; None = auto (filled fastest first)."""

    peer: float | None = None
    cpu: float | None = None
    nvme: float | None = None

    def get(self, tier: str) -> float | None:
        return None if tier == "gpu" else getattr(self, tier)


@dataclass(frozen=True)
class Knobs:
    auto: bool = True
    peer_fraction: str = "auto"
    cpu_fraction: str = "auto"
    nvme_fraction: str = "auto"
    chunks: int = 0
    streams: int = 0
    prefetch: float = 0.0
    order: str = "auto"
    offload_activations: bool = False
    host_grad_bytes: float = 4.0

    def fractions(self) -> Fractions:
        return Fractions(**{t: _fraction(getattr(self, f"{t}_fraction"), f"{t}_fraction") for t in FETCHED})

    def validate(self) -> None:
        fr = self.fractions()
        if sum(getattr(fr, t) or 0.0 for t in FETCHED) > 1.0 + 1e-9:
            raise KnobError(f"{NAME}: knobs 'peer_fraction' + 'cpu_fraction' + 'nvme_fraction' must not exceed 1")
        for name in ("chunks", "streams"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0 or v > 256:
                raise KnobError(f"{NAME}: knob '{name}' must be 0 (auto) or an integer 1..256, got {v!r}")
        if not (self.prefetch == 0 or 0.0 < self.prefetch <= 64):
            raise KnobError(f"{NAME}: knob 'prefetch' must be 0 (auto) or a number of layers in (0, 64], "
                            f"got {self.prefetch!r}")
        if self.host_grad_bytes not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'host_grad_bytes' must be 2 (bf16/fp16) or 4 (fp32), "
                            f"got {self.host_grad_bytes!r}")
        if self.order not in ("auto", "tail", "spread"):
            raise KnobError(f"{NAME}: knob 'order' must be one of auto, tail, spread, got {self.order!r}")


def _fraction(text: Any, name: str) -> float | None:
    if isinstance(text, str) and text.strip().lower() == "auto":
        return None
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise KnobError(f"{NAME}: knob '{name}' must be auto or a fraction in [0, 1], got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise KnobError(f"{NAME}: knob '{name}' must be auto or a fraction in [0, 1], got {text!r}")
    return v
