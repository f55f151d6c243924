"""hardware_models.loader: presets, user files, overrides and one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hardware_models import HardwareInputError, list_presets, load_hardware, spec_from_dict


def _error(*args: object, **kwargs: object) -> str:
    with pytest.raises(HardwareInputError) as info:
        load_hardware(*args, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


def _write(tmp_path: Path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _preset_dict(name: str) -> dict:  # type: ignore[type-arg]
    return load_hardware(name).to_dict()


# ----------------------------------------------------------------------------------- names, files


def test_preset_names_are_case_insensitive() -> None:
    assert load_hardware("A100X8") == load_hardware("a100x8")
    assert load_hardware(" Dgx-Spark ").name == "dgx-spark"


def test_loads_a_user_file_in_human_units(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "hardware_models" / "presets" / "a100.yaml").read_text()
    path = _write(tmp_path, "mybox.yaml", text.replace("name: a100\n", "name: mybox\n"))
    spec = load_hardware(path)
    assert spec.name == "mybox"
    assert spec.host.dram_bytes == 256e9
    assert load_hardware(Path(path)) == spec


def test_unknown_preset_lists_the_known_ones() -> None:
    message = _error("a1000")
    assert message.startswith("unknown hardware preset 'a1000'")
    assert "known: " + ", ".join(list_presets()) in message
    assert "a100, a100-40g, a100x8" in message
    assert message.endswith("or pass a path to a YAML file")


def test_missing_file_names_it(tmp_path: Path) -> None:
    message = _error(str(tmp_path / "nope.yaml"))
    assert "nope.yaml: no such file" in message


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.yaml", "name: x\ngpu:\n  model: [A100\n  count: 8\n")
    message = _error(path)
    assert message.startswith(f"{path}: line ")
    assert "malformed YAML" in message
    assert "line 4" in message or "line 3" in message


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    text = yaml.safe_dump(_preset_dict("a100"), sort_keys=False) + "name: again\n"
    message = _error(_write(tmp_path, "dup.yaml", text))
    assert "duplicate key 'name'" in message
    assert "line " in message


def test_empty_or_non_mapping_file(tmp_path: Path) -> None:
    assert "expected a mapping" in _error(_write(tmp_path, "empty.yaml", ""))
    assert "expected a mapping" in _error(_write(tmp_path, "list.yaml", "- 1\n- 2\n"))


# ---------------------------------------------------------------------------------- bad values


def test_bad_unit_string_names_file_and_field(tmp_path: Path) -> None:
    data = _preset_dict("a100x8")
    data["gpu"]["memory"] = "eighty"
    path = _write(tmp_path, "a100x8.yaml", data)
    assert _error(path) == f"{path}: field 'gpu.memory': expected a size like '80GB' or '80GiB', got 'eighty'"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("gpu.memory=-80GB", "gpu.memory"),
        ("gpu.memory=0", "gpu.memory"),
        ("host.dram=0GB", "host.dram"),
        ("nvme.capacity_each=-1TB", "nvme.capacity_each"),
        ("gpu.hbm_bw=0GB/s", "gpu.hbm_bw"),
        ("gpu.reserved.cuda_context=-1GiB", "gpu.reserved.cuda_context"),
        ("pcie.efficiency=1.5", "pcie.efficiency"),
        ("pcie.duplex_fraction=0.3", "pcie.duplex_fraction"),
        ("nvme.raid_read_efficiency=0", "nvme.raid_read_efficiency"),
        ("gpu.fragmentation=1", "gpu.fragmentation"),
        ("gpu.count=0", "gpu.count"),
        ("nvme.count=0", "nvme.count"),
        ("pcie.lanes=12", "pcie.lanes"),
        ("host.cores=1", "host.cores"),
        ("gpu.reserved.comm_buffers=100GB", "gpu.reserved"),
    ],
)
def test_out_of_range_values_name_the_field(override: str, field: str) -> None:
    message = _error("a100x8", [override])
    assert f"field '{field}'" in message


def test_unknown_pcie_generation() -> None:
    message = _error("a100x8", ["pcie.gen=7"])
    assert "field 'pcie.gen': must be one of 3, 4, 5, 6, got 7" in message


def test_unknown_field_suggests_the_closest(tmp_path: Path) -> None:
    data = _preset_dict("a100")
    data["gpu"]["memroy"] = data["gpu"].pop("memory")
    message = _error(_write(tmp_path, "typo.yaml", data))
    assert "field 'gpu.memroy': unknown field (did you mean 'memory'?)" in message
    data = _preset_dict("a100")
    data["hots"] = data.pop("host")
    assert "(did you mean 'host'?)" in _error(_write(tmp_path, "typo2.yaml", data))


def test_missing_field_is_named(tmp_path: Path) -> None:
    data = _preset_dict("a100")
    del data["gpu"]["hbm_bw"]
    assert "field 'gpu.hbm_bw': missing (expected a bandwidth like '25GB/s')" in _error(
        _write(tmp_path, "m.yaml", data)
    )
    data = _preset_dict("a100")
    del data["pcie"]
    assert "field 'pcie': missing" in _error(_write(tmp_path, "m2.yaml", data))


def test_unknown_dtype_and_bad_curve(tmp_path: Path) -> None:
    data = _preset_dict("a100")
    data["gpu"]["peak_flops"]["bf61"] = "1TFLOPS"
    assert "field 'gpu.peak_flops.bf61': unknown dtype (did you mean 'bf16'?)" in _error(
        _write(tmp_path, "d.yaml", data)
    )
    data = _preset_dict("a100")
    data["gpu"]["gemm_efficiency"] = [[1e9, 0.5], [1e8, 0.6]]
    assert "field 'gpu.gemm_efficiency[1]': sizes must be strictly ascending" in _error(
        _write(tmp_path, "c.yaml", data)
    )


def test_sources_must_cite_existing_fields(tmp_path: Path) -> None:
    data = _preset_dict("a100")
    data["sources"]["gpu.memroy"] = "klockwood_a100"
    message = _error(_write(tmp_path, "s.yaml", data))
    assert "field 'sources'" in message
    assert "did you mean 'gpu.memory'?" in message


def test_unified_machine_rules() -> None:
    assert "field 'gpu.memory': must be 0 on a unified-memory machine" in _error(
        "dgx-spark", ["gpu.memory=80GB"]
    )
    assert "field 'gpu.count'" in _error("dgx-spark", ["gpu.count=2"])


def test_user_files_need_no_sources(tmp_path: Path) -> None:
    data = _preset_dict("a100")
    del data["sources"]
    spec = load_hardware(_write(tmp_path, "nosrc.yaml", data))
    assert "gpu.memory" in spec.missing_sources()


# ------------------------------------------------------------------------------------ overrides


def test_pcie_gen5_doubles_per_direction_bandwidth() -> None:
    base = load_hardware("a100x8")
    faster = load_hardware("a100x8", ["pcie.gen=5"])
    assert faster.pcie.per_direction_bw == pytest.approx(2 * base.pcie.per_direction_bw)
    assert faster.sources["pcie.gen"] == "override: pcie.gen=5"


def test_host_dram_override() -> None:
    spec = load_hardware("a100x8", ["host.dram=1TB"])
    assert spec.host.dram_bytes == 1e12
    assert load_hardware("a100x8", {"host.dram": "1TB"}) == spec


def test_nvme_count_raises_aggregate_read_bandwidth() -> None:
    one = load_hardware("a100")
    four = load_hardware("a100", ["nvme.count=4"])
    assert one.nvme is not None and four.nvme is not None
    assert one.nvme.read_bw == pytest.approx(7.0e9)
    assert four.nvme.read_bw == pytest.approx(4 * 7.0e9 * 0.9)
    assert four.nvme.capacity_bytes == pytest.approx(4 * 3.84e12)


def test_map_entry_curve_and_section_overrides() -> None:
    spec = load_hardware("v100", ["gpu.peak_flops.bf16=125TFLOPS", "gpu.reserved.cuda_context=1GiB"])
    assert spec.peak_flops_for("bf16") == 125e12
    assert spec.gpu.reserved["cuda_context"] == 2**30
    assert spec.sources["gpu.peak_flops.bf16"] == "override: gpu.peak_flops.bf16=125TFLOPS"
    curve = load_hardware("a100", ["gpu.gemm_efficiency=[[1e9, 0.3], [1e12, 0.6]]"]).gpu.gemm_efficiency
    assert curve.points == ((1e9, 0.3), (1e12, 0.6))
    flat = load_hardware("a100x8", ["nvlink=none"])
    assert flat.nvlink is None
    assert not any(k.startswith("nvlink.") for k in flat.sources)
    assert flat.missing_sources() == ()


def test_unknown_override_path_names_it_and_lists_valid_keys() -> None:
    message = _error("a100x8", ["pcie.speed=5"])
    assert message.startswith("override 'pcie.speed=5': field 'pcie.speed': unknown override path")
    assert "valid keys under 'pcie': gen, lanes, efficiency" in message
    message = _error("a100x8", ["hots.dram=1TB"])
    assert "field 'hots.dram'" in message and "did you mean 'host'?" in message
    assert "field 'host.dram.x'" in _error("a100x8", ["host.dram.x=1"])


def test_bad_override_values_and_shapes() -> None:
    message = _error("a100x8", ["host.dram=lots"])
    assert (
        message
        == "override 'host.dram=lots': field 'host.dram': expected a size like '80GB' or '80GiB', got 'lots'"
    )
    assert (
        _error("a100x8", ["host.dram"]) == "override 'host.dram': expected PATH=VALUE, e.g. 'host.dram=1TB'"
    )
    assert "field 'gpu.gemm_efficiency': malformed YAML value" in _error(
        "a100", ["gpu.gemm_efficiency=[[1e9, 0.5"]
    )
    assert "no 'nvlink' section" in _error("a100", ["nvlink.per_direction_bw=100GB/s"])
    assert "'none' to remove" in _error("a100x8", ["nvme=4"])


def test_spec_from_dict_reports_the_file_it_is_given() -> None:
    data = _preset_dict("a100")
    data["host"]["dram"] = "lots"
    with pytest.raises(HardwareInputError, match=r"^box\.yaml: field 'host\.dram'"):
        spec_from_dict(data, file="box.yaml")
