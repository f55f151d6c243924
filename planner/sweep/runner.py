"""Run the points of a sweep that the store lacks, on one of three executors, writing each result as it lands.

- serial (``processes=1``): in this process, one point after another (the baseline of the benchmark);
- a local process pool (the default): ``planner.workers.Workers`` with one process per CPU this process
  may use, started with ``forkserver`` (no fork of a process that may hold threads);
- Dask: a ``dask.distributed.LocalCluster`` of ``workers`` processes on loopback (127.0.0.1 only, no
  dashboard and no HTTP server; :func:`local_cluster`; the summary's executor names every address that
  listens), or the running cluster whose scheduler is at ``scheduler`` (``tcp://HOST:PORT``; it listens
  where its owner started it); its workers need tiersim installed.

Points go to the workers as tasks of a few points of the same hardware and model (:func:`tasks`), so a
worker loads a preset once per task rather than once per point. The client is the only writer of the
store: every finished point is committed as it arrives, so an interrupted sweep (Ctrl-C, a killed client,
a killed worker) loses nothing that finished, and the same call again runs only what is missing. A point
whose simulation raises is stored as failed with its error and the sweep goes on; the points of a Dask
task that killed its workers too often (``KilledWorker``) are stored as failed too.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from planner.sweep.grid import Point
from planner.sweep.progress import Progress
from planner.sweep.store import SweepStore
from planner.sweep.worker import Loaded, run_point, run_points
from planner.workers import WorkerDied, Workers

DASK_MISSING = ("dask.distributed is not installed; install the extra with pip install -e '.[dask]' "
                "(or drop --workers/--scheduler to use the local process pool)")
Outcomes = Generator[dict[str, Any], None, None]
MAX_TASK_POINTS = 16  # points of one hardware and model per task, at most


class SweepSetupError(ValueError):
    """The executor cannot be started (Dask missing, scheduler unreachable, bad worker count): one line."""


class SweepAborted(RuntimeError):
    """The executor broke down mid-way (not a point's own error); what finished is stored, rerun to resume."""


@dataclass(frozen=True)
class SweepSummary:
    store: str
    executor: str          # "serial", "process pool", "dask LocalCluster", "dask tcp://..."
    workers: int
    points: int            # in the grid
    already: int           # in the store before this run (skipped)
    done: int              # finished in this run
    failed: int            # failed in this run (stored with their error)
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_sweep(points: Sequence[Point], store: str | os.PathLike[str], *, processes: int | None = None,
              workers: int | None = None, scheduler: str | None = None, retry_failed: bool = False,
              progress: TextIO | None = None) -> SweepSummary:
    """Simulate every point the store at ``store`` lacks; see the module docstring for the executors.

    ``processes``: size of the local pool (default: the CPUs available; 1 runs serially in this process).
    ``workers``: start a local Dask cluster of that many worker processes. ``scheduler``: use a running
    Dask cluster. ``retry_failed``: run the points stored as failed again (their rows are replaced).
    ``progress``: a stream for the progress line (None: silent). KeyboardInterrupt (Ctrl-C, or SIGTERM under
    ``tiersim.signals``) propagates after the executor is shut down; everything finished before it is in the
    store, each point once (a row is committed whole or not at all; a resumed sweep skips stored keys).
    """
    if workers is not None and scheduler is not None:
        raise SweepSetupError("--workers and --scheduler exclude each other: --workers N starts a local Dask "
                              "cluster, --scheduler ADDR uses a running one")
    for name, value in (("--workers", workers), ("--processes", processes)):
        if value is not None and value < 1:
            raise SweepSetupError(f"{name} {value}: give a positive number of processes")
    t0 = time.perf_counter()
    with SweepStore(store) as st:
        stored = st.keys(("done",) if retry_failed else ("done", "failed"))
        todo = [p for p in points if p.key not in stored]
        by_key = {p.key: p for p in todo}
        tracker = Progress(len(points), already=len(points) - len(todo), stream=progress)
        executor, n_workers, outcomes = _executor(todo, processes, workers, scheduler)
        try:
            with contextlib.closing(outcomes):
                for outcome in outcomes:
                    point = by_key[outcome["key"]]
                    st.add(point.key, point.inputs, outcome, replace_failed=retry_failed)
                    tracker.update(outcome["status"])
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (tiersim.signals): end the progress line where it stood
            if progress is not None:
                tracker.finish()
            raise
        if progress is not None and todo:
            tracker.finish()
    return SweepSummary(store=str(store), executor=executor, workers=n_workers, points=len(points),
                        already=tracker.already, done=tracker.done, failed=tracker.failed,
                        wall_s=time.perf_counter() - t0)


def _executor(todo: list[Point], processes: int | None, workers: int | None,
              scheduler: str | None) -> tuple[str, int, Outcomes]:
    if not todo:
        return "nothing to run", 0, (o for o in list[dict[str, Any]]())
    if scheduler is not None or workers is not None:
        return _dask(todo, workers, scheduler)
    n = min(processes or available_cpus(), len(todo))
    if n == 1:
        return "serial", 1, _serial(todo)
    return "process pool", n, _pool(todo, n)


def tasks(todo: Sequence[Point], workers: int) -> list[list[tuple[str, dict[str, Any]]]]:
    """Consecutive points of the same hardware and model, grouped into tasks of at most
    :data:`MAX_TASK_POINTS` and small enough to give every worker about four tasks (the last ones
    finish together), as ``(key, inputs)`` pairs for :func:`planner.sweep.worker.run_points`."""
    size = max(1, min(MAX_TASK_POINTS, len(todo) // (4 * workers)))
    out: list[list[tuple[str, dict[str, Any]]]] = []
    group: tuple[Any, ...] | None = None
    for p in todo:
        g = (p.inputs["hardware"], tuple(p.inputs["set"]), p.inputs["model"])
        if not out or g != group or len(out[-1]) == size:
            out.append([])
            group = g
        out[-1].append((p.key, dict(p.inputs)))
    return out


def _serial(todo: list[Point]) -> Outcomes:
    """In this process, each point's outcome as soon as it is known (a task's loads are shared)."""
    for task in tasks(todo, 1):
        loaded: Loaded = {}
        for key, inputs in task:
            yield run_point(key, inputs, loaded)


def _pool(todo: list[Point], n: int) -> Outcomes:
    """Tasks on ``n`` local processes; leaving (done, Ctrl-C or an error in the client) stops them at once
    rather than waiting for the running tasks (``planner.workers``, whose processes also leave Ctrl-C to the
    client and die with it when it is killed)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["planner.sweep.worker"])  # imported once, in the server, not per process
    with Workers(n, context=context) as pool:
        for k, task in enumerate(tasks(todo, n)):
            pool.submit(k, run_points, task)
        while pool.pending():
            try:
                finished = pool.wait()
            except WorkerDied as e:
                raise SweepAborted(f"a process of the local pool died ({e}); what finished is stored: "
                                   "run the same sweep again to resume") from None
            for _, outcomes in finished:
                yield from outcomes


def _dask(todo: list[Point], workers: int | None, scheduler: str | None) -> tuple[str, int, Outcomes]:
    try:
        import distributed
    except ImportError:
        raise SweepSetupError(DASK_MISSING) from None
    stack = contextlib.ExitStack()
    try:
        if scheduler is not None:
            try:
                client = stack.enter_context(distributed.Client(scheduler, timeout="10s"))
            except (OSError, TimeoutError, ValueError) as e:
                raise SweepSetupError(f"--scheduler {scheduler}: cannot connect ({' '.join(str(e).split())}); "
                                      "start one with `dask scheduler` and `dask worker ADDRESS`, or use "
                                      "--workers N for a local cluster") from None
            n = len(client.scheduler_info(n_workers=-1)["workers"])
            label = f"dask {scheduler}"
        else:
            assert workers is not None
            cluster = stack.enter_context(local_cluster(workers))
            client = stack.enter_context(distributed.Client(cluster))
            listening = close_http(client)
            n, label = workers, f"dask LocalCluster (listening on {', '.join(listening)}; no HTTP)"
        _check_workers_import(client, scheduler)
    except BaseException:
        stack.close()
        raise
    return label, n, _dask_outcomes(stack, client, tasks(todo, max(n, 1)))


def local_cluster(workers: int) -> Any:
    """A LocalCluster of ``workers`` single-threaded processes on loopback, quiet logs, and no HTTP: dask
    always opens an HTTP server in the scheduler (on port 8787 unless told otherwise, even with the
    dashboard off) and in each worker; here they serve no route and stop listening once the cluster is up
    (:func:`close_http`), so what listens is the scheduler, the workers and their nannies, on 127.0.0.1."""
    import logging

    import dask
    import distributed

    no_routes: dict[str, list[str]] = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}
    with dask.config.set(no_routes):  # the nannies hand this config to their worker processes
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR,
                                           scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})
    try:
        cluster.sync(_stop_http, cluster.scheduler)
    except BaseException:
        cluster.close()
        raise
    return cluster


async def _stop_http(server: Any) -> None:
    """Stop a dask server's HTTP listener (on its own event loop)."""
    http = getattr(server, "http_server", None)
    if http is not None:
        http.stop()


def _stop_worker_http(dask_worker: Any) -> None:
    http = getattr(dask_worker, "http_server", None)
    if http is not None:
        http.stop()


def close_http(client: Any) -> list[str]:
    """Stop the workers' HTTP listeners; what still listens, e.g. ``["scheduler tcp://127.0.0.1:40111",
    "worker tcp://127.0.0.1:35957", "nanny tcp://127.0.0.1:32797"]``."""
    client.run(_stop_worker_http)
    info = client.scheduler_info(n_workers=-1)
    addresses = [f"scheduler {info['address']}"]
    for addr, w in sorted(info["workers"].items()):
        addresses.append(f"worker {addr}")
        if w.get("nanny"):
            addresses.append(f"nanny {w['nanny']}")
    return addresses


def _check_workers_import(client: Any, scheduler: str | None) -> None:
    """Fail in one line when the cluster's workers cannot import tiersim (rather than storing N failures)."""
    from planner.sweep.worker import importable

    try:
        client.submit(importable, pure=False).result(timeout=120)
    except Exception as e:
        where = scheduler or "the local cluster"
        raise SweepSetupError(f"workers of {where} cannot run tiersim ({type(e).__name__}: "
                              f"{' '.join(str(e).split())}); install tiersim on every worker") from None


def _dask_outcomes(stack: contextlib.ExitStack, client: Any, work: list[list[tuple[str, dict[str, Any]]]]) -> Outcomes:
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    with stack:
        # a task's key hashes its points' keys: two clients sweeping the same points share the results
        names = [f"tiersim-points-{hashlib.sha256(' '.join(k for k, _ in task).encode()).hexdigest()[:32]}"
                 for task in work]
        futures = client.map(run_points, work, key=names, pure=False)
        points_of = dict(zip(names, work, strict=True))
        try:
            for fut in as_completed(futures):
                try:
                    outcomes = fut.result()
                except KilledWorker as e:  # the task itself keeps killing workers: its points failed
                    error = f"KilledWorker: {' '.join(str(e).split())}"
                    outcomes = [{"key": key, "status": "failed", "result": None, "traceback": None, "wall_s": None,
                                 "error": error} for key, _ in points_of[fut.key]]
                except Exception as e:
                    raise SweepAborted(f"the Dask cluster failed mid-way ({type(e).__name__}: "
                                       f"{' '.join(str(e).split())}); what finished is stored: run the same "
                                       "sweep again to resume") from None
                fut.release()
                yield from outcomes
        finally:
            client.cancel(futures)
