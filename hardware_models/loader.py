"""Loading hardware descriptions: presets shipped as package data, user YAML files, overrides.

`load_hardware("a100x8")` reads ``hardware_models/presets/a100x8.yaml`` (at call time, through
importlib.resources); `load_hardware("my_box.yaml")` reads a user file in the same format (see
`hardware_models.schema`). Overrides such as ``["host.dram=1TB", "pcie.gen=5", "nvlink=none"]`` are
applied to the YAML structure before validation, parsed with the same unit parsers as the field, and
recorded in `sources` as ``override: PATH=VALUE``. Every problem is one `HardwareInputError` line.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import userfiles
from hardware_models.curve import Curve
from hardware_models.describe import describe
from hardware_models.errors import HardwareInputError
from hardware_models.frozen import FrozenDict
from hardware_models.schema import (
    DTYPES,
    OPTIONAL_SECTIONS,
    SCALAR_PARSERS,
    SECTIONS,
    TOP_LEVEL,
    FieldDef,
    closest,
    field_def,
)
from hardware_models.spec import (
    C2CSpec,
    GpuSpec,
    HardwareSpec,
    HostSpec,
    NetworkSpec,
    NvlinkSpec,
    NvmeSpec,
    PcieSpec,
)
from hardware_models.units import parse_bool, parse_bytes, parse_flops, parse_fraction, parse_int, parse_number
from userfiles import UserFileError
from userfiles.limits import MAX_GPUS_PER_MACHINE

__all__ = ["describe", "list_presets", "load_hardware", "spec_from_dict"]

Overrides = Mapping[str, object] | Sequence[str]

_SECTION_CLASSES: Mapping[str, type] = FrozenDict(
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
_REQUIRED_TOP = ("name", "gpu", "host", "pcie")
_HINTS: Mapping[str, str] = FrozenDict(
    {
        "str": "a text",
        "bool": "true or false",
        "int": "a whole number like '8'",
        "bytes": "a size like '80GB'",
        "bandwidth": "a bandwidth like '25GB/s'",
        "time": "a time like '5us'",
        "fraction": "a fraction like '0.79'",
        "number": "a number like '36'",
        "curve": "a list of [flops, efficiency] pairs",
        "bytes_map": "a mapping of name: size",
        "flops_map": "a mapping of dtype: rate like {bf16: 312TFLOPS}",
    }
)


# ---------------------------------------------------------------------------------------- presets


def _preset_dir() -> Traversable:
    return resources.files("hardware_models").joinpath("presets")


def list_presets() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.name[: -len(".yaml")] for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def _looks_like_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name or os.sep in name


def load_hardware(name_or_path: str | os.PathLike[str], overrides: Overrides = ()) -> HardwareSpec:
    """A preset by name (case-insensitive) or a YAML file by path, with `overrides` applied."""
    text = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or _looks_like_path(text):
        return _load_file(Path(text), overrides)
    presets = list_presets()
    wanted = text.strip().lower()
    if wanted in presets:
        label = f"{wanted}.yaml"
        body = _preset_dir().joinpath(label).read_text(encoding="utf-8")
        return spec_from_dict(_parse_yaml(body, label), file=label, overrides=overrides)
    if Path(text).is_file():
        return _load_file(Path(text), overrides)
    raise HardwareInputError(
        f"unknown hardware preset '{text}'{closest(wanted, presets)}; known: {', '.join(presets)}; "
        "or pass a path to a YAML file"
    )


def _load_file(path: Path, overrides: Overrides) -> HardwareSpec:
    label = str(path)
    if not path.exists():
        raise HardwareInputError(
            f"no such file; pass an existing YAML path or a preset name ({', '.join(list_presets())})",
            file=label,
        )
    try:
        data = userfiles.read_yaml(path, "hardware")
    except UserFileError as err:
        raise _hardware_error(err) from None
    return spec_from_dict(data, file=label, overrides=overrides)


# ------------------------------------------------------------------------------------------- YAML


def _hardware_error(err: UserFileError) -> HardwareInputError:
    """A `userfiles` refusal as this package's error (same text: file, line, key, problem and fix)."""
    return HardwareInputError(err.detail(), file=err.file)


def _parse_yaml(body: str, label: str) -> object:
    """Strict YAML through `userfiles` (duplicate keys, aliases, depth, numbers: see its docstring)."""
    try:
        return userfiles.parse_text(body, "hardware", label)
    except UserFileError as err:
        raise _hardware_error(err) from None


# -------------------------------------------------------------------------------------- structure


def spec_from_dict(data: object, *, file: str | None = None, overrides: Overrides = ()) -> HardwareSpec:
    """A `HardwareSpec` from the preset-file structure (e.g. `HardwareSpec.to_dict()`)."""
    try:
        if not isinstance(data, Mapping):
            raise HardwareInputError(
                f"expected a mapping with {', '.join(_REQUIRED_TOP)}, ...; got {type(data).__name__}"
            )
        raw: dict[str, Any] = copy.deepcopy(dict(data))
        _apply_overrides(raw, overrides)
        return _build(raw)
    except HardwareInputError as err:
        raise err.in_file(file) from None


def _check_keys(mapping: Mapping[Any, Any], valid: Sequence[str], where: str) -> None:
    for key in mapping:
        path = f"{where}.{key}" if where else str(key)
        if key not in valid:
            raise HardwareInputError(
                f"unknown field{closest(str(key), valid)}; valid here: {', '.join(valid)}", field=path
            )


def _build(raw: dict[str, Any]) -> HardwareSpec:
    _check_keys(raw, TOP_LEVEL, "")
    for key in _REQUIRED_TOP:
        if raw.get(key) is None:
            raise HardwareInputError("missing (required)", field=key)
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise HardwareInputError(f"expected a text, got a {type(description).__name__}", field="description")
    sections: dict[str, Any] = {}
    for section in SECTIONS:
        value = raw.get(section)
        sections[section] = None if value is None else _build_section(section, value)
    nodes = _nodes(raw.get("nodes", 1))
    _check_bounds(sections, nodes)
    if nodes > 1 and isinstance(sections["gpu"], GpuSpec):  # the file's gpu.count is per node
        sections["gpu"] = dataclasses.replace(sections["gpu"], count=sections["gpu"].count * nodes)
    sources = raw.get("sources") or {}
    if not isinstance(sources, Mapping):
        raise HardwareInputError(
            f"must be a mapping of field path: citation, got {sources!r}", field="sources"
        )
    return HardwareSpec(
        name=raw["name"],
        description=description,
        unified_memory=parse_bool(raw.get("unified_memory", False), "unified_memory"),
        sources=dict(sources),
        nodes=nodes,
        **sections,
    )


def _nodes(value: object) -> int:
    """The ``nodes`` field: a whole number >= 1 (default 1)."""
    nodes = parse_int(value, "nodes")
    if nodes < 1:
        raise HardwareInputError(f"must be a whole number of nodes >= 1, got {value!r}", field="nodes")
    return nodes


def _check_bounds(sections: Mapping[str, Any], nodes: int = 1) -> None:
    """Impossible sizes, refused before any plan is built (docs/design.md, "Bounded inputs")."""
    gpu = sections.get("gpu")
    if isinstance(gpu, GpuSpec) and gpu.count > MAX_GPUS_PER_MACHINE:
        raise HardwareInputError(
            f"{gpu.count:,} GPUs in one machine is beyond the bound MAX_GPUS_PER_MACHINE = "
            f"{MAX_GPUS_PER_MACHINE:,}; describe at most that many (a cluster is machines x nodes)",
            field="gpu.count",
        )
    if isinstance(gpu, GpuSpec) and gpu.count * nodes > MAX_GPUS_PER_MACHINE:
        raise HardwareInputError(
            f"{nodes:,} nodes x {gpu.count:,} GPUs = {gpu.count * nodes:,} GPUs is beyond the bound "
            f"MAX_GPUS_PER_MACHINE = {MAX_GPUS_PER_MACHINE:,}; use at most "
            f"{max(1, MAX_GPUS_PER_MACHINE // gpu.count):,} nodes of this machine",
            field="nodes",
        )


def _build_section(section: str, value: object) -> object:
    if not isinstance(value, Mapping):
        raise HardwareInputError(f"must be a mapping of fields, got {value!r}", field=section)
    defs = SECTIONS[section]
    _check_keys(value, [fd.key for fd in defs], section)
    kwargs: dict[str, object] = {}
    for fd in defs:
        path = f"{section}.{fd.key}"
        if value.get(fd.key) is None:
            if fd.required:
                raise HardwareInputError(f"missing (expected {_HINTS[fd.kind]})", field=path)
            kwargs[fd.attr] = fd.default
            continue
        kwargs[fd.attr] = _parse_field(fd, value[fd.key], path)
    return _SECTION_CLASSES[section](**kwargs)


def _parse_field(fd: FieldDef, value: object, path: str) -> object:
    if fd.kind == "str":
        if not isinstance(value, str):
            raise HardwareInputError(f"expected a text, got {value!r}", field=path)
        return value
    if fd.kind == "curve":
        return _parse_curve(value, path)
    if fd.kind in ("bytes_map", "flops_map"):
        if not isinstance(value, Mapping):
            raise HardwareInputError(f"expected {_HINTS[fd.kind]}, got {value!r}", field=path)
        out: dict[str, float] = {}
        for key, item in value.items():
            if fd.kind == "flops_map" and key not in DTYPES:
                raise HardwareInputError(
                    f"unknown dtype{closest(str(key), DTYPES)}; known: {', '.join(DTYPES)}",
                    field=f"{path}.{key}",
                )
            parse = parse_flops if fd.kind == "flops_map" else parse_bytes
            out[str(key)] = parse(item, f"{path}.{key}")
        return out
    return SCALAR_PARSERS[fd.kind](value, path)


def _parse_curve(value: object, path: str) -> Curve:
    if not isinstance(value, list) or not value:
        raise HardwareInputError(f"expected {_HINTS['curve']}, got {value!r}", field=path)
    points: list[tuple[float, float]] = []
    for i, pair in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise HardwareInputError(f"expected a pair [flops, efficiency], got {pair!r}", field=where)
        points.append((parse_number(pair[0], where), parse_fraction(pair[1], where)))
    try:
        return Curve(tuple(points))
    except HardwareInputError as err:
        raise err.within(path) from None


# -------------------------------------------------------------------------------------- overrides


def _override_items(overrides: Overrides) -> list[tuple[str, object, str]]:
    """(path, value, label) triples; label is how the user wrote the override."""
    if isinstance(overrides, Mapping):
        return [(str(k), v, f"{k}={v}") for k, v in overrides.items()]
    if isinstance(overrides, str):
        overrides = [overrides]
    items: list[tuple[str, object, str]] = []
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise HardwareInputError("expected PATH=VALUE, e.g. 'host.dram=1TB'", file=f"override {item!r}")
        path, value = item.split("=", 1)
        twice = [label for seen, _, label in items if seen == path.strip()]
        if twice:
            raise HardwareInputError(f"given twice ({twice[0]!r} and {item!r}); give each override once",
                                     file=f"override {item!r}")
        items.append((path.strip(), value.strip(), item))
    return items


def _apply_overrides(raw: dict[str, Any], overrides: Overrides) -> None:
    for path, value, label in _override_items(overrides):
        try:
            _apply_one(raw, path, value)
        except HardwareInputError as err:
            shown = label if len(label) <= 80 else f"{label[:60]}...({len(label):,} characters)"
            raise err.in_file(f"override '{shown}'") from None


def _set_source(raw: dict[str, Any], path: str, value: object) -> None:
    sources = raw.get("sources")
    if not isinstance(sources, dict):
        sources = raw["sources"] = {}
    sources[path] = f"override: {path}={value}"


def _drop_sources(raw: dict[str, Any], prefix: str) -> None:
    sources = raw.get("sources")
    if isinstance(sources, dict):
        for key in [k for k in sources if str(k) == prefix or str(k).startswith(prefix + ".")]:
            del sources[key]


def _apply_one(raw: dict[str, Any], path: str, value: object) -> None:
    parts = path.split(".")
    top = parts[0]
    if top == "sources" and len(parts) > 1:
        raw.setdefault("sources", {})[".".join(parts[1:])] = value
        return
    if top not in TOP_LEVEL or top == "sources":
        raise HardwareInputError(
            f"unknown override path{closest(top, TOP_LEVEL)}; valid top-level keys: {', '.join(TOP_LEVEL)}",
            field=path,
        )
    if top not in SECTIONS:
        if len(parts) != 1:
            raise HardwareInputError(f"'{top}' has no sub-fields", field=path)
        if top == "unified_memory":
            value = parse_bool(value, path)
        if top == "nodes":
            value = _nodes(value)
        raw[top] = value
        return
    keys = [fd.key for fd in SECTIONS[top]]
    if len(parts) == 1:
        if top in OPTIONAL_SECTIONS and str(value).lower() in ("none", "null", ""):
            raw[top] = None
            _drop_sources(raw, top)
            return
        raise HardwareInputError(
            f"give a field ({', '.join(keys)})"
            + (" or 'none' to remove the section" if top in OPTIONAL_SECTIONS else ""),
            field=path,
        )
    fd = field_def(top, parts[1])
    if fd is None:
        raise HardwareInputError(
            f"unknown override path{closest(parts[1], keys)}; valid keys under '{top}': {', '.join(keys)}",
            field=path,
        )
    section = raw.get(top)
    if not isinstance(section, dict):
        raise HardwareInputError(
            f"this machine has no '{top}' section; describe the whole section in a YAML file", field=path
        )
    if fd.kind.endswith("_map") and len(parts) == 3:
        _parse_field(fd, {parts[2]: value}, f"{top}.{fd.key}")  # checks the key and the value
        current = section.get(fd.key)
        section[fd.key] = {**(current if isinstance(current, Mapping) else {}), parts[2]: value}
        _set_source(raw, path, value)
        return
    if len(parts) != 2:
        raise HardwareInputError(f"'{top}.{fd.key}' has no sub-fields", field=path)
    if fd.kind in ("curve", "bytes_map", "flops_map") and isinstance(value, str):
        try:
            value = userfiles.parse_text(value, "hardware", "value")
        except UserFileError as err:
            raise HardwareInputError(f"malformed YAML value: {err.detail()}", field=path) from None
    parsed = _parse_field(fd, value, path)
    section[fd.key] = value
    if fd.kind.endswith("_map") and isinstance(parsed, Mapping):
        _drop_sources(raw, path)
        for key in parsed:
            _set_source(raw, f"{path}.{key}", parsed[key])
    else:
        _set_source(raw, path, value)
