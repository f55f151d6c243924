"""Output files and folders a command writes: checked before any work is done, written with one line on
failure (bad input, exit 2) naming the flag."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiersim.errors import UsageError


def check_output_path(flag: str, path: str | None) -> None:
    """Fail before any work when ``path`` cannot be written: its directory must exist."""
    if path is None:
        return
    if not path.strip():
        raise UsageError(f"{flag}: empty path; give a file name, e.g. {flag} out.json")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name, e.g. {p / 'out.json'}")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: directory '{parent}' does not exist; create it first or pick another path")


def check_output_dir(flag: str, path: str) -> Path:
    """Fail before any work when ``path`` cannot become an output folder (created if missing)."""
    if not path or not path.strip():
        raise UsageError(f"{flag}: empty path; give a folder, e.g. {flag} report/")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: is a file; give a folder (it is created if missing)")
    if not p.exists() and not p.parent.is_dir():
        raise UsageError(f"{flag} {path}: its parent '{p.parent}' does not exist; create it first or pick another "
                         "folder")
    return p


def write_or_fail(flag: str, path: str, write: Callable[[str], Any]) -> None:
    """``write(path)``; an OSError becomes one line naming ``flag``."""
    try:
        write(path)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write ({e.strerror or e})") from None
