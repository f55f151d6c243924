"""Faults and interruptions of real ``python -m tiersim`` processes (issue 17, process hygiene).

Each test starts tiersim as a user would, waits until work is in progress (a progress line on stderr, or
the pool's worker processes in the process table; never a blind sleep), then sends SIGINT (to the process
group, as a terminal's Ctrl-C does), SIGTERM (to the client only, as ``kill PID`` does) or SIGKILL, and
checks: the exit code (130, 143, -9), exactly one line on stderr besides progress, no traceback, no output
file or a complete one, no temporary file, and no process left behind (every process a test starts carries
an environment marker; ``/proc`` is read until none carries it). Also: stdout closed (``>&-``) or its
reader gone, atomic output files, worker processes dying with their parent.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import yaml

from planner.sweep import expand_grid, read_results, run_sweep
from planner.workers import PARENT_POLL_S, die_with_parent
from tiersim import signals
from tiersim.output_files import atomic_folder, atomic_path, write_or_fail

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table in /proc")

ROOT = Path(__file__).resolve().parent.parent
MARKER = "TIERSIM_FAULT_TEST"
WAIT_S = 120.0      # at most this long for work to be in progress (a loaded machine is slow to start)
ORPHAN_S = 5.0      # every process of a run must be gone this long after its client ended
PROGRESS = re.compile(r"^(\[plan \d+/\d+\]|\[\d+/\d+\] |sweep: \d+/\d+ completed|report: drawing)")
# 8 quick points (gpt2 on one A100): 4 policies x 2 micro-batches, one point per task on 2 processes
QUICK_GRID = {"hardware": ["a100"], "models": ["gpt2"], "policies": ["none", "zero-offload", "zero-infinity",
                                                                     "tinypipe"],
              "workload": {"global_batch": 8, "micro_batch": [1, 2], "seq_len": 256}}
# 32 quick points: a SIGTERM after the first few completions lands with most of them still to run (with
# QUICK_GRID's 8, the last could finish between the progress line and the signal: seen once, 8 of 8 stored)
RESUME_GRID = {**QUICK_GRID, "workload": {"global_batch": 8, "micro_batch": [1, 2, 4, 8], "seq_len": [256, 512]}}
# 16 slow points (seconds each), tasks of 2 points on 2 processes: a task outlives ORPHAN_S by far, so a
# worker that did not die with its client would still be found
SLOW_GRID = {"hardware": ["a100x8"], "models": ["llama2-13b"], "policies": ["zero-infinity"],
             "workload": {"global_batch": [64, 128], "micro_batch": [1, 2, 4, 8], "seq_len": [512, 1024]}}


class Run:
    """``python -m tiersim ARGS`` in its own process group, marked; stderr on a pipe or a terminal (pty)."""

    def __init__(self, args: list[str], cwd: Path, tty: bool = False):
        self.marker = uuid.uuid4().hex
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               MARKER: self.marker}
        self.master = -1
        err: int = subprocess.PIPE
        if tty:
            self.master, slave = pty.openpty()
            err = slave
        self.proc = subprocess.Popen([sys.executable, "-m", "tiersim", *args], cwd=cwd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                     start_new_session=True)
        if tty:
            os.close(slave)
        assert self.proc.stdout is not None
        self.fds = {"out": self.proc.stdout.fileno(),
                    "err": self.master if tty else self.proc.stderr.fileno()}  # type: ignore[union-attr]
        self.text = {"out": b"", "err": b""}
        self.t0 = time.monotonic()

    @property
    def err(self) -> str:
        return self.text["err"].decode(errors="replace").replace("\r\n", "\n")

    def _read(self, timeout: float) -> bool:
        """Read what is there, waiting at most ``timeout``; False when nothing came (or every stream ended)."""
        open_fds = {fd: k for k, fd in self.fds.items() if fd >= 0}
        if not open_fds:
            return False
        ready, _, _ = select.select(list(open_fds), [], [], timeout)
        if not ready:
            return False
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # a pty whose other side is closed
                data = b""
            if data:
                self.text[open_fds[fd]] += data
            else:
                self.fds[open_fds[fd]] = -1
        return True

    def wait_for(self, pattern: str) -> float:
        """Read stderr until a line with ``pattern`` ends (newline or carriage return); the seconds it took."""
        deadline = time.monotonic() + WAIT_S
        while not re.search(pattern + r"[^\n\r]*[\n\r]", self.err):
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                f"no {pattern!r} on stderr (exit {self.proc.poll()}): {self.err[-2000:]}"
            self._read(0.2)
        return time.monotonic() - self.t0

    def finish(self) -> tuple[int, float]:
        """Wait for the client to end (reading its output meanwhile): its exit code, seconds it took."""
        t = time.monotonic()
        while self.proc.poll() is None:
            assert time.monotonic() - t < WAIT_S, "the client did not end"
            self._read(0.05)
        return self.proc.returncode, time.monotonic() - t

    def output(self) -> tuple[str, str]:
        """stdout and stderr, read until their end (or 2 s without news: a process left behind holds them)."""
        while self._read(2.0) and any(fd >= 0 for fd in self.fds.values()):
            pass
        for k in ("out", "err"):
            if self.fds[k] >= 0:
                self.fds[k] = -1
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        return self.text["out"].decode(errors="replace"), self.err


@pytest.fixture
def start() -> Iterator[Callable[..., Run]]:
    """``start(args, cwd, tty=False)``: a :class:`Run`; whatever it leaves running (a failure) is killed after
    the test, so that a failing test does not load the machine for minutes."""
    runs: list[Run] = []

    def _start(args: list[str], cwd: Path, tty: bool = False) -> Run:
        runs.append(Run(args, cwd, tty))
        return runs[-1]

    yield _start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        for pid, _, _ in processes(run.marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        run.output()


def processes(marker: str) -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every live process whose environment carries ``marker``."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if f"{MARKER}={marker}".encode() not in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                continue
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if fields[0] not in ("Z", "X"):
            found.append((int(d), int(fields[1]), cmd[:120]))
    return found


def orphans_after(marker: str) -> tuple[list[tuple[int, int, str]], float]:
    """The processes still carrying ``marker`` after at most ORPHAN_S, and how long they took to go."""
    t0 = time.monotonic()
    left = processes(marker)
    while left and time.monotonic() - t0 < ORPHAN_S:
        time.sleep(0.1)
        left = processes(marker)
    return left, time.monotonic() - t0


def other_lines(err: str) -> list[str]:
    """stderr's lines other than progress (a sweep redraws its line with carriage returns)."""
    lines = []
    for line in err.split("\n"):
        last = line.split("\r")[-1].replace("\x1b[K", "").strip()
        if last and not PROGRESS.match(last):
            lines.append(last)
    return lines


def pool_workers(marker: str, client: int) -> list[int]:
    """Pids of the processes whose parent is a marked process other than the client (a fork server's
    children: the sweep's pool) or the client itself running the same command (a forked pool)."""
    procs = processes(marker)
    helpers = {pid for pid, ppid, _ in procs if ppid == client}
    return [pid for pid, ppid, _ in procs if ppid in helpers]


# ---------------------------------------------------------------------------------------- plan


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigkill"])
def test_plan_interrupted_mid_search(start: Callable[..., Run], tmp_path: Path, how: str) -> None:
    plan_out = tmp_path / "best.json"
    run = start(["plan", "--hw", "a100x8", "--model", "7b", "--workers", "2", "--progress",
               "--cache-dir", str(tmp_path / "cache"), "--plan-out", str(plan_out)], cwd=tmp_path)
    started = run.wait_for(r"\[plan \d+/\d+\]")
    helpers = [pid for pid, ppid, _ in processes(run.marker) if ppid == run.proc.pid]
    if how == "ctrl-c":
        os.killpg(run.proc.pid, signal.SIGINT)  # a terminal sends it to the whole group
    else:
        run.proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    rc, took = run.finish()
    left, gone = orphans_after(run.marker)
    out, err = run.output()
    print(f"plan {how}: progress after {started:.1f} s, {len(helpers)} workers, exit {rc} {took:.2f} s after "
          f"the signal, processes gone {gone:.2f} s after")
    assert helpers, "the search's worker processes should be running"
    assert not left, f"left running after the client ended: {left}"
    assert "Traceback" not in err and out == ""
    assert not plan_out.exists() and not list(tmp_path.glob(".best.json*"))
    if how == "sigkill":
        assert rc == -signal.SIGKILL
        return
    name = "SIGINT" if how == "ctrl-c" else "SIGTERM"
    assert rc == (130 if how == "ctrl-c" else 143), err
    assert other_lines(err) == [f"tiersim plan: interrupted ({name}); no output file is left half-written"], err


# ---------------------------------------------------------------------------------------- sweep


def _rows(store: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return db.execute("SELECT key, status FROM runs").fetchall()
    finally:
        db.close()


def test_sweep_terminated_then_resumed_loses_and_repeats_nothing(start: Callable[..., Run], tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(RESUME_GRID))
    store = tmp_path / "s.sqlite"
    run = start(["sweep", str(grid), "--store", str(store), "--processes", "2", "--progress"], cwd=tmp_path)
    started = run.wait_for(r"sweep: [1-8]/32 completed")
    run.proc.send_signal(signal.SIGTERM)  # `kill PID`: the client alone
    rc, took = run.finish()
    left, gone = orphans_after(run.marker)
    out, err = run.output()
    print(f"sweep SIGTERM: progress after {started:.1f} s, exit {rc} {took:.2f} s after, processes gone "
          f"{gone:.2f} s after")
    assert rc == 143, err
    assert other_lines(err) == [f"tiersim sweep: interrupted (SIGTERM); what finished is stored in {store}: run "
                                "the same command again to resume"], err
    assert "Traceback" not in err and out == ""
    assert not left, f"left running after the client ended: {left}"
    kept = _rows(store)
    assert 1 <= len(kept) < 32 and {s for _, s in kept} == {"done"}
    before = {r["key"]: r for r in read_results(store)}

    points = expand_grid(RESUME_GRID)
    assert len(points) == 32
    summary = run_sweep(points, store, processes=1)  # resume: only what is missing
    rows = _rows(store)
    assert (summary.already, summary.done, summary.failed) == (len(kept), 32 - len(kept), 0)
    assert sorted(k for k, _ in rows) == sorted(p.key for p in points)  # each point once: none lost, none twice
    after = {r["key"]: r for r in read_results(store)}
    assert all(after[k] == r for k, r in before.items())  # what finished before was not recomputed


def test_sweep_client_killed_leaves_no_worker_fork_server_or_tracker(start: Callable[..., Run], tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(SLOW_GRID))
    store = tmp_path / "s.sqlite"
    run = start(["sweep", str(grid), "--store", str(store), "--processes", "2"], cwd=tmp_path)
    deadline = time.monotonic() + WAIT_S
    while len(pool_workers(run.marker, run.proc.pid)) < 2:  # both processes of the pool have a point
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()
        time.sleep(0.05)
    started = time.monotonic() - run.t0
    helpers = processes(run.marker)
    run.proc.send_signal(signal.SIGKILL)
    rc, _ = run.finish()
    left, gone = orphans_after(run.marker)
    _, err = run.output()
    print(f"sweep SIGKILL: pool busy after {started:.1f} s ({len(helpers)} processes), gone {gone:.2f} s after")
    assert rc == -signal.SIGKILL
    assert len(helpers) >= 4  # client, fork server, resource tracker, 2 workers
    assert not left, f"left running after the client was killed: {left}"
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------- simulate


def test_policy_all_interrupted_while_drawing_its_report_writes_no_report(start: Callable[..., Run],
                                                                         tmp_path: Path) -> None:
    report = tmp_path / "report"
    run = start(["simulate", "--hw", "a100", "--model", "gpt2", "--policy", "all", "--report", str(report)],
              cwd=tmp_path, tty=True)  # on a terminal: progress lines, and Ctrl-C goes to the group
    started = run.wait_for(r"report: drawing figures")
    os.killpg(run.proc.pid, signal.SIGINT)
    rc, took = run.finish()
    left, gone = orphans_after(run.marker)
    out, err = run.output()
    print(f"simulate --policy all --report: drawing after {started:.1f} s, exit {rc} {took:.2f} s after, "
          f"processes gone {gone:.2f} s after")
    assert rc == 130, err
    assert other_lines(err) == ["tiersim simulate: interrupted (SIGINT); no output file is left half-written"], err
    assert "Traceback" not in err and "every policy" in out  # the table was printed before the report
    assert list(tmp_path.iterdir()) == []  # no report folder, no temporary folder
    assert not left, f"left running: {left}"


def test_closed_stdout_is_one_line_and_exit_141(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(["sh", "-c", 'exec "$0" -m tiersim simulate --hw a100 --model gpt2 --json >&-',
                        sys.executable], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert p.returncode == 141, p.stderr
    assert p.stderr.splitlines() == ["tiersim simulate: standard output is closed; nothing was run. Redirect it "
                                     "instead (>/dev/null or >FILE), or use the command's file flags"]


def test_reader_gone_is_one_line_and_exit_141(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "tiersim", "policies", "list"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    p.stdout.close()  # like `| head -0`: the reader is gone before the first write
    _, err = p.communicate(timeout=WAIT_S)
    assert p.returncode == 141, err
    assert err.splitlines() == ["tiersim policies: standard output closed by its reader (broken pipe); the rest of "
                                "the output is lost"]


# ---------------------------------------------------------------------------------------- the pieces


def test_sigterm_raises_interrupted_and_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(signals.Interrupted) as caught, signals.handled("t"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted long before
    assert caught.value.signum == signal.SIGTERM and caught.value.exit_code == 143
    assert isinstance(caught.value, KeyboardInterrupt)  # clean-up written for Ctrl-C runs for SIGTERM too
    assert signal.getsignal(signal.SIGTERM) is before
    assert signals.interrupted_line("t", signals.keeping(caught.value, "kept X")) == "t: interrupted (SIGTERM); kept X"
    assert signals.interrupted_line("t", KeyboardInterrupt()) == \
        "t: interrupted (SIGINT); no output file is left half-written"


def test_a_second_signal_ends_the_process_at_once() -> None:
    code = ("import os, signal, time\nfrom tiersim.signals import handled\nwith handled('t'):\n"
            "    try:\n        os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
            "    finally:\n        os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)\n")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=WAIT_S)
    assert (p.returncode, p.stderr) == (130, "t: SIGTERM again; stopping at once\n")


def _fill_then_fail(path: str) -> None:
    with open(path, "w") as f:
        f.write("{half")
    raise KeyboardInterrupt


def test_atomic_path_writes_whole_files_or_none(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(KeyboardInterrupt):
        write_or_fail("--trace", str(target), _fill_then_fail)
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary one
    write_or_fail("--trace", str(target), lambda p: Path(p).write_text("{}"))
    assert target.read_text() == "{}"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask  # as open(path, "w") would make it
    target.chmod(0o640)
    with pytest.raises(KeyboardInterrupt):
        write_or_fail("--trace", str(target), _fill_then_fail)
    assert target.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["out.json"]  # old one kept
    with atomic_path(target) as tmp:
        tmp.write_text("[1]")
    assert target.read_text() == "[1]" and stat.S_IMODE(target.stat().st_mode) == 0o640
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with atomic_path(link) as tmp:
        tmp.write_text("[2]")
    assert link.is_symlink() and target.read_text() == "[2]"
    with atomic_path(os.devnull) as tmp:  # not a regular file: written directly, never replaced
        assert str(tmp) == os.devnull
        tmp.write_text("x")
    assert not stat.S_ISREG(os.stat(os.devnull).st_mode)


def test_atomic_folder_writes_a_whole_report_or_none(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with pytest.raises(KeyboardInterrupt), atomic_folder(out) as tmp:
        (tmp / "report.html").write_text("<html>")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_folder(out) as tmp:
        (tmp / "report.html").write_text("<html>")
        (tmp / "fig1.png").write_bytes(b"png")
    assert sorted(p.name for p in out.iterdir()) == ["fig1.png", "report.html"]
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def _orphan_child() -> None:
    sys.platform = "portable"  # no prctl: only the parent-watch thread (the fallback elsewhere than Linux)
    die_with_parent()
    time.sleep(60)


def _middle(conn: Connection) -> None:
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=_orphan_child)
    child.start()
    conn.send(child.pid)
    os._exit(0)  # the child's parent is gone now


def test_parent_watch_ends_a_worker_whose_parent_died() -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    middle = ctx.Process(target=_middle, args=(there,))
    middle.start()
    assert here.poll(WAIT_S)
    pid = here.recv()
    middle.join(WAIT_S)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 * PARENT_POLL_S + 5:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"process {pid} outlived its parent by {time.monotonic() - t0:.1f} s")
