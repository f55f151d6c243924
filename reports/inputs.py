"""What ``tiersim report FILE...`` reads, told apart by a ``kind`` key where there is one, else by shape:

- ``simulate --json`` (one result) or ``simulate --policy all --json`` (``{"job", "results"}``): figure 1
  only (they hold no time series);
- a plan file (``--plan-out``): re-simulated here, so figures 1-4;
- ``tiersim replay --json`` (``simulated``/``measured``/``error``) or ``python -m replay.validation --json``
  (``rows`` of simulated and measured figures): figure 7;
- ``tiersim coverage --json`` (``kind: tiersim.coverage``): figure 5; ``tiersim whatif --json``
  (``kind: tiersim.whatif``): figure 6;
- a sweep store (an SQLite file, told by its header): every stored result, figure 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import userfiles
from reports.build import ReportInputs
from reports.input_checks import InputMeaningError, check_document
from simulator import PLAN_SCHEMA
from userfiles import UserFileError

SQLITE_HEADER = b"SQLite format 3\x00"
KNOWN = ("simulate --json", "simulate --policy all --json", "a plan (--plan-out)", "tiersim replay --json",
         "python -m replay.validation --json", "tiersim coverage --json", "tiersim whatif --json",
         "a sweep store (SQLite)")


class ReportInputError(ValueError):
    """An input file that cannot be used (one line naming the file and the fix)."""


def _is_result(d: Mapping[str, Any]) -> bool:
    return {"feasible", "policy", "peak_bytes", "capacity_bytes"} <= set(d)


def kind_of(doc: Any) -> str:
    """The kind of a parsed JSON document (``unknown`` when none fits)."""
    if not isinstance(doc, dict):
        return "unknown"
    kind = doc.get("kind")
    if kind in ("tiersim.coverage", "tiersim.whatif"):
        return str(kind).split(".", 1)[1]
    if doc.get("schema") == PLAN_SCHEMA:
        return "plan"
    if _is_result(doc):
        return "result"
    if isinstance(doc.get("results"), list) and all(isinstance(r, dict) and _is_result(r) for r in doc["results"]):
        return "results"
    if {"simulated", "measured", "error"} <= set(doc):
        return "replay"
    if isinstance(doc.get("rows"), list) and doc["rows"] and all(
            isinstance(r, dict) and "sim_step_s" in r and "meas_step_s" in r for r in doc["rows"]):
        return "replay-validation"
    return "unknown"


def load_inputs(paths: Sequence[str], title: str | None = None,
                progress: Callable[[str], None] | None = None) -> ReportInputs:
    """Read every file into one ReportInputs; plan files are simulated (``progress`` hears of each)."""
    inputs = ReportInputs(sources=[str(p) for p in paths])
    for path in paths:
        _load_one(Path(path), inputs, progress)
    if title:
        inputs.title = title
    else:
        inputs.title = default_title(inputs)
    return inputs


def _header(path: Path) -> bytes:
    """The first bytes of the file (enough to tell a sweep store), or one ReportInputError line."""
    if not path.exists():
        raise ReportInputError(f"{path}: no such file; give a simulate --json output, a plan, a replay, coverage or "
                               "what-if JSON, or a sweep store")
    if path.is_dir():
        raise ReportInputError(f"{path}: is a directory; give the files in it")
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise ReportInputError(f"{path}: cannot read ({e.strerror or e})") from None


def _load_one(path: Path, inputs: ReportInputs, progress: Callable[[str], None] | None) -> None:
    if _header(path).startswith(SQLITE_HEADER):
        _load_store(path, inputs)
        return
    try:  # size, UTF-8, duplicate keys, depth, integers, no NaN: one line naming file, line and key
        doc = userfiles.read_json(path, "report-input")
    except UserFileError as e:
        if e.problem.startswith(("malformed JSON", "not UTF-8")):
            raise ReportInputError(f"{path}: not JSON and not a sweep store ({e.detail()}); give one of: "
                                   f"{', '.join(KNOWN)}") from e
        raise ReportInputError(str(e)) from e
    kind = kind_of(doc)
    if kind == "unknown":
        keys = ", ".join(sorted(doc)[:6]) if isinstance(doc, dict) else type(doc).__name__
        raise ReportInputError(f"{path}: unknown kind of file (top-level keys: {keys}); give one of: "
                               f"{', '.join(KNOWN)}")
    try:
        check_document(kind, doc, str(path))
    except InputMeaningError as e:
        raise ReportInputError(str(e)) from None
    if kind == "result":
        _add(inputs, [doc], path)
    elif kind == "results":
        _add(inputs, doc["results"], path)
    elif kind == "plan":
        _add(inputs, [_simulate_plan_file(path, progress)], path)
    elif kind == "coverage":
        inputs.coverage.append(doc)
    elif kind == "whatif":
        inputs.whatif.append(doc)
    elif kind == "replay":
        inputs.replay.append((None, doc))
    else:  # replay-validation
        inputs.replay.append((None, doc))


def _simulate_plan_file(path: Path, progress: Callable[[str], None] | None) -> Any:
    from planner.plan_check import check_saved_plan
    from simulator import Plan, PlanError, simulate_plan

    try:
        plan = Plan.load(str(path))
        check_saved_plan(plan, str(path))
    except PlanError as e:
        raise ReportInputError(" ".join(str(e).split())) from None
    if progress:
        progress(f"simulating {path} ({plan.policy} on {plan.hardware.name})")
    return simulate_plan(plan, plan.hardware)


def _load_store(path: Path, inputs: ReportInputs) -> None:
    try:
        from planner.sweep.store import StoreError, read_results
    except ImportError:
        raise ReportInputError(f"{path}: a sweep store, but this install has no planner.sweep to read it") from None
    try:
        rows = read_results(path)
    except StoreError as e:
        raise ReportInputError(" ".join(str(e).split())) from None
    if not rows:
        raise ReportInputError(f"{path}: the sweep store holds no finished run; run `tiersim sweep` first")
    _add(inputs, rows, path)


def _add(inputs: ReportInputs, items: list[Any], path: Path) -> None:
    inputs.items.extend(items)
    inputs.item_sources.extend([path.name] * len(items))


def default_title(inputs: ReportInputs) -> str:
    jobs = []
    for d in inputs.comparison_rows():
        model = (d.get("model") or {}).get("name")
        jobs.append(f"{model} on {d.get('hardware')}")
    jobs = list(dict.fromkeys(jobs))
    if len(jobs) == 1:
        return f"tiersim report: {jobs[0]}"
    return "tiersim report"
