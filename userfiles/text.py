"""Reading a user file's text: at most its kind's size, strict UTF-8, one line for every failure."""

from __future__ import annotations

import os
from pathlib import Path

from userfiles.errors import UserFileError
from userfiles.limits import FileKind, limit_text

__all__ = ["decode", "read_text"]

_BOM = b"\xef\xbb\xbf"


def read_text(path: str | os.PathLike[str], kind: FileKind) -> str:
    """The file's text. Reads at most ``kind.max_bytes + 1`` bytes (a device that never ends is refused
    too), decodes strictly as UTF-8 (a byte-order mark is dropped)."""
    label = os.fspath(path)
    p = Path(label)
    try:
        with p.open("rb") as f:
            raw = f.read(kind.max_bytes + 1)
    except IsADirectoryError:
        raise UserFileError(f"cannot read {kind.title} (it is a directory)", file=label,
                            fix=f"give {kind.expect}") from None
    except FileNotFoundError:
        raise UserFileError(f"cannot read {kind.title} (No such file or directory)", file=label,
                            fix=f"give an existing path to {kind.expect}") from None
    except OSError as e:
        raise UserFileError(f"cannot read {kind.title} ({e.strerror or e})", file=label,
                            fix="check the path and its permissions") from None
    if len(raw) > kind.max_bytes:
        raise UserFileError(f"larger than {kind.max_bytes:,} bytes ({limit_text(kind.limit_name, kind.max_bytes)})",
                            file=label, fix=f"give {kind.expect}; is this the right file?")
    return decode(raw, label)


def decode(raw: bytes, label: str) -> str:
    """Strict UTF-8: the first bad byte is named by its offset and line."""
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        bad = raw[e.start:e.start + 1].hex()
        raise UserFileError(f"not UTF-8 text: byte 0x{bad} at offset {e.start}", file=label, line=line,
                            fix="save the file as UTF-8") from None
    if "\x00" in text:
        at = text.index("\x00")
        raise UserFileError(f"a NUL character at offset {at}", file=label, line=text.count("\n", 0, at) + 1,
                            fix="this is a binary file; give a text file")
    return text
