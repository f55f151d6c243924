"""Execute a Plan for real: one worker thread per stream, in plan order, waiting on its dependencies.

The plan is unrolled with ``simulator.unroll.Unroller`` (every step in full). Each task then:

- *begins*: the tensors it reads must be resident where it says, its allocations are made (and counted
  against the plan's pool capacities, the GPU included even on a CPU-only machine), a copy's tensor must
  be at its source — the same rules as the simulator's engine, so a replay doubles as a plan checker;
- *runs* for real (``replay.store``): compute tasks tagged ``{"layer": i, "phase": fwd|recompute|bwd}``
  run module i; optimizer tasks run Adam on the layer's (``"layers": [...]``: those layers'; untagged:
  every layer's) master parameters where the plan puts them; ``param-upload`` (a layer, or a pack of
  layers swapped in) and ``grad-offload`` copies move those tensors; other copies
  move a real buffer of the plan's size (files under ``--nvme-dir`` for nvme); collectives over one rank
  are no-ops; over several (``replay.ranks``) they are real: gradient reductions, parameter gathers, the
  tensor-parallel all-reduces of Megatron-style shards (``replay.tensor_parallel``) and the sum of a tied
  table's two gradients between a pipeline's first and last stage;
- *ends*: its frees are applied.

Recorded: per-task start/end (``simulator.engine.TaskRecord``, so the simulator's metrics and trace
writer apply unchanged), bytes per pool over time, bytes per link (routed over the plan's topology),
real bytes moved, step ends, losses and final weights.

The replay computes in the plan's precision (``replay.precision``: bf16/fp16 autocast over fp32 master
weights, a static loss scale for fp16; bytes are counted as the plan states them); dropout is off. On CUDA
every plan stream gets its own CUDA stream and a task ends when its kernels have finished (a synchronisation per task).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import simpy
import torch
from torch import Tensor, nn

from costs.collective import fabric_factor, ring_per_rank_bytes
from hardware_models import HardwareSpec, Topology, build_topology
from replay.errors import ReplayError, ReplayOom
from replay.host_memory import host_reserve_bytes, keep_freed_memory
from replay.model import Dims, build_layers
from replay.pools import Pools
from replay.ranks import RankView, is_p2p, plan_gpus, rank_view
from replay.store import Batching, Sharding, Store
from replay.tensor_parallel import TpPlace, shard_layers
from replay.threads import cpu_op_threads, pin_this_thread
from simulator.engine import RawRun, TaskRecord, collective_kind, task_gpus
from simulator.errors import PlanError
from simulator.flows import FlowNetwork
from simulator.memory import MemoryTracker
from simulator.phase import UPLOAD_PHASES, Phase
from simulator.plan import Plan, TaskSpec, validate_plan
from simulator.result import Result, SimInfo, build_result, step_metrics
from simulator.simulate import simulate_plan
from simulator.unroll import ConcreteTask, Unroller

DEFAULT_SEED = 1234
TP_PHASES = {Phase.TP_FWD: "f", Phase.TP_RECOMPUTE: "r", Phase.TP_BWD: "b"}
# a parameter gather: at a step's end (ZeRO's updated shards), or a param-upload's all-gather of the 1/n slices
# each rank uploaded, or of peer GPUs' shards (synergyscale's sliced fetches and its peer tier)
GATHER_PHASES = (Phase.PARAM_GATHER, Phase.PARAM_UPLOAD)


def task_layers(tags: dict | object) -> list[int] | None:
    """The layers a task works on: its ``layers`` tag (a pack), else its ``layer`` tag, else None."""
    get = getattr(tags, "get", None)
    if get is None:
        return None
    many = get("layers")
    if isinstance(many, list | tuple):
        return [int(x) for x in many]
    one = get("layer")
    return [one] if one is not None else None
# Python hands the GIL to a waiting thread only every sys.getswitchinterval() (5 ms by default): a copy
# stream that wakes while the compute stream runs Python glue between kernels would wait up to 5 ms for
# work the simulator prices in microseconds. The replay lowers it for its own run and restores it after.
SWITCH_INTERVAL_S = 2e-4
# a failed replay waits this long for its other stream threads to stop (Runner._join)
JOIN_POLL_S, ABORT_GRACE_S = 0.05, 2.0


@dataclass
class Measurement:
    records: list[TaskRecord]
    memory: MemoryTracker
    link_bytes: dict[str, float]
    link_bytes_by_step: dict[int, dict[str, float]]
    real_link_bytes: dict[str, float]
    step_end: dict[int, float]
    wall_s: float
    losses: dict[tuple[int, int], float]
    weights: list[dict[str, Tensor]]
    topology: Topology
    device: str
    leaked: list[str] = field(default_factory=list)
    # shared pools of a multi-rank replay with the ranks aligned as a simulation runs them: the pool's initial
    # tensors plus each rank's own peak on it, summed (replay.dist_merge.aligned_peaks); empty for one rank
    aligned_peaks: dict[str, float] = field(default_factory=dict)

    def step_times(self) -> list[float]:
        ends = [self.step_end[s] for s in sorted(self.step_end)]
        return [e - (ends[i - 1] if i else 0.0) for i, e in enumerate(ends)]


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ReplayError("--device cuda: no CUDA device on this machine; use --device cpu")
    return torch.device(name)


def _is_collective(t: ConcreteTask) -> bool:
    return t.spec.op == "collective" and len(t.spec.ranks) > 1


def _is_rendezvous(t: ConcreteTask) -> bool:
    """A task that its ranks run together (a collective, a GPU-to-GPU send and its receive): the call itself
    waits for the other side, so another rank's dependencies of it need no wait of their own."""
    return _is_collective(t) or is_p2p(t.spec)


class LoggedMemory(MemoryTracker):
    """The runner's memory accounting, also logged (time, +bytes or -1, instance, location, kind, task) so
    that the ranks of a multi-rank replay merge into one timeline per pool (``replay.dist_merge``)."""

    def __init__(self, capacities: Mapping[str, float], pool_of: Mapping[str, str]):
        super().__init__(capacities, pool_of)
        self.log: list[tuple[float, float, str, str, str, str]] = []

    def alloc(self, now: float, inst: str, loc: str, nbytes: float, kind: str, task: str,
              mult: float = 1.0) -> None:
        super().alloc(now, inst, loc, nbytes, kind, task, mult)
        self.log.append((now, nbytes * mult, inst, loc, kind, task))

    def free(self, now: float, inst: str, loc: str, task: str) -> None:
        super().free(now, inst, loc, task)
        self.log.append((now, -1.0, inst, loc, "", task))


def check_replayable(plan: Plan, rank: int | None = None) -> RankView:
    """The rank's view of the plan (a single-GPU plan: rank 0 of 1); ReplayError when this process
    cannot replay it (a multi-GPU plan needs a rank: ``replay.dist_launch`` starts one process per GPU)."""
    gpus = plan_gpus(plan)
    if not gpus:
        raise ReplayError("plan computes on no GPU; nothing to replay")
    if len(gpus) > 1 and rank is None:
        raise ReplayError(f"plan uses {len(gpus)} GPUs: replay it with one process per GPU "
                          "(replay.dist_launch.run_ranks, as `tiersim replay` does)")
    c = plan.workload.config
    if c.checkpointing == "full" and c.checkpoint_early_stop:
        raise ReplayError("plan recomputes with checkpoint_early_stop (PyTorch's non-reentrant early stop), but the "
                          "runner recomputes whole blocks; plan it again without --checkpoint-early-stop to replay it")
    return rank_view(plan, rank or 0)


def _order_check(per_stream: dict[str, list[ConcreteTask]], uids: set[str], remote: frozenset[str] = frozenset()
                 ) -> None:
    """Fail before running when some task could never start (deadlock, or a dep the plan never runs);
    ``remote``: tasks other ranks run (checked with the whole plan by the launcher, taken as done here)."""
    for ts in per_stream.values():
        for t in ts:
            for d in t.deps:
                if d not in uids and d not in remote:
                    raise ReplayError(f"task {t.uid!r}: depends on {d!r}, which the plan never runs")
    done: set[str] = set(remote)
    pos = dict.fromkeys(per_stream, 0)
    progress = True
    while progress:
        progress = False
        for sid, ts in per_stream.items():
            while pos[sid] < len(ts) and all(d in done for d in ts[pos[sid]].deps):
                done.add(ts[pos[sid]].uid)
                pos[sid] += 1
                progress = True
    for sid, ts in per_stream.items():
        if pos[sid] < len(ts):
            t = ts[pos[sid]]
            waits = [d for d in t.deps if d not in done]
            raise ReplayError(f"deadlock: task {t.uid!r} on stream {sid!r} never runs (it waits for {waits[0]!r})")


class Runner:
    """Replays one plan (or, with ``rank`` and ``comm``, one rank's part of a multi-GPU plan: see
    ``replay.ranks``); ``run()`` returns a Measurement (raises ReplayError / ReplayOom)."""

    def __init__(self, plan: Plan, hw: HardwareSpec, *, device: str = "auto", nvme_dir: str | None = None,
                 seed: int = DEFAULT_SEED, rank: int | None = None, comm: Any = None):
        self.topo = build_topology(hw)
        validate_plan(plan, "plan", self.topo.locations)
        self.plan = plan
        self.hw = hw
        self.device = pick_device(device)
        self.view = check_replayable(plan, rank)
        if self.view.world > 1 and comm is None:
            raise ReplayError(f"rank {self.view.rank} of {self.view.world}: no process group (replay.dist_launch)")
        self.comm = comm
        self.gpu = self.view.gpu
        self.dims = Dims.from_model(plan.workload.model)
        self.n_layers = self.dims.n_layers + 2
        self.seed = seed
        self.nvme_dir = nvme_dir
        config = plan.workload.config
        self.batching = Batching(seed, config.micro_batch, config.seq_len, config.precision)  # replay.precision
        self.streams = plan.stream_map()
        self.tensors = plan.tensor_map()
        self._scan()

    def _mine(self) -> Iterator[TaskSpec]:
        for seg in self.plan.segments:
            for t in seg.tasks:
                if self.view.runs(t):
                    yield t

    # -- static analysis of the plan (this rank's tasks) -----------------------------------------------
    def _scan(self) -> None:
        recompute: set[int] = set()
        master: dict[int, str] = {}
        self.producers: dict[str, set[int] | None] = {}
        self.sharded: set[int] = set()
        self.computes: set[int] = set()
        dp_group: tuple[str, ...] = (self.gpu,)
        tp_groups: set[tuple[tuple[str, ...], str]] = set()
        gathers: list[TaskSpec] = []
        uploads: list[TaskSpec] = []
        self.tp_rc_layers: set[int] = set()
        for t in self._mine():
            layer = t.tags.get("layer")
            layers = task_layers(t.tags)
            for x in layers or ():
                if not (isinstance(x, int) and 0 <= x < self.n_layers):
                    raise ReplayError(f"task {t.id!r}: layer {x!r} is not a layer of this model "
                                      f"(0..{self.n_layers - 1})")
            dev = self.streams[t.stream].device
            if t.op == "compute" and t.tags.get("phase") == Phase.RECOMPUTE and layer is not None:
                recompute.add(layer)
            if t.op == "compute" and layer is not None:
                self.computes.add(layer)
            if t.op == "optimizer":
                for i in (layers if layers is not None else range(self.n_layers)):
                    if master.setdefault(i, dev) != dev:
                        raise ReplayError(f"task {t.id!r}: updates layer {i} on {dev!r}, but another "
                                          f"optimizer task updates it on {master[i]!r}")
                if dev == self.gpu:
                    self.producers[t.id] = set(layers) if layers is not None else None
            if t.op == "copy" and t.tags.get("phase") in UPLOAD_PHASES and layers is not None \
                    and t.dst == self.gpu:
                self.producers[t.id] = set(layers)
                uploads.append(t)
            if t.op == "collective" and len(t.ranks) > 1:
                if t.tags.get("phase") == Phase.GRAD_REDUCE:
                    dp_group = tuple(t.ranks)  # the data-parallel replicas of this rank's layers
                if t.tags.get("phase") == Phase.GRAD_REDUCE and t.coll == "reduce_scatter":
                    self.sharded |= set(layers if layers is not None else range(self.n_layers))
                if t.tags.get("phase") in GATHER_PHASES:
                    gathers.append(t)
                if t.tags.get("phase") in TP_PHASES:
                    tp_groups.add((tuple(t.ranks), t.stream))
                if t.tags.get("phase") == Phase.TP_RECOMPUTE and isinstance(layer, int):
                    self.tp_rc_layers.add(layer)
        self.master_loc = [master.get(i, self.gpu) for i in range(self.n_layers)]
        for t in gathers:  # a gather of partitioned layers makes their versions (an upload or update of a shard
            layers = task_layers(t.tags)  # does not)
            self.producers[t.id] = set(layers) if layers is not None else set(self._gathered())
        gather_ids = {g.id for g in gathers}
        self._check_whole_uploads(uploads, {x for g in gather_ids for x in self.producers[g] or ()}, len(dp_group))
        for tid, made in list(self.producers.items()):  # an optimizer step or upload of a shard makes no version
            if tid in gather_ids or not self.sharded:
                continue
            keep = (set(range(self.n_layers)) if made is None else made) - self.sharded
            if keep:
                self.producers[tid] = keep
            else:
                del self.producers[tid]
        # this rank's place among the replicas of its layers: its micro-batches are its own (replay.store)
        self.dp_rank, self.dp_world = dp_group.index(self.gpu), len(dp_group)
        if len(tp_groups) > 1:
            raise ReplayError(f"{self.gpu} is in {len(tp_groups)} tensor-parallel groups "
                              f"({', '.join(sorted(s for _, s in tp_groups))}); replay runs one per rank")
        tp_ranks, self.tp_stream = next(iter(tp_groups)) if tp_groups else ((self.gpu,), "")
        self.tp = TpPlace(tp_ranks.index(self.gpu), len(tp_ranks), len(tp_ranks) > 1)
        self.keep_graph = [i not in recompute for i in range(self.n_layers)]

    def _check_whole_uploads(self, uploads: list[TaskSpec], gathered: set[int], n: int) -> None:
        """Refuse an upload of a partitioned layer updated on the host that no all-gather follows: each GPU
        uploads the whole layer from host memory, where each rank's CPU Adam updated its 1/n slice (synergyscale
        without NVLink). A rank's process holds its own slice only, so the replay would compute with stale
        parameters (measured: 4% weight error at two ranks) instead of failing."""
        for t in uploads:
            for x in task_layers(t.tags) or ():
                if x in self.sharded and self.master_loc[x] != self.gpu and x not in gathered:
                    raise ReplayError(f"task {t.id!r}: uploads the whole of layer {x}, whose {n} "
                                      "ranks' slices are updated by each rank's host optimizer in its own process "
                                      "(shared host memory is not replayed); replay a plan whose ranks upload their "
                                      "slices and all-gather them (NVLink), or one GPU")

    def _gathered(self) -> list[int]:
        """The layers an untagged parameter gather gathers: the partitioned layers updated on this GPU (a
        layer updated on the host comes back by its own upload and gather, tagged with it: synergyscale's
        host tiers, whose step-end gather ``agg`` is the GPU tier's)."""
        return [i for i in sorted(self.sharded) if self.master_loc[i] == self.gpu]

    # -- running ----------------------------------------------------------------------------------------
    def run(self) -> Measurement:
        reserve = self._host_reserve() if self.device.type == "cpu" else 0
        with cpu_op_threads(self.device), keep_freed_memory(self.device.type, reserve):
            return self._run()

    def _host_reserve(self) -> int:
        """The heap a CPU replay faults in before its first step (``replay.host_memory``): sized from the plan's
        simulated peaks of the pools this process holds in host memory, its GPU's and its share of the hosts'. 0
        for a plan the simulator rejects: the replay's own checks then say what is wrong with it, task by task."""
        try:
            peaks = simulate_plan(self.plan, self.hw).peak_bytes
        except PlanError:
            return 0
        own = self.topo.pool_of.get(self.gpu)
        held = sum(float(peaks.get(name, 0.0)) * (1.0 if name == own else 1.0 / max(self.view.world, 1))
                   for name, pool in self.topo.pools.items() if name == own or pool.kind == "dram")
        return host_reserve_bytes(held)

    def _run(self) -> Measurement:
        every = Unroller(self.plan).unroll()
        self._micro_steps(every)
        tasks = [t for t in every if self.view.runs(t.spec)]
        local = {t.uid for t in tasks}
        remote = frozenset(t.uid for t in every if t.uid not in local)
        # what another rank waits for (a collective's or a send's own deps are met by the call itself)
        self.publish = {d for t in every if t.uid not in local and not _is_rendezvous(t) for d in t.deps
                        if d in local}
        per_stream: dict[str, list[ConcreteTask]] = defaultdict(list)
        for t in tasks:
            per_stream[t.spec.stream].append(t)
        _order_check(per_stream, local, remote)
        self.mem = LoggedMemory({p.name: p.capacity_bytes for p in self.topo.pools.values()}, self.topo.pool_of)
        for ts in self.plan.tensors:
            if ts.home is not None:
                self.mem.alloc(0.0, ts.id, ts.home, ts.bytes, ts.kind, "<initial>")
        if self.mem.ooms:  # the tensors that live from the start do not fit: nothing runs (as in the engine)
            o = self.mem.ooms[0]
            raise ReplayOom(f"out of memory on {o.pool} before the first task: {o.tensor!r} ({o.requested_bytes:.0f} "
                            f"bytes) with {o.free_bytes:.0f} of {o.capacity_bytes:.0f} bytes free")
        self.pools = Pools(self.device, self.nvme_dir)
        layers = build_layers(self.dims, self.seed)
        if self.dims.tied and self.n_layers - 1 in self.computes and 0 not in self.computes:
            # the last pipeline stage keeps its own copy of the tied table, as Megatron does (same init)
            layers[-1].register_parameter("wte", nn.Parameter(layers[0].get_parameter("wte").detach().clone()))
        shard_layers(layers, self.dims, self.tp)  # this rank's tensor-parallel shards (none without tp)
        self.store = Store(self.dims, layers, self.gpu, self.master_loc, self.pools, self.batching,
                           Sharding(self.dp_rank, self.dp_world, frozenset(self.sharded)), self.tp)
        if self.tp.active:
            self.store.tp_link(self.comm, self.tp_stream)
            self.store.tp_rc_layers = frozenset(self.tp_rc_layers)
        self.mem.log.clear()  # the initial tensors: every rank holds the plan's, merged once (replay.dist_merge)
        self.mem_lock = threading.Lock()
        self.records: list[TaskRecord] = []
        self.link_bytes: dict[str, float] = defaultdict(float)
        self.by_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.real_bytes: dict[str, float] = defaultdict(float)
        self.step_end: dict[int, float] = defaultdict(float)
        self.events = {t.uid: threading.Event() for t in tasks}
        self.error: BaseException | None = None
        self.abort = threading.Event()
        self.store.abort = self.abort
        # the stream with the most compute runs in the calling thread: torch's CPU kernels run 1.5-2x slower
        # from a freshly started thread than from the main one here (measured: a decoder block's forward +
        # backward 24-29 ms in a new thread vs 13-19 ms in the main thread, same process, same minute)
        home = max(per_stream, key=lambda sid: (sum(t.spec.op == "compute" for t in per_stream[sid]), sid))
        threads = [threading.Thread(target=self._worker, args=(sid, ts), name=f"replay:{sid}", daemon=True)
                   for sid, ts in per_stream.items() if sid != home]
        switch = sys.getswitchinterval()
        try:
            sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
            # the ranks of a multi-rank replay share one time zero (replay.dist_comm.Comm.common_t0)
            self.t0 = self.comm.common_t0() if self.comm is not None else time.perf_counter()
            for th in threads:
                th.start()
            self._worker(home, per_stream[home])
            self._join(threads)
            wall = time.perf_counter() - self.t0
            sys.setswitchinterval(switch)
            if self.error is not None:
                raise self.error
            keep = {t.id for t in self.plan.tensors if t.persistent or t.home is not None}
            leaked = [f"{inst}@{loc}" for inst, loc in self.mem.resident if inst.split("[", 1)[0] not in keep]
            return Measurement(sorted(self.records, key=lambda r: (r.start, r.stream)), self.mem,
                               dict(self.link_bytes), {k: dict(v) for k, v in self.by_step.items()},
                               dict(self.real_bytes), dict(self.step_end), wall, dict(self.store.losses),
                               self.store.final_weights(), self.topo, str(self.device), leaked)
        finally:
            sys.setswitchinterval(switch)
            self.store.close()
            self.pools.close()

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for the stream threads; once one failed, at most ``ABORT_GRACE_S`` more: a thread inside a
        blocking send, receive or collective of a multi-rank replay never returns when its peer rank stops
        on this rank's failure (it would wait for this rank's matching call), so the rank reports its error
        instead of waiting forever (the threads are daemons: they end with the rank's process)."""
        deadline = None
        for th in threads:
            while th.is_alive():
                th.join(JOIN_POLL_S)
                if self.abort.is_set():
                    deadline = deadline or time.monotonic() + ABORT_GRACE_S
                    if time.monotonic() > deadline:
                        return

    def _micro_steps(self, tasks: list[ConcreteTask]) -> None:
        """Each task's micro-step within its step: its ``mb`` tag, else the rank of its (segment, iteration)
        among the step's groups that run a forward (a plan may split a step's micro-steps over segments)."""
        groups: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for t in tasks:
            if t.spec.op == "compute" and t.spec.tags.get("phase") == Phase.FWD:
                g = (t.segment, t.iteration)
                if g not in groups[t.step]:
                    groups[t.step].append(g)
        self.micro_of = {(s, *g): i for s, gs in groups.items() for i, g in enumerate(gs)}
        self.accum: dict[int, int] = defaultdict(int)
        for t in tasks:
            if t.spec.op == "compute" and t.spec.tags.get("phase") == Phase.BWD:
                self.accum[t.step] = max(self.accum[t.step], self._micro(t) + 1)

    def _micro(self, t: ConcreteTask) -> int:
        mb = t.spec.tags.get("mb")
        if isinstance(mb, int):
            return mb
        lead = t.spec.tags.get("mb_from_it")  # a repeated segment's micro-batch: its iteration + this (tinypipe)
        if isinstance(lead, int):
            return t.iteration + lead
        return self.micro_of.get((t.step, t.segment, t.iteration), t.iteration)

    def _in_micro_step(self, t: ConcreteTask) -> bool:
        """Does the task belong to one micro-step (a tag says which, or its iteration runs a forward)?"""
        tags = t.spec.tags
        return "mb" in tags or "mb_from_it" in tags or (t.step, t.segment, t.iteration) in self.micro_of

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _worker(self, sid: str, tasks: list[ConcreteTask]) -> None:
        device = self.streams[sid].device
        try:
            if self.device.type == "cuda":  # one CUDA stream per plan stream, so copies overlap compute
                with torch.cuda.device(self.device), torch.cuda.stream(torch.cuda.Stream(self.device)):
                    self._tasks(sid, device, tasks)
            else:
                pin_this_thread(self.device)
                self._tasks(sid, device, tasks)
        except BaseException as e:  # noqa: BLE001 - any failure stops every stream and is re-raised
            with self.mem_lock:
                if self.error is None:
                    self.error = e if isinstance(e, ReplayError) else \
                        ReplayError(f"stream {sid!r}: {type(e).__name__}: {e}")
            self.abort.set()
            for ev in self.events.values():
                ev.set()

    def _tasks(self, sid: str, device: str, tasks: list[ConcreteTask]) -> None:
        """Run one stream's tasks in order; a task ends when its device work has finished."""
        cuda = self.device.type == "cuda"
        for t in tasks:
            far = []
            for d in t.deps:
                ev = self.events.get(d)
                if ev is not None:
                    ev.wait()
                else:
                    far.append(d)
            if far and self.comm is not None and not _is_rendezvous(t):
                self.comm.wait(far, self.abort)
            if self.abort.is_set():
                return
            start = self._now()
            self._begin(t)
            try:
                nbytes, links = self._execute(t, device)
                if cuda:
                    torch.cuda.current_stream(self.device).synchronize()
            except (RuntimeError, KeyError, ValueError, OSError) as e:  # torch's and the file system's failures
                raise ReplayError(f"task {t.uid!r}: {type(e).__name__}: {' '.join(str(e).split())}") from e
            self._finish(t)
            end = self._now()
            with self.mem_lock:
                self.records.append(TaskRecord(t.uid, t.spec.id, t.spec.op, sid, device, start, end, t.step,
                                               t.segment, t.iteration, nbytes, dict(t.spec.tags),
                                               task_gpus(t, device), links))
                self.step_end[t.step] = max(self.step_end[t.step], end)
            self.events[t.uid].set()
            if t.uid in self.publish:
                self.comm.publish(t.uid)

    # -- memory accounting (the simulator engine's rules) ----------------------------------------------
    def _alloc(self, inst: str, loc: str, uid: str) -> None:
        spec = self.tensors[inst.split("[", 1)[0]]
        n = len(self.mem.ooms)
        self.mem.alloc(self._now(), inst, loc, spec.bytes, spec.kind, uid)
        if len(self.mem.ooms) > n:
            o = self.mem.ooms[-1]
            raise ReplayOom(f"task {uid!r}: out of memory on {o.pool}: allocating {inst!r} ({o.requested_bytes:.0f} "
                            f"bytes) with {o.free_bytes:.0f} of {o.capacity_bytes:.0f} bytes free")

    def _placed(self, t: ConcreteTask, placements: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """A collective's placements this rank applies: those on its GPU (each rank its own buffers), and
        those on a host pool by the collective's first rank only (counted once)."""
        if not _is_collective(t) or self.view.world == 1:
            return placements
        first = t.spec.ranks[0] == self.gpu
        return tuple(p for p in placements if p[1] == self.gpu or (not p[1].startswith("gpu") and first))

    def _begin(self, t: ConcreteTask) -> None:
        with self.mem_lock:
            try:
                for inst, loc in self._placed(t, t.reads):
                    if not self.mem.is_resident(inst, loc):
                        raise ReplayError(f"task {t.uid!r}: reads tensor {inst!r} on {loc!r}, but it is not there")
                for inst, loc in self._placed(t, t.allocs):
                    self._alloc(inst, loc, t.uid)
                s = t.spec
                if s.op == "copy" and t.tensor is not None:
                    if not self.mem.is_resident(t.tensor, s.src or ""):
                        raise ReplayError(f"task {t.uid!r}: copies tensor {t.tensor!r} from {s.src!r}, "
                                          "but it is not there")
                    if s.alloc_dst:
                        self._alloc(t.tensor, s.dst or "", t.uid)
            except PlanError as e:
                raise ReplayError(str(e)) from None

    def _finish(self, t: ConcreteTask) -> None:
        with self.mem_lock:
            try:
                s = t.spec
                if s.op == "copy" and t.tensor is not None and s.free_src:
                    self.mem.free(self._now(), t.tensor, s.src or "", t.uid)
                for inst, loc in self._placed(t, t.frees):
                    self.mem.free(self._now(), inst, loc, t.uid)
            except PlanError as e:
                raise ReplayError(str(e)) from None
        for inst, loc in self._placed(t, t.frees):
            self.store.drop_buffer(inst, loc)

    # -- the real work -----------------------------------------------------------------------------------
    def _version(self, t: ConcreteTask, layer: int) -> int:
        """The parameter version a forward uses: the one its producer dependency made (0 before the run)."""
        refs = [r.id for r in t.spec.deps if r.id in self.producers
                and (self.producers[r.id] is None or layer in (self.producers[r.id] or ()))]
        if not refs:
            return self.store.latest[layer]
        found = [self.store.produced.get(d, {}).get(layer) for d in t.deps if d.split("[", 1)[0] in refs]
        made = [v for v in found if v is not None]
        return max(made) if made else 0

    def _execute(self, t: ConcreteTask, device: str) -> tuple[float, tuple[str, ...]]:
        s = t.spec
        phase = s.tags.get("phase")
        layer = s.tags.get("layer")
        if s.op == "compute":
            if device != self.gpu:
                raise ReplayError(f"task {t.uid!r}: computes on {device!r}, which is not the plan's GPU")
            chunks = s.tags.get("chunks")  # a layer split in chunks (synergyscale) runs whole in its last chunk
            if layer is None or chunks is not None and s.tags.get("chunk") != chunks - 1:
                return 0.0, ()
            key = (t.step, self._micro(t), layer)
            part = s.tags.get("part", 0)  # a tensor-parallel layer's compute part (policies.kit.tp_steps)
            if phase == Phase.FWD:
                version = self._version(t, layer) if part == 0 else 0
                self.store.forward(t.uid, key, version, self.keep_graph[layer], part)
            elif phase == Phase.RECOMPUTE:
                self.store.recompute(t.uid, key, part)
            elif phase == Phase.BWD:
                self.store.backward(t.uid, key, self.accum[t.step], device, part)
            return 0.0, ()
        layers = task_layers(s.tags)
        if s.op == "optimizer":
            if layers is None:  # every layer this rank computes (its pipeline stage's) updated here
                layers = [i for i in range(self.n_layers) if self.master_loc[i] == device and i in self.computes]
            self.store.optimizer(t.uid, device, layers, t.step, self.accum[t.step])
            return 0.0, ()
        if s.op == "copy" and is_p2p(s) and self.view.world > 1:
            return self._p2p(t)
        if s.op == "copy":
            src, dst = s.src or "", s.dst or ""
            nbytes = s.bytes if s.bytes > 0 else self.tensors[s.tensor.id].bytes if s.tensor else 0.0
            if phase in UPLOAD_PHASES and layers is not None:
                real = sum(self.store.upload(t.uid, x, src, dst) for x in layers)
            elif phase == Phase.GRAD_OFFLOAD and layers is not None:
                micro = self._micro(t) if self._in_micro_step(t) else None  # None: the step's, accumulated
                real = sum(self.store.move_grads(t.uid, x, t.step, micro, src, dst) for x in layers)
            else:
                real = self.store.copy_buffer(t.tensor, src, dst, int(nbytes), s.free_src)
            return nbytes, self._count_copy(t.step, src, dst, nbytes, real)
        if s.op == "collective" and len(s.ranks) > 1:
            return self._collective(t, layers)
        return 0.0, ()

    def _p2p(self, t: ConcreteTask) -> tuple[float, tuple[str, ...]]:
        """A pipeline stage's boundary tensor (its output activation, or its input's gradient going back):
        sent by the source GPU's rank, received by the destination's; the bytes counted once, by the sender."""
        s = t.spec
        src, dst = s.src or "", s.dst or ""
        phase = s.tags.get("phase")
        if phase not in (Phase.SEND_ACT, Phase.SEND_GRAD):
            raise ReplayError(f"task {t.uid!r}: a copy from {src} to {dst} in phase {phase!r} is not replayed yet "
                              "(pipeline activations and gradients are)")
        grad = phase == Phase.SEND_GRAD
        peer = self.view.gpus.index(dst if src == self.gpu else src)
        shape = (self.batching.micro_batch, self.batching.seq_len, self.dims.hidden)
        if src == self.gpu:
            real = self.store.send_boundary(t.uid, self.comm, s.stream, peer, t.step, self._micro(t), grad)
        else:
            self.store.recv_boundary(self.comm, s.stream, peer, t.step, self._micro(t), grad, shape)
            return 0.0, ()
        nbytes = s.bytes if s.bytes > 0 else float(real)
        return nbytes, self._count_copy(t.step, src, dst, nbytes, real)

    def _count_copy(self, step: int, src: str, dst: str, nbytes: float, real: float) -> tuple[str, ...]:
        """A copy's plan bytes and real bytes counted on every link of its route; the links."""
        links = tuple(h.link for h in self.topo.route(src, dst))
        with self.mem_lock:
            for ln in links:
                self.link_bytes[ln] += nbytes
                self.by_step[step][ln] += nbytes
                self.real_bytes[ln] += real
        return links

    def _collective(self, t: ConcreteTask, layers: list[int] | None) -> tuple[float, tuple[str, ...]]:
        """This rank's side of a real collective; its bytes counted on this rank's hop of the ring (the
        simulator's accounting: every rank sends ``ring_per_rank_bytes`` to the next)."""
        s = t.spec
        phase, coll = s.tags.get("phase"), s.coll or ""
        if phase == Phase.GRAD_REDUCE:
            grouped = self._in_micro_step(t)
            real = self.store.reduce_grads(t.uid, self.comm, s.stream, coll,
                                           layers if layers is not None else list(range(self.n_layers)), t.step,
                                           [self._micro(t)] if grouped else None, self.gpu)
        elif phase in GATHER_PHASES and coll == "all_gather":  # a step-end gather, or an upload's (sliced) gather
            real = self.store.gather_params(t.uid, self.comm, s.stream,
                                            layers if layers is not None else self._gathered())
        elif phase == Phase.TIED_GRAD_SYNC:
            real = self.store.sync_tied(t.uid, self.comm, s.stream, t.step, self.gpu)
        elif phase in TP_PHASES and isinstance(s.tags.get("layer"), int):
            real = self.store.tp_close(t.uid, TP_PHASES[phase], (t.step, self._micro(t), s.tags["layer"]),
                                       int(s.tags.get("part", 0)))
        else:
            raise ReplayError(f"task {t.uid!r}: a {coll or 'collective'} in phase {phase!r} is not replayed (gradient "
                              "reductions, parameter gathers, tensor-parallel all-reduces and tied-gradient sums are)")
        if self.gpu not in s.ranks:
            raise ReplayError(f"task {t.uid!r}: runs on {self.gpu!r}, which is not one of its ranks {s.ranks}")
        n = len(s.ranks)
        nxt = s.ranks[(s.ranks.index(self.gpu) + 1) % n]
        kind = collective_kind(s)
        factor = fabric_factor(self.topo, kind)  # as costs.collective.ring prices it
        per_rank = ring_per_rank_bytes(s.bytes, n, kind) * factor
        real_per_rank = ring_per_rank_bytes(real, n, kind) * factor  # the same ring over the real tensor
        links = tuple(h.link for h in self.topo.route(self.gpu, nxt))
        with self.mem_lock:
            for ln in links:
                self.link_bytes[ln] += per_rank
                self.by_step[t.step][ln] += per_rank
                self.real_bytes[ln] += real_per_rank
        return per_rank, links


def measured_result(plan: Plan, hw: HardwareSpec, m: Measurement) -> Result:
    """The measurement as a simulator Result (same metric definitions, same trace writer)."""
    raw = RawRun(m.records, m.memory, FlowNetwork(simpy.Environment(), {}), m.link_bytes, m.link_bytes_by_step,
                 m.step_end, len(m.records), m.wall_s, m.topology, m.leaked, None)
    metrics = step_metrics(plan, raw)
    return build_result(plan, hw, raw, metrics,
                        SimInfo(len(m.records), m.wall_s, f"measured by tiersim replay on {m.device}", len(m.records)))


def with_steps(plan: Plan, steps: int | None) -> Plan:
    if steps is None:
        return plan
    if steps < 1:
        raise ReplayError(f"--steps must be >= 1, got {steps}")
    return replace(plan, steps=steps)
