"""On-disk cache of candidate evaluations, so that a repeated plan search is near-instant.

Key: SHA-256 of (hardware spec dict, model spec dict, workload config, policy, knobs, plan schema version,
and a fingerprint of the code that computes the answer: the .py sources of hardware_models, workloads,
policies, simulator and the planner's candidate/bound/search modules). A change to any of them gives new
keys, so a stale entry is never read (a policy registered from outside the package counts with its module's
source). Value: one JSON file per key holding the evaluation summary
(verdict, bounds, simulated figures), written atomically (temporary file + rename), so concurrent
searches may share a directory.

Default directory: ``$XDG_CACHE_HOME/tiersim`` or ``~/.cache/tiersim``, created with mode 0o700 (its
subdirectories too) and holding files of mode 0o600: an evaluation reveals what was planned.

An entry that cannot be used -- not JSON, not an object, or not of the layout the reader expects (a
missing field, a field of the wrong type) -- is a miss: it is ignored, evaluated again and overwritten,
and the first one of a run is reported in one warning line (``warn``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simulator import PLAN_SCHEMA, PLAN_VERSION

CACHE_FORMAT = 1
_CODE_PACKAGES = ("hardware_models", "workloads", "policies", "simulator")
_PLANNER_MODULES = ("bounds.py", "candidates.py", "search.py", "job.py")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiersim"


def code_fingerprint() -> str:
    """Hash of the sources that determine an evaluation (read when a search starts, not at import)."""
    import importlib

    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    files: list[Path] = [root / m for m in _PLANNER_MODULES]
    for pkg in _CODE_PACKAGES:
        mod = importlib.import_module(pkg)
        files += sorted(Path(mod.__file__).resolve().parent.rglob("*.py"))  # type: ignore[arg-type]
    files += _registered_policy_files(files)
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _registered_policy_files(known: list[Path]) -> list[Path]:
    """Source files of registered policies that live outside the ``policies`` package (``register``)."""
    import sys

    from policies import POLICIES

    seen = set(known)
    out: list[Path] = []
    for info in POLICIES.values():
        f = getattr(sys.modules.get(info.plan.__module__), "__file__", None)
        if f is not None and Path(f).resolve() not in seen:
            seen.add(Path(f).resolve())
            out.append(Path(f).resolve())
    return out


def _canon(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if isinstance(x, float | int | str | bool) or x is None:
        return x
    return repr(x)


def evaluation_key(hardware: Mapping[str, Any], model: Mapping[str, Any], workload: Mapping[str, Any],
                   policy: str, knobs: Mapping[str, Any], code: str) -> str:
    doc = {"format": CACHE_FORMAT, "plan": [PLAN_SCHEMA, PLAN_VERSION], "code": code,
           "hardware": hardware, "model": model, "workload": workload, "policy": policy, "knobs": knobs}
    return hashlib.sha256(json.dumps(_canon(doc), sort_keys=True).encode()).hexdigest()


class EvalCache:
    """A directory of ``<key[:2]>/<key>.json`` files; ``warn`` hears of the first corrupt entry read."""

    def __init__(self, directory: str | Path, warn: Callable[[str], None] | None = None):
        self.dir = Path(directory)
        self.hits = 0
        self.misses = 0
        self.corrupt = 0
        self._warn = warn

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str, check: Callable[[Any], str | None] | None = None) -> dict[str, Any] | None:
        """The entry of ``key``, or None (a miss) when there is none or it is corrupt: not a JSON object,
        or ``check(entry)`` says what is wrong with it (e.g. :func:`entry_problem`)."""
        path = self._path(key)
        try:
            text = path.read_bytes().decode("utf-8")
            d = json.loads(text)
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
            self._corrupt(path, type(e).__name__)
            return None
        problem = "not a JSON object" if not isinstance(d, dict) else check(d) if check is not None else None
        if problem is not None:
            self._corrupt(path, problem)
            return None
        self.hits += 1
        return d  # type: ignore[no-any-return]

    def _corrupt(self, path: Path, problem: str) -> None:
        self.misses += 1
        self.corrupt += 1
        if self.corrupt == 1 and self._warn is not None:
            self._warn(f"warning: corrupt evaluation cache entry {path} ({problem}) ignored and evaluated again, "
                       "as is any other this run")

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        path = self._path(key)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.parent.mkdir(exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")  # mode 0o600
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def entry_problem(d: Any, layout: type) -> str | None:
    """None when ``d`` (parsed JSON) holds the fields of the dataclass ``layout`` with their types (nested
    dataclasses, ``dict[str, float]``, optional fields), else what is wrong, e.g. "missing 'verdict'"."""
    if not isinstance(d, dict):
        return "not a JSON object"
    hints = typing.get_type_hints(layout)
    fields = {f.name: f for f in dataclasses.fields(layout)}
    for name in d:
        if name not in fields:
            return f"unknown field {name!r}"
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return f"missing {name!r}"
            continue
        problem = _value_problem(d[name], hints[name])
        if problem is not None:
            return f"{name!r}: {problem}"
    return None


def _value_problem(v: Any, tp: Any) -> str | None:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        problems = [_value_problem(v, a) for a in typing.get_args(tp)]
        return None if None in problems else next(p for p in problems if p is not None)
    if tp is type(None):
        return None if v is None else f"expected null, got {type(v).__name__}"
    if tp is float:
        ok = isinstance(v, int | float) and not isinstance(v, bool)
        return None if ok else f"expected a number, got {type(v).__name__}"
    if tp in (int, bool, str):
        ok = isinstance(v, tp) and (tp is bool or not isinstance(v, bool))
        return None if ok else f"expected {tp.__name__}, got {type(v).__name__}"
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        if not isinstance(v, dict):
            return f"expected an object, got {type(v).__name__}"
        for k, x in v.items():
            problem = _value_problem(k, key_t) or _value_problem(x, val_t)
            if problem is not None:
                return f"[{k!r}]: {problem}"
        return None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return entry_problem(v, tp)
    return None
