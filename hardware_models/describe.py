"""`describe(spec)`: the human text behind ``tiersim hardware show NAME``.

Every figure is printed with its unit and its citation from `spec.sources`, followed by the derived
quantities (PCIe per direction, RAID aggregates) and the topology's pools and links.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hardware_models.schema import SECTIONS, fmt_value
from hardware_models.spec import PCIE_X16_PER_DIRECTION, HardwareSpec
from hardware_models.topology import Link, Pool, build_topology
from hardware_models.units import fmt_bandwidth, fmt_bytes, fmt_time

__all__ = ["describe"]

_GPU_INDEX = re.compile(r"\b(gpu|sw|n|nic)\d+")


def _row(label: str, value: str, source: str | None) -> str:
    return f"  {label:<30} {value:<26} [{source if source else 'no source given'}]"


def _fields(spec: HardwareSpec) -> list[str]:
    lines: list[str] = []
    for section, defs in SECTIONS.items():
        obj = getattr(spec, section)
        if obj is None:
            lines.append(f"{section}: none")
            continue
        lines.append(f"{section}:")
        for fd in defs:
            path, value = f"{section}.{fd.key}", getattr(obj, fd.attr)
            if fd.omit_default and value == fd.default:
                continue  # an optional field the description does not have
            if fd.kind.endswith("_map"):
                entry_kind = "flops" if fd.kind == "flops_map" else "bytes"
                for key, item in value.items():
                    lines.append(
                        _row(
                            f"{fd.key}.{key}", fmt_value(entry_kind, item), spec.sources.get(f"{path}.{key}")
                        )
                    )
                if not value:
                    lines.append(_row(fd.key, "(none)", spec.sources.get(path)))
            elif fd.kind == "curve":
                points = ", ".join(f"{x:.0e}: {y:.2f}" for x, y in value.points)
                lines.append(_row(fd.key, "FLOP/op -> fraction of peak", spec.sources.get(path)))
                lines.append(f"    {points}")
            else:
                text = fmt_value(fd.kind, value) + (f" {fd.unit}" if fd.unit else "")
                if path == "gpu.count" and spec.nodes > 1:
                    text = f"{spec.gpus_per_node} per node x {spec.nodes} = {value} GPUs"
                lines.append(_row(fd.key, text, spec.sources.get(path)))
    return lines


def _derived(spec: HardwareSpec) -> list[str]:
    pcie, lines = spec.pcie, ["derived:"]
    theo = PCIE_X16_PER_DIRECTION[pcie.gen]
    lines.append(
        _row(
            "pcie per direction",
            fmt_bandwidth(pcie.per_direction_bw),
            f"derived: {fmt_bandwidth(theo)} x {pcie.lanes}/16 lanes x {pcie.efficiency:g} (pcie_table)",
        )
    )
    lines.append(
        _row(
            "pcie both directions",
            fmt_bandwidth(pcie.duplex_bw),
            f"derived: 2 x per direction x duplex_fraction {pcie.duplex_fraction:g}",
        )
    )
    if pcie.gpus_per_switch > 1:
        lines.append(
            _row(
                "switch uplink per direction",
                fmt_bandwidth(pcie.uplink_bw),
                f"derived: x16 {fmt_bandwidth(theo)} x {pcie.efficiency:g}, shared by "
                f"{pcie.gpus_per_switch} GPUs",
            )
        )
    gpu = spec.gpu
    lines.append(
        _row(
            "gpu adam step rate",
            f"{gpu.hbm_bw / gpu.optimizer_bytes_per_param:.3g} params/s",
            "derived: hbm_bw / optimizer_bytes_per_param",
        )
    )
    if spec.nvme is not None:
        nvme = spec.nvme
        lines.append(_row("nvme capacity", fmt_bytes(nvme.capacity_bytes), f"derived: {nvme.count} x each"))
        lines.append(
            _row(
                "nvme read (aggregate)",
                fmt_bandwidth(nvme.read_bw),
                f"derived: {nvme.count} x each x {nvme.raid_read_efficiency:g}"
                if nvme.count > 1
                else "derived: one drive",
            )
        )
        lines.append(
            _row(
                "nvme write (aggregate)",
                fmt_bandwidth(nvme.write_bw),
                f"derived: {nvme.count} x each x {nvme.raid_write_efficiency:g}"
                if nvme.count > 1
                else "derived: one drive",
            )
        )
    lines += _network_lines(spec)
    return lines


def _network_lines(spec: HardwareSpec) -> list[str]:
    net = spec.network
    if net is None:
        return []
    lines = [
        _row("network per NIC, each way", fmt_bandwidth(net.per_direction_bw),
             f"derived: nic_bw x efficiency {net.efficiency:g}"),
        _row("network per node, each way", fmt_bandwidth(net.node_bw), f"derived: {net.nics} NICs x per NIC"),
    ]
    if spec.nodes == 1:
        lines.append(_row("nodes", "1 (the network is unused)", "use --nodes N for a cluster of N"))
    else:
        lines.append(_row("nodes", f"{spec.nodes} alike; host, PCIe, NVMe and network are per node",
                          spec.sources.get("nodes", "--nodes")))
    return lines


def _grouped(names: list[str], key: Callable[[str], tuple[object, ...]]) -> list[tuple[str, str]]:
    """(display name, representative) for runs of per-GPU items that are alike."""
    groups: dict[tuple[object, ...], list[str]] = {}
    for name in names:
        groups.setdefault((_GPU_INDEX.sub(lambda m: m.group(1) + "*", name), *key(name)), []).append(name)
    out: list[tuple[str, str]] = []
    for (pattern, *_), members in groups.items():
        shown = members[0] if len(members) == 1 else f"{pattern} (x{len(members)})"
        out.append((str(shown), members[0]))
    return out


def _pool_text(pool: Pool) -> str:
    reserved = sum(pool.reserved.values())
    return (
        f"{pool.kind:<8} physical {fmt_bytes(pool.physical_bytes)}, reserved {fmt_bytes(reserved)}, "
        f"usable {fmt_bytes(pool.capacity_bytes)} ({fmt_bytes(pool.capacity_bytes, binary=True)})"
    )


def _link_text(link: Link) -> str:
    duplex = "full duplex" if link.duplex_bw is None else f"both {fmt_bandwidth(link.duplex_bw)}"
    return (
        f"{link.kind:<7} fwd {fmt_bandwidth(link.bw_fwd)}, rev {fmt_bandwidth(link.bw_rev)}, "
        f"{duplex}, latency {fmt_time(link.latency_s)}"
    )


def describe(spec: HardwareSpec) -> str:
    """Multi-line text: every figure with unit and source, derived figures, pools and links."""
    lines = [f"{spec.name}: {spec.description}".rstrip(": ")]
    if spec.unified_memory:
        lines.append("unified memory: the GPU and the CPU allocate from one pool (host.dram)")
    lines += _fields(spec)
    lines += _derived(spec)
    topo = build_topology(spec)
    lines.append("pools (usable = physical - reserved, minus gpu.fragmentation on GPUs; NCCL comm_buffers only with "
                 f"more than one GPU; each GPU tensor is then charged the {spec.gpu.allocator} allocator's rounding):")
    if spec.nodes > 1:
        lines.append(f"  (cpu and nvme: the {spec.nodes} nodes' host DRAM and NVMe taken together; each GPU reaches "
                     "them over its own node's PCIe)")
    for shown, name in _grouped(list(topo.pools), lambda n: (_pool_text(topo.pools[n]),)):
        lines.append(f"  {shown:<22} {_pool_text(topo.pools[name])}")
    lines.append("links (forward = away from host DRAM):")
    for shown, name in _grouped(list(topo.links), lambda n: (_link_text(topo.links[n]),)):
        lines.append(f"  {shown:<22} {_link_text(topo.links[name])}")
    missing = spec.missing_sources()
    if missing:
        lines.append(f"fields without a source: {', '.join(missing)}")
    return "\n".join(lines)
