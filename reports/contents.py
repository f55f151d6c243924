"""What a report is made of: the results and documents its figures and tables are drawn from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator import Result


@dataclass
class ReportInputs:
    # figure 1, in this order: Results simulated in this process (also figures 2-4) and result dicts
    # (``simulate --json`` objects, a policy's up-front infeasible verdict included)
    items: list[Result | Mapping[str, Any]] = field(default_factory=list)
    item_sources: list[str] = field(default_factory=list)  # the file each item came from (labels duplicates)
    coverage: list[Mapping[str, Any]] = field(default_factory=list)  # tiersim coverage --json: figure 5
    whatif: list[Mapping[str, Any]] = field(default_factory=list)    # tiersim whatif --json: figure 6
    replay: list[tuple[str | None, Mapping[str, Any]]] = field(default_factory=list)  # (case, doc): figure 7
    title: str = "tiersim report"
    sources: list[str] = field(default_factory=list)

    @property
    def results(self) -> list[Result]:
        return [x for x in self.items if isinstance(x, Result)]

    def comparison_rows(self) -> list[Mapping[str, Any]]:
        rows = [x.to_dict() if isinstance(x, Result) else x for x in self.items]
        if len(self.item_sources) == len(rows):
            rows = [{**r, "source": s} for r, s in zip(rows, self.item_sources, strict=True)]
        return rows

    def empty(self) -> bool:
        return not (self.items or self.coverage or self.whatif or self.replay)
