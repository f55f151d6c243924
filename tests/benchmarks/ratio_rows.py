"""The per-policy and 1024-GPU rows of the ratio table alone, in seconds (wall and CPU) and as ratios to 1 M raw
SimPy timeouts measured in the same process (the faster of one yardstick before and one after the cases), as
``test_bench_ratios.py`` measures them, without the three long commands (a minute instead of twelve):

    PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/ratio_rows.py [--no-1024]

CPU time is the steadier figure on a shared machine (others' processes stretch wall time); HiGHS may use more
than one thread, so LazyTrain's CPU time can exceed its wall time.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import simpy

HERE = Path(__file__).resolve().parent


def _raw() -> tuple[float, float]:
    env = simpy.Environment()

    def ticker(env: simpy.Environment):  # noqa: ANN202 - a SimPy process
        for _ in range(1_000_000):
            yield env.timeout(1)

    env.process(ticker(env))
    t0, c0 = time.perf_counter(), time.process_time()
    env.run()
    return time.perf_counter() - t0, time.process_time() - c0


def _timed(fn: Callable[[], str]) -> tuple[float, float, str]:
    t0, c0 = time.perf_counter(), time.process_time()
    note = fn()
    return time.perf_counter() - t0, time.process_time() - c0, note


def main(argv: list[str]) -> None:
    os.environ["TIERSIM_CHECK_INVARIANTS"] = "0"  # as the benchmarks: the work only
    sys.path.insert(0, str(HERE))  # the two benchmark modules, imported as the script's neighbours
    import test_bench_ratios as ratios

    from policies import POLICIES

    raw = [_raw()]
    rows = [(f"plan+simulate 70b/a100x8 {p}", *_timed(lambda p=p: ratios.plan_and_simulate(p))) for p in POLICIES]
    if "--no-1024" not in argv:
        import test_bench_simulate as bench

        rows.append(("1024-GPU symmetric job (7b zero-offload)", *_timed(lambda: str(bench.run_1024_gpu_case()))))
    raw.append(_raw())
    wall, cpu = min(r[0] for r in raw), min(r[1] for r in raw)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"1 M raw SimPy timeouts: {wall:.2f} s wall, {cpu:.2f} s CPU (the faster of "
          f"{', '.join(f'{r[0]:.2f}' for r in raw)} s); load average {load}")
    for case, w, c, note in rows:
        print(f"{case:45s} {w:6.2f} s {w / wall:6.2f}x   CPU {c:6.2f} s {c / cpu:6.2f}x   {note}")


if __name__ == "__main__":
    main(sys.argv[1:])
