"""Output files and folders a command writes: checked before any work is done, written whole or not at all,
with one line on failure (bad input, exit 2) naming the flag.

Every file a command writes goes through :func:`atomic_path` (a file) or :func:`atomic_folder` (a report
folder): it is written under a temporary name in the same directory (``.NAME.XXXX.tmp``) and renamed into
place once complete, so an interruption (Ctrl-C, SIGTERM: ``tiersim.signals``) or an error leaves the
previous file or none, never a half-written one, and no temporary file. A target that is not a regular
file (``/dev/stdout``, a FIFO) is written directly: it cannot be replaced.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tiersim.errors import UsageError

TEMP_SUFFIX = ".tmp"


def check_output_path(flag: str, path: str | None) -> None:
    """Fail before any work when ``path`` cannot be written: its directory must exist."""
    if path is None:
        return
    if not path.strip():
        raise UsageError(f"{flag}: empty path; give a file name, e.g. {flag} out.json")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name, e.g. {p / 'out.json'}")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: directory '{parent}' does not exist; create it first or pick another path")


def check_output_dir(flag: str, path: str) -> Path:
    """Fail before any work when ``path`` cannot become an output folder (created if missing)."""
    if not path or not path.strip():
        raise UsageError(f"{flag}: empty path; give a folder, e.g. {flag} report/")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: is a file; give a folder (it is created if missing)")
    if not p.exists() and not p.parent.is_dir():
        raise UsageError(f"{flag} {path}: its parent '{p.parent}' does not exist; create it first or pick another "
                         "folder")
    return p


def write_or_fail(flag: str, path: str, write: Callable[[str], Any]) -> None:
    """``write(temporary path)``, then renamed onto ``path`` (:func:`atomic_path`); an OSError becomes one line
    naming ``flag``."""
    try:
        with atomic_path(path) as tmp:
            write(str(tmp))
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write ({e.strerror or e})") from None


def _new_file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file (0o666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path in ``path``'s directory to write the whole file to; renamed onto ``path`` when the
    block ends normally (keeping an existing file's permissions; a symlink's target is replaced, not the
    link), removed when it ends by an exception or an interruption."""
    target = Path(path)
    try:
        st = os.stat(target)  # follows a symlink
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # /dev/stdout, /dev/null, a FIFO: no rename possible
        yield target
        return
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    tmp = Path(name)
    try:
        os.close(fd)
        yield tmp
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else _new_file_mode())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder beside ``path`` to write a whole folder of files to (a report); when the block ends
    normally ``path`` is created if missing and each file is renamed into it (each one whole; files of
    ``path`` not written again are kept), and the temporary folder is removed. When it ends by an exception
    or an interruption the temporary folder is removed and ``path`` is as it was (not created)."""
    target = Path(path)
    tmp: Path | None = None
    try:
        with _signals_held():  # an interruption lands after ``tmp`` is known, so the finally removes it
            tmp = Path(tempfile.mkdtemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.",
                                        suffix=TEMP_SUFFIX))
        yield tmp
        target.mkdir(exist_ok=True)
        for src in sorted(tmp.rglob("*")):  # a folder before what it holds
            dst = target / src.relative_to(tmp)
            if src.is_dir():
                dst.mkdir(exist_ok=True)
            else:
                os.replace(src, dst)
    finally:
        if tmp is not None:
            _remove_tree(tmp)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (delivered when the block ends) where the platform can."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _remove_tree(path: Path, *, patience_s: float = 5.0) -> None:
    """Remove ``path`` and everything under it, again while a writer that is being stopped (a report's
    figure worker, interrupted) still adds a file to it; gives up after ``patience_s``."""
    deadline = time.monotonic() + patience_s
    shutil.rmtree(path, ignore_errors=True)
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
        shutil.rmtree(path, ignore_errors=True)
