"""Reading JSON and YAML files with one-line errors that name the file, the line, the key and the fix.

Both delegate to `userfiles` (size limit, strict UTF-8, duplicate keys, bounded aliases, depth and
integers, no NaN/Infinity) and re-raise its refusal as a `WorkloadInputError` with the same text, e.g.
``config.json: line 4, column 3: key 'hidden_size': duplicate key; ...``; the `userfiles.UserFileError`
is the error's ``__cause__``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import userfiles
from userfiles import UserFileError
from userfiles.limits import MAX_MODEL_LAYERS, MAX_MODEL_PARAMS
from workloads.errors import WorkloadInputError

__all__ = ["check_model_size", "read_json", "read_yaml"]


def read_json(path: Path, *, kind: str = "hf-config") -> Any:
    """Parse a JSON user file (`kind` picks the size bound and the hint, e.g. ``"deepspeed"``)."""
    try:
        return userfiles.read_json(path, kind)
    except UserFileError as err:
        raise WorkloadInputError(str(err)) from err


def read_yaml(path: Path, *, kind: str = "model") -> Any:
    """Parse a YAML user file (plain data only; see `userfiles.yaml_reader`)."""
    try:
        return userfiles.read_yaml(path, kind)
    except UserFileError as err:
        raise WorkloadInputError(str(err)) from err


def check_model_size(params: int, layers: int, file: str) -> None:
    """Refuse a model file beyond the documented bounds (docs/design.md, "Bounded inputs"), naming the bound."""
    try:
        userfiles.check_at_most(params, MAX_MODEL_PARAMS, "MAX_MODEL_PARAMS", what="parameters",
                                file=file, fix="describe a model of at most that many parameters")
        userfiles.check_at_most(layers, MAX_MODEL_LAYERS, "MAX_MODEL_LAYERS", what="layers",
                                file=file, fix="describe a model of at most that many layers")
    except UserFileError as err:
        raise WorkloadInputError(str(err)) from err
