"""On-disk cache of candidate evaluations, so that a repeated plan search is near-instant.

Key: SHA-256 of (hardware spec dict, model spec dict, workload config, policy, knobs, plan schema version,
and a fingerprint of the code that computes the answer: the .py sources of hardware_models, workloads,
policies, simulator and the planner's candidate/bound/search modules). A change to any of them gives new
keys, so a stale entry is never read (a policy registered from outside the package counts with its module's
source). Value: one JSON file per key holding the evaluation summary
(verdict, bounds, simulated figures), written atomically (temporary file + rename), so concurrent
searches may share a directory.

Default directory: ``$XDG_CACHE_HOME/tiersim`` or ``~/.cache/tiersim``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
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
    """A directory of ``<key[:2]>/<key>.json`` files."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            d = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return d if isinstance(d, dict) else None

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
