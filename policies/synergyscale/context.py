"""SynergyScale's knobs (defaults, the fixed values ``auto=False`` uses, validation), the ``Choice`` (one point
of its search space) and the per-job facts it computes once (sizes, link rates, capacities, a compute-time
cache): per data-parallel rank (all ranks are alike) unless it says "pool" (host DRAM and NVMe are shared)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from costs import ComputePricer, link_capacities, ring_per_rank_bytes, ring_steps, slowest_transfer_rate
from hardware_models import Topology, build_topology
from policies.base import Job, KnobError, gpu_pool
from workloads import LayerTrace

NAME = "synergyscale"
TIERS = ("gpu", "peer", "cpu", "nvme")
FETCHED = ("peer", "cpu", "nvme")      # tiers whose parameters are brought to the GPU before each use
HOST = ("cpu", "nvme")                 # tiers updated by CPU Adam from host gradients
DEFAULT_CHUNKS = 2
DEFAULT_STREAMS = 2
DEFAULT_PREFETCH = 2.0
DEFAULT_ORDER = "tail"
BUCKETS_IN_FLIGHT = 3                  # gradient buckets alive at once (bounded: bwd of layer i waits for i+3)
NVME_SWAP_BUFFERS = 2                  # pinned host sets of the NVMe optimizer swap (double buffering)
GRAD_STAGING_LAYERS = 2                # NVMe-tier layers whose fp32 gradients may sit in pinned DRAM at once
GRAD32_BYTES = 4.0                     # the fp32 gradient the optimizer swapper writes to NVMe (per parameter)


@dataclass(frozen=True)
class Fractions:
    """Explicit placement fractions (of parameters) per tier; None = auto (filled fastest first)."""

    peer: float | None = None
    cpu: float | None = None
    nvme: float | None = None

    def get(self, tier: str) -> float | None:
        return None if tier == "gpu" else getattr(self, tier)


@dataclass(frozen=True)
class Knobs:
    auto: bool = True
    peer_fraction: str = "auto"
    cpu_fraction: str = "auto"
    nvme_fraction: str = "auto"
    chunks: int = 0
    streams: int = 0
    prefetch: float = 0.0
    order: str = "auto"
    offload_activations: bool = False
    host_grad_bytes: float = 4.0

    def fractions(self) -> Fractions:
        return Fractions(**{t: _fraction(getattr(self, f"{t}_fraction"), f"{t}_fraction") for t in FETCHED})

    def fixed(self) -> tuple[str, int, int, float]:
        """(order, chunks, streams, prefetch) of ``auto=False``: each knob where set, else its default."""
        return (self.order if self.order != "auto" else DEFAULT_ORDER, self.chunks or DEFAULT_CHUNKS,
                self.streams or DEFAULT_STREAMS, self.prefetch or DEFAULT_PREFETCH)

    def validate(self) -> None:
        fr = self.fractions()
        if sum(getattr(fr, t) or 0.0 for t in FETCHED) > 1.0 + 1e-9:
            raise KnobError(f"{NAME}: knobs 'peer_fraction' + 'cpu_fraction' + 'nvme_fraction' must not exceed 1")
        for name in ("chunks", "streams"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0 or v > 256:
                raise KnobError(f"{NAME}: knob '{name}' must be 0 (auto) or an integer 1..256, got {v!r}")
        if not (self.prefetch == 0 or 0.0 < self.prefetch <= 64):
            raise KnobError(f"{NAME}: knob 'prefetch' must be 0 (auto) or a number of layers in (0, 64], "
                            f"got {self.prefetch!r}")
        if self.host_grad_bytes not in (2.0, 4.0):
            raise KnobError(f"{NAME}: knob 'host_grad_bytes' must be 2 (bf16/fp16) or 4 (fp32), "
                            f"got {self.host_grad_bytes!r}")
        if self.order not in ("auto", "tail", "spread"):
            raise KnobError(f"{NAME}: knob 'order' must be one of auto, tail, spread, got {self.order!r}")


def _fraction(text: Any, name: str) -> float | None:
    if isinstance(text, str) and text.strip().lower() == "auto":
        return None
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 <= v <= 1.0:
        raise KnobError(f"{NAME}: knob '{name}' must be auto or a fraction in [0, 1], got {text!r}")
    return v


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
    def fetches(self) -> bool:
        return any(t in FETCHED for t in self.tiers)

    def units(self) -> list[tuple[str, int, int]]:
        """Fetch units (pass "f" | "b", layer, chunk) in consumption order: forward chunks, then backward."""
        idx = range(len(self.tiers))
        return [(p, i, k) for p, order in (("f", idx), ("b", idx[::-1])) for i in order
                if self.tiers[i] in FETCHED for k in range(self.chunks)]

    def params(self) -> dict[str, object]:
        return {"chunks": self.chunks, "streams": self.streams, "buffers": self.buffers,
                "prefetch_layers": round(self.buffers / self.chunks, 3), "order": self.order,
                "gpu_share": self.gpu_share, "offload_activations": self.offload_activations,
                "grad_buckets": self.buckets}


@dataclass
class Ctx:
    job: Job
    topo: Topology
    n: int
    unified: bool
    has_nvme: bool
    peer_ok: bool                   # more than one GPU and NVLink: a peer tier, and sliced fetches (below)
    gpu_cap: float
    cpu_cap: float                  # host pool (on a unified machine: the same pool as the GPU's)
    nvme_cap: float
    up_rate: float                  # cpu -> gpu bytes/s per GPU with every GPU uploading
    up_lat: float
    down_rate: float
    ring_rate: float                # per-rank bytes/s of a ring collective over all GPUs
    ring_lat: float
    nvme_read: float
    nvme_write: float
    nvme_lat: float
    host_grad_bytes: float = 4.0    # host gradient buffer per parameter (fp32 in DeepSpeed's offload path)
    grads_to_nvme: bool = False     # the NVMe tier's gradients go to NVMe (one micro-step per step), not to DRAM
    _ct: dict[tuple[int, str, int], float] = field(default_factory=dict)
    _pricer: ComputePricer | None = None

    @property
    def sliced(self) -> bool:
        """Offloaded parameters: each rank uploads 1/n, then an NVLink all-gather."""
        return self.peer_ok

    @property
    def layers(self) -> tuple[LayerTrace, ...]:
        return self.job.trace.layers

    def gpu_cost(self, i: int, tier: str) -> float:
        """Persistent bytes on each GPU for layer i's model states in ``tier``."""
        ly = self.layers[i]
        rest = ly.grad_bytes + ly.master_bytes + ly.optimizer_bytes
        return {"gpu": ly.param_bytes + rest / self.n, "peer": (ly.param_bytes + rest) / self.n}.get(tier, 0.0)

    def host_cost(self, i: int, tier: str) -> float:
        """Bytes in the host pool for layer i's states in ``tier`` (the NVMe tier: its gradient accumulation
        buffer, none when its gradients go to NVMe; the pinned swap buffers are ``placement.host_fixed_bytes``)."""
        ly = self.layers[i]
        grads = self.host_grad_bytes * ly.params
        nvme = 0.0 if self.grads_to_nvme else grads
        return {"cpu": ly.param_bytes + ly.master_bytes + ly.optimizer_bytes + grads, "nvme": nvme}.get(tier, 0.0)

    def nvme_cost(self, i: int, tier: str) -> float:
        """Bytes on the NVMe set for layer i's states in ``tier``: 16-bit weights, fp32 master, m and v, and the
        fp32 gradient when it is swapped out there."""
        ly = self.layers[i]
        if tier != "nvme":
            return 0.0
        return ly.param_bytes + ly.master_bytes + ly.optimizer_bytes + self.grad32_bytes(i)

    def grad32_bytes(self, i: int) -> float:
        """Layer i's fp32 gradient on NVMe (0 when the NVMe tier accumulates its gradients in DRAM)."""
        return GRAD32_BYTES * self.layers[i].params if self.grads_to_nvme else 0.0

    def swap_in_bytes(self, i: int) -> float:
        """What the optimizer reads from NVMe for NVMe-tier layer i into its pinned buffers: fp32 master, m, v
        and (``grads_to_nvme``) the fp32 gradient (DeepSpeed ``swap_in_optimizer_state``: one buffer per state
        tensor plus one for the gradient)."""
        ly = self.layers[i]
        return ly.master_bytes + ly.optimizer_bytes + self.grad32_bytes(i)

    def grad_part(self, i: int) -> float:
        """Bytes of layer i's gradients one rank copies to the host (its 1/n partition)."""
        ly = self.layers[i]
        return ly.params / self.n * (ly.grad_bytes / ly.params if ly.params else 0.0)

    def tier_sum(self, tiers: tuple[str, ...], tier: str, attr: str = "params") -> float:
        return float(sum(getattr(self.layers[i], attr) for i, t in enumerate(tiers) if t == tier))

    def gpu_adam_params(self, tiers: tuple[str, ...]) -> float:
        """Parameters GPU Adam updates per rank: 1/n of the gpu and peer tiers (one GPU: the gpu tier)."""
        gpu = self.tier_sum(tiers, "gpu")
        return (gpu + self.tier_sum(tiers, "peer")) / self.n if self.n > 1 else gpu

    def ctime(self, i: int, phase: str, c: int) -> float:
        """Seconds of one of c chunks of layer i's ``phase`` (fwd | rc | bwd), launch overhead included: what the
        engine charges the chunk's task (``costs.ComputePricer``: 1/c of the layer's kernels, each smaller and
        so less efficient on its curve, its element-wise bytes where the GPU prices them apart, and
        ``chunk_hbm`` as a floor)."""
        key = (i, phase, c)
        t = self._ct.get(key)
        if t is None:
            ly = self.layers[i]
            flops = {"fwd": ly.fwd_flops, "rc": ly.recompute_flops, "bwd": ly.bwd_flops}[phase]
            hbm = ly.bwd_hbm_bytes if phase == "bwd" else ly.fwd_hbm_bytes
            if self._pricer is None:
                self._pricer = ComputePricer(self.job.hw, self.job.config.precision, (self.job.model, self.job.config))
            t = self._ct[key] = self._pricer.seconds(flops / c, chunk_hbm(hbm, ly.output_bytes, c), i,
                                                     {"fwd": "fwd", "rc": "recompute", "bwd": "bwd"}[phase])
        return t

    def ring_seconds(self, nbytes: float) -> float:
        """Seconds of an all-gather / reduce-scatter of ``nbytes`` over every GPU (the ring's per-rank bytes at
        its shared rate, and the largest hop latency once per ring step)."""
        return (ring_per_rank_bytes(nbytes, self.n, "all_gather") / self.ring_rate
                + self.ring_lat * ring_steps(self.n, "all_gather"))


def chunk_hbm(hbm: float, output_bytes: float, c: int) -> float:
    """HBM bytes of one of c chunks: 1/c of the layer's (it reads the whole layer input), plus for c > 1 the
    partial-sum output written and read."""
    return hbm / c + (2.0 * output_bytes if c > 1 else 0.0)


def make_ctx(job: Job, host_grad_bytes: float = 4.0) -> Ctx:
    hw, topo, n = job.hw, build_topology(job.hw), job.n_gpus
    gpus = [f"gpu{r}" for r in range(n)]
    cap = link_capacities(topo)
    up_rate, up_lat = slowest_transfer_rate(topo, [("cpu", g) for g in gpus], cap)   # every GPU uploading
    down_rate, _ = slowest_transfer_rate(topo, [(g, "cpu") for g in gpus], cap)
    ring_rate, ring_lat = (slowest_transfer_rate(topo, [(gpus[r], gpus[(r + 1) % n]) for r in range(n)], cap)
                           if n > 1 else (math.inf, 0.0))  # a ring over all GPUs: every hop at once
    has_nvme, nv = "nvme" in topo.locations, hw.nvme
    # one micro-step per step: each reduced gradient partition is final, so the NVMe tier's go to NVMe through
    # pinned buffers (DeepSpeed); with accumulation they are summed in a host buffer first (``host_grad_bytes``)
    grads_to_nvme = has_nvme and job.accumulation(n) == 1
    return Ctx(job, topo, n, topo.pool_of["gpu0"] == topo.pool_of["cpu"], has_nvme, n > 1 and hw.nvlink is not None,
               gpu_pool(job).capacity_bytes, topo.pools[topo.pool_of["cpu"]].capacity_bytes,
               topo.pools["nvme"].capacity_bytes if has_nvme else 0.0, up_rate, up_lat, down_rate, ring_rate,
               ring_lat, nv.read_bw if nv else 1.0, nv.write_bw if nv else 1.0, nv.latency_s if nv else 0.0,
               host_grad_bytes, grads_to_nvme)
