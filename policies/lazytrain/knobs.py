"""LazyTrain's knobs (the package docstring describes each) and their validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from policies.base import KnobError
from policies.lazytrain.milp import NODE_LIMIT, TIME_LIMIT_S

NAME = "lazytrain"
HEURISTICS = ("keep_all", "checkpoint_all", "offload_all")
HOMES = ("auto", "gpu", "cpu", "nvme")
TIERING_RULES = ("least_offload", "fastest_estimate")


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class Knobs:
    strategy: Literal["milp", "keep_all", "checkpoint_all", "offload_all"] = "milp"
    time_limit_s: float = TIME_LIMIT_S
    node_limit: int = NODE_LIMIT
    mip_rel_gap: float = 1e-4
    prefetch_depth: int = 1
    optimizer_8bit: bool = False
    param_home: Literal["auto", "gpu", "cpu", "nvme"] = "auto"
    optimizer_home: Literal["auto", "gpu", "cpu", "nvme"] = "auto"
    cpu_grad_bytes: float = 4.0
    tiering_rule: Literal["least_offload", "fastest_estimate"] = "least_offload"

    def validate(self) -> None:
        """Raise :class:`KnobError` (one line naming the knob) for the first bad value."""
        for ok, why in self._checks():
            if not ok:
                raise KnobError(f"{NAME}: {why}")

    def _checks(self) -> list[tuple[bool, str]]:
        return [
            (self.strategy in ("milp", *HEURISTICS),
             f"knob 'strategy' must be one of milp, {', '.join(HEURISTICS)}"),
            (self.time_limit_s > 0, f"knob 'time_limit_s' must be > 0 seconds, got {self.time_limit_s}"),
            (_positive_int(self.node_limit), f"knob 'node_limit' must be an integer >= 1, got {self.node_limit}"),
            (0 <= self.mip_rel_gap < 1, f"knob 'mip_rel_gap' must be in [0, 1), got {self.mip_rel_gap}"),
            (_positive_int(self.prefetch_depth),
             f"knob 'prefetch_depth' must be an integer >= 1, got {self.prefetch_depth}"),
            (self.param_home in HOMES, "knob 'param_home' must be one of auto, gpu, cpu, nvme"),
            (self.optimizer_home in HOMES, "knob 'optimizer_home' must be one of auto, gpu, cpu, nvme"),
            (not (self.param_home in ("cpu", "nvme") and self.optimizer_home == "gpu"),
             f"knob 'optimizer_home' cannot be gpu when 'param_home' is {self.param_home} "
             "(streamed parameters use the CPU optimizer)"),
            (self.cpu_grad_bytes in (2.0, 4.0), "knob 'cpu_grad_bytes' must be 2 or 4"),
            (self.tiering_rule in TIERING_RULES, "knob 'tiering_rule' must be least_offload or fastest_estimate"),
        ]
