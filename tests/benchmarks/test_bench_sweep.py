"""Benchmark (issue 7): simulations per second of a 500-point sweep, serial vs the local process pool vs a
local Dask cluster, and Dask's overhead per task. Deselected by default; `make bench` runs it.

The points: gpt2 on one A100 with PCIe Gen3, 4 and 5, six policy settings, micro-batch, sequence length,
checkpointing and global batch varied: the first 500 of that grid (648). Invariant checks are off (as in
the other benchmarks): this times the sweep, not the suite's checking. On a machine shared with other
work the pool cannot beat serial; the figures say what this machine gave at that moment.
"""

from __future__ import annotations

import time

import pytest

from planner.sweep import expand_grid, read_results, results_frame, run_sweep

pytestmark = pytest.mark.benchmark

GRID = {
    "hardware": [{"preset": "a100", "set": {"pcie.gen": [3, 4, 5]}}],
    "models": ["gpt2"],
    "policies": {"none": {}, "zero-offload": {"delayed_update": [False, True]}, "zero-infinity": {},
                 "tinypipe": {}, "synergyscale": {}},
    "workload": {"global_batch": [16, 32], "micro_batch": [1, 2, 4], "seq_len": [256, 512, 1024],
                 "checkpointing": ["none", "full"]},
}
N_POINTS = 500
N_OVERHEAD = 100  # points for the Dask overhead per task (one worker vs serial in this process)


@pytest.fixture(autouse=True)
def _time_the_sweep_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERSIM_CHECK_INVARIANTS", "0")


def _noop(x: int) -> int:
    return x


def test_bench_sweep_500_points_pool_vs_serial_and_dask_overhead(tmp_path) -> None:
    distributed = pytest.importorskip("distributed")
    from planner.sweep.runner import local_cluster

    points = expand_grid(GRID)[:N_POINTS]
    assert len(points) == N_POINTS
    serial = run_sweep(points, tmp_path / "serial.sqlite", processes=1)
    pool = run_sweep(points, tmp_path / "pool.sqlite")
    dask = run_sweep(points, tmp_path / "dask.sqlite", workers=pool.workers)
    for s in (serial, pool, dask):
        assert (s.done, s.failed) == (N_POINTS, 0)
    assert len(read_results(tmp_path / "pool.sqlite")) == N_POINTS

    # Dask overhead per task: on a warm one-worker cluster, the wall time not spent simulating (the sum of the
    # points' own wall times, measured in the worker) per point, less the same for a serial run here; both
    # runs are measured against their own simulation time, so a change of load between them cancels out.
    # Also the round trip of a no-op task (submit, schedule, run, gather) on the same cluster.
    subset = points[:N_OVERHEAD]
    serial_sub = run_sweep(subset, tmp_path / "serial_sub.sqlite", processes=1)
    with local_cluster(1) as cluster, distributed.Client(cluster) as client:
        client.submit(_noop, 0, pure=False).result()  # the worker is up
        dask_sub = run_sweep(subset, tmp_path / "dask_sub.sqlite", scheduler=cluster.scheduler_address)
        t0 = time.perf_counter()
        assert client.gather(client.map(_noop, range(N_POINTS), pure=False)) == list(range(N_POINTS))
        noop_s = (time.perf_counter() - t0) / N_POINTS
    assert dask_sub.done == N_OVERHEAD

    def outside_simulation_s(summary, store):
        busy = sum(results_frame(store)["wall_s"])
        return (summary.wall_s - busy) / N_OVERHEAD

    serial_extra = outside_simulation_s(serial_sub, tmp_path / "serial_sub.sqlite")
    dask_extra = outside_simulation_s(dask_sub, tmp_path / "dask_sub.sqlite")
    overhead_s = dask_extra - serial_extra

    def rate(s):
        return N_POINTS / s.wall_s

    print(f"\nsweep of {N_POINTS} points: serial {serial.wall_s:.1f} s ({rate(serial):.1f} sims/s); "
          f"process pool of {pool.workers}: {pool.wall_s:.1f} s ({rate(pool):.1f} sims/s, "
          f"x{serial.wall_s / pool.wall_s:.2f}); dask LocalCluster of {dask.workers}: {dask.wall_s:.1f} s incl. "
          f"cluster start ({rate(dask):.1f} sims/s)")
    print(f"dask overhead per point: {overhead_s * 1e3:.1f} ms (one warm worker, {N_OVERHEAD} points: "
          f"{dask_extra * 1e3:.1f} ms per point outside the simulations vs {serial_extra * 1e3:.1f} ms serial; "
          f"walls {dask_sub.wall_s:.2f} s and {serial_sub.wall_s:.2f} s); no-op task round trip "
          f"{noop_s * 1e3:.2f} ms")
