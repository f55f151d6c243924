"""A wall-clock promise (``--budget``): a :class:`Deadline`, and running one piece of work so that it stops there.

    deadline = Deadline.after(60.0)              # 60 s from now (None: no deadline)
    deadline.left(), deadline.expired()
    part = deadline.share(4)                     # a quarter of what is left, ending no later than deadline
    done, value = run_bounded(deadline, fn, x)   # fn(x) in a worker process, stopped at the deadline

The clock is injected (``clock``, default ``time.monotonic``), so the tests drive a deadline with a fake
clock and never depend on how loaded the machine is. A search keeps its promise in two ways: it checks
``expired()`` before each plan and each simulation, and, with a deadline, it runs those in worker processes
(``planner.workers``) that it stops when the deadline passes, so no single long plan (a MILP) or
simulation can carry a command past it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from planner.workers import Workers

Clock = Callable[[], float]

WAIT_STEP_S = 0.5  # longest wait for a worker between looks at the deadline


class Deadline:
    """A point in time ``budget_s`` seconds after the deadline was made (``budget_s`` None: never).

    ``end`` is on ``clock``'s scale; sub-deadlines (:meth:`within`, :meth:`share`) share the clock and never
    end after their parent.
    """

    def __init__(self, budget_s: float | None, clock: Clock = time.monotonic, *, end: float | None = None):
        if budget_s is not None and not budget_s > 0:
            raise ValueError(f"a budget must be more than zero seconds, got {budget_s}")
        self.clock = clock
        self.start = clock()
        self.budget_s = budget_s
        if end is not None:
            self.end: float | None = end
        else:
            self.end = None if budget_s is None else self.start + budget_s

    @classmethod
    def after(cls, budget_s: float | None, clock: Clock = time.monotonic) -> Deadline:
        return cls(budget_s, clock)

    @classmethod
    def never(cls) -> Deadline:
        return cls(None)

    @property
    def bounded(self) -> bool:
        return self.end is not None

    def left(self) -> float:
        """Seconds until the deadline (0 once it has passed; ``inf`` without one)."""
        return math.inf if self.end is None else max(0.0, self.end - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.end is not None and self.clock() >= self.end

    def within(self, seconds: float | None) -> Deadline:
        """A deadline ``seconds`` from now (None: this one's end), never later than this one."""
        now = self.clock()
        ends = [e for e in (self.end, None if seconds is None else now + max(seconds, 0.0)) if e is not None]
        end = min(ends) if ends else None
        sub = Deadline(None, self.clock, end=end)
        sub.budget_s = None if end is None else max(end - now, 0.0)
        return sub

    def share(self, parts: int, floor_s: float = 0.0) -> Deadline:
        """An equal share of what is left among ``parts`` pieces of work still to do (at least ``floor_s``,
        but never past this deadline)."""
        if self.end is None:
            return self.within(None)
        return self.within(max(self.left() / max(parts, 1), floor_s))

    def describe(self) -> str:
        return "no budget" if self.budget_s is None else f"budget of {self.budget_s:g} s"


def run_bounded(deadline: Deadline, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """``(True, fn(*args))``, or ``(False, None)`` when the deadline passed first. Without a deadline ``fn``
    runs in this process; with one, in a worker process that is stopped at the deadline (``fn`` must be a
    module-level function; its arguments and result are pickled)."""
    if not deadline.bounded:
        return True, fn(*args)
    if deadline.expired():
        return False, None
    with Workers(1) as pool:
        pool.submit(0, fn, *args)
        while True:
            for _, value in pool.wait(timeout=min(WAIT_STEP_S, deadline.left())):
                return True, value
            if deadline.expired():
                return False, None  # the pool stops the worker on exit
