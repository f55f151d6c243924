"""Signals and the end of a run, in one place: every command runs inside :func:`handled`.

- SIGINT (Ctrl-C) and SIGTERM raise :class:`Interrupted` in the main thread, where the command is running,
  so every ``with`` and ``finally`` on the way out runs: worker pools are stopped (``planner.workers``),
  an output file being written is dropped (``tiersim.output_files``), a sweep store commits nothing half
  done. ``tiersim.cli`` then prints one line on stderr and exits 130 (SIGINT) or 143 (SIGTERM), the codes a
  shell gives a process that such a signal ends.
- A second signal while the first is being handled ends the process at once (exit code as above), without
  waiting for that clean-up: a person pressing Ctrl-C twice wants out. Worker processes still die with
  their parent (``planner.workers``); an output file being written may then be left as ``.NAME.*.tmp``.
- Standard output closed (``>&-``) or its reader gone (``| head -1``): one line on stderr and exit 141
  (128 + SIGPIPE, what a shell reports for a writer whose reader went away); see :func:`stdout_closed`.

A command that keeps something when interrupted says what (``raise keeping(e, "what finished is stored in
X")``); the line names it. ``Interrupted`` is a ``KeyboardInterrupt``, so code that cleans up on Ctrl-C
cleans up on SIGTERM too, and ``except Exception`` does not swallow either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from tiersim.exit_codes import EXIT_INTERRUPTED, EXIT_TERMINATED

HANDLED = (signal.SIGINT, signal.SIGTERM)
_CODE_OF = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}
NOTHING_HALF_WRITTEN = "no output file is left half-written"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while a command ran. ``kept``: what the command kept (for the line)."""

    def __init__(self, signum: int = signal.SIGINT, kept: str | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum = signal.Signals(signum)
        self.kept = kept

    @property
    def exit_code(self) -> int:
        return _CODE_OF.get(self.signum, 128 + int(self.signum))


def as_interrupted(e: KeyboardInterrupt) -> Interrupted:
    """``e`` as an :class:`Interrupted` (a plain KeyboardInterrupt is a SIGINT)."""
    return e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)


def keeping(e: KeyboardInterrupt, kept: str) -> Interrupted:
    """The interruption ``e``, saying what the command kept (``raise keeping(e, "...") from None``)."""
    return Interrupted(as_interrupted(e).signum, kept)


def interrupted_line(prog: str, e: KeyboardInterrupt) -> str:
    """The one line on stderr, e.g. ``tiersim plan: interrupted (SIGINT); no output file is left half-written``."""
    i = as_interrupted(e)
    return f"{prog}: interrupted ({i.signum.name}); {i.kept or NOTHING_HALF_WRITTEN}"


@contextlib.contextmanager
def handled(prog: str = "tiersim") -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block (the first one; a second one ends the
    process at once); the previous handlers are restored on leaving. Outside the main thread (where Python
    cannot set handlers) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in HANDLED}
    seen: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if seen:  # already unwinding from the first signal: stop waiting for the clean-up
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.write(f"{prog}: {signal.Signals(signum).name} again; stopping at once\n")
                sys.stderr.flush()
            os._exit(_CODE_OF.get(signal.Signals(seen[0]), 128 + seen[0]))
        seen.append(signum)
        raise Interrupted(signum)

    for s in HANDLED:
        signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def stderr_line(text: str) -> None:
    """Write one line (progress) to stderr in one write: an interruption cannot separate it from its newline,
    so the interruption's own line starts on a line of its own."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def stdout_closed() -> bool:
    """True when there is no standard output to write to (the process was started with ``>&-``)."""
    out = sys.stdout
    if out is None:
        return True
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):  # no real file behind it (a test capturing output)
        return False
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def stdout_closed_line(prog: str, broken_pipe: bool) -> str:
    if broken_pipe:
        return f"{prog}: standard output closed by its reader (broken pipe); the rest of the output is lost"
    return (f"{prog}: standard output is closed; nothing was run. Redirect it instead (>/dev/null or >FILE), "
            "or use the command's file flags")


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of a broken pipe is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (tests capture it)
        pass


__all__ = ["HANDLED", "Interrupted", "as_interrupted", "handled", "interrupted_line",
           "keeping", "silence_stdout", "stderr_line", "stdout_closed", "stdout_closed_line"]
