"""One reader for every user file: hardware YAML, model YAML, HF ``config.json``, plan JSON, sweep YAML,
report inputs (result / what-if / coverage JSON), DeepSpeed config JSON.

    from userfiles import read_yaml, read_json, UserFileError
    data = read_yaml("my_box.yaml", "hardware")     # plain data: dict / list / str / int / float / bool / None

Every file is read the same way (docs/design.md, "Bounded inputs"): at most its kind's size in bytes; strict
UTF-8 (a bad byte is named by offset and line); duplicate keys refused (YAML and JSON, with the line);
YAML aliases bounded in how far they expand; nesting bounded (`MAX_DEPTH`); integers bounded to 64 bits
(no huge-integer conversion ever runs); NaN and infinities refused. Every failure is ONE
`UserFileError` line naming the file, the line, the dotted key where known, and the fix.

This package imports none of ours: every package may import it. The bounds on impossible sizes (GPUs per
machine, model parameters, plan tasks and steps, replay steps) live in `userfiles.limits` for the packages
that check them.
"""

from __future__ import annotations

import os
from typing import Any

from userfiles import limits
from userfiles.errors import UserFileError, one_line
from userfiles.json_reader import parse_json
from userfiles.limits import KINDS, FileKind, limit_text
from userfiles.text import decode, read_text
from userfiles.yaml_reader import parse_yaml

__all__ = ["KINDS", "FileKind", "UserFileError", "check_at_most", "limits", "one_line", "parse_text", "read",
           "read_json", "read_yaml"]


def read(path: str | os.PathLike[str], kind: str) -> Any:
    """Read and parse a user file of `kind` (one of `KINDS`) in that kind's format."""
    k = limits.kind(kind)
    return parse_text(read_text(path, k), kind, os.fspath(path))


def read_yaml(path: str | os.PathLike[str], kind: str) -> Any:
    """Read a YAML user file (JSON is YAML too, so a JSON file of the same content reads the same)."""
    return parse_yaml(read_text(path, limits.kind(kind)), os.fspath(path))


def read_json(path: str | os.PathLike[str], kind: str) -> Any:
    """Read a JSON user file."""
    return parse_json(read_text(path, limits.kind(kind)), os.fspath(path))


def parse_text(text: str | bytes, kind: str, label: str) -> Any:
    """Parse text already in hand (bytes are decoded strictly) as `kind`'s format, with `label` as file."""
    k = limits.kind(kind)
    if isinstance(text, bytes):
        text = decode(text, label)
    if len(text.encode("utf-8", "surrogatepass")) > k.max_bytes:
        raise UserFileError(f"larger than {k.max_bytes:,} bytes ({limit_text(k.limit_name, k.max_bytes)})",
                            file=label, fix=f"give {k.expect}")
    return parse_yaml(text, label) if k.fmt == "yaml" else parse_json(text, label)


def check_at_most(value: int | float, limit: int, limit_name: str, *, what: str, file: str | None = None,
                  key: str | None = None, fix: str | None = None) -> None:
    """Refuse an impossible size up front: ``1,000 layers is beyond the bound MAX_MODEL_LAYERS = 4,096``."""
    if value > limit:
        shown = f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
        raise UserFileError(f"{shown} {what} is beyond the bound {limit_text(limit_name, limit)}", file=file,
                            key=key, fix=fix or "see docs/design.md, 'Bounded inputs'")
