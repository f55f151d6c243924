"""hardware_models.spec: value objects built by hand are validated, frozen, hashable and picklable."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from hardware_models import (
    Curve,
    GpuSpec,
    HardwareInputError,
    HardwareSpec,
    HostSpec,
    NvmeSpec,
    PcieSpec,
    load_hardware,
)
from hardware_models.frozen import FrozenDict


def _gpu(**changes: object) -> GpuSpec:
    fields: dict[str, object] = dict(
        model="X", count=1, memory_bytes=80e9, peak_flops={"bf16": 1e14}, hbm_bw=1e12,
        gemm_efficiency=Curve.constant(0.5), launch_overhead_s=5e-6, reserved={"cuda_context": 1e9},
        fragmentation=0.05, optimizer_bytes_per_param=36.0,
    )  # fmt: skip
    fields.update(changes)
    return GpuSpec(**fields)  # type: ignore[arg-type]


def test_hand_built_gpu_spec_is_checked() -> None:
    assert _gpu().peak_flops == {"bf16": 1e14}
    cases = {
        "gpu.memory": {"memory_bytes": -1.0},
        "gpu.count": {"count": True},
        "gpu.peak_flops.int4": {"peak_flops": {"int4": 1e15}},
        "gpu.peak_flops.bf16": {"peak_flops": {"bf16": 0.0}},
        "gpu.hbm_bw": {"hbm_bw": float("inf")},
        "gpu.gemm_efficiency": {"gemm_efficiency": 0.5},
        "gpu.fragmentation": {"fragmentation": -0.1},
        "gpu.reserved": {"reserved": {"a": 90e9}},
    }
    for field, change in cases.items():
        with pytest.raises(HardwareInputError) as info:
            _gpu(**change)
        assert info.value.field == field, change


def test_other_parts_are_checked() -> None:
    with pytest.raises(HardwareInputError, match="host.cores"):
        HostSpec("cpu", 2, 1, 1e12, 1e11, 1e9, {})
    with pytest.raises(HardwareInputError, match="pcie.p2p"):
        PcieSpec(4, 16, 0.79, 0.7, 1, 1e-5, p2p="yes")  # type: ignore[arg-type]
    with pytest.raises(HardwareInputError, match="nvme.pcie_gen"):
        NvmeSpec(1, 1e12, 7e9, 3.5e9, 0.9, 0.75, 2, 1e-4)


def test_pcie_and_nvme_derived_figures() -> None:
    pcie = PcieSpec(4, 8, 0.8, 0.75, 2, 1e-5)
    assert pcie.per_direction_bw == pytest.approx(31.5e9 * 0.5 * 0.8)
    assert pcie.uplink_bw == pytest.approx(31.5e9 * 0.8)
    assert pcie.duplex_bw == pytest.approx(2 * pcie.per_direction_bw * 0.75)
    nvme = NvmeSpec(3, 2e12, 7e9, 4e9, 0.9, 0.5, 4, 1e-4)
    assert (nvme.capacity_bytes, nvme.read_bw, nvme.write_bw) == pytest.approx((6e12, 18.9e9, 6e9))


def test_peak_flops_for_a_missing_dtype_is_a_clear_error() -> None:
    v100 = load_hardware("v100")
    assert v100.peak_flops_for("fp16") == 125e12
    with pytest.raises(HardwareInputError) as info:
        v100.peak_flops_for("bf16")
    assert "hardware 'v100'" in str(info.value)
    assert "(has: fp16, fp32)" in str(info.value)
    assert info.value.field == "gpu.peak_flops.bf16"


def test_specs_are_frozen_hashable_and_picklable() -> None:
    spec = load_hardware("a100x8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.gpu.peak_flops["bf16"] = 1.0  # type: ignore[index]
    assert isinstance(spec.sources, FrozenDict)
    assert hash(spec) == hash(load_hardware("a100x8"))
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert len({spec, load_hardware("a100x8"), load_hardware("a100")}) == 2


def test_replace_revalidates() -> None:
    spec = load_hardware("a100")
    with pytest.raises(HardwareInputError, match="field 'gpu.memory'"):
        dataclasses.replace(spec, unified_memory=True)
    bigger = dataclasses.replace(spec, host=dataclasses.replace(spec.host, dram_bytes=1e12))
    assert bigger.host.dram_bytes == 1e12
    with pytest.raises(HardwareInputError, match="field 'sources'"):
        dataclasses.replace(spec, sources={"gpu.nothing": "x"})
    with pytest.raises(HardwareInputError, match="field 'nvme'"):
        HardwareSpec("x", "", spec.gpu, spec.host, spec.pcie, None, None, spec.host, False)  # type: ignore[arg-type]
