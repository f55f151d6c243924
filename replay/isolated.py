"""A one-GPU replay in a process of its own, as ``tiersim replay`` runs it (``python -m replay.validation``).

The validation matrix replayed its one-rank cases one after the other in its own long process, whose heap,
buffer caches and huge pages grew with every case: a case could run slower there than alone
(gpt-h2048-lazytrain: +148% and +188% in two matrix runs, +23% replayed alone; replay/validation.py).
A user replays one plan per ``tiersim replay`` process. :func:`replay_alone` does the same: a fresh
interpreter (``spawn``) that takes this process's 16-bit GEMM path (the one calibration measured: a child
probing for itself picked the native fp16 GEMM at a third of the emulated one's rate once, llama-h256-zoff-fp16
+492%), the plan replayed there, the measurement (without the final weights, which the matrix does not
compare) sent back; a child that does not answer within ``timeout_s`` is stopped.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import queue
import time
from typing import Any

from hardware_models import HardwareSpec
from replay.errors import ReplayError, ReplayTimeout
from replay.precision import gemm16_forced
from simulator.plan import Plan

POLL_S = 1.0  # how often the parent looks whether the child is still alive

__all__ = ["replay_alone"]


def _child(plan: Plan, hw: HardwareSpec, nvme_dir: str | None, out: Any) -> None:
    try:
        from replay.runner import Runner

        meas = Runner(plan, hw, device="cpu", nvme_dir=nvme_dir).run()
        out.put(("ok", dataclasses.replace(meas, weights=[])))
    except ReplayError as e:  # the plan's own verdict (rejected, over a pool): the caller's to report
        out.put(("error", e))
    except BaseException as e:  # noqa: BLE001 - anything else: one line back, not a hung parent
        out.put(("error", ReplayError(f"the replay process failed: {type(e).__name__}: {e}")))


def replay_alone(plan: Plan, hw: HardwareSpec, nvme_dir: str | None, timeout_s: float) -> Any:
    """The ``replay.runner.Measurement`` of ``plan`` replayed on the CPU in a fresh process (its ``weights``
    left out); the child's ReplayError re-raised here; ReplayTimeout when it has not answered in time."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(plan, hw, nvme_dir, out), daemon=True)
    # the 16-bit GEMM path this process picked (and calibrated on), not the child's own probe: set in the
    # environment the child starts with (replay.precision.gemm16_forced, as the rank processes get it)
    with gemm16_forced(None, plan.workload.config.precision, "cpu"):
        proc.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                kind, got = out.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not proc.is_alive():  # died without a word (a crash): say so now, not at the deadline
                    try:
                        kind, got = out.get(timeout=POLL_S)
                        break
                    except queue.Empty:
                        raise ReplayError(f"the replay process died (exit code {proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise ReplayTimeout(f"the replay process gave no result within {timeout_s:.0f} s; it was "
                                        "stopped") from None
    finally:
        proc.join(5.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
    if kind == "error":
        raise got
    return got
