"""The meaning of a report input, once its kind is known: the fields each figure reads, with their types.

``tiersim report`` tells a file's kind by its ``kind`` key or its shape (``reports.inputs.kind_of``); this
module then checks that the document holds what the figure of that kind draws, so a malformed file is one
line naming the file and the field (exit 2) rather than a figure without data or a traceback. A field the
figure reads with a default may be absent; one that is present must have its type; a list the figure
draws must not be empty; a verdict must agree with itself (``feasible`` true with an ``oom``, or false
without one, is refused).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# field -> (type, required); types: "str", "num", "bool", "obj" (of anything), "nums" (an object of numbers),
# "list"; a number type may end in ">=0" (not negative) or ">0" (positive); a trailing "?" allows null. Every
# number is finite and at most MAX_FIGURE in size (the figures scale them: 1e308 tokens/s overflowed a multiply)
MAX_FIGURE = 1e30
Schema = Mapping[str, tuple[str, bool]]

RESULT: Schema = {
    "feasible": ("bool", True), "policy": ("str", True), "hardware": ("str?", False), "model": ("obj?", False),
    "peak_bytes": ("nums>=0?", True), "capacity_bytes": ("nums>0?", True), "step_time_s": ("num>=0?", False),
    "tokens_per_s": ("num>=0?", False), "tflops_per_gpu": ("num>=0?", False), "mfu": ("num>=0?", False),
    "hw_tflops_per_gpu": ("num>=0?", False), "hfu": ("num>=0?", False), "source": ("str?", False),
    "oom": ("obj?", False), "point": ("obj?", False),
}
OOM: Schema = {"pool": ("str", True), "over_by_bytes": ("num>=0?", False), "requested_bytes": ("num>=0?", False),
               "stage": ("str?", False)}
COVERAGE_ROW: Schema = {
    "policy": ("str", True), "model": ("str", True), "feasible": ("bool", True), "params": ("num>=0?", False),
    "tokens_per_s": ("num>=0?", False), "tflops_per_gpu": ("num>=0?", False), "binding": ("str?", False),
    "knobs": ("obj?", False),
}
WHATIF_ROW: Schema = {
    "change": ("str", True), "base_tokens_per_s": ("num>=0?", False), "tokens_per_s": ("num>=0?", False),
    "gain": ("num?", False), "makes_feasible": ("bool?", False),
}
REPLAY_SIDE: Schema = {"step_time_s": ("num>=0", True), "peak_bytes": ("nums>=0", False)}
REPLAY_ROW: Schema = {"case": ("str", True), "policy": ("str?", False), "sim_step_s": ("num>=0?", True),
                      "meas_step_s": ("num>=0?", True), "sim_peak": ("nums>=0?", False),
                      "meas_peak": ("nums>=0?", False)}


class InputMeaningError(ValueError):
    """A report input of a known kind whose fields do not say what that kind must (one line)."""


def check_document(kind: str, doc: Mapping[str, Any], path: str) -> None:
    """InputMeaningError naming ``path`` and the field unless ``doc`` (of ``kind``, see ``kind_of``) holds
    what its figure draws."""
    if kind == "result":
        _result(doc, path)
    elif kind == "results":
        for i, r in enumerate(doc["results"]):
            _result(r, f"{path}: results[{i}]")
    elif kind == "coverage":
        for i, row in enumerate(_rows(doc, "rows", path)):
            where = f"{path}: rows[{i}]"
            _fields(row, COVERAGE_ROW, where)
            if row["feasible"] and not _positive(row.get("tokens_per_s")):
                raise InputMeaningError(f"{where}: field 'tokens_per_s': a feasible row needs a positive number, "
                                        f"got {row.get('tokens_per_s')!r}")
    elif kind == "whatif":
        for i, row in enumerate(_rows(doc, "sensitivity", path)):
            _fields(row, WHATIF_ROW, f"{path}: sensitivity[{i}]")
    elif kind == "replay":
        for side in ("simulated", "measured"):
            _fields(_object(doc, side, path), REPLAY_SIDE, f"{path}: {side}")
    elif kind == "replay-validation":
        for i, row in enumerate(_rows(doc, "rows", path)):
            _fields(row, REPLAY_ROW, f"{path}: rows[{i}]")


def _result(d: Any, where: str) -> None:
    if not isinstance(d, Mapping):
        raise InputMeaningError(f"{where}: expected a simulate --json object, got {_name(d)}")
    _fields(d, RESULT, where)
    oom = d.get("oom")
    if d["feasible"] and oom:
        raise InputMeaningError(f"{where}: field 'oom': a feasible result has no oom (feasible is true); "
                                "give the file simulate --json wrote")
    if not d["feasible"]:
        if not oom:
            raise InputMeaningError(f"{where}: field 'oom': an infeasible result (feasible is false) needs its "
                                    "oom object; give the file simulate --json wrote")
        _fields(oom, OOM, f"{where}: oom")
    elif not _positive(d.get("tokens_per_s")):
        raise InputMeaningError(f"{where}: field 'tokens_per_s': a feasible result needs a positive number, got "
                                f"{d.get('tokens_per_s')!r}")


def _rows(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    rows = doc.get(key)
    if not isinstance(rows, list):
        raise InputMeaningError(f"{where}: field {key!r}: expected a list, got {_name(rows)}")
    if not rows:
        raise InputMeaningError(f"{where}: field {key!r} is empty: nothing to draw; give a file with results")
    return rows


def _object(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    v = doc.get(key)
    if not isinstance(v, Mapping):
        raise InputMeaningError(f"{where}: field {key!r}: expected an object, got {_name(v)}")
    return v


def _fields(d: Any, schema: Schema, where: str) -> None:
    if not isinstance(d, Mapping):
        raise InputMeaningError(f"{where}: expected an object, got {_name(d)}")
    for name, (kind, required) in schema.items():
        if name not in d:
            if required:
                raise InputMeaningError(f"{where}: missing field {name!r}")
            continue
        problem = _type_problem(d[name], kind)
        if problem is not None:
            raise InputMeaningError(f"{where}: field {name!r}: {problem}")


def _type_problem(v: Any, kind: str) -> str | None:
    if kind.endswith("?"):
        if v is None:
            return None
        kind = kind[:-1]
    kind, _, bound = kind.partition(">")  # "num>=0" -> ("num", "=0"), "nums>0" -> ("nums", "0")
    if kind == "nums":
        if not isinstance(v, Mapping):
            return f"expected an object of numbers, got {_name(v)}"
        for k, x in v.items():
            problem = _number_problem(x, bound)
            if problem is not None:
                return f"[{k!r}]: {problem}"
        return None
    if kind == "num":
        return _number_problem(v, bound)
    ok = {"str": isinstance(v, str), "bool": isinstance(v, bool), "obj": isinstance(v, Mapping),
          "list": isinstance(v, list)}[kind]
    want = {"str": "a string", "bool": "true or false", "obj": "an object", "list": "a list"}[kind]
    return None if ok else f"expected {want}, got {_name(v)}"


def _number_problem(v: Any, bound: str) -> str | None:
    """None when v is a finite number within MAX_FIGURE and the bound ("=0": not negative, "0": positive)."""
    if not _number(v):
        return f"expected a finite number, got {_name(v)}"
    if abs(v) > MAX_FIGURE:
        return f"{v!r} is out of range; give a figure of at most {MAX_FIGURE:g} in size"
    if bound == "=0" and v < 0:
        return f"{v!r} is negative; give a number >= 0"
    if bound == "0" and v <= 0:
        return f"{v!r} is not positive; give a number > 0"
    return None


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: Any) -> bool:
    return _number(v) and v > 0


def _name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str | int | float):
        return repr(v) if len(repr(v)) <= 40 else f"a {type(v).__name__}"
    return {"dict": "an object", "list": "a list"}.get(type(v).__name__, type(v).__name__)
