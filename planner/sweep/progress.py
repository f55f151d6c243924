"""Progress of a sweep on stderr: completed / failed / remaining, rate and ETA, one line rewritten in place."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Counts finished points; ``line()`` is the status text, ``update()`` redraws it on ``stream``.

    ``already`` points were in the store before this run (they are neither run nor counted as remaining).
    The ETA is the remaining points over the rate of this run so far.
    """

    def __init__(self, total: int, already: int = 0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.already = total, already
        self.done = self.failed = 0
        self.stream = stream
        self._clock = clock
        self._start = clock()
        self._last_draw = float("-inf")

    @property
    def remaining(self) -> int:
        return self.total - self.already - self.done - self.failed

    def elapsed_s(self) -> float:
        return self._clock() - self._start

    def rate(self) -> float:
        """Points finished per second in this run (0 before the first)."""
        elapsed = self.elapsed_s()
        finished = self.done + self.failed
        return finished / elapsed if finished and elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        eta = _clock_text(self.remaining / rate) if rate > 0 else "?"
        stored = f" (+{self.already} already stored)" if self.already else ""
        return (f"sweep: {self.done + self.already}/{self.total} completed{stored}, {self.failed} failed, "
                f"{self.remaining} remaining, {rate:.1f}/s, ETA {eta}")

    def update(self, status: str) -> None:
        if status == "done":
            self.done += 1
        else:
            self.failed += 1
        now = self._clock()
        if self.stream is not None and (now - self._last_draw >= 0.1 or self.remaining == 0):
            self._last_draw = now
            self.stream.write("\r" + self.line() + "\033[K")
            self.stream.flush()

    def finish(self) -> None:
        if self.stream is not None:
            self.stream.write("\r" + self.line() + "\033[K\n")
            self.stream.flush()


def _clock_text(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
