"""The YAML format of a hardware description: sections, field names, value kinds.

One table drives the loader (parsing, unknown-field errors, overrides), `HardwareSpec.to_dict` and
`describe`, so the three cannot drift apart. YAML keys are the human names ("gpu.memory"); the
dataclass attributes carry the unit ("memory_bytes"). Error messages always use the YAML path.

A file looks like::

    name: a100x8
    description: "..."
    unified_memory: false
    gpu:    {model, count, memory, peak_flops: {bf16: ...}, hbm_bw, gemm_efficiency: [[flops, eff], ...],
             launch_overhead, reserved: {name: size}, fragmentation, optimizer_bytes_per_param,
             op_overhead, elementwise_bw, elementwise_efficiency, gemm_backward_efficiency,
             attention_efficiency, attention_backward_efficiency, shares_host, dispatch_overlap,
             gemm_op_overhead, task_overhead (optional: per-operator compute pricing, see GpuSpec),
             allocator (optional: caching | exact, default caching)}
    host:   {cpu_model, sockets, cores, dram, dram_bw, optimizer_params_per_s, reserved: {name: size}}
    pcie:   {gen, lanes, efficiency, duplex_fraction, gpus_per_switch, latency, p2p (optional, true)}
    nvlink: {per_direction_bw, latency, reduce_scatter_bytes, all_gather_bytes (optional, 1: a ring)}
    c2c:    {per_direction_bw, latency}                      # optional section
    nvme:   {count, capacity_each, read_bw_each, write_bw_each, raid_read_efficiency,
             raid_write_efficiency, pcie_gen, latency}       # optional section
    network: {nics, nic_bw, efficiency, latency}              # optional: the node's inter-node NICs
    nodes: 1                                                  # optional: identical nodes (default 1)
    sources: {"gpu.memory": "<citation>", ...}               # dotted path -> citation
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from hardware_models.frozen import FrozenDict
from hardware_models.units import (
    fmt_bandwidth,
    fmt_bytes,
    fmt_flops,
    fmt_time,
    parse_bandwidth,
    parse_bool,
    parse_bytes,
    parse_flops,
    parse_fraction,
    parse_int,
    parse_number,
    parse_time,
)

__all__ = [
    "DTYPES",
    "FieldDef",
    "Kind",
    "NUMERIC_KINDS",
    "OPTIONAL_SECTIONS",
    "SCALAR_PARSERS",
    "SECTIONS",
    "TOP_LEVEL",
    "closest",
    "field_def",
    "fmt_value",
]

Kind = Literal[
    "str", "bool", "int", "bytes", "bandwidth", "time", "flops", "fraction", "number",
    "curve", "bytes_map", "flops_map",
]  # fmt: skip

DTYPES: Final = ("bf16", "fp16", "fp32", "tf32", "fp8")


@dataclass(frozen=True)
class FieldDef:
    """One YAML field: its key, the dataclass attribute it fills, its kind and a unit for humans."""

    key: str
    attr: str
    kind: Kind
    unit: str = ""
    required: bool = True
    default: object = None
    omit_default: bool = False  # left out of to_dict / describe while it holds its default


SECTIONS: Final[Mapping[str, tuple[FieldDef, ...]]] = FrozenDict(
    {
        "gpu": (
            FieldDef("model", "model", "str"),
            FieldDef("count", "count", "int", "GPUs"),
            FieldDef("memory", "memory_bytes", "bytes"),
            FieldDef("peak_flops", "peak_flops", "flops_map"),
            FieldDef("hbm_bw", "hbm_bw", "bandwidth"),
            FieldDef("gemm_efficiency", "gemm_efficiency", "curve", "fraction of peak over FLOPs/op"),
            FieldDef("launch_overhead", "launch_overhead_s", "time"),
            FieldDef("reserved", "reserved", "bytes_map"),
            FieldDef("fragmentation", "fragmentation", "fraction"),
            FieldDef("optimizer_bytes_per_param", "optimizer_bytes_per_param", "number", "B/param"),
            FieldDef("op_overhead", "op_overhead_s", "time", "per operator", required=False, omit_default=True),
            FieldDef("elementwise_bw", "elementwise_bw", "bandwidth", required=False, omit_default=True),
            FieldDef("elementwise_efficiency", "elementwise_efficiency", "fraction",
                     "of hbm_bw, element-wise operators", required=False, omit_default=True),
            FieldDef("gemm_backward_efficiency", "gemm_backward_efficiency", "curve",
                     "fraction of peak over FLOPs/op", required=False, omit_default=True),
            FieldDef("attention_efficiency", "attention_efficiency", "curve", "fraction of peak over FLOPs/op",
                     required=False, omit_default=True),
            FieldDef("attention_backward_efficiency", "attention_backward_efficiency", "curve",
                     "fraction of peak over FLOPs/op", required=False, omit_default=True),
            FieldDef("shares_host", "shares_host", "bool", required=False, default=False, omit_default=True),
            FieldDef("allocator", "allocator", "str", required=False, default="caching", omit_default=True),
            FieldDef("gemm_unaligned_efficiency", "gemm_unaligned_efficiency", "fraction",
                     "of the curve's rate, N not a multiple of 8", required=False, omit_default=True),
            FieldDef("dispatch_overlap", "dispatch_overlap", "bool", required=False, default=False,
                     omit_default=True),
            FieldDef("gemm_op_overhead", "gemm_op_overhead_s", "time", "per matmul or attention operator",
                     required=False, omit_default=True),
            FieldDef("task_overhead", "task_overhead_s", "time", "per layer task", required=False,
                     omit_default=True),
        ),
        "host": (
            FieldDef("cpu_model", "cpu_model", "str"),
            FieldDef("sockets", "sockets", "int"),
            FieldDef("cores", "cores", "int"),
            FieldDef("dram", "dram_bytes", "bytes"),
            FieldDef("dram_bw", "dram_bw", "bandwidth"),
            FieldDef("optimizer_params_per_s", "optimizer_params_per_s", "number", "params/s"),
            FieldDef("reserved", "reserved", "bytes_map"),
        ),
        "pcie": (
            FieldDef("gen", "gen", "int"),
            FieldDef("lanes", "lanes", "int"),
            FieldDef("efficiency", "efficiency", "fraction"),
            FieldDef("duplex_fraction", "duplex_fraction", "fraction"),
            FieldDef("gpus_per_switch", "gpus_per_switch", "int"),
            FieldDef("latency", "latency_s", "time"),
            FieldDef("p2p", "p2p", "bool", required=False, default=True),
        ),
        "nvlink": (
            FieldDef("per_direction_bw", "per_direction_bw", "bandwidth"),
            FieldDef("latency", "latency_s", "time"),
            FieldDef("reduce_scatter_bytes", "reduce_scatter_bytes", "number", "x a ring's bytes", required=False,
                     omit_default=True),
            FieldDef("all_gather_bytes", "all_gather_bytes", "number", "x a ring's bytes", required=False,
                     omit_default=True),
        ),
        "c2c": (
            FieldDef("per_direction_bw", "per_direction_bw", "bandwidth"),
            FieldDef("latency", "latency_s", "time"),
        ),
        "nvme": (
            FieldDef("count", "count", "int", "drives"),
            FieldDef("capacity_each", "capacity_bytes_each", "bytes"),
            FieldDef("read_bw_each", "read_bw_each", "bandwidth"),
            FieldDef("write_bw_each", "write_bw_each", "bandwidth"),
            FieldDef("raid_read_efficiency", "raid_read_efficiency", "fraction"),
            FieldDef("raid_write_efficiency", "raid_write_efficiency", "fraction"),
            FieldDef("pcie_gen", "pcie_gen", "int"),
            FieldDef("latency", "latency_s", "time"),
        ),
        "network": (
            FieldDef("nics", "nics", "int", "NICs per node"),
            FieldDef("nic_bw", "nic_bw", "bandwidth", "per NIC, each direction"),
            FieldDef("efficiency", "efficiency", "fraction"),
            FieldDef("latency", "latency_s", "time"),
        ),
    }
)
OPTIONAL_SECTIONS: Final = ("nvlink", "c2c", "nvme", "network")
TOP_LEVEL: Final = ("name", "description", "unified_memory", "nodes", *SECTIONS, "sources")
NUMERIC_KINDS: Final = frozenset(
    {"int", "bytes", "bandwidth", "time", "flops", "fraction", "number", "curve", "bytes_map", "flops_map"}
)

SCALAR_PARSERS: Final[Mapping[str, Callable[[object, str], object]]] = FrozenDict(
    {
        "bool": parse_bool,
        "int": parse_int,
        "bytes": parse_bytes,
        "bandwidth": parse_bandwidth,
        "time": parse_time,
        "flops": parse_flops,
        "fraction": parse_fraction,
        "number": parse_number,
    }
)


def field_def(section: str, key: str) -> FieldDef | None:
    """The definition of `section.key`, or None."""
    for fd in SECTIONS.get(section, ()):
        if fd.key == key:
            return fd
    return None


def closest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or '' when nothing is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def fmt_value(kind: str, value: object) -> str:
    """A value of `kind` in human units (bytes also in GiB)."""
    if kind == "bytes" and isinstance(value, int | float):
        return f"{fmt_bytes(value)} ({fmt_bytes(value, binary=True)})"
    formatters: dict[str, Callable[[float], str]] = {
        "bandwidth": fmt_bandwidth,
        "time": fmt_time,
        "flops": fmt_flops,
    }
    if kind in formatters and isinstance(value, int | float):
        return formatters[kind](value)
    if kind == "number" and isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
