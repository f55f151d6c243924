"""Strict JSON: duplicate keys, NaN/Infinity, integers beyond 64 bits and nesting beyond `MAX_DEPTH` refused.

The document is parsed by the standard library's C decoder with hooks that refuse as they go (duplicate
keys, non-finite numbers, huge integer literals: no integer is ever converted from more than
`MAX_INT_DIGITS` digits, so Python's int-string limit is never reached); nesting is checked after (the
decoder's own recursion guard stops a document nested thousands deep first). Where a problem is found only
by its value, its place (line, column and dotted key) is looked up in the text afterwards.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from userfiles.errors import UserFileError
from userfiles.limits import MAX_DEPTH, MAX_INT, MAX_INT_DIGITS, limit_text
from userfiles.tree import check_tree, join_key

__all__ = ["parse_json"]


class _Refused(Exception):
    """Raised inside a decoder hook; turned into a UserFileError with the place looked up."""

    def __init__(self, problem: str, fix: str, literal: str | None = None, key: str | None = None) -> None:
        super().__init__(problem)
        self.problem, self.fix, self.literal, self.key = problem, fix, literal, key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"duplicate key '{dup}'", "each key may appear once in an object; keep the one you mean",
                       key=dup)
    return out


def _int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS or int(digits) > MAX_INT:
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(digits):,} digits)"
        raise _Refused(f"integer {shown} out of range (|n| < 2**63, {limit_text('MAX_INT_DIGITS', MAX_INT_DIGITS)})",
                       "give a number of at most 19 digits", literal=text)
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:24]} is out of range (it overflows to infinity)",
                       "give a finite number", literal=text)
    return value


def _constant(text: str) -> float:
    raise _Refused(f"{text} is not a number JSON allows", "give a finite number", literal=text)


def parse_json(text: str, label: str) -> Any:
    """The document in `text` (from file `label`), or a UserFileError."""
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_int=_int, parse_float=_float,
                         parse_constant=_constant)
    except _Refused as r:
        raise _placed(r, text, label) from None
    except json.JSONDecodeError as e:
        raise UserFileError(f"malformed JSON ({e.msg})", file=label, line=e.lineno, column=e.colno,
                            fix="fix the syntax there") from None
    except RecursionError:
        raise _too_deep(text, label) from None
    try:
        check_tree(doc, label)
    except UserFileError:
        raise _too_deep(text, label) from None
    return doc


def _too_deep(text: str, label: str) -> UserFileError:
    line, key = _deep_place(text)
    return UserFileError(f"nested deeper than {MAX_DEPTH} levels ({limit_text('MAX_DEPTH', MAX_DEPTH)})",
                         file=label, key=key, line=line, fix="flatten the document")


# --------------------------------------------------------------------------- places in the text


def _line_col(text: str, at: int) -> tuple[int, int]:
    line = text.count("\n", 0, at) + 1
    return line, at - (text.rfind("\n", 0, at) + 1) + 1


def _placed(r: _Refused, text: str, label: str) -> UserFileError:
    line = column = None
    key = None
    if r.key is not None:
        found = _find_duplicate(text)
        if found is not None:
            key, at = found
            line, column = _line_col(text, at)
        else:
            key = r.key
    elif r.literal is not None:
        m = re.search(rf"(?<![\w.\"]){re.escape(r.literal)}(?![\w.])", text)
        if m is not None:
            line, column = _line_col(text, m.start())
            key = _path_at(text, m.start())
    return UserFileError(r.problem, file=label, key=key, line=line, column=column, fix=r.fix)


def _scan(text: str, stop: Callable[[re.Match[str], list[list[Any]]], bool]) -> str | None:
    """Scan the text's tokens keeping the path of open containers; the path where `stop` first holds."""
    frames: list[list[Any]] = []  # [kind "{" or "[", key or index]
    for m in _TOKENS.finditer(text):
        if stop(m, frames):
            return _path(frames)
        tok = m.group()
        if tok in "[{":
            frames.append([tok, 0 if tok == "[" else ""])
        elif tok in "]}":
            if frames:
                frames.pop()
        elif tok == ",":
            if frames and frames[-1][0] == "[":
                frames[-1][1] += 1
        elif frames and frames[-1][0] == "{" and text.startswith(":", _WS.match(text, m.end()).end()):  # type: ignore[union-attr]
            try:
                frames[-1][1] = json.loads(tok)
            except ValueError:
                frames[-1][1] = tok.strip('"')
    return None


def _deep_place(text: str) -> tuple[int | None, str | None]:
    """(line, dotted key) where nesting first exceeds MAX_DEPTH."""
    where: list[int] = []

    def too_deep(m: re.Match[str], frames: list[list[Any]]) -> bool:
        if m.group() in "[{" and len(frames) >= MAX_DEPTH:
            where.append(m.start())
            return True
        return False

    path = _scan(text, too_deep)
    return (text.count("\n", 0, where[0]) + 1, path or None) if where else (None, None)


def _path_at(text: str, at: int) -> str | None:
    """The dotted key of the value at offset `at`."""
    return _scan(text, lambda m, _: m.start() >= at) or None


def _path(frames: list[list[Any]]) -> str:
    path = ""
    for _, key in frames:
        path = join_key(path, key)
    return path


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')
_WS = re.compile(r"[ \t\n\r]*")
_FIND_LIMIT = 32 << 20  # characters: beyond, a duplicate is named without its place (pure-Python walk)


def _find_duplicate(text: str) -> tuple[str, int] | None:
    """(dotted key, offset) of the first duplicate key, by a walk that knows offsets (only on the error path)."""
    if len(text) > _FIND_LIMIT:
        return None
    dec = json.JSONDecoder()
    try:
        found, _ = _value(text, _WS.match(text, 0).end(), "", dec, 0)  # type: ignore[union-attr]
        return found
    except (ValueError, IndexError, RecursionError):
        return None


def _value(s: str, i: int, path: str, dec: json.JSONDecoder, depth: int) -> tuple[tuple[str, int] | None, int]:
    """(the first duplicate key in the value at offset i, or None; the offset after the value)."""
    if depth > MAX_DEPTH:
        raise ValueError("too deep")
    ch = s[i]
    if ch == "{":
        return _object(s, i, path, dec, depth)
    if ch == "[":
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
        n = 0
        while s[i] != "]":
            found, i = _value(s, i, f"{path}[{n}]", dec, depth + 1)
            if found:
                return found, i
            i = _WS.match(s, i).end()  # type: ignore[union-attr]
            if s[i] == ",":
                i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
            n += 1
        return None, i + 1
    _, end = dec.raw_decode(s, i)
    return None, end


def _object(s: str, i: int, path: str, dec: json.JSONDecoder, depth: int) -> tuple[tuple[str, int] | None, int]:
    seen: set[str] = set()
    i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
    while s[i] != "}":
        key_at = i
        key, i = json.decoder.scanstring(s, i + 1)  # type: ignore[attr-defined]
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]  # past ':'
        if key in seen:
            return (join_key(path, key), key_at), i
        seen.add(key)
        found, i = _value(s, i, join_key(path, key), dec, depth + 1)
        if found:
            return found, i
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s[i] == ",":
            i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
    return None, i + 1
