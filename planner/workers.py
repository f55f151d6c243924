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
A task submitted with :meth:`Workers.submit_scratch` is called as ``fn(scratch, *args)``: ``scratch`` is a dict
private to the worker process that runs it, kept between that process's tasks and lost with the process (a
cancelled task's worker is replaced), so a task may leave something there for a later one (the plan search
keeps the plans it built for their simulation) and must do without it when it is gone.

Worker processes never outlive the process that started the pool, the client (:func:`worker_setup`, run
first in each worker; every process pool of tiersim is this one: the plan search's, the sweep's,
``simulate --policy all``'s and the report's figures'): Ctrl-C is left to the client, which stops the pool
(a terminal sends it to every process of the group; a worker ignores it rather than printing a traceback of
its own); SIGTERM ends a worker at once; and when the client dies, even by SIGKILL, its workers follow
(:func:`die_with_parent`: ``prctl(PR_SET_PDEATHSIG)`` on Linux, and everywhere a thread that watches the
parent and the client). With the ``forkserver`` method the fork server then exits too, and with it
multiprocessing's resource tracker.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any

STOP_TIMEOUT_S = 5.0
PARENT_POLL_S = 0.5  # how often a worker looks for its parent (where the kernel does not tell it at once)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class WorkerDied(RuntimeError):
    """A worker process ended without answering (killed from outside, or out of memory)."""


def worker_setup(client_pid: int | None = None) -> None:
    """Run first in every worker process (an ``initializer``): leave Ctrl-C to the client, end at once on
    SIGTERM, and die with the client (:func:`die_with_parent`). ``client_pid``: the process that started the
    pool (default: this process's parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the client while it started this process
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    die_with_parent(client_pid)


def die_with_parent(client_pid: int | None = None) -> None:
    """End this process when its parent, or the client ``client_pid`` that started it, ends.

    Linux: the kernel sends SIGKILL when the parent ends (``prctl(PR_SET_PDEATHSIG)``). Everywhere: a
    daemon thread looks every :data:`PARENT_POLL_S` seconds whether the parent changed or the client is
    gone. The client is watched because with the ``forkserver`` method the parent is the fork server, which
    outlives a killed client as long as the client's workers live (each holds the server's keep-alive pipe).
    A process whose parent or client is gone already when this runs exits at once."""
    ppid = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    client = client_pid if client_pid is not None else ppid
    born = _start_time(client)
    if ppid == 1 or os.getppid() != ppid or not _alive(client, born):
        os._exit(1)
    threading.Thread(target=_watch, args=(ppid, client, born), name="tiersim-parent-watch", daemon=True).start()


def _watch(ppid: int, client: int, born: str | None) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != ppid or not _alive(client, born):
            os._exit(1)


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (Linux: field 22 of /proc/PID/stat), to tell it from a later process of that pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _alive(pid: int, born: str | None) -> bool:
    """``pid`` runs (not a zombie) and is the process that started at ``born`` (when known)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0] not in (b"Z", b"X") and (born is None or fields[19].decode() == born)
    except FileNotFoundError:
        if os.path.exists("/proc/self/stat"):  # /proc is there, the process is not
            return False
    except (OSError, IndexError):  # /proc unreadable: ask the kernel
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: ours is gone and its pid reused
        return False
    return True


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back while a worker starts: it inherits the mask (fork, or the exec of spawn)
    and unblocks them once :func:`worker_setup` has set what they do, so none arrives before."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _serve(conn: Connection, initializer: Callable[[], None] | None, client_pid: int | None = None) -> None:
    """A worker's loop: run ``(fn, args)`` requests until told to stop (``None``) or the pipe closes."""
    worker_setup(client_pid)
    if initializer is not None:
        initializer()
    scratch: dict[Any, Any] = {}  # this process's, for the tasks submitted with submit_scratch
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        fn, args, with_scratch = item
        try:
            out: tuple[bool, Any] = (True, fn(scratch, *args) if with_scratch else fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which re-raises it
            out = (False, e)
        try:
            conn.send(out)
        except OSError:  # the parent is gone (or stopped this worker): nobody to answer
            return


@dataclass
class _Worker:
    proc: BaseProcess
    conn: Connection

    def end(self) -> None:
        self.signal_end()
        self.reap()

    def signal_end(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()  # SIGTERM: a worker ends at once (worker_setup)

    def reap(self) -> None:
        self.proc.join(STOP_TIMEOUT_S)
        if self.proc.is_alive():  # should not happen; never leave a process behind
            self.proc.kill()
            self.proc.join(STOP_TIMEOUT_S)
        self.conn.close()


class Workers:
    """``n`` worker processes; tasks beyond ``n`` wait in submission order. ``context``: a
    ``multiprocessing`` context (default: the platform's); ``initializer``: run once in each worker;
    ``daemon=False``: the workers may start pools of their own (multiprocessing refuses a daemonic process
    children), as the what-if's machines do, each a search with its own worker. Either way a worker ends with
    the pool (:meth:`stop`) and with the client (:func:`die_with_parent`)."""

    def __init__(self, n: int, *, context: BaseContext | None = None,
                 initializer: Callable[[], None] | None = None, daemon: bool = True):
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        self._n = n
        self._ctx = context if context is not None else multiprocessing.get_context()
        self._initializer = initializer
        self._daemon = daemon
        self._idle: list[_Worker] = []
        self._busy: dict[int, _Worker] = {}
        self._queue: deque[tuple[int, Callable[..., Any], tuple[Any, ...], bool]] = deque()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- tasks ------------------------------------------------------------------------------------------
    def submit(self, key: int, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker (now, or when one is free); ``key`` names it in ``wait``."""
        self._submit(key, fn, args, False)

    def submit_scratch(self, key: int, fn: Callable[..., Any], *args: Any) -> None:
        """:meth:`submit`, the task called as ``fn(scratch, *args)`` with its worker process's scratch dict."""
        self._submit(key, fn, args, True)

    def _submit(self, key: int, fn: Callable[..., Any], args: tuple[Any, ...], with_scratch: bool) -> None:
        if key in self._busy or any(item[0] == key for item in self._queue):
            raise ValueError(f"task {key} is already submitted")
        self._queue.append((key, fn, args, with_scratch))
        self._dispatch()

    def pending(self) -> list[int]:
        """Keys of the tasks running or waiting, in key order."""
        return sorted([*self._busy, *(item[0] for item in self._queue)])

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
        workers = [*self._busy.values(), *self._idle]
        for w in workers:  # all at once, then wait for each
            w.signal_end()
        for w in workers:
            w.reap()
        self._busy.clear()
        self._idle.clear()

    # -- processes --------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while self._queue and len(self._busy) < self._n:
            key, fn, args, with_scratch = self._queue.popleft()
            if not self._idle:
                self._start()
            # tracked before it is handed the task: an interruption here still finds it in stop()
            self._busy[key] = self._idle.pop()
            self._busy[key].conn.send((fn, args, with_scratch))

    def _start(self) -> None:
        """Start one worker process, idle."""
        parent, child = self._ctx.Pipe()
        # every concrete context has Process; typeshed declares it on the subclasses only
        proc = self._ctx.Process(target=_serve, args=(child, self._initializer, os.getpid()),  # type: ignore[attr-defined]
                                 daemon=self._daemon, name="tiersim-worker")
        # a forkserver's child is forked by the fork server, which must not inherit a blocked mask (it serves
        # other pools too); a signal held back here is raised as the block ends, the worker already tracked
        forkserver = self._ctx.get_start_method() == "forkserver"
        with contextlib.nullcontext() if forkserver else _stop_signals_blocked():
            try:
                proc.start()
            finally:
                child.close()
            self._idle.append(_Worker(proc, parent))
