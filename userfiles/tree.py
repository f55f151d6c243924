"""Checks on a parsed document as a tree: nesting depth, with the dotted key of the deepest place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from userfiles.errors import UserFileError
from userfiles.limits import MAX_DEPTH, limit_text

__all__ = ["check_tree", "join_key"]


def join_key(path: str, key: object) -> str:
    """``gpu`` + ``count`` -> ``gpu.count``; ``segments`` + 0 -> ``segments[0]``."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def check_tree(doc: Any, label: str, locate: Callable[[str], int | None] | None = None) -> None:
    """Refuse a document whose containers nest deeper than MAX_DEPTH (iteratively: no recursion)."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise UserFileError(f"nested deeper than {MAX_DEPTH} levels ({limit_text('MAX_DEPTH', MAX_DEPTH)})",
                                file=label, key=path or None, line=locate(path) if locate and path else None,
                                fix="flatten the document")
        if isinstance(node, dict):
            stack.extend((v, join_key(path, k), depth + 1) for k, v in node.items() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, join_key(path, i), depth + 1) for i, v in enumerate(node) if isinstance(v, dict | list))
