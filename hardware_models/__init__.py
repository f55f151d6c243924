"""Hardware descriptions for tiersim: frozen value objects, presets, YAML loading and the topology.

Imports nothing else of tiersim (stdlib + PyYAML only) and does no I/O at import time.

Example::

    from hardware_models import build_topology, load_hardware
    spec = load_hardware("a100x8", ["pcie.gen=5"])
    build_topology(spec).route("gpu0", "cpu")   # (Hop('gpu0.pcie', False), Hop('sw0.uplink', False))
"""

from hardware_models.curve import Curve
from hardware_models.errors import HardwareInputError
from hardware_models.loader import describe, list_presets, load_hardware, spec_from_dict
from hardware_models.sources import reference_source_keys, reference_specs
from hardware_models.spec import (
    PCIE_X16_PER_DIRECTION,
    C2CSpec,
    GpuSpec,
    HardwareSpec,
    HostSpec,
    NvlinkSpec,
    NvmeSpec,
    PcieSpec,
)
from hardware_models.topology import Hop, Link, Pool, Topology, build_topology
from hardware_models.units import (
    GB,
    GIB,
    fmt_bandwidth,
    fmt_bytes,
    fmt_flops,
    fmt_time,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_time,
)

__all__ = [
    "GB",
    "GIB",
    "PCIE_X16_PER_DIRECTION",
    "C2CSpec",
    "Curve",
    "GpuSpec",
    "HardwareInputError",
    "HardwareSpec",
    "Hop",
    "HostSpec",
    "Link",
    "NvlinkSpec",
    "NvmeSpec",
    "PcieSpec",
    "Pool",
    "Topology",
    "build_topology",
    "describe",
    "fmt_bandwidth",
    "fmt_bytes",
    "fmt_flops",
    "fmt_time",
    "list_presets",
    "load_hardware",
    "parse_bandwidth",
    "parse_bytes",
    "parse_flops",
    "parse_time",
    "reference_source_keys",
    "reference_specs",
    "spec_from_dict",
]
