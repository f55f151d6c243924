"""The row filter of ``tiersim results --where EXPR``: a small grammar of its own, never Python.

The expression is tokenised and parsed here by hand (recursive descent) and evaluated on a DataFrame with
boolean masks. Nothing of the user's text reaches ``eval``, ``exec``, ``DataFrame.query`` or
``DataFrame.eval``: an ``@name``, a call or an attribute is not part of the grammar and is refused with
the position where it starts.

Grammar (keywords are case-insensitive)::

    expr       := or_expr
    or_expr    := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | primary
    primary    := "(" expr ")" | FIELD [ OP value | ["not"] "in" "(" value ("," value)* ")" ]
    OP         := "==" | "!=" | "<" | "<=" | ">" | ">="
    value      := NUMBER | STRING | WORD        (STRING: '...' or "..."; WORD: a bare word such as gpt2,
                                                 opt-1.3b, true, false)

A FIELD alone is a boolean field (``feasible``, ``flash_attention``) and means ``FIELD == true``.
Number fields compare with numbers, text fields with strings or bare words (``==``, ``!=``, ``in``; ``<``
etc. compare text alphabetically), boolean fields with ``true`` or ``false``. A missing value (a failed
run has no ``tokens_per_s``) satisfies no comparison, ``!=`` included; ``not`` turns the result over.
Every error is one :class:`WhereError` line: an unknown field lists the known ones, anything else gives
the position (counted from 1) and what was expected there.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_LENGTH = 10_000  # characters of one expression
MAX_DEPTH = 64       # nested parentheses and "not"s

NUMBER = "number"
TEXT = "text"
BOOLEAN = "boolean"

OPS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
KEYWORDS = ("and", "or", "not", "in")

_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z0-9_.])")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_OP_RE = re.compile(r"==|!=|<=|>=|<|>")


class WhereError(ValueError):
    """A ``--where`` expression that cannot be used: one line (position and what was expected, or the
    unknown field with the known ones)."""


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "number", "string", "op", "(", ")", ",", "end"
    text: str
    value: Any
    pos: int   # 1-based column


def tokenize(expr: str) -> list[Token]:
    """The tokens of ``expr`` (a WhereError names the position of the first character that fits none)."""
    if len(expr) > MAX_LENGTH:
        raise WhereError(f"expression of {len(expr):,} characters; keep it under {MAX_LENGTH:,}")
    out: list[Token] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
            continue
        if c in "(),":
            out.append(Token(c, c, c, i + 1))
            i += 1
            continue
        if c in "'\"":
            end = expr.find(c, i + 1)
            if end < 0:
                raise WhereError(f"position {i + 1}: string opened with {c} is not closed")
            out.append(Token("string", expr[i:end + 1], expr[i + 1:end], i + 1))
            i = end + 1
            continue
        m = _OP_RE.match(expr, i)
        if m:
            out.append(Token("op", m.group(), m.group(), i + 1))
            i = m.end()
            continue
        m = _NUMBER_RE.match(expr, i)
        if m:
            value = float(m.group())
            if not math.isfinite(value):
                raise WhereError(f"position {i + 1}: number {m.group()!r} is out of range")
            out.append(Token("number", m.group(), value, i + 1))
            i = m.end()
            continue
        m = _WORD_RE.match(expr, i)
        if m:
            out.append(Token("word", m.group(), m.group(), i + 1))
            i = m.end()
            continue
        hint = "; compare with ==" if c == "=" else "; combine with and / or / not" if c in "&|!~" else ""
        raise WhereError(f"position {i + 1}: unexpected character {c!r}{hint}")
    out.append(Token("end", "", None, n + 1))
    return out


# -- the tree ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compare:
    field: str
    kind: str        # NUMBER, TEXT or BOOLEAN
    op: str          # one of OPS, or "in" / "not in"
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Truth:
    field: str       # a boolean field on its own: FIELD == true


@dataclass(frozen=True)
class Not:
    arg: Node


@dataclass(frozen=True)
class BoolOp:
    op: str          # "and" | "or"
    args: tuple[Node, ...]


Node = Compare | Truth | Not | BoolOp


def parse(expr: str, fields: Mapping[str, str]) -> Node:
    """The tree of ``expr`` over ``fields`` (name -> NUMBER, TEXT or BOOLEAN); a WhereError if it is not one."""
    if not expr.strip():
        raise WhereError("empty expression; give e.g. \"policy == 'none'\" or \"feasible and tokens_per_s > 5e4\"")
    return _Parser(tokenize(expr), fields).parse()


class _Parser:
    def __init__(self, tokens: Sequence[Token], fields: Mapping[str, str]):
        self.tokens = tokens
        self.fields = fields
        self.i = 0
        self.depth = 0

    # -- helpers
    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        t = self.tokens[self.i]
        if t.kind != "end":
            self.i += 1
        return t

    def keyword(self, word: str) -> bool:
        t = self.peek()
        if t.kind == "word" and t.text.lower() == word:
            self.i += 1
            return True
        return False

    def fail(self, t: Token, expected: str) -> WhereError:
        got = "the end" if t.kind == "end" else repr(t.text)
        return WhereError(f"position {t.pos}: expected {expected}, got {got}")

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise WhereError(f"position {self.peek().pos}: nested deeper than {MAX_DEPTH} levels")

    # -- rules
    def parse(self) -> Node:
        node = self.or_expr()
        t = self.peek()
        if t.kind != "end":
            raise self.fail(t, "and, or, or the end of the expression")
        return node

    def or_expr(self) -> Node:
        args = [self.and_expr()]
        while self.keyword("or"):
            args.append(self.and_expr())
        return args[0] if len(args) == 1 else BoolOp("or", tuple(args))

    def and_expr(self) -> Node:
        args = [self.not_expr()]
        while self.keyword("and"):
            args.append(self.not_expr())
        return args[0] if len(args) == 1 else BoolOp("and", tuple(args))

    def not_expr(self) -> Node:
        if self.keyword("not"):
            self.nest()
            node = Not(self.not_expr())
            self.depth -= 1
            return node
        return self.primary()

    def primary(self) -> Node:
        t = self.peek()
        if t.kind == "(":
            self.take()
            self.nest()
            node = self.or_expr()
            self.depth -= 1
            close = self.take()
            if close.kind != ")":
                raise self.fail(close, "')' to close the '(' at position " + str(t.pos))
            return node
        if t.kind != "word" or t.text.lower() in KEYWORDS:
            raise self.fail(t, "a field name or '('")
        self.take()
        name = t.text
        if name not in self.fields:
            raise WhereError(f"unknown field {name!r}; fields: {', '.join(self.fields)}")
        kind = self.fields[name]
        nxt = self.peek()
        if nxt.kind == "op":
            self.take()
            if kind == BOOLEAN and nxt.text not in ("==", "!="):
                raise WhereError(f"position {nxt.pos}: {name!r} is true or false; compare it with == or !=")
            return Compare(name, kind, nxt.text, (self.value(name, kind),))
        if nxt.kind == "word" and nxt.text.lower() in ("in", "not"):
            negated = self.keyword("not")
            if not self.keyword("in"):
                raise self.fail(self.peek(), "'in' after 'not'")
            return Compare(name, kind, "not in" if negated else "in", self.value_list(name, kind))
        if kind == BOOLEAN:
            return Truth(name)
        raise self.fail(nxt, f"a comparison after {name!r} (== != < <= > >= in)")

    def value_list(self, name: str, kind: str) -> tuple[Any, ...]:
        t = self.take()
        if t.kind != "(":
            raise self.fail(t, "'(' to start the list of values")
        values = [self.value(name, kind)]
        while self.peek().kind == ",":
            self.take()
            values.append(self.value(name, kind))
        close = self.take()
        if close.kind != ")":
            raise self.fail(close, "',' or ')' in the list of values")
        return tuple(values)

    def value(self, name: str, kind: str) -> Any:
        t = self.take()
        if t.kind not in ("number", "string", "word") or (t.kind == "word" and t.text.lower() in KEYWORDS):
            raise self.fail(t, f"a value for {name!r}")
        if kind == NUMBER:
            if t.kind != "number":
                raise WhereError(f"position {t.pos}: {name!r} is a number; compare it with a number, not {t.text}")
            return t.value
        if kind == BOOLEAN:
            word = str(t.value).lower() if t.kind != "number" else t.text
            if word not in ("true", "false"):
                raise WhereError(f"position {t.pos}: {name!r} is true or false; compare it with true or false, "
                                 f"not {t.text}")
            return word == "true"
        return t.text if t.kind == "number" else t.value  # a text field: 0.5 is the text "0.5"


# -- evaluation -------------------------------------------------------------------------------------------
def evaluate(node: Node, frame: Any) -> Any:
    """A numpy boolean array over ``frame``'s rows (True where ``node`` holds)."""
    import numpy as np

    if isinstance(node, BoolOp):
        masks = [evaluate(a, frame) for a in node.args]
        out = masks[0]
        for m in masks[1:]:
            out = (out & m) if node.op == "and" else (out | m)
        return out
    if isinstance(node, Not):
        return ~evaluate(node.arg, frame)
    if isinstance(node, Truth):
        return np.array([_missing(v) is False and bool(v) is True for v in frame[node.field]], dtype=bool)
    values = frame[node.field].tolist()
    if node.kind == NUMBER:
        import pandas as pd

        values = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").tolist()
    return np.array([holds(node, v) for v in values], dtype=bool)


def holds(node: Compare, v: Any) -> bool:
    """Whether the comparison holds for one cell (a missing cell satisfies none)."""
    if _missing(v):
        return False
    if node.kind == BOOLEAN:
        v = bool(v)
    if node.op == "in":
        return v in node.values
    if node.op == "not in":
        return v not in node.values
    return bool(OPS[node.op](v, node.values[0]))


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN, pandas NA (whose comparison raises)
    except TypeError:
        return True


def filter_frame(frame: Any, expr: str, kinds: Mapping[str, str]) -> Any:
    """The rows of ``frame`` where ``expr`` holds, ``kinds`` giving each field's kind (NUMBER, TEXT or
    BOOLEAN); a WhereError when ``expr`` is not an expression of the grammar."""
    node = parse(expr, kinds)
    return frame[evaluate(node, frame)]
