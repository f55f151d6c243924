"""The one exception type of `hardware_models`.

Every problem with a hardware description (a preset, a user YAML file, an override or a value object
built by hand) is reported as a `HardwareInputError`: a `ValueError` whose message is ONE line naming
the file (if any), the dotted field path (if any) and what to do about it, e.g.::

    a100x8.yaml: field 'gpu.memory': expected a size like '80GB', got 'eighty'
"""

from __future__ import annotations

from typing import Any

__all__ = ["HardwareInputError"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


class HardwareInputError(ValueError):
    """Bad hardware input. `str(err)` is one line: ``<file>: field '<path>': <problem>``.

    The parts are kept as attributes (`problem`, `field`, `file`) so that callers can add context
    while the error travels outwards (`within`, `in_file`) without parsing the message.
    """

    def __init__(self, problem: str, *, field: str | None = None, file: str | None = None) -> None:
        self.problem = _one_line(problem)
        self.field = field
        self.file = file
        super().__init__(self._render())

    def _render(self) -> str:
        parts: list[str] = []
        if self.file:
            parts.append(self.file)
        if self.field:
            parts.append(f"field '{self.field}'")
        parts.append(self.problem)
        return ": ".join(parts)

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only arguments are not in self.args; keep the error picklable (multiprocessing)
        return (_rebuild, (self.problem, self.field, self.file))

    def within(self, prefix: str) -> HardwareInputError:
        """The same error with `prefix` put in front of its field path (`[i]` joins without a dot)."""
        if not self.field:
            field = prefix
        elif self.field.startswith("["):
            field = prefix + self.field
        else:
            field = f"{prefix}.{self.field}"
        return HardwareInputError(self.problem, field=field, file=self.file)

    def in_file(self, file: str | None) -> HardwareInputError:
        """The same error naming `file`, unless it already names one (the innermost file wins)."""
        if file is None or self.file is not None:
            return self
        return HardwareInputError(self.problem, field=self.field, file=file)


def _rebuild(problem: str, field: str | None, file: str | None) -> HardwareInputError:
    return HardwareInputError(problem, field=field, file=file)
