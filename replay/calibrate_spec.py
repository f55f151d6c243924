"""Turning a `Calibration` (replay.calibrate) into a hardware description the simulator loads.

Pure data: no torch, no I/O. The result is the preset-file structure (`HardwareSpec.to_dict()` format,
raw numbers in internal units) with a citation in ``sources`` for every figure: ``measured: tiersim
calibrate on HOST at DATE (method)`` for what was measured, ``derived: ...`` for what follows from
measurements, ``assumed: ...`` for what cannot be measured here, and ``from --base NAME: ...`` for a
field kept from a preset given with ``--base``.

PCIe: the spec expresses a link as x16 theoretical(gen) x lanes/16 x efficiency with efficiency in (0, 1],
so the measured per-direction rate r is written as lanes 16, the lowest gen whose theoretical x16 rate is
>= r, and efficiency = r / theoretical(gen); then `PcieSpec.per_direction_bw` equals r exactly (above
Gen6 x16 it is capped at Gen6, efficiency 1, and the sources say so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hardware_models import PCIE_X16_PER_DIRECTION
from hardware_models.gpu_arch import gpu_arch

if TYPE_CHECKING:
    from replay.calibrate import Calibration
    from replay.calibrate_ranks import RanksCalibration

__all__ = ["pcie_fields", "spec_dict", "with_ranks"]

_GIB = 2**30
_MIB = 2**20


def pcie_fields(rate: float) -> tuple[int, int, float, bool]:
    """(gen, lanes, efficiency, capped) such that x16 theoretical(gen) * efficiency == `rate`."""
    for gen in sorted(PCIE_X16_PER_DIRECTION):
        theo = PCIE_X16_PER_DIRECTION[gen]
        if theo >= rate:
            return gen, 16, min(1.0, rate / theo), False
    return max(PCIE_X16_PER_DIRECTION), 16, 1.0, True


def _get(d: Mapping[str, Any] | None, path: str) -> Any:
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _path_tag(cal: Calibration, dtype: str) -> str:
    """``, gemm16=PATH`` for a 16-bit dtype measured on PATH (``replay.precision.gemm16_path``): the tag
    ``replay.precision.spec_gemm16`` reads back from a spec's sources."""
    path = cal.gemm16.get(dtype)
    return f", gemm16={path}" if path else ""


def spec_dict(cal: Calibration, base: Mapping[str, Any] | None = None, base_name: str | None = None,
              ranks: RanksCalibration | None = None) -> dict[str, Any]:
    """The hardware description of the calibrated machine (loads with `spec_from_dict`).

    `base`: a preset's `to_dict()` whose unmeasured fields (fragmentation, RAID efficiencies, NVLink,
    latencies that cannot be measured here, ...) are kept instead of the assumptions.
    `ranks` (``calibrate --ranks N`` on a CPU-only machine): N "GPUs", each rank's peaks at the share of its
    solo rate it measured while every rank computed, the gloo all-reduce rate and latency as the GPU <-> GPU
    link (``nvlink``: the fabric the simulator prices collectives over), and the ranks' copies behind one
    shared uplink (``pcie.gpus_per_switch`` = N: their memcpys share the host's memory bus).
    """
    stamp = f"tiersim calibrate on {cal.host} at {cal.date}"
    sources: dict[str, str] = {}

    def measured(path: str, how: str) -> None:
        sources[path] = f"measured: {stamp} ({how})"

    def kept(path: str, default: Any, why: str) -> Any:
        value = _get(base, path)
        if value is not None:
            cited = _get(base, "sources") or {}
            sources[path] = f"from --base {base_name}: {cited.get(path, 'uncited in the preset')}"
            return value
        sources[path] = f"assumed: {stamp}: {why}"
        return default

    cpu_only = cal.device == "cpu"
    reps = "median of repeats"

    # ---------------------------------------------------------------- gpu
    dtype = cal.gemm_dtype
    kind_points = [*cal.gemm_backward_curve, *cal.attention_curve, *cal.attention_backward_curve]
    peak = max([cal.peak_flops[dtype], *(rate for _, rate in kind_points)])
    scale = peak / cal.peak_flops[dtype]  # > 1 where a kernel kind beats the best forward linear layer
    curve = _fractions(cal.gemm_curve, peak)
    gpu: dict[str, Any] = {
        "model": cal.gpu_model,
        "count": cal.gpu_count,
        "memory": float(cal.gpu_memory),
        "peak_flops": {k: float(v * scale) for k, v in cal.peak_flops.items()},
        "hbm_bw": float(cal.hbm_bw),
        "gemm_efficiency": curve,
        "launch_overhead": float(cal.launch_overhead_s),
    }
    measured("gpu.model", "torch.cuda.get_device_properties" if not cpu_only
             else "no CUDA device: the runner's gpu0 is the CPU")
    measured("gpu.count", "torch.cuda.device_count()" if not cpu_only else "no CUDA device: one CPU 'GPU'")
    if cpu_only:
        sources["gpu.memory"] = (f"assumed: {stamp}: no GPU, the gpu0 pool is host memory; a budget of a quarter "
                                 "of host DRAM (change with --set gpu.memory=SIZE)")
    else:
        measured("gpu.memory", cal.gpu_memory_method)
    for k in cal.peak_flops:
        measured(f"gpu.peak_flops.{k}", f"best {k} linear-layer rate on {cal.device} as the runner computes it "
                                        f"(replay.precision.linear of fp32 operands under {k} autocast"
                                        f"{_path_tag(cal, k)}) over "
                                        f"square sizes, reached at "
                                        f"{cal.peak_at.get(k, 0):.2e} FLOP/op, {reps}; used as the peak"
                                        + ("" if scale == 1 else
                                           f"; x {scale:.3f}: the fastest {dtype} kernel kind measured "
                                           f"(backward products or attention) ran that much faster than the best "
                                           f"{dtype} forward linear layer, so every peak is scaled by it and every "
                                           f"curve is a fraction of it (a forward GEMM's rate is unchanged)"))
    measured("gpu.hbm_bw", f"{cal.hbm_method}, {reps}")
    measured("gpu.gemm_efficiency", f"{dtype} linear-layer FLOP/s as the runner computes it (replay.precision) "
                                    f"over square sizes {curve[0][0]:.0e}..{curve[-1][0]:.0e} FLOP/op, {reps}, "
                                    f"as a fraction of the measured {dtype} peak; the curve, gpu.op_overhead and "
                                    f"gpu.elementwise_bw are {dtype}'s (calibrate --precision {dtype}): plans "
                                    f"in another precision are priced on this curve at their own peak")
    measured("gpu.launch_overhead", f"median time of a synchronised 8x8 torch.mm on {cal.device}")
    for key, pts, how in (
            ("gemm_backward_efficiency", cal.gemm_backward_curve,
             f"{dtype} linear-layer backward as the runner computes it (replay.precision.linear_backward_rate_op: "
             f"forward + input- and weight-gradient products, minus the forward) over square sizes, FLOP/s per "
             f"product, {reps}"),
            ("attention_efficiency", cal.attention_curve, f"forward: {cal.attention_method}"),
            ("attention_backward_efficiency", cal.attention_backward_curve, f"backward: {cal.attention_method}")):
        if pts:
            gpu[key] = _fractions(pts, peak)
            measured(f"gpu.{key}", f"{how}; as a fraction of gpu.peak_flops.{dtype}")
    if cal.gemm_unaligned is not None:
        gpu["gemm_unaligned_efficiency"] = float(cal.gemm_unaligned)
        measured("gpu.gemm_unaligned_efficiency", cal.gemm_unaligned_method)
    if cal.op_overhead_s is not None:
        gpu["op_overhead"] = float(cal.op_overhead_s)
        measured("gpu.op_overhead", cal.op_overhead_method)
    for key, value in (("gemm_op_overhead", cal.gemm_op_overhead_s), ("task_overhead", cal.task_overhead_s)):
        if value is not None:
            gpu[key] = float(value)
            measured(f"gpu.{key}", cal.op_overhead_method)
    if cal.dispatch_overlap:
        gpu["dispatch_overlap"] = True
        sources["gpu.dispatch_overlap"] = (f"derived: {stamp}: a CUDA device, whose kernels are launched "
                                           "asynchronously (the runner synchronises once per task), so a task's "
                                           "operator dispatch overlaps its kernels")
    if cal.elementwise_bw is not None:
        gpu["elementwise_bw"] = float(cal.elementwise_bw)
        measured("gpu.elementwise_bw", cal.elementwise_method)
    if cpu_only:
        gpu["shares_host"] = True
        sources["gpu.shares_host"] = (f"measured: {stamp}: no CUDA device, the runner's gpu0 computes on the "
                                      "host's cores, shared with the CPU optimizer and host copies")
    if cpu_only:
        gpu["reserved"] = {"cuda_context": 0.0}
        sources["gpu.reserved.cuda_context"] = f"assumed: {stamp}: no CUDA context on a CPU-only machine"
    else:
        reserved = _get(base, "gpu.reserved")
        if isinstance(reserved, Mapping) and reserved:
            gpu["reserved"] = {k: kept(f"gpu.reserved.{k}", v, "") for k, v in reserved.items()}
        else:
            gpu["reserved"] = _reserved_by_arch(cal, stamp, sources)
    gpu["fragmentation"] = kept("gpu.fragmentation", 0.0,
                                "0: the caching allocator's rounding is charged per allocation instead "
                                "(gpu.allocator caching; pt_caching_allocator in "
                                "hardware_models/reference/hardware_specs.yaml)")
    gpu["optimizer_bytes_per_param"] = cal.hbm_bw / cal.gpu_optimizer_params_per_s
    sources["gpu.optimizer_bytes_per_param"] = (
        f"derived: measured gpu.hbm_bw / measured torch.optim.Adam rate on {cal.device} "
        f"({cal.gpu_optimizer_params_per_s:.3g} params/s), so a simulated device optimizer step takes the "
        f"measured time ({stamp})")

    # ---------------------------------------------------------------- host
    dram = float(cal.dram)
    host: dict[str, Any] = {
        "cpu_model": cal.cpu_model,
        "sockets": 1,
        "cores": int(cal.cores),
        "dram": dram,
        "dram_bw": float(cal.dram_bw),
        "optimizer_params_per_s": float(cal.optimizer_params_per_s),
        "reserved": {"os": min(16 * _GIB, 0.1 * dram), "framework": min(4 * _GIB, 0.05 * dram)},
    }
    measured("host.cpu_model", "/proc/cpuinfo model name")
    sources["host.sockets"] = f"assumed: {stamp}: counted as one socket (all cores in one pool)"
    measured("host.cores", "os.cpu_count(), logical cores")
    measured("host.dram", "os.sysconf(SC_PAGE_SIZE x SC_PHYS_PAGES) or /proc/meminfo MemTotal")
    measured("host.dram_bw", "host memcpy (tensor copy_), read + write bytes counted (2 x bytes copied / s), "
                             + reps)
    measured("host.optimizer_params_per_s", f"torch.optim.Adam ({cal.optimizer_variant}) step over fp32 params "
                                            f"on the CPU, {reps}")
    sources["host.reserved.os"] = f"assumed: {stamp}: 10% of DRAM (at most 16 GiB) for the OS and page cache"
    sources["host.reserved.framework"] = f"assumed: {stamp}: 5% of DRAM (at most 4 GiB) for Python and torch"

    # ---------------------------------------------------------------- pcie
    rate = (cal.h2d_bw + cal.d2h_bw) / 2
    gen, lanes, eff, capped = pcie_fields(rate)
    theo = PCIE_X16_PER_DIRECTION[gen]
    how = (f"{cal.copy_method}; H2D {cal.h2d_bw / 1e9:.3g} GB/s, D2H {cal.d2h_bw / 1e9:.3g} GB/s, mean "
           f"{rate / 1e9:.3g} GB/s one way, {reps}")
    expressed = (f"expressed as gen {gen} x{lanes} ({theo / 1e9:g} GB/s theoretical) x efficiency {eff:.4f} "
                 + ("= the measured rate" if not capped else "(capped: the measured rate exceeds Gen6 x16)"))
    duplex = max(0.5, min(1.0, cal.duplex_bw / (2 * rate)))
    pcie: dict[str, Any] = {
        "gen": gen,
        "lanes": lanes,
        "efficiency": eff,
        "duplex_fraction": duplex,
        "gpus_per_switch": kept("pcie.gpus_per_switch", 1, "each GPU on its own root port"),
        "latency": float(cal.copy_latency_s),
        "p2p": kept("pcie.p2p", True, "irrelevant with one GPU"),
    }
    measured("pcie.gen", f"{how}; {expressed}")
    measured("pcie.lanes", f"{how}; {expressed}")
    measured("pcie.efficiency", f"{how}; {expressed}")
    measured("pcie.duplex_fraction", f"both directions at once: {cal.duplex_bw / 1e9:.3g} GB/s total / (2 x "
                                     f"{rate / 1e9:.3g} GB/s), clamped to [0.5, 1]")
    measured("pcie.latency", "median time of a synchronised 64-byte copy between the pools")

    # ---------------------------------------------------------------- nvme
    d = cal.disk
    disk_how = (f"a {d.file_bytes / 2**20:.0f} MiB file of tensors in {d.directory} ({d.fs_type}) as the runner "
                "moves them to and from nvme (replay.nvme_files: through a reused page-aligned staging buffer), "
                + ("O_DIRECT" if d.method == "O_DIRECT"
                   else "write + fsync, then read after posix_fadvise(POSIX_FADV_DONTNEED) (no O_DIRECT there)")
                + ", median of 3 passes after a first")
    nvme: dict[str, Any] = {
        "count": 1,
        "capacity_each": float(d.capacity_free),
        "read_bw_each": float(d.read_bw),
        "write_bw_each": float(d.write_bw),
        "raid_read_efficiency": kept("nvme.raid_read_efficiency", 0.9, "unused with one drive"),
        "raid_write_efficiency": kept("nvme.raid_write_efficiency", 0.75, "unused with one drive"),
        "pcie_gen": kept("nvme.pcie_gen", 4, "not measured (the disk may not be an NVMe drive)"),
        "latency": kept("nvme.latency", 100e-6, "~100 us per request, not measured"),
    }
    sources["nvme.count"] = f"measured: {stamp} (one directory measured, counted as one drive)"
    measured("nvme.capacity_each", f"free space of the filesystem of {d.directory} (shutil.disk_usage)")
    measured("nvme.read_bw_each", disk_how)
    measured("nvme.write_bw_each", disk_how + ("" if d.method == "O_DIRECT" else "; write time includes the fsync"))

    out: dict[str, Any] = {
        "name": "calibrated-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", cal.host).strip("-") or "host"),
        "description": (f"measured by tiersim calibrate on {cal.host} at {cal.date}: {cal.gpu_model}, "
                        f"{cal.cores} cores, {dram / 2**30:.1f} GiB DRAM; disk {d.directory} ({d.method}); "
                        f"per-operator figures measured in {dtype}"
                        + ("; CPU-only: the gpu0 pool is a budget of host memory" if cpu_only else "")),
        "unified_memory": False,
        "gpu": gpu,
        "host": host,
        "pcie": pcie,
        "nvme": nvme,
    }
    nvlink = _get(base, "nvlink")
    if isinstance(nvlink, Mapping) and cal.gpu_count > 1:
        out["nvlink"] = dict(nvlink)
        for key in nvlink:
            kept(f"nvlink.{key}", nvlink[key], "")
    if ranks is not None and cpu_only:
        _apply_ranks(out, sources, ranks, stamp, dram)
    out["sources"] = sources
    return out


def with_ranks(data: Mapping[str, Any], ranks: RanksCalibration, stamp: str) -> dict[str, Any]:
    """A CPU-only spec (``spec_dict``'s structure, e.g. a ``HardwareSpec.to_dict()``) with what ``ranks.ranks``
    ranks share measured by ``ranks`` (as ``spec_dict(..., ranks=...)`` writes it): the 1-rank calibration
    reused, not measured again."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    out["gpu"] = {**out["gpu"], "peak_flops": dict(out["gpu"]["peak_flops"])}
    out["pcie"] = dict(out["pcie"])
    sources = dict(out.get("sources") or {})
    _apply_ranks(out, sources, ranks, stamp, float(out["host"]["dram"]))
    out["sources"] = sources
    return out


def _fractions(points: list[tuple[float, float]], peak: float) -> list[list[float]]:
    """A curve of measured (FLOPs, FLOP/s) points as [FLOPs, fraction of `peak`] (clamped to (0, 1], 4 digits),
    one point per size, ascending."""
    curve: list[list[float]] = []
    for flops, rate in sorted(points):
        if curve and flops <= curve[-1][0]:
            continue
        curve.append([float(flops), max(1e-6, min(1.0, float(f"{rate / peak:.4g}")))])
    return curve


def _apply_ranks(out: dict[str, Any], sources: dict[str, str], rc: RanksCalibration, stamp: str,
                 dram: float) -> None:
    """Write what ``rc.ranks`` ranks share into the CPU-only spec `out` (see :func:`spec_dict`)."""
    n = rc.ranks
    gpu, pcie = out["gpu"], out["pcie"]
    how = f"measured: {stamp} ({rc.method}"
    gpu["count"] = n
    sources["gpu.count"] = f"{how}): one CPU 'GPU' per rank"
    gpu["memory"] = dram / (2 * n)
    sources["gpu.memory"] = (f"assumed: {stamp}: no GPU, each rank's gpu pool is host memory; a budget of "
                             f"1/{2 * n} of host DRAM per rank (change with --set gpu.memory=SIZE)")
    share = rc.compute_share
    for k, v in list(gpu["peak_flops"].items()):
        gpu["peak_flops"][k] = v * share
        sources[f"gpu.peak_flops.{k}"] = (
            f"derived: {sources.get(f'gpu.peak_flops.{k}', k)}; x {share:.3f}, the share of its solo rate one rank "
            f"computed at while all {n} ranks computed ({rc.precision} linear layer as the runner computes it: "
            f"{rc.gemm_shared / 1e9:.3g} vs {rc.gemm_alone / 1e9:.3g} GFLOP/s; {how}))")
    mem = rc.memory_share
    for key in ("hbm_bw", "elementwise_bw"):
        if gpu.get(key):
            gpu[key] = float(gpu[key]) * mem
            sources[f"gpu.{key}"] = (
                f"derived: {sources.get(f'gpu.{key}', key)}; x {mem:.3f}, the share of its solo memory bandwidth one "
                f"rank gets while all {n} ranks stream memory (their host copies at once: "
                f"{rc.copy_shared_total / 1e9:.3g} GB/s in all, one alone {rc.copy_alone / 1e9:.3g} GB/s; {how}))")
    out["nvlink"] = {"per_direction_bw": float(rc.collective_bw), "latency": float(rc.collective_latency_s)}
    sources["nvlink.per_direction_bw"] = (
        f"{how}): torch.distributed gloo all_reduce of {rc.allreduce_bytes / 2**20:.0f} MiB {rc.precision} in "
        f"{rc.allreduce_s * 1e3:.2f} ms (median), a ring's 2 (n-1)/n x bytes per rank / (time - its latency); "
        f"the CPU-only ranks' collective fabric, written as the GPU <-> GPU link the simulator prices "
        f"collectives over")
    sources["nvlink.latency"] = (f"{how}): a 4-byte gloo all_reduce / its 2 (n-1) ring steps")
    for kind, seconds, factor in (("reduce_scatter", rc.reduce_scatter_s, rc.reduce_scatter_bytes),
                                  ("all_gather", rc.all_gather_s, rc.all_gather_bytes)):
        if seconds > 0:
            out["nvlink"][f"{kind}_bytes"] = float(factor)
            sources[f"nvlink.{kind}_bytes"] = (
                f"{how}): a gloo {kind} of the same {rc.allreduce_bytes / 2**20:.0f} MiB {rc.precision} in "
                f"{seconds * 1e3:.2f} ms (median) against the all_reduce's {rc.allreduce_s * 1e3:.2f} ms: "
                f"{factor:.2f}x the time a ring's (n-1)/n x bytes per rank take at the all_reduce's rate, priced as "
                f"that multiple of a ring's bytes")
    pcie["gpus_per_switch"] = n
    sources["pcie.gpus_per_switch"] = (
        f"{how}): the {n} ranks' gpu <-> cpu copies are host memcpys over one memory bus, written as one shared "
        f"uplink; all ranks copying at once moved {rc.copy_shared_total / 1e9:.3g} GB/s in all, one alone "
        f"{rc.copy_alone / 1e9:.3g} GB/s")


def _reserved_by_arch(cal: Calibration, stamp: str, sources: dict[str, str]) -> dict[str, float]:
    """The GPU memory a training process holds before its first tensor, as the presets reserve it (their
    cited figures, hardware_models/reference/hardware_specs.yaml): the CUDA context (lazy module loading),
    cuBLAS's workspace by architecture (pt_cublas_workspace: 8,320 KiB + 1 MiB cuBLASLt before sm90,
    32 MiB + 1 MiB on sm90+) and NCCL's buffers only where there is more than one GPU (nccl_buffsize)."""
    arch = gpu_arch(cal.gpu_model)
    hopper_on = arch is not None and arch.compute_capability >= 9.0
    out = {"cuda_context": 426 * _MIB, "cublas_workspace": (33.0 if hopper_on else 9.125) * _MIB,
           "comm_buffers": 0.5 * _GIB if cal.gpu_count > 1 else 0.0}
    sources["gpu.reserved.cuda_context"] = (f"assumed: {stamp}: 426 MiB, the presets' cited figure "
                                            "(unsloth_zoo_1053, pt_109888: CUDA >= 11.7 lazy module loading)")
    sources["gpu.reserved.cublas_workspace"] = (
        f"assumed: {stamp}: {'sm90+' if hopper_on else 'before sm90'} ({cal.gpu_model}: "
        f"{arch.sm if arch else 'architecture unknown, taken as before sm90'}), pt_cublas_workspace")
    sources["gpu.reserved.comm_buffers"] = (f"assumed: {stamp}: nccl_buffsize, ~0.5 GiB per rank with more "
                                            f"than one GPU ({cal.gpu_count} here)")
    return out
