"""The one error of `userfiles`: a user file that cannot be read as data.

`str(err)` is ONE line naming the file, where in it (line and column when known), the key at fault as a
dotted path (``gpu.count``, ``segments[0].tasks[3].bytes``) when known, the problem and the fix::

    my_box.yaml: line 7, column 3: key 'gpu.count': duplicate key; each key may appear once in a mapping

The parts stay attributes (`problem`, `file`, `key`, `line`, `column`, `fix`) so a caller can re-raise it
as its own error type (``HardwareInputError(err.detail(), file=err.file)``) without parsing the text.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UserFileError", "one_line"]


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class UserFileError(ValueError):
    """A user file that is not acceptable data (too big, not UTF-8, malformed, duplicate key, too deep, a
    number out of range, an alias that expands too far, an impossible size). Exit code 2 in the CLI."""

    def __init__(self, problem: str, *, file: str | None = None, key: str | None = None, line: int | None = None,
                 column: int | None = None, fix: str | None = None) -> None:
        self.problem = one_line(problem)
        self.file = file
        self.key = key or None
        self.line = line
        self.column = column
        self.fix = one_line(fix) if fix else None
        super().__init__(self._render())

    def where(self) -> str:
        """``line 7, column 3`` (or ``line 7``, or empty)."""
        if self.line is None:
            return ""
        return f"line {self.line}" + (f", column {self.column}" if self.column is not None else "")

    def detail(self) -> str:
        """The message without the file: ``line 7: key 'gpu.count': duplicate key; <fix>``."""
        key = self.key if self.key is None or len(self.key) <= 100 else f"{self.key[:48]}...{self.key[-40:]}"
        parts = [p for p in (self.where(), f"key '{key}'" if key else "") if p]
        text = self.problem + (f"; {self.fix}" if self.fix else "")
        return ": ".join([*parts, text])

    def _render(self) -> str:
        return f"{self.file}: {self.detail()}" if self.file else self.detail()

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only arguments are not in self.args; keep the error picklable (sweep worker processes)
        return (_rebuild, (self.problem, self.file, self.key, self.line, self.column, self.fix))

    def in_file(self, file: str | None) -> UserFileError:
        """The same error naming `file`, unless it already names one."""
        if file is None or self.file is not None:
            return self
        return UserFileError(self.problem, file=file, key=self.key, line=self.line, column=self.column,
                             fix=self.fix)


def _rebuild(problem: str, file: str | None, key: str | None, line: int | None, column: int | None,
             fix: str | None) -> UserFileError:
    return UserFileError(problem, file=file, key=key, line=line, column=column, fix=fix)
