"""Per-job facts SynergyScale computes once (sizes, link rates, capacities, a compute-time cache) and the
``Choice``, one point of its search space.

Everything here is per data-parallel rank (all ranks are alike) unless it says "pool" (host DRAM and
NVMe are shared by every rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from costs import kernel_seconds, link_capacities, ring_per_rank_bytes, ring_steps, slowest_transfer_rate
from hardware_models import Topology, build_topology
from policies.base import Job, gpu_pool
from workloads import LayerTrace

GPU_HEADROOM = 0.01                    # fraction of a GPU's usable memory the placement leaves free
BUCKETS_IN_FLIGHT = 3                  # gradient buckets alive at once (bounded: bwd of layer i waits for i+3)
NVME_SWAP_BUFFERS = 2                  # host buffers of the NVMe optimizer swap (double buffering)


@dataclass(frozen=True)
class Choice:
    """One point of the search space (everything the plan builder needs besides the job)."""

    tiers: tuple[str, ...]          # tier of every layer
    chunks: int                     # chunks per fetched layer
    streams: int                    # compute streams per GPU
    buffers: int                    # chunk buffers per GPU for fetched parameters (prefetch window)
    order: str                      # "tail" | "spread": which layers get the fast tiers first
    gpu_share: float                # share of the GPU's spare memory the 'gpu' tier may take (the rest: peer)
    offload_activations: bool
    buckets: int = BUCKETS_IN_FLIGHT  # gradient buckets in flight per GPU (the backward waits beyond that)

    @property
    def prefetch_layers(self) -> float:
        return self.buffers / self.chunks

    def params(self) -> dict[str, object]:
        return {"chunks": self.chunks, "streams": self.streams, "buffers": self.buffers,
                "prefetch_layers": round(self.prefetch_layers, 3), "order": self.order,
                "gpu_share": self.gpu_share, "offload_activations": self.offload_activations,
                "grad_buckets": self.buckets}


@dataclass
class Ctx:
    """Per-job facts computed once: sizes, link rates, capacities, compute-time cache."""

    job: Job
    topo: Topology
    n: int
    unified: bool
    has_nvme: bool
    peer_ok: bool                   # peer-GPU tier possible: more than one GPU and NVLink
    sliced: bool                    # offloaded parameters: each rank uploads 1/n, then an NVLink all-gather
    gpu_cap: float
    cpu_cap: float                  # host pool (on a unified machine: the same pool as the GPU's)
    nvme_cap: float
    dtype: str
    up_rate: float                  # cpu -> gpu bytes/s per GPU with every GPU uploading
    up_lat: float
    down_rate: float
    ring_rate: float                # per-rank bytes/s of a ring collective over all GPUs
    ring_lat: float
    nvme_read: float
    nvme_write: float
    nvme_lat: float
    host_grad_bytes: float = 4.0    # host gradient buffer per parameter (fp32 in DeepSpeed's offload path)
    _ct: dict[tuple[int, str, int], float] = field(default_factory=dict)

    @property
    def layers(self) -> tuple[LayerTrace, ...]:
        return self.job.trace.layers

    # -- per-layer sizes -----------------------------------------------------------------------------
    def gpu_cost(self, i: int, tier: str) -> float:
        """Persistent bytes on each GPU for layer i's model states in ``tier``."""
        ly = self.layers[i]
        rest = ly.grad_bytes + ly.master_bytes + ly.optimizer_bytes
        if tier == "gpu":
            return ly.param_bytes + rest / self.n
        if tier == "peer":
            return (ly.param_bytes + rest) / self.n
        return 0.0

    def host_cost(self, i: int, tier: str) -> float:
        """Bytes in the host pool for layer i's states in ``tier``."""
        ly = self.layers[i]
        if tier == "cpu":
            return ly.param_bytes + ly.master_bytes + ly.optimizer_bytes + self.host_grad_bytes * ly.params
        if tier == "nvme":
            return self.host_grad_bytes * ly.params
        return 0.0

    def nvme_cost(self, i: int, tier: str) -> float:
        ly = self.layers[i]
        return ly.param_bytes + ly.master_bytes + ly.optimizer_bytes if tier == "nvme" else 0.0

    def grad_bytes_per_param(self, i: int) -> float:
        ly = self.layers[i]
        return ly.grad_bytes / ly.params if ly.params else 0.0

    # -- compute -------------------------------------------------------------------------------------
    def ctime(self, i: int, phase: str, c: int) -> float:
        """Seconds of one of c chunks of layer i's ``phase`` (fwd | rc | bwd), launch overhead included.

        A chunk does 1/c of the FLOPs at the efficiency of its own size (the GPU's gemm_efficiency curve),
        reads 1/c of the weights and activations and, for c > 1, reads the whole layer input and writes a
        partial-sum output (2 x output bytes) that the chunks add up.
        """
        key = (i, phase, c)
        t = self._ct.get(key)
        if t is None:
            ly = self.layers[i]
            flops = {"fwd": ly.fwd_flops, "rc": ly.recompute_flops, "bwd": ly.bwd_flops}[phase]
            hbm = ly.bwd_hbm_bytes if phase == "bwd" else ly.fwd_hbm_bytes
            t = kernel_seconds(self.job.hw, flops / c, chunk_hbm(hbm, ly.output_bytes, c), self.dtype)
            self._ct[key] = t
        return t

    # -- transfers -----------------------------------------------------------------------------------
    def ring_seconds(self, nbytes: float) -> float:
        """Seconds of an all-gather / reduce-scatter of ``nbytes`` over every GPU (the ring's per-rank bytes at
        its shared rate, and the largest hop latency once per ring step)."""
        return (ring_per_rank_bytes(nbytes, self.n, "all_gather") / self.ring_rate
                + self.ring_lat * ring_steps(self.n, "all_gather"))


def chunk_hbm(hbm: float, output_bytes: float, c: int) -> float:
    """HBM bytes of one of c chunks: 1/c of the layer's, plus the partial-sum output written and read."""
    return hbm / c + (2.0 * output_bytes if c > 1 else 0.0)


def make_ctx(job: Job, host_grad_bytes: float = 4.0) -> Ctx:
    hw = job.hw
    topo = build_topology(hw)
    n = job.n_gpus
    gpus = [f"gpu{r}" for r in range(n)]
    unified = topo.pool_of["gpu0"] == topo.pool_of["cpu"]
    cap = link_capacities(topo)
    up_rate, up_lat = slowest_transfer_rate(topo, [("cpu", g) for g in gpus], cap)   # every GPU uploading
    down_rate, _ = slowest_transfer_rate(topo, [(g, "cpu") for g in gpus], cap)
    if n > 1:  # a ring over all GPUs: every hop at once
        ring_rate, ring_lat = slowest_transfer_rate(topo, [(gpus[r], gpus[(r + 1) % n]) for r in range(n)], cap)
    else:
        ring_rate, ring_lat = math.inf, 0.0
    has_nvme = "nvme" in topo.locations
    nv = hw.nvme
    return Ctx(
        job=job, topo=topo, n=n, unified=unified, has_nvme=has_nvme,
        peer_ok=n > 1 and hw.nvlink is not None, sliced=n > 1 and hw.nvlink is not None,
        gpu_cap=gpu_pool(job).capacity_bytes, cpu_cap=topo.pools[topo.pool_of["cpu"]].capacity_bytes,
        nvme_cap=topo.pools["nvme"].capacity_bytes if has_nvme else 0.0,
        dtype=job.config.precision,
        up_rate=up_rate, up_lat=up_lat, down_rate=down_rate, ring_rate=ring_rate, ring_lat=ring_lat,
        nvme_read=nv.read_bw if nv else 1.0, nvme_write=nv.write_bw if nv else 1.0,
        nvme_lat=nv.latency_s if nv else 0.0, host_grad_bytes=host_grad_bytes)
