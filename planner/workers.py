"""A small process pool whose running tasks can be stopped: the plan search's speculative simulations.

``concurrent.futures.ProcessPoolExecutor`` cannot stop a task once it runs (``cancel`` only drops queued
ones, and Python 3.11 has no public way to end its workers), while a speculative simulation that the
search no longer needs can take minutes. :class:`Workers` keeps ``n`` worker processes of its own, each
running one task at a time; :meth:`Workers.cancel` ends one task (its process is terminated and replaced
when needed) and :meth:`Workers.stop` ends them all. Used as a context manager it stops on exit.

    with Workers(2) as pool:
        pool.submit(7, fn, arg)           # tasks are keyed by the caller (an int: the candidate index)
        for key, value in pool.wait():    # the tasks that finished, by key; a task's exception re-raised
            ...

Tasks and their results cross process boundaries by pickling (``fn`` must be a module-level function).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any

STOP_TIMEOUT_S = 5.0


class WorkerDied(RuntimeError):
    """A worker process ended without answering (killed from outside, or out of memory)."""


def _serve(conn: Connection, initializer: Callable[[], None] | None) -> None:
    """A worker's loop: run ``(fn, args)`` requests until told to stop (``None``) or the pipe closes."""
    if initializer is not None:
        initializer()
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        fn, args = item
        try:
            out: tuple[bool, Any] = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which re-raises it
            out = (False, e)
        conn.send(out)


@dataclass
class _Worker:
    proc: BaseProcess
    conn: Connection

    def end(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(STOP_TIMEOUT_S)
        self.conn.close()


class Workers:
    """``n`` worker processes; tasks beyond ``n`` wait in submission order. ``context``: a
    ``multiprocessing`` context (default: the platform's); ``initializer``: run once in each worker."""

    def __init__(self, n: int, *, context: BaseContext | None = None,
                 initializer: Callable[[], None] | None = None):
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        self._n = n
        self._ctx = context if context is not None else multiprocessing.get_context()
        self._initializer = initializer
        self._idle: list[_Worker] = []
        self._busy: dict[int, _Worker] = {}
        self._queue: deque[tuple[int, Callable[..., Any], tuple[Any, ...]]] = deque()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- tasks ------------------------------------------------------------------------------------------
    def submit(self, key: int, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker (now, or when one is free); ``key`` names it in ``wait``."""
        if key in self._busy or any(k == key for k, _, _ in self._queue):
            raise ValueError(f"task {key} is already submitted")
        self._queue.append((key, fn, args))
        self._dispatch()

    def pending(self) -> list[int]:
        """Keys of the tasks running or waiting, in key order."""
        return sorted([*self._busy, *(k for k, _, _ in self._queue)])

    def running(self) -> list[int]:
        return sorted(self._busy)

    def wait(self, timeout: float | None = None) -> list[tuple[int, Any]]:
        """Block until a running task ends (at most ``timeout`` s); the ``(key, result)`` of those that
        ended, by key. A task's exception is re-raised here, after every other task is stopped."""
        if not self._busy:
            return []
        handles: list[Any] = [w.conn for w in self._busy.values()] + [w.proc.sentinel for w in self._busy.values()]
        ready = set(wait_ready(handles, timeout))
        out: list[tuple[int, Any]] = []
        for key in sorted(self._busy):
            w = self._busy[key]
            if w.conn not in ready and w.proc.sentinel not in ready:
                continue
            del self._busy[key]
            try:
                ok, value = w.conn.recv()
            except (EOFError, OSError):  # the process ended without answering
                w.end()
                self.stop()
                raise WorkerDied(f"worker process {w.proc.pid} ended (exit code {w.proc.exitcode}) "
                                 f"while running task {key}") from None
            self._idle.append(w)
            if not ok:
                self.stop()
                raise value
            out.append((key, value))
        self._dispatch()
        return out

    def cancel(self, key: int) -> None:
        """Drop a waiting task, or stop a running one (its worker process is terminated)."""
        self._queue = deque(item for item in self._queue if item[0] != key)
        w = self._busy.pop(key, None)
        if w is not None:
            w.end()
        self._dispatch()

    def stop(self) -> None:
        """End every worker process now, running tasks included, and drop the waiting ones."""
        self._queue.clear()
        for w in [*self._busy.values(), *self._idle]:
            w.end()
        self._busy.clear()
        self._idle.clear()

    # -- processes --------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while self._queue and len(self._busy) < self._n:
            key, fn, args = self._queue.popleft()
            w = self._idle.pop() if self._idle else self._start()
            w.conn.send((fn, args))
            self._busy[key] = w

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        # every concrete context has Process; typeshed declares it on the subclasses only
        proc = self._ctx.Process(target=_serve, args=(child, self._initializer),  # type: ignore[attr-defined]
                                 daemon=True, name="tiersim-worker")
        proc.start()
        child.close()
        return _Worker(proc, parent)
