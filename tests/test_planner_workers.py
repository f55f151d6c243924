"""planner.workers: the plan search's own worker processes, whose running tasks can be stopped."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from planner.workers import WorkerDied, Workers


def _square(x: int) -> int:
    return x * x


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _fail(message: str) -> None:
    raise ValueError(message)


def _pid() -> int:
    return os.getpid()


def _collect(pool: Workers) -> dict[int, object]:
    got: dict[int, object] = {}
    while pool.pending():
        got.update(pool.wait())
    return got


def test_results_come_back_by_key_and_tasks_beyond_the_workers_wait_their_turn() -> None:
    with Workers(2) as pool:
        for k in range(5):
            pool.submit(k, _square, k)
        assert len(pool.running()) == 2 and pool.pending() == [0, 1, 2, 3, 4]
        assert _collect(pool) == {k: k * k for k in range(5)}
    assert multiprocessing.active_children() == []


def test_workers_are_reused_between_tasks() -> None:
    with Workers(1) as pool:
        pool.submit(0, _pid)
        first = _collect(pool)[0]
        pool.submit(1, _pid)
        assert _collect(pool)[1] == first != os.getpid()


def test_a_task_exception_is_raised_in_the_caller_and_stops_the_rest() -> None:
    with Workers(2) as pool:
        pool.submit(0, _fail, "bad knob")
        pool.submit(1, _sleep, 60.0)
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match="bad knob"):
            _collect(pool)
        assert time.perf_counter() - t0 < 30 and pool.pending() == []
    assert multiprocessing.active_children() == []


def test_cancel_and_stop_end_running_tasks_at_once() -> None:
    with Workers(2) as pool:
        pool.submit(0, _sleep, 60.0)
        pool.submit(1, _sleep, 60.0)
        pool.submit(2, _square, 3)
        assert pool.wait(timeout=0.2) == []
        t0 = time.perf_counter()
        pool.cancel(0)  # its process is ended; the waiting task takes the free slot
        assert pool.running() == [1, 2]
        assert pool.wait() == [(2, 9)]
        pool.stop()
        assert time.perf_counter() - t0 < 30 and pool.pending() == []
    assert multiprocessing.active_children() == []


def test_a_worker_killed_from_outside_is_an_error_not_a_hang() -> None:
    with Workers(1) as pool:
        pool.submit(0, _pid)
        pid = _collect(pool)[0]
        pool.submit(1, _sleep, 60.0)
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied, match="task 1"):
            _collect(pool)


def _remember(scratch: dict, key: str, value: int) -> tuple[int | None, int]:  # type: ignore[type-arg]
    """A scratch task: what was there under ``key`` before, and the worker's pid."""
    before = scratch.get(key)
    scratch[key] = value
    return before, os.getpid()


def test_a_scratch_task_finds_what_an_earlier_task_of_its_process_left_until_the_process_is_replaced() -> None:
    with Workers(1) as pool:
        pool.submit_scratch(0, _remember, "plan", 1)
        pool.submit(1, _square, 4)  # a plain task neither sees nor clears the scratch
        pool.submit_scratch(2, _remember, "plan", 2)
        got = _collect(pool)
        assert got[0][0] is None and got[1] == 16 and got[2][0] == 1  # type: ignore[index]
        pool.submit(3, _sleep, 60.0)
        pool.cancel(3)  # its process ended: the next one starts with an empty scratch
        pool.submit_scratch(4, _remember, "plan", 3)
        before, pid = _collect(pool)[4]  # type: ignore[misc]
        assert before is None and pid != got[0][1]  # type: ignore[index]
    assert multiprocessing.active_children() == []
