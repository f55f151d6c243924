"""Frozen, validated value objects describing one machine (`HardwareSpec` and its parts).

Units: bytes, seconds, FLOP/s, bytes/s. Every check failure is a `HardwareInputError` naming the dotted
YAML path of the field (``gpu.memory``), whether the object came from a file or was built by hand.
Mapping fields are stored as `FrozenDict`, so every object here is immutable, hashable and picklable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from hardware_models.allocator import ALLOCATORS
from hardware_models.checks import (
    check_fraction,
    check_int,
    check_mapping,
    check_non_negative,
    check_positive,
    check_text,
)
from hardware_models.curve import Curve
from hardware_models.errors import HardwareInputError
from hardware_models.frozen import FrozenDict
from hardware_models.schema import DTYPES, NUMERIC_KINDS, SECTIONS, closest
from hardware_models.units import fmt_bandwidth, fmt_bytes, fmt_flops, fmt_time

__all__ = [
    "C2CSpec",
    "Curve",
    "GpuSpec",
    "HardwareSpec",
    "HostSpec",
    "NetworkSpec",
    "NvlinkSpec",
    "NvmeSpec",
    "PCIE_X16_PER_DIRECTION",
    "PcieSpec",
]

# Theoretical bytes/s of one direction of an x16 link (128b/130b encoding): pcie_table lists Gen3-5;
# Gen6 is derived as 2 x Gen5 (PAM4 doubles the rate; FLIT overhead ignored).
PCIE_X16_PER_DIRECTION: Final[Mapping[int, float]] = FrozenDict(
    {3: 15.75e9, 4: 31.5e9, 5: 63.0e9, 6: 126.0e9}
)
_LANES: Final = (1, 2, 4, 8, 16)


def _size(value: object, path: str) -> None:
    check_non_negative(value, path, "a size", fmt_bytes)


def _flops(value: object, path: str) -> None:
    check_positive(value, path, "a compute rate", fmt_flops)


@dataclass(frozen=True)
class GpuSpec:
    """The GPUs of the machine (all alike).

    `memory_bytes` is the physical memory per GPU (0 on a unified machine, where the GPU allocates from
    `HostSpec.dram_bytes`). `gemm_efficiency(flops_of_one_op)` is the achievable fraction of
    `peak_flops` for an operation of that size, end to end: it includes a layer's non-GEMM work, unless
    `elementwise_efficiency` is given (the Ampere and Hopper presets, ``tiersim.foundry_fit``): then the curve is
    the matmuls' alone, the attention kernel runs on `attention_efficiency` where given, and a layer's element-wise
    operators (``workloads.ops``) are priced apart, their bytes over `elementwise_bw` or else
    `elementwise_efficiency` x `hbm_bw`.
    `optimizer_bytes_per_param` is the HBM traffic of a fused Adam step per parameter, so that
    step time = params * optimizer_bytes_per_param / hbm_bw.

    Optional, measured by ``tiersim calibrate`` (absent in the presets, which price a layer task as one
    kernel): `op_overhead_s` is the fixed cost of one operator (dispatch + launch). When it is set, a
    layer task is priced operator by operator (`workloads.ops`): each matmul at its own size on the
    efficiency curve, the element-wise bytes at `elementwise_bw` (default `hbm_bw`), plus `op_overhead_s`
    per operator (`dispatch_overlap` true: the host issues operators ahead of the device, as CUDA's
    asynchronous launches do, so a task costs the larger of its kernels and its operators' fixed cost, not
    their sum; ``tiersim calibrate`` sets it on a CUDA device). On such a device the host's side is told apart
    where measured: `gemm_op_overhead_s` per matmul or attention operator (its autocast casts and dispatch; default
    `op_overhead_s`) and `task_overhead_s` once per layer task (the runner's module call and its synchronisation
    at the task's end; default 0). Where the spec has them, a backward's matmuls
    run on `gemm_backward_efficiency` (the input-
    and weight-gradient products of a linear layer) and the attention kernel on `attention_efficiency` /
    `attention_backward_efficiency` (fractions of the same peak, over FLOPs per kernel; else the forward
    GEMM curve). `gemm_unaligned_efficiency`: where measured, the fraction of its curve's rate a forward GEMM
    runs at whose output width N is not a multiple of 8 (``costs.compute.UNALIGNED_ELEMENTS``; a GPT-2 vocabulary:
    50257; the curves are measured at multiples of 8, as a model's dimensions are). `shares_host`: the "GPU" is the
    host's own cores (a CPU-only machine), so its kernels, the CPU optimizer and host memory copies share one
    pool of cores.

    Usable memory (``hardware_models.topology``): `memory_bytes` minus the `reserved` lines (CUDA context by
    GPU generation, cuBLAS workspace, NCCL buffers; ``comm_buffers`` only on a machine with more than one
    GPU, i.e. more than one rank) minus the `fragmentation` fraction of the rest (0 in the presets). Each
    tensor is then charged what `allocator` holds for it: ``caching`` (PyTorch's CUDA caching allocator,
    `hardware_models.allocator`) or ``exact`` (its own bytes).
    """

    model: str
    count: int
    memory_bytes: float
    peak_flops: Mapping[str, float]
    hbm_bw: float
    gemm_efficiency: Curve
    launch_overhead_s: float
    reserved: Mapping[str, float]
    fragmentation: float
    optimizer_bytes_per_param: float
    op_overhead_s: float | None = None
    elementwise_bw: float | None = None
    elementwise_efficiency: float | None = None
    gemm_backward_efficiency: Curve | None = None
    attention_efficiency: Curve | None = None
    attention_backward_efficiency: Curve | None = None
    shares_host: bool = False
    allocator: str = "caching"
    gemm_unaligned_efficiency: float | None = None
    dispatch_overlap: bool = False
    gemm_op_overhead_s: float | None = None
    task_overhead_s: float | None = None

    def __post_init__(self) -> None:
        check_text(self.model, "gpu.model")
        if self.allocator not in ALLOCATORS:
            raise HardwareInputError(f"must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}",
                                     field="gpu.allocator")
        if self.op_overhead_s is not None:
            check_non_negative(self.op_overhead_s, "gpu.op_overhead", "a time", fmt_time)
        for attr, name in (("gemm_op_overhead_s", "gemm_op_overhead"), ("task_overhead_s", "task_overhead")):
            if getattr(self, attr) is not None:
                check_non_negative(getattr(self, attr), f"gpu.{name}", "a time", fmt_time)
        if self.elementwise_bw is not None:
            check_positive(self.elementwise_bw, "gpu.elementwise_bw", "a bandwidth", fmt_bandwidth)
        if self.elementwise_efficiency is not None:
            check_fraction(self.elementwise_efficiency, "gpu.elementwise_efficiency", low_inclusive=False,
                           high_inclusive=True)
        for attr in ("gemm_backward_efficiency", "attention_efficiency", "attention_backward_efficiency"):
            if getattr(self, attr) is not None and not isinstance(getattr(self, attr), Curve):
                raise HardwareInputError(f"must be a Curve, got {getattr(self, attr)!r}", field=f"gpu.{attr}")
        if not isinstance(self.shares_host, bool):
            raise HardwareInputError(f"must be true or false, got {self.shares_host!r}", field="gpu.shares_host")
        if not isinstance(self.dispatch_overlap, bool):
            raise HardwareInputError(f"must be true or false, got {self.dispatch_overlap!r}",
                                     field="gpu.dispatch_overlap")
        if self.gemm_unaligned_efficiency is not None:
            check_fraction(self.gemm_unaligned_efficiency, "gpu.gemm_unaligned_efficiency", low_inclusive=False,
                           high_inclusive=True)
        check_int(self.count, "gpu.count")
        _size(self.memory_bytes, "gpu.memory")
        peaks = check_mapping(self.peak_flops, "gpu.peak_flops", _flops, keys=DTYPES)
        if not peaks:
            raise HardwareInputError(f"needs at least one of {', '.join(DTYPES)}", field="gpu.peak_flops")
        object.__setattr__(self, "peak_flops", peaks)
        check_positive(self.hbm_bw, "gpu.hbm_bw", "a bandwidth", fmt_bandwidth)
        if not isinstance(self.gemm_efficiency, Curve):
            raise HardwareInputError(
                f"must be a Curve, got {self.gemm_efficiency!r}", field="gpu.gemm_efficiency"
            )
        check_non_negative(self.launch_overhead_s, "gpu.launch_overhead", "a time", fmt_time)
        reserved = check_mapping(self.reserved, "gpu.reserved", _size)
        object.__setattr__(self, "reserved", reserved)
        check_fraction(self.fragmentation, "gpu.fragmentation", low_inclusive=True, high_inclusive=False)
        check_positive(self.optimizer_bytes_per_param, "gpu.optimizer_bytes_per_param")
        if self.memory_bytes > 0 and sum(reserved.values()) >= self.memory_bytes:
            raise HardwareInputError(
                f"reserved total {fmt_bytes(sum(reserved.values()))} leaves nothing of "
                f"gpu.memory {fmt_bytes(self.memory_bytes)}; lower the reserved sizes",
                field="gpu.reserved",
            )


@dataclass(frozen=True)
class HostSpec:
    """The CPU side: sockets, cores, DRAM and the CPU Adam rate (whole host, DeepSpeedCPUAdam)."""

    cpu_model: str
    sockets: int
    cores: int
    dram_bytes: float
    dram_bw: float
    optimizer_params_per_s: float
    reserved: Mapping[str, float]

    def __post_init__(self) -> None:
        check_text(self.cpu_model, "host.cpu_model")
        check_int(self.sockets, "host.sockets")
        check_int(self.cores, "host.cores", minimum=self.sockets)
        check_positive(self.dram_bytes, "host.dram", "a size", fmt_bytes)
        check_positive(self.dram_bw, "host.dram_bw", "a bandwidth", fmt_bandwidth)
        check_positive(self.optimizer_params_per_s, "host.optimizer_params_per_s", "a rate")
        reserved = check_mapping(self.reserved, "host.reserved", _size)
        object.__setattr__(self, "reserved", reserved)
        if sum(reserved.values()) >= self.dram_bytes:
            raise HardwareInputError(
                f"reserved total {fmt_bytes(sum(reserved.values()))} leaves nothing of "
                f"host.dram {fmt_bytes(self.dram_bytes)}; lower the reserved sizes",
                field="host.reserved",
            )


@dataclass(frozen=True)
class PcieSpec:
    """The GPU <-> host PCIe links, all alike.

    `efficiency` = achieved / theoretical bandwidth of one direction; `duplex_fraction` = (H2D + D2H
    achieved together) / (2 x one direction achieved), in [0.5, 1]. `gpus_per_switch` GPUs share one
    x16 switch uplink to the CPU (1 = each GPU on its own root port). `p2p` = whether GPUs may copy
    to each other directly over PCIe (False: GPU<->GPU copies bounce through host DRAM).
    """

    gen: int
    lanes: int
    efficiency: float
    duplex_fraction: float
    gpus_per_switch: int
    latency_s: float
    p2p: bool = True

    def __post_init__(self) -> None:
        check_int(self.gen, "pcie.gen", allowed=tuple(PCIE_X16_PER_DIRECTION))
        check_int(self.lanes, "pcie.lanes", allowed=_LANES)
        check_fraction(self.efficiency, "pcie.efficiency")
        check_fraction(self.duplex_fraction, "pcie.duplex_fraction", low=0.5, low_inclusive=True)
        check_int(self.gpus_per_switch, "pcie.gpus_per_switch")
        check_non_negative(self.latency_s, "pcie.latency", "a time", fmt_time)
        if not isinstance(self.p2p, bool):
            raise HardwareInputError(f"must be true or false, got {self.p2p!r}", field="pcie.p2p")

    @property
    def per_direction_bw(self) -> float:
        """Achievable bytes/s one way on a GPU's link: x16 theoretical(gen) * lanes/16 * efficiency."""
        return PCIE_X16_PER_DIRECTION[self.gen] * self.lanes / 16 * self.efficiency

    @property
    def uplink_bw(self) -> float:
        """Achievable bytes/s one way on a switch's x16 uplink to the CPU."""
        return PCIE_X16_PER_DIRECTION[self.gen] * self.efficiency

    @property
    def duplex_bw(self) -> float:
        """Cap on both directions together of a GPU's link: 2 * per_direction_bw * duplex_fraction."""
        return 2 * self.per_direction_bw * self.duplex_fraction


@dataclass(frozen=True)
class NvlinkSpec:
    """Each GPU's NVLink to the NVSwitch fabric: bytes/s per direction, full duplex.

    ``reduce_scatter_bytes`` / ``all_gather_bytes``: what a reduce-scatter / all-gather moves over this fabric
    per rank, as a multiple of a ring's ``(n-1)/n`` of the tensor (default 1: NCCL's rings). A fabric whose
    library runs them otherwise says so here: torch.distributed's gloo on one host (``calibrate --ranks``)
    measured a reduce-scatter at 1.5x and an all-gather at about 1x the time of an all-reduce of the same
    tensor on two ranks, i.e. 3.0-4.0x and 1.9-2.9x a ring's bytes (``replay.calibrate_ranks``, docs/calib.md)."""

    per_direction_bw: float
    latency_s: float
    reduce_scatter_bytes: float | None = None  # None: a ring's (1)
    all_gather_bytes: float | None = None

    def __post_init__(self) -> None:
        check_positive(self.per_direction_bw, "nvlink.per_direction_bw", "a bandwidth", fmt_bandwidth)
        check_non_negative(self.latency_s, "nvlink.latency", "a time", fmt_time)
        for key in ("reduce_scatter_bytes", "all_gather_bytes"):
            if getattr(self, key) is not None:
                check_positive(getattr(self, key), f"nvlink.{key}", "a multiple of a ring's bytes",
                               lambda x: f"{x:g}")

    def collective_bytes(self) -> dict[str, float]:
        """Collective kind -> its bytes as a multiple of a ring's, where given."""
        out = {"reduce_scatter": self.reduce_scatter_bytes, "all_gather": self.all_gather_bytes}
        return {k: float(v) for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class C2CSpec:
    """NVLink-C2C between the CPU and the GPU die (GB10, GH200)."""

    per_direction_bw: float
    latency_s: float

    def __post_init__(self) -> None:
        check_positive(self.per_direction_bw, "c2c.per_direction_bw", "a bandwidth", fmt_bandwidth)
        check_non_negative(self.latency_s, "c2c.latency", "a time", fmt_time)


@dataclass(frozen=True)
class NvmeSpec:
    """Identical NVMe drives; with count > 1 they form one RAID0 set."""

    count: int
    capacity_bytes_each: float
    read_bw_each: float
    write_bw_each: float
    raid_read_efficiency: float
    raid_write_efficiency: float
    pcie_gen: int
    latency_s: float

    def __post_init__(self) -> None:
        check_int(self.count, "nvme.count")
        check_positive(self.capacity_bytes_each, "nvme.capacity_each", "a size", fmt_bytes)
        check_positive(self.read_bw_each, "nvme.read_bw_each", "a bandwidth", fmt_bandwidth)
        check_positive(self.write_bw_each, "nvme.write_bw_each", "a bandwidth", fmt_bandwidth)
        check_fraction(self.raid_read_efficiency, "nvme.raid_read_efficiency")
        check_fraction(self.raid_write_efficiency, "nvme.raid_write_efficiency")
        check_int(self.pcie_gen, "nvme.pcie_gen", allowed=tuple(PCIE_X16_PER_DIRECTION))
        check_non_negative(self.latency_s, "nvme.latency", "a time", fmt_time)

    @property
    def capacity_bytes(self) -> float:
        """RAID0 capacity: the sum of the drives."""
        return self.count * self.capacity_bytes_each

    @property
    def read_bw(self) -> float:
        """Aggregate sequential read bytes/s: count * each * raid_read_efficiency (one drive: each)."""
        if self.count == 1:
            return self.read_bw_each
        return self.count * self.read_bw_each * self.raid_read_efficiency

    @property
    def write_bw(self) -> float:
        """Aggregate sequential write bytes/s: count * each * raid_write_efficiency (one drive: each)."""
        if self.count == 1:
            return self.write_bw_each
        return self.count * self.write_bw_each * self.raid_write_efficiency


@dataclass(frozen=True)
class NetworkSpec:
    """The inter-node network of ONE node: its `nics` NICs for the compute fabric, each `nic_bw` bytes/s per
    direction (the data rate: HDR InfiniBand 200 Gb/s = 25 GB/s), of which `efficiency` is achieved by
    NCCL, and the one-way latency of a message between two nodes (`latency_s`, NIC to NIC through the
    fabric). The fabric itself is taken as non-blocking (a rail-optimised fat tree, as in NVIDIA's DGX
    SuperPOD): only the NICs limit inter-node traffic. Used only when the machine has more than one node.
    """

    nics: int
    nic_bw: float
    efficiency: float
    latency_s: float

    def __post_init__(self) -> None:
        check_int(self.nics, "network.nics")
        check_positive(self.nic_bw, "network.nic_bw", "a bandwidth", fmt_bandwidth)
        check_fraction(self.efficiency, "network.efficiency")
        check_non_negative(self.latency_s, "network.latency", "a time", fmt_time)

    @property
    def per_direction_bw(self) -> float:
        """Achievable bytes/s one way on one NIC: nic_bw x efficiency."""
        return self.nic_bw * self.efficiency

    @property
    def node_bw(self) -> float:
        """Achievable bytes/s one way out of (or into) one node: nics x per NIC."""
        return self.nics * self.per_direction_bw


_SECTION_TYPES: Final[Mapping[str, type]] = FrozenDict(
    {
        "gpu": GpuSpec,
        "host": HostSpec,
        "pcie": PcieSpec,
        "nvlink": NvlinkSpec,
        "c2c": C2CSpec,
        "nvme": NvmeSpec,
        "network": NetworkSpec,
    }
)
_OPTIONAL: Final = ("nvlink", "c2c", "nvme", "network")


@dataclass(frozen=True, eq=False)
class HardwareSpec:
    """One machine, or `nodes` identical machines joined by their `network`. `sources` maps dotted YAML
    paths (``gpu.memory``, ``gpu.reserved.os``) to citations.

    With `unified_memory` (DGX Spark) the GPU and the CPU allocate from one pool, `host.dram_bytes`;
    `gpu.memory_bytes` must then be 0 and there must be exactly one GPU.

    Nodes: `gpu.count` is every GPU of the machine, `nodes` x the GPUs of one node (the YAML's ``gpu.count``
    is per node and the loader multiplies it); `host`, `pcie`, `nvme` and `network` describe ONE node.
    GPUs are numbered node by node (node k holds ``gpu{k*g} .. gpu{k*g+g-1}``), so a one-node machine is
    exactly the machine it always was. Its network is then unused (no route crosses it): it is left out of
    `to_dict` and of equality, so a one-node plan stays byte-identical to one made before networks existed
    and loads back equal.
    """

    name: str
    description: str
    gpu: GpuSpec
    host: HostSpec
    pcie: PcieSpec
    nvlink: NvlinkSpec | None
    c2c: C2CSpec | None
    nvme: NvmeSpec | None
    unified_memory: bool
    sources: Mapping[str, str] = field(default_factory=FrozenDict)
    network: NetworkSpec | None = None
    nodes: int = 1

    def __post_init__(self) -> None:
        check_text(self.name, "name")
        if not isinstance(self.description, str):
            raise HardwareInputError(f"must be a text, got {self.description!r}", field="description")
        for section, cls in _SECTION_TYPES.items():
            value = getattr(self, section)
            if value is None and section in _OPTIONAL:
                continue
            if not isinstance(value, cls):
                raise HardwareInputError(f"must be a {cls.__name__}, got {value!r}", field=section)
        if not isinstance(self.unified_memory, bool):
            raise HardwareInputError(
                f"must be true or false, got {self.unified_memory!r}", field="unified_memory"
            )
        self._check_nodes()
        if self.unified_memory:
            self._check_unified()
        elif self.gpu.memory_bytes <= 0:
            raise HardwareInputError(
                f"must be a positive size (> 0), got {fmt_bytes(self.gpu.memory_bytes)}", field="gpu.memory"
            )
        object.__setattr__(self, "sources", self._checked_sources())

    def _check_nodes(self) -> None:
        check_int(self.nodes, "nodes")
        if self.nodes == 1:
            return
        if self.unified_memory:
            raise HardwareInputError(
                f"a unified-memory machine is modelled as one node, got {self.nodes}; use nodes 1", field="nodes"
            )
        if self.network is None:
            raise HardwareInputError(
                f"{self.nodes} nodes need an inter-node network; describe a 'network' section "
                "(nics, nic_bw, efficiency, latency) or use nodes 1",
                field="network",
            )
        if self.gpu.count % self.nodes:
            raise HardwareInputError(
                f"{self.gpu.count} GPUs do not split evenly over {self.nodes} nodes", field="gpu.count"
            )

    @property
    def gpus_per_node(self) -> int:
        """GPUs of one node (`gpu.count` / `nodes`)."""
        return self.gpu.count // self.nodes

    def _key(self) -> tuple[object, ...]:
        """What equality and the hash compare: every field, less a one-node machine's unused network."""
        if self.nodes > 1:
            return (self.name, self.description, self.gpu, self.host, self.pcie, self.nvlink, self.c2c, self.nvme,
                    self.unified_memory, self.sources, self.network, self.nodes)
        sources = {k: v for k, v in self.sources.items() if not k.startswith("network.")}
        return (self.name, self.description, self.gpu, self.host, self.pcie, self.nvlink, self.c2c, self.nvme,
                self.unified_memory, FrozenDict(sources), None, 1)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HardwareSpec):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _check_unified(self) -> None:
        if self.gpu.count != 1:
            raise HardwareInputError(
                f"a unified-memory machine is modelled with one GPU, got {self.gpu.count}", field="gpu.count"
            )
        if self.gpu.memory_bytes != 0:
            raise HardwareInputError(
                "must be 0 on a unified-memory machine (the GPU allocates from host.dram), got "
                f"{fmt_bytes(self.gpu.memory_bytes)}",
                field="gpu.memory",
            )
        reserved = sum(self.gpu.reserved.values()) + sum(self.host.reserved.values())
        if reserved >= self.host.dram_bytes:
            raise HardwareInputError(
                f"gpu.reserved + host.reserved ({fmt_bytes(reserved)}) leave nothing of the unified "
                f"host.dram ({fmt_bytes(self.host.dram_bytes)}); lower the reserved sizes",
                field="host.reserved",
            )

    def _checked_sources(self) -> FrozenDict[str, str]:
        if not isinstance(self.sources, Mapping):
            raise HardwareInputError(
                f"must be a mapping of field path: citation, got {self.sources!r}", field="sources"
            )
        known = self.field_paths()
        for path, citation in self.sources.items():
            if not isinstance(path, str) or path not in known:
                raise HardwareInputError(
                    f"cites {path!r}, which is not a field of this machine{closest(str(path), known)}",
                    field="sources",
                )
            if not isinstance(citation, str) or not citation.strip():
                raise HardwareInputError(
                    f"citation must be a non-empty text, got {citation!r}", field=f"sources.{path}"
                )
        return FrozenDict(self.sources)

    # ------------------------------------------------------------------ queries

    def peak_flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s of one GPU for `dtype`; a clear error when the GPU lists none."""
        if dtype in self.gpu.peak_flops:
            return self.gpu.peak_flops[dtype]
        has = ", ".join(self.gpu.peak_flops)
        raise HardwareInputError(
            f"hardware '{self.name}' ({self.gpu.model}) lists no peak for dtype '{dtype}' (has: {has}); "
            f"use one of those or add gpu.peak_flops.{dtype}",
            field=f"gpu.peak_flops.{dtype}",
        )

    def field_paths(self, numeric_only: bool = False) -> tuple[str, ...]:
        """Dotted paths of every leaf field present (map entries count as leaves, curves as one)."""
        paths: list[str] = [] if numeric_only else ["name", "description", "unified_memory", "nodes"]
        for section, defs in SECTIONS.items():
            obj = getattr(self, section)
            if obj is None:
                continue
            for fd in defs:
                if numeric_only and fd.kind not in NUMERIC_KINDS or getattr(obj, fd.attr) is None:  # absent
                    continue
                if fd.kind.endswith("_map"):
                    paths.extend(f"{section}.{fd.key}.{k}" for k in getattr(obj, fd.attr))
                else:
                    paths.append(f"{section}.{fd.key}")
        return tuple(paths)

    def missing_sources(self) -> tuple[str, ...]:
        """Numeric fields without a citation in `sources` (empty for every shipped preset)."""
        return tuple(p for p in self.field_paths(numeric_only=True) if p not in self.sources)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict in the preset-file format (raw numbers in internal units); loads back equal."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "unified_memory": self.unified_memory,
        }
        if self.nodes > 1:
            out["nodes"] = self.nodes
        for section, defs in SECTIONS.items():
            obj = getattr(self, section)
            if obj is not None and (section != "network" or self.nodes > 1):
                out[section] = {fd.key: _plain(getattr(obj, fd.attr)) for fd in defs
                                if not (fd.omit_default and getattr(obj, fd.attr) == fd.default)}
        if self.nodes > 1:
            out["gpu"]["count"] = self.gpus_per_node  # the file's gpu.count is per node
        out["sources"] = {k: v for k, v in self.sources.items()
                          if self.nodes > 1 or not k.startswith("network.")}
        return out


def _plain(value: object) -> object:
    if isinstance(value, Curve):
        return [[x, y] for x, y in value.points]
    if isinstance(value, Mapping):
        return dict(value)
    return value
