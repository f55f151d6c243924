"""The shipped presets: they load, round-trip, cite a source for every figure and match the reference."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import hardware_models
from hardware_models import (
    GIB,
    describe,
    list_presets,
    load_hardware,
    reference_source_keys,
    reference_specs,
    spec_from_dict,
)

PRESETS = list_presets()
# Citations that are not reference keys must say what they are.
_FREE_PREFIXES = ("derived", "assumed", "fitted", "NVIDIA V100 datasheet", "NVIDIA DGX-2", "ZeRO-Offload paper")


SHIPPED = (
    "a100",
    "a100-40g",
    "a100x8",
    "h800",
    "h800x8",
    "h200",
    "h200x8",
    "dgx-spark",
    "v100",
    "dgx2",
    "rtx4090x4",
)


def test_the_expected_presets_ship() -> None:
    assert sorted(SHIPPED) == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_is_named_after_its_file(name: str) -> None:
    spec = load_hardware(name)
    assert spec.name == name
    assert spec.description


@pytest.mark.parametrize("name", PRESETS)
def test_to_dict_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    spec = load_hardware(name)
    assert spec_from_dict(spec.to_dict()) == spec
    path = tmp_path / f"{name}-copy.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    assert load_hardware(str(path)) == spec


@pytest.mark.parametrize("name", PRESETS)
def test_every_numeric_field_has_a_source(name: str) -> None:
    spec = load_hardware(name)
    assert spec.missing_sources() == ()
    assert len(spec.field_paths(numeric_only=True)) >= 30


def test_the_reference_ships_inside_the_package() -> None:
    keys = reference_source_keys()
    assert {"klockwood_a100", "nvbw_53", "dgx_a100_learn", "gb10_hf_kernels_283"} <= keys
    assert {"sources", "gpus", "systems", "models"} <= set(reference_specs())


@pytest.mark.parametrize("name", PRESETS)
def test_citations_are_reference_keys_or_say_what_they_are(name: str) -> None:
    keys = reference_source_keys()
    for path, citation in load_hardware(name).sources.items():
        if citation.startswith(_FREE_PREFIXES):
            continue
        leading = re.split(r"\s[(\-]", citation)[0]
        cited = [part.strip() for part in leading.split(",")]
        unknown = [c for c in cited if c not in keys]
        assert not unknown, f"{name}: {path}: {citation!r} cites unknown keys {unknown}"


@pytest.mark.parametrize("name", PRESETS)
def test_describe_shows_every_source(name: str) -> None:
    spec = load_hardware(name)
    text = describe(spec)
    assert text.startswith(f"{name}: ")
    for citation in spec.sources.values():
        assert citation in text
    assert "no source given" not in text.split("derived:")[0]
    assert "fields without a source" not in text


# Figures from hardware_models/reference/hardware_specs.yaml (and the task brief), with their units;
# the ones the reference records are also read from it below (test_figures_are_the_reference_figures).
EXPECTED: dict[str, dict[str, float | None]] = {
    "a100x8": {
        "gpu.count": 8,
        "host.dram_bytes": 2e12,
        "host.dram_bw": 409.6e9,
        "host.cores": 128,
        "peak.bf16": 312e12,
        "gpu.hbm_bw": 2039e9,
        "nvlink": 300e9,
        "pcie.gen": 4,
        "pcie.gpus_per_switch": 2,
        "nvme.count": 8,
        "nvme.capacity_bytes_each": 3.84e12,
        "nvme.read_bw_each": 7.0e9,
        "nvme.write_bw_each": 3.5e9,
    },
    "a100": {"gpu.count": 1, "peak.bf16": 312e12, "gpu.hbm_bw": 2039e9, "nvlink": None},
    "a100-40g": {"gpu.memory_bytes": 40 * GIB, "gpu.hbm_bw": 1555e9, "peak.bf16": 312e12},
    "h800": {"gpu.hbm_bw": 3350e9, "peak.bf16": 989.4e12, "pcie.gen": 5},
    "h800x8": {"gpu.count": 8, "nvlink": 200e9, "peak.bf16": 989.4e12, "peak.fp8": 1978.9e12},
    "h200": {"gpu.hbm_bw": 4800e9, "peak.bf16": 989.4e12, "pcie.gen": 5},
    "h200x8": {"gpu.count": 8, "nvlink": 450e9, "host.dram_bytes": 2e12, "pcie.gen": 5},
    "dgx-spark": {"host.dram_bw": 273e9, "host.cores": 20, "peak.bf16": 125e12, "c2c": 300e9,
                  "nvme.capacity_bytes_each": 4e12, "gpu.memory_bytes": 0.0},
    "v100": {"peak.fp16": 125e12, "gpu.hbm_bw": 900e9, "pcie.gen": 3, "gpu.memory_bytes": 32 * GIB},
    "dgx2": {"gpu.count": 16, "nvlink": 150e9, "host.dram_bytes": 1.5e12, "host.cores": 48,
             "host.optimizer_params_per_s": 10e9 / 2.57, "pcie.gen": 3},
    "rtx4090x4": {"gpu.count": 4, "peak.bf16": 165e12, "gpu.hbm_bw": 1008e9, "nvlink": None,
                  "pcie.gpus_per_switch": 4, "host.dram_bytes": 256e9},
}  # fmt: skip


def _figure(name: str, key: str) -> object:
    spec = load_hardware(name)
    if key.startswith("peak."):
        return spec.peak_flops_for(key.split(".")[1])
    if key in ("nvlink", "c2c"):
        part = getattr(spec, key)
        return None if part is None else part.per_direction_bw
    section, attr = key.split(".")
    return getattr(getattr(spec, section), attr)


@pytest.mark.parametrize(("name", "key"), [(n, k) for n, figs in EXPECTED.items() for k in figs])
def test_figures_match_the_reference(name: str, key: str) -> None:
    expected = EXPECTED[name][key]
    actual = _figure(name, key)
    if isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-3)
    else:
        assert actual == expected


# (preset, figure) -> (dotted path in the reference, factor to our units). A preset figure that the
# reference records must be the reference's figure; the rest are derived or assumed (see each source).
TB, GBS, TFLOPS = 1e12, 1e9, 1e12
REFERENCE_FIGURES: dict[tuple[str, str], tuple[str, float]] = {
    ("a100x8", "peak.bf16"): ("gpus.a100_sxm4_80gb.bf16_tflops", TFLOPS),
    ("a100x8", "peak.fp32"): ("gpus.a100_sxm4_80gb.fp32_tflops", TFLOPS),
    ("a100x8", "gpu.hbm_bw"): ("gpus.a100_sxm4_80gb.mem_bw_gbps", GBS),
    ("a100x8", "nvlink"): ("gpus.a100_sxm4_80gb.nvlink.per_direction_gbps", GBS),
    ("a100x8", "pcie.gen"): ("gpus.a100_sxm4_80gb.pcie.gen", 1),
    ("a100x8", "host.dram_bytes"): ("systems.dgx_a100.dram.640gb_model.capacity_tb", TB),
    ("a100x8", "host.dram_bw"): ("systems.dgx_a100.dram.bw_total_gbps_theoretical", GBS),
    ("a100x8", "pcie.gpus_per_switch"): ("systems.dgx_a100.pcie_topology.gpus_per_switch", 1),
    ("a100x8", "nvme.count"): ("systems.dgx_a100.nvme.data_drives_640gb_model.count", 1),
    ("a100x8", "nvme.capacity_bytes_each"): ("systems.dgx_a100.nvme.data_drives_640gb_model.capacity_tb_each", TB),
    ("a100x8", "nvme.read_bw_each"): ("systems.dgx_a100.nvme.per_drive_seq_read_gbps", GBS),
    ("a100x8", "nvme.write_bw_each"): ("storage.gen4_drives.samsung_pm1733.seq_write_gbps", GBS),
    ("a100", "peak.bf16"): ("gpus.a100_sxm4_80gb.bf16_tflops", TFLOPS),
    ("a100", "gpu.hbm_bw"): ("gpus.a100_sxm4_80gb.mem_bw_gbps", GBS),
    ("a100-40g", "peak.bf16"): ("gpus.a100_sxm4_40gb.bf16_tflops", TFLOPS),
    ("a100-40g", "gpu.hbm_bw"): ("gpus.a100_sxm4_40gb.mem_bw_gbps", GBS),
    ("h800", "peak.bf16"): ("gpus.h800_sxm5_80gb.bf16_tflops", TFLOPS),
    ("h800", "gpu.hbm_bw"): ("gpus.h800_sxm5_80gb.mem_bw_gbps", GBS),
    ("h800", "pcie.gen"): ("gpus.h800_sxm5_80gb.pcie.gen", 1),
    ("h800x8", "peak.bf16"): ("gpus.h800_sxm5_80gb.bf16_tflops", TFLOPS),
    ("h800x8", "peak.fp8"): ("gpus.h800_sxm5_80gb.fp8_tflops", TFLOPS),
    ("h800x8", "nvlink"): ("gpus.h800_sxm5_80gb.nvlink.per_direction_gbps", GBS),
    ("h200", "peak.bf16"): ("gpus.h200_sxm_141gb.bf16_tflops", TFLOPS),
    ("h200", "gpu.hbm_bw"): ("gpus.h200_sxm_141gb.mem_bw_gbps", GBS),
    ("h200", "pcie.gen"): ("gpus.h200_sxm_141gb.pcie.gen", 1),
    ("h200x8", "nvlink"): ("gpus.h200_sxm_141gb.nvlink.per_direction_gbps", GBS),
    ("h200x8", "pcie.gen"): ("gpus.h200_sxm_141gb.pcie.gen", 1),
    ("dgx-spark", "peak.bf16"): ("gpus.gb10_dgx_spark_gpu.bf16_tflops", TFLOPS),
    ("dgx-spark", "c2c"): ("gpus.gb10_dgx_spark_gpu.cpu_gpu_link.per_direction_gbps", GBS),
    ("dgx-spark", "host.dram_bw"): ("systems.dgx_spark.memory.bw_gbps", GBS),
    ("dgx-spark", "host.cores"): ("systems.dgx_spark.cpu.cores", 1),
    ("dgx-spark", "nvme.capacity_bytes_each"): ("systems.dgx_spark.storage.capacity_tb", TB),
    ("dgx2", "host.dram_bytes"): ("offload_reference_zero_infinity.host_memory_dgx2_tb", TB),
}  # fmt: skip


def _reference_figure(dotted: str) -> Any:
    node: Any = reference_specs()
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"reference has no {dotted!r} (missing {part!r})"
        node = node[part]
    return node


@pytest.mark.parametrize(("name", "key"), sorted(REFERENCE_FIGURES))
def test_figures_are_the_reference_figures(name: str, key: str) -> None:
    path, factor = REFERENCE_FIGURES[(name, key)]
    recorded = _reference_figure(path)
    assert isinstance(recorded, int | float), f"{path} is {recorded!r}, not a number"
    assert _figure(name, key) == pytest.approx(recorded * factor, rel=1e-9), path


def test_every_pinned_figure_the_reference_records_is_read_from_it() -> None:
    # The hand-typed EXPECTED table and the reference agree wherever both speak.
    for (name, key), (path, factor) in REFERENCE_FIGURES.items():
        if key in EXPECTED.get(name, {}):
            assert EXPECTED[name][key] == pytest.approx(_reference_figure(path) * factor, rel=1e-9), (name, key)


def test_a100x8_pcie_gen4_per_direction_is_the_measured_25_gbs() -> None:
    spec = load_hardware("a100x8")
    assert spec.pcie.per_direction_bw == pytest.approx(24.9e9, rel=0.01)  # nvbw_53: 24.8-25.1 GB/s
    assert spec.pcie.duplex_bw == pytest.approx((24 + 11) * 1e9, rel=0.01)  # nvbw_53: D2H 24 + H2D 11


def test_gpu_memory_is_what_cuda_reports_not_the_marketing_gb() -> None:
    assert load_hardware("a100x8").gpu.memory_bytes == 81920 * 2**20
    assert load_hardware("h200").gpu.memory_bytes == 143771 * 2**20


def test_dgx_spark_usable_total_matches_gpud() -> None:
    spec = load_hardware("dgx-spark")
    assert spec.unified_memory
    visible = (
        spec.host.dram_bytes - spec.host.reserved["display_carveout"] - spec.host.reserved["firmware_kernel"]
    )
    assert visible == 128501256192  # gpud_1170: ~119.7 GiB
    assert spec.host.reserved["display_carveout"] == 2 * GIB


@pytest.mark.parametrize(
    ("name", "micro_batch", "seq", "low", "high"),
    [
        ("a100x8", 1, 4096, 0.55, 0.68),  # llmfoundry A100-80GB MPT-7B MFU 0.47-0.64 (whole steps, seq 512-65536)
        ("a100x8", 4, 4096, 0.55, 0.68),
        ("h200x8", 1, 4096, 0.38, 0.52),  # llmfoundry H100 MPT-7B 0.37-0.46
        ("h800x8", 4, 4096, 0.38, 0.52),
    ],
)
def test_gemm_efficiency_of_a_large_layer_lands_near_published_mfu(
    name: str, micro_batch: int, seq: int, low: float, high: float
) -> None:
    """An MPT-7B block forward (the architecture the Ampere and Hopper prices were fitted to,
    tiersim.foundry_fit) priced as the engine does (costs.ComputePricer: each matmul kernel on its curve, the
    element-wise bytes apart) lands near the published MFU; an eager LLaMA-2-7B block (its RMSNorm and rotary
    unfused, workloads.ops) moves more element-wise bytes and is priced lower."""
    from costs import ComputePricer
    from tiersim.validate_runs import gpt_like
    from workloads import WorkloadConfig, load_model

    hw = load_hardware(name)
    config = WorkloadConfig(micro_batch=micro_batch, seq_len=seq, precision="bf16")

    def efficiency(model: object) -> tuple[float, float]:
        pricer = ComputePricer(hw, "bf16", (model, config))  # type: ignore[arg-type]
        ops = pricer.layer_ops(1, "fwd", 0.0)  # 0: the whole layer, unscaled
        assert ops is not None
        return ops.flops / (pricer.seconds(ops.flops, 0.0, 1, "fwd") * hw.peak_flops_for("bf16")), ops.flops

    mpt, flops = efficiency(gpt_like("mpt-7b", 32, 4096, 32, 50368, seq, dropout=False))
    assert low <= mpt <= high
    assert efficiency(load_model("llama2-7b"))[0] < mpt
    curve = hw.gpu.gemm_efficiency
    assert curve(1e8) < 0.5 * curve(flops)  # small kernels are much less efficient


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_uses_its_generations_kernel_curve(name: str) -> None:
    from hardware_models.gpu_arch import gpu_arch

    spec = load_hardware(name)
    arch = gpu_arch(spec.gpu.model)
    assert arch is not None, f"{name}: no architecture for {spec.gpu.model!r}"
    generation = reference_specs()["gemm_efficiency_by_generation"][arch.name]
    assert name in generation["presets"]
    assert [list(p) for p in spec.gpu.gemm_efficiency.points] == [[float(x), y] for x, y in generation["curve"]]
    assert f"gemm_efficiency_by_generation.{arch.name}" in spec.sources["gpu.gemm_efficiency"]


def test_gemm_efficiency_never_exceeds_the_measured_matmul_ceiling() -> None:
    assert max(y for _, y in load_hardware("a100x8").gpu.gemm_efficiency.points) <= 0.86
    spark = load_hardware("dgx-spark")
    best = max(y for _, y in spark.gpu.gemm_efficiency.points)
    assert best * spark.peak_flops_for("bf16") <= 92.3e12  # gb10_hf_kernels_283


def test_package_imports_nothing_else_of_the_project() -> None:
    allowed = set(sys.stdlib_module_names) | {"yaml", "hardware_models", "userfiles", "__future__"}  # userfiles: bottom
    package = Path(hardware_models.__file__).parent
    for source in package.glob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{source.name} imports {roots}"


def test_import_loads_no_other_project_package() -> None:
    code = (
        "import sys, hardware_models; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('workloads', 'policies', 'simulator', 'reports', 'tiersim', 'replay', 'planner')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
