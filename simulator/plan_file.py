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


# ------------------------------------------------------------------ typed fields of tensors and tasks

_SCALAR = (str, int, float, bool, type(None))
_WHOLE_TAGS = ("layer", "rank")


def text(d: Any, key: str, where: str) -> str:
    """A required text field (a missing one is a KeyError, named by `Plan.from_dict`)."""
    value = d[key]
    if not isinstance(value, str):
        raise PlanError(f"{where}: field '{key}' must be a text, got {_short(value)}")
    return value


def opt_text(d: Any, key: str, where: str) -> str | None:
    """An optional text field (absent or null: None)."""
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise PlanError(f"{where}: field '{key}' must be a text, got {_short(value)}")
    return value


def opt_whole(d: Any, key: str, where: str) -> int | None:
    """An optional whole-number field (absent or null: None)."""
    value = d.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise PlanError(f"{where}: field '{key}' must be a whole number, got {_short(value)}")
    return value


def text_list(d: Any, key: str, where: str) -> tuple[str, ...]:
    value = d.get(key, ())
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{where}: field '{key}' must be a list of texts, got {_short(value)}")
    return tuple(value)


def tags_of(d: Any, where: str) -> dict[str, Any]:
    """A task's tags: text keys, plain values; ``layer`` and ``rank`` whole numbers, ``layers`` a list of them."""
    tags = d.get("tags", {})
    if not isinstance(tags, dict):
        raise PlanError(f"{where}: field 'tags' must be a mapping of tag: value, got {_short(tags)}")
    for key, value in tags.items():
        if key == "layers" and isinstance(value, list):  # a pack of layers (tinypipe, synergyscale's GPU Adam)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise PlanError(f"{where}: tag 'layers' must be a list of whole numbers, got {_short(value)}")
            continue
        if not isinstance(value, _SCALAR):
            raise PlanError(f"{where}: tag '{key}' must be a plain value, got {_short(value)}")
        if key in _WHOLE_TAGS:
            opt_whole(tags, key, f"{where} tags")
    return dict(tags)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def number_map(d: Any, key: str, where: str) -> dict[str, float]:
    """A mapping of name: finite number >= 0 (the plan's ``metrics``)."""
    value = d.get(key, {})
    if not isinstance(value, dict):
        raise PlanError(f"{where}: field '{key}' must be a mapping of name: number, got {_short(value)}")
    for name, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise PlanError(f"{where}: field '{key}.{name}' must be a finite number >= 0, got {_short(v)}")
    return dict(value)
