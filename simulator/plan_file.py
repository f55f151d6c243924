"""Reading a plan file: through `userfiles` (size, UTF-8, duplicate keys, depth, integers, no NaN), then the
bounds that keep its simulation bounded (docs/design.md, "Bounded inputs"), checked on the raw document
before any object is built: at most `MAX_PLAN_TASKS` tasks, `MAX_PLAN_STEPS` steps, and
`MAX_PLAN_SIMULATED_TASKS` task executions (steps x segment repeats x tasks). A field of the wrong type is
left to `Plan.from_dict`, which names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import userfiles
from simulator.errors import PlanError
from userfiles import UserFileError
from userfiles.limits import MAX_PLAN_SIMULATED_TASKS, MAX_PLAN_STEPS, MAX_PLAN_TASKS, limit_text

__all__ = ["check_plan_bounds", "read_plan_document"]


def read_plan_document(path: str | Path) -> Any:
    """The parsed plan JSON of `path`, or one `PlanError` line (its cause the `UserFileError`)."""
    label = str(path)
    try:
        doc = userfiles.read_json(path, "plan")
    except UserFileError as err:
        raise PlanError(str(err)) from err
    check_plan_bounds(doc, label)
    return doc


def _count(x: Any) -> int | None:
    """A whole number (int or integral float) as int, else None (the type error is named later)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return None


def check_plan_bounds(doc: Any, where: str) -> None:
    """Refuse a plan that asks for an impossible amount of simulation, naming the bound."""
    if not isinstance(doc, dict):
        return
    steps = _count(doc.get("steps", 1))
    if steps is not None and steps > MAX_PLAN_STEPS:
        raise PlanError(f"{where}: field 'steps' is {steps:,}, beyond the bound "
                        f"{limit_text('MAX_PLAN_STEPS', MAX_PLAN_STEPS)}; the steady state is reached by the "
                        "second step: give at most that many")
    segments = doc.get("segments")
    if not isinstance(segments, list):
        return
    tasks = executions = 0
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict) or not isinstance(seg.get("tasks"), list):
            continue
        n = len(seg["tasks"])
        repeat = _count(seg.get("repeat", 1))
        if repeat is not None and repeat > MAX_PLAN_SIMULATED_TASKS:
            raise PlanError(f"{where}: field 'segments[{i}].repeat' is {repeat:,}, beyond the bound "
                            f"{limit_text('MAX_PLAN_SIMULATED_TASKS', MAX_PLAN_SIMULATED_TASKS)} task executions")
        tasks += n
        executions += n * max(repeat or 1, 1)
    if tasks > MAX_PLAN_TASKS:
        raise PlanError(f"{where}: {tasks:,} tasks, beyond the bound {limit_text('MAX_PLAN_TASKS', MAX_PLAN_TASKS)}; "
                        "plan a smaller job")
    executions *= max(steps or 1, 1)
    if executions > MAX_PLAN_SIMULATED_TASKS:
        raise PlanError(f"{where}: steps x segment repeats x tasks = {executions:,} task executions, beyond the "
                        f"bound {limit_text('MAX_PLAN_SIMULATED_TASKS', MAX_PLAN_SIMULATED_TASKS)}; lower 'steps' "
                        "or the segments' 'repeat'")
