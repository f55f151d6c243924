"""Strict YAML: plain data only (mappings, lists, text, numbers, true/false, null), every key once.

The text is composed into YAML nodes by PyYAML's safe loader with nesting bounded while composing (a
document nested thousands deep is refused at `MAX_DEPTH`, never a RecursionError), then the node graph is
checked before any Python object is built:

- aliases: the document's size with every alias expanded (nodes plus characters of text) is computed
  once per node and must stay within `MAX_YAML_EXPANSION` times the file's length, so an alias bomb
  (under any key, ``description`` included) is refused in time and memory proportional to the file; an
  alias to itself is refused;
- every key of a mapping appears once (merge keys ``<<`` may override, as YAML says) and is a plain value;
- integers have at most `MAX_INT_DIGITS` digits and fit 64 bits; floats are finite (``.nan``, ``.inf``
  and ``1e999`` are refused);
- no tags beyond the plain ones (``!!python/...``, ``!!binary``, ``!!set``... are refused); dates stay
  text (``2024-01-01`` is the string it looks like).

Each refusal is one `UserFileError` naming the line, the column and the dotted key.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from userfiles.errors import UserFileError
from userfiles.limits import MAX_DEPTH, MAX_INT, MAX_INT_DIGITS, MAX_YAML_EXPANSION, limit_text
from userfiles.tree import join_key

__all__ = ["parse_yaml"]

_T = "tag:yaml.org,2002:"
_PLAIN_TAGS = frozenset(_T + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge"))
_NOT_RESOLVED = frozenset({_T + "timestamp", _T + "value"})
_MIN_EXPANSION = 65_536  # a small file may still use a few aliases


class _Refused(Exception):
    def __init__(self, problem: str, node: Node | None, key: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.node, self.key, self.fix = problem, node, key, fix


# YAML 1.2 numbers: no sexagesimal (``1:30`` is text, not 90) and no octal by a leading zero (``010`` is 10,
# not 8; write ``0o10``); the rest as YAML 1.1 (underscores, ``0x``, ``.inf``/``.nan`` refused later)
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X)
_NUMBERS = {_T + "int": _INT, _T + "float": _FLOAT}


def _resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    out: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items():
        out[first] = [(tag, _NUMBERS.get(tag, rx)) for tag, rx in resolvers if tag not in _NOT_RESOLVED]
    return out


def _int12(text: str) -> int:
    """A YAML 1.2 integer literal (already matched by `_INT`)."""
    value = text.replace("_", "")
    sign = -1 if value.startswith("-") else 1
    value = value.lstrip("+-")
    if value.startswith("0x"):
        return sign * int(value[2:], 16)
    if value.startswith("0o"):
        return sign * int(value[2:], 8)
    return sign * int(value, 10)


class _Loader(yaml.SafeLoader):
    """SafeLoader with nesting bounded while composing, YAML 1.2 numbers, no implicit dates or '=' values."""

    yaml_implicit_resolvers = _resolvers()

    def construct_yaml_int(self, node: ScalarNode) -> int:  # type: ignore[override]
        text = str(self.construct_scalar(node))
        if not _INT.match(text):
            raise _Refused(f"{text[:24]!r} is not an integer", node, "", "give a whole number like 8")
        return _int12(text)

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels ({limit_text('MAX_DEPTH', MAX_DEPTH)})",
                               ScalarNode(_T + "null", "", event.start_mark, event.end_mark), "",
                               "flatten the document")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_yaml(text: str, label: str) -> Any:
    """The document in `text` (from file `label`), or a UserFileError."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _Checker(loader, max(MAX_YAML_EXPANSION * len(text), _MIN_EXPANSION)).check(node)
        return loader.construct_document(node)
    except _Refused as r:
        mark = r.node.start_mark if r.node is not None else None
        raise UserFileError(r.problem, file=label, key=r.key or None,
                            line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None,
                            fix=r.fix) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        char = chr(e.character) if isinstance(e.character, int) else str(e.character)
        raise UserFileError(f"character {char!r} (offset {e.position}) is not allowed in YAML", file=label, line=line,
                            fix="remove it (control characters are not text)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or "syntax error"
        raise UserFileError(f"malformed YAML ({problem})", file=label,
                            line=mark.line + 1 if mark is not None else None,
                            column=mark.column + 1 if mark is not None else None,
                            fix="fix the syntax there") from None
    finally:
        if loader is not None:
            loader.dispose()


class _Checker:
    """One pass over the node graph: expanded size, depth, keys, numbers, tags (see the module docstring)."""

    def __init__(self, loader: _Loader, budget: int) -> None:
        self.loader = loader
        self.budget = budget
        self.done: dict[int, tuple[int, int]] = {}   # id(node) -> (expanded size, height)
        self.open: set[int] = set()                  # nodes on the current path (an alias to one is a cycle)
        self.total = 0

    def check(self, root: Node) -> None:
        self.visit(root, "", 1)

    def visit(self, node: Node, key: str, depth: int) -> tuple[int, int]:
        nid = id(node)
        if nid in self.done:
            size, height = self.done[nid]
            self._grow(size, node, key)
            if depth - 1 + height > MAX_DEPTH:
                self._too_deep(node, key)
            return size, height
        if nid in self.open:
            raise _Refused("an alias refers to the node that contains it (an endless document)", node, key,
                           "write the value out instead of referring to itself")
        if depth > MAX_DEPTH:
            self._too_deep(node, key)
        if node.tag not in _PLAIN_TAGS:
            raise _Refused(f"unsupported YAML tag {node.tag}", node, key,
                           "write plain data: mappings, lists, text, numbers, true/false, null")
        self.open.add(nid)
        size, height = 1, 1
        if isinstance(node, ScalarNode):
            self._scalar(node, key)
            size += len(node.value)
            self._grow(size, node, key)
        elif isinstance(node, SequenceNode):
            self._grow(1, node, key)
            for i, child in enumerate(node.value):
                s, h = self.visit(child, join_key(key, i), depth + 1)
                size, height = size + s, max(height, h + 1)
        elif isinstance(node, MappingNode):
            self._grow(1, node, key)
            s, height = self._mapping(node, key, depth)
            size += s
        self.open.discard(nid)
        self.done[nid] = (size, height)
        return size, height

    def _mapping(self, node: MappingNode, key: str, depth: int) -> tuple[int, int]:
        seen: set[object] = set()
        size, height = 0, 1
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                raise _Refused("a key must be a plain value (text or a number), not a list or a mapping",
                               key_node, key, "write the key as text")
            if key_node.tag == _T + "merge":
                sub = key
            else:
                if key_node.tag not in _PLAIN_TAGS:
                    raise _Refused(f"unsupported YAML tag {key_node.tag}", key_node, key, "write the key as text")
                self._scalar(key_node, key)
                name = self.loader.construct_object(key_node)
                sub = join_key(key, name if isinstance(name, str) else str(name))
                if name in seen:
                    raise _Refused(f"duplicate key '{name}'", key_node, sub,
                                   "each key may appear once in a mapping; keep the one you mean")
                seen.add(name)
            s, h = self.visit(value_node, sub, depth + 1)
            size, height = size + s + len(key_node.value), max(height, h + 1)
        return size, height

    def _scalar(self, node: ScalarNode, key: str) -> None:
        if node.tag == _T + "int":
            if not _INT.match(node.value):
                raise _Refused(f"{node.value[:24]!r} is not an integer", node, key, "give a whole number like 8")
            digits = node.value.lstrip("+-").replace("_", "")
            if len(digits) > MAX_INT_DIGITS + 2 or abs(_int12(node.value)) > MAX_INT:
                shown = node.value if len(node.value) <= 24 else f"{node.value[:12]}...({len(node.value):,} chars)"
                raise _Refused(f"integer {shown} out of range (|n| < 2**63, "
                               f"{limit_text('MAX_INT_DIGITS', MAX_INT_DIGITS)})", node, key,
                               "give a number of at most 19 digits")
        elif node.tag == _T + "float" and (
                len(node.value) > 64 or not math.isfinite(self.loader.construct_yaml_float(node))):
            raise _Refused(f"{node.value[:24]} is not a finite number (NaN or infinity)", node, key,
                           "give a finite number")

    def _grow(self, amount: int, node: Node, key: str) -> None:
        self.total += amount
        if self.total > self.budget:
            raise _Refused(f"the document expands through its aliases (&anchor / *alias) to more than "
                           f"{self.budget:,} nodes and characters ({MAX_YAML_EXPANSION}x its length, "
                           f"{limit_text('MAX_YAML_EXPANSION', MAX_YAML_EXPANSION)})", node, key,
                           "write the values out instead of repeating aliases")

    def _too_deep(self, node: Node, key: str) -> None:
        raise _Refused(f"nested deeper than {MAX_DEPTH} levels ({limit_text('MAX_DEPTH', MAX_DEPTH)})", node, key,
                       "flatten the document")


_Loader.add_constructor(_T + "int", _Loader.construct_yaml_int)
