"""Run a multi-GPU plan as one process per rank (``torch.distributed``: gloo on CPU, NCCL on CUDA).

Two ways in, one code path (``run_rank``):

- ``tiersim replay`` on one machine: :func:`run_ranks` starts the ranks itself, forked from a
  ``forkserver`` that imported torch once (no threads or state inherited from the caller, as ``spawn``,
  without paying an interpreter start and torch import per rank and per replay: measured 75 s for a
  2-rank replay under spawn on a loaded 2-core machine whose replay itself took 0.3 s). The parent
  hosts the rendezvous ``TCPStore`` on a port the OS picks (so no port race), every child joins it;
  each child sends its rank's measurement back on a queue, the parent merges them (``replay.dist_merge``).
  A child that fails stops the others.
- ``torchrun --nproc-per-node N -m tiersim replay PLAN`` (or any launcher that sets ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): :func:`under_launcher` tells, and
  :func:`run_ranks` then runs this process's rank only, gathers every rank's measurement on rank 0 and
  returns the merge there (``None`` on the other ranks, which print nothing).

On CUDA rank K uses ``cuda:LOCAL_RANK`` (``cuda:K`` when spawned); more ranks than devices is refused. On
CPU each rank is one process whose "GPU" is one core (``replay.threads``) beside its copy and optimizer
threads: more ranks than cores still trains exactly (``--verify``) but its timing is meaningless
(:func:`timing_note`). The ranks started here allocate from one malloc arena (``MALLOC_ARENA_MAX=1``,
``replay.host_memory.one_malloc_arena``: a worker thread's tensor above 64 MiB is otherwise mmapped afresh
each time); under a launcher, set it in the launcher's environment for the same timing.
"""

from __future__ import annotations

import io
import os
import queue
import time
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hardware_models import HardwareSpec
from replay.dist_comm import Comm
from replay.dist_merge import RankResult, merge
from replay.errors import ReplayError, ReplayOom, ReplayTimeout
from replay.host_memory import one_malloc_arena
from replay.precision import GEMM16_ENV, TORCH_DTYPES, gemm16_path
from replay.ranks import check_multi_rank, plan_gpus, shared_groups
from replay.runner import Measurement, Runner, pick_device
from simulator.plan import Plan

# imported once by the fork server, so no rank pays them: torch.optim's first step imports torch._dynamo
# (measured 9 s of a 14 s rank start on a loaded 2-core machine, 2026-12-03)
FORKSERVER_PRELOAD = ["replay.dist_launch", "replay.reference", "torch._dynamo"]
STORE_TIMEOUT = timedelta(seconds=300)
JOIN_POLL_S = 0.5
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class RankJob:
    plan: dict[str, Any]
    device: str
    nvme_dir: str | None
    seed: int
    run_id: str
    gemm16: str | None = None   # the 16-bit GEMM path every spawned rank takes (picked once by the parent)


def under_launcher() -> bool:
    """True when a launcher (torchrun) started this process as one rank of several."""
    return all(k in os.environ for k in LAUNCHER_ENV) and int(os.environ["WORLD_SIZE"]) > 1


def timing_note(world: int, device: str) -> str | None:
    """Why the measured times of a ``world``-rank replay on ``device`` mean nothing, or None."""
    cores = os.cpu_count() or 1
    if device.startswith("cpu") and world > cores:
        return (f"timing meaningless: {world} ranks share {cores} CPU cores (each rank stands for a GPU); "
                "the losses and weights (--verify) are exact")
    return None


def check_world(plan: Plan, device: str, verify: bool) -> int:
    """The plan's rank count; ReplayError when this machine cannot host that many ranks."""
    world = len(plan_gpus(plan))
    check_multi_rank(plan)
    dev = pick_device(device)
    if dev.type == "cuda" and not under_launcher() and world > torch.cuda.device_count():
        raise ReplayError(f"plan uses {world} GPUs but this machine has {torch.cuda.device_count()} CUDA device(s); "
                          "replay it under torchrun on enough GPUs, or with --device cpu --verify")
    if dev.type == "cpu" and world > (os.cpu_count() or 1) and not verify:
        raise ReplayError(f"plan uses {world} GPUs but this machine has {os.cpu_count()} CPU cores to stand in for "
                          "them; add --verify to replay it anyway (exact training, meaningless timing)")
    return world


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def run_rank(rank: int, world: int, store: Any, job: RankJob, local_rank: int) -> RankResult:
    """This process's rank: join the process group, make the plan's groups, replay its part."""
    device = pick_device(job.device)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group(_backend(device), store=store, rank=rank, world_size=world)
    plan = Plan.from_dict(job.plan)
    groups = {stream: dist.new_group(list(ranks)) for stream, ranks in shared_groups(plan)}
    comm = Comm(rank, world, store, groups, device, job.run_id)
    runner = Runner(plan, plan.hardware, device=str(device), nvme_dir=job.nvme_dir, seed=job.seed, rank=rank,
                    comm=comm)
    meas = runner.run()
    return RankResult.of(rank, runner, meas)


def _child(rank: int, world: int, port: int, job: RankJob, out: Any) -> None:
    """A spawned rank: its result (or its one-line error) goes back to the parent on ``out``."""
    try:
        if job.gemm16 is not None:  # the parent's pick, whatever this rank's own probe would say
            os.environ[GEMM16_ENV] = job.gemm16
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=STORE_TIMEOUT)
        res = run_rank(rank, world, store, job, rank)
        out.put(("ok", rank, _dumps(res)))
    except ReplayOom as e:
        out.put(("oom", rank, str(e)))
    except ReplayError as e:
        out.put(("error", rank, str(e)))
    except Exception as e:  # noqa: BLE001 - a rank's failure is reported by the parent in one line
        out.put(("error", rank, f"rank {rank}: {type(e).__name__}: {' '.join(str(e).split())}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _dumps(res: RankResult) -> bytes:
    buf = io.BytesIO()
    torch.save(res, buf)
    return buf.getvalue()


def _loads(data: bytes) -> RankResult:
    res = torch.load(io.BytesIO(data), weights_only=False)
    assert isinstance(res, RankResult)
    return res


def run_ranks(plan: Plan, hw: HardwareSpec, *, device: str = "auto", nvme_dir: str | None = None,
              seed: int, verify: bool = False, timeout_s: float | None = None
              ) -> tuple[Measurement, list[RankResult]] | None:
    """Replay a multi-GPU plan with one process per rank; the merged measurement and every rank's result
    (None on the ranks other than 0 under a launcher). Raises ReplayError / ReplayOom; with ``timeout_s``,
    ReplayError when the spawned ranks have not all answered within that many seconds (they are killed)."""
    world = check_world(plan, device, verify)
    job = RankJob(plan.to_dict(), device, nvme_dir, seed, uuid.uuid4().hex[:12])
    if under_launcher():
        return _run_launched(plan, hw, job, world)
    precision = plan.workload.config.precision
    if precision in TORCH_DTYPES and precision != "fp32":  # one path for every rank and this process's reference
        job = replace(job, gemm16=gemm16_path(pick_device(device).type, TORCH_DTYPES[precision]))
    return _spawn(plan, hw, job, world, timeout_s)


def _run_launched(plan: Plan, hw: HardwareSpec, job: RankJob, world: int
                  ) -> tuple[Measurement, list[RankResult]] | None:
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if int(os.environ["WORLD_SIZE"]) != world:
        raise ReplayError(f"the launcher started {os.environ['WORLD_SIZE']} ranks but the plan has {world} GPUs")
    device = pick_device(job.device)
    dist.init_process_group(_backend(device) if device.type == "cpu" else "nccl")
    try:
        store = dist.distributed_c10d._get_default_store()
        # every rank must run the same run id: rank 0's
        ids: list[Any] = [job.run_id]
        dist.broadcast_object_list(ids, src=0)
        job = RankJob(job.plan, job.device, job.nvme_dir, job.seed, str(ids[0]))
        res = run_rank(rank, world, store, job, local)
        got: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(_dumps(res), got if rank == 0 else None, dst=0)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    results = [_loads(x) for x in got]
    return merge(plan, hw, results), results


def _spawn(plan: Plan, hw: HardwareSpec, job: RankJob, world: int, timeout_s: float | None = None
           ) -> tuple[Measurement, list[RankResult]]:
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=STORE_TIMEOUT, wait_for_workers=False)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, world, server.port, job, out), daemon=True, name=f"replay-rank{r}")
             for r in range(world)]
    with one_malloc_arena():  # the forkserver's environment, hence the ranks' (replay.host_memory)
        for p in procs:
            p.start()
    results: dict[int, RankResult] = {}
    failure: tuple[str, str] | None = None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while len(results) < world and failure is None:
            try:
                wait = JOIN_POLL_S if deadline is None else max(0.0, min(JOIN_POLL_S, deadline - time.monotonic()))
                kind, rank, payload = out.get(timeout=wait)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    failure = ("error", f"{dead[0].name} exited with code {dead[0].exitcode} without a result")
                elif deadline is not None and time.monotonic() > deadline:
                    missing = [r for r in range(world) if r not in results]
                    failure = ("timeout", f"ranks {missing} gave no result within {timeout_s:.0f} s (stopped; a hang "
                                          "or a plan far slower than simulated)")
                continue
            if kind == "ok":
                results[rank] = _loads(payload)
            else:
                failure = (kind, payload)
    finally:
        for p in procs:
            if failure is not None and p.is_alive():
                p.kill()
            p.join(timeout=30)
        out.close()
    if failure is not None:
        raise {"oom": ReplayOom, "timeout": ReplayTimeout}.get(failure[0], ReplayError)(failure[1])
    ordered = [results[r] for r in range(world)]
    return merge(plan, hw, ordered), ordered
