"""A sweep file (YAML) → the list of points to simulate, each keyed by a hash of its canonical inputs.

The file names a grid; every list is one axis and the points are the product of all axes::

    hardware:                      # preset names / YAML files, or a preset with --set variations
      - a100
      - preset: a100
        set: {pcie.gen: [3, 5]}    # a list is an axis: two variants here
    models: [gpt2, opt-1.3b]       # presets, config.json or model YAML files
    policies:                      # a list of names (default knobs), "all", or name -> knobs
      <policy>: {<knob>: [0, 2]}   # a list of knob values is an axis too
      <other policy>: {}
    workload:                      # each field a value or a list of values; absent = simulate's default
      global_batch: 16
      micro_batch: [1, 2]
      seq_len: 512
      precision: bf16              # bf16 | fp16 | fp32
      checkpointing: [none, full]  # none | selective | full
      flash_attention: true
      checkpoint_early_stop: false # full checkpointing as PyTorch's non-reentrant early stop runs it
    deepspeed: [ds_z3.json]        # DeepSpeed configs (tiersim sweep only): each is one more policy entry whose
                                   # knobs and workload come from the file (the workload values above act as
                                   # flags: they resolve "auto" and must agree with the file)

Files named in the sweep file are relative to it. Everything is checked before any simulation: a bad
field is one :class:`SweepFileError` line naming the file, the field and the fix. The key of a point
hashes what the simulation depends on — the resolved hardware figures (overrides applied, sources left
out), the model's dimensions, the policy with all its knobs (defaults filled in) and the workload request —
so the same run written two ways (``stage: 0`` or no knob at all) is one run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import userfiles
from hardware_models import HardwareInputError, HardwareSpec, load_hardware
from planner.version import tiersim_version
from policies import POLICIES, KnobError, get_policy, parse_knobs
from userfiles import UserFileError
from workloads import ModelSpec, WorkloadInputError, load_model

KEY_VERSION = 1  # bump when the meaning of a point's inputs changes, so old rows are not reused
SECTIONS = ("hardware", "models", "policies", "workload", "deepspeed")
#: ``deepspeed: [ds.json, ...]``: a DeepSpeed config file, its hardware, model and the YAML's workload values (as
#: flags) -> (policy, knobs, workload). ``tiersim sweep`` passes tiersim's reader (``tiersim.deepspeed_cli``),
#: which the planner may not import; a ValueError is the file's one-line error.
DeepSpeedReader = Callable[[str, HardwareSpec, ModelSpec, Mapping[str, Any]],
                           tuple[str, dict[str, Any], dict[str, Any]]]
WORKLOAD_FIELDS: dict[str, tuple[type, tuple[Any, ...] | None]] = {
    "global_batch": (int, None), "micro_batch": (int, None), "seq_len": (int, None),
    "precision": (str, ("bf16", "fp16", "fp32")), "checkpointing": (str, ("none", "selective", "full")),
    "flash_attention": (bool, None), "checkpoint_early_stop": (bool, None),
}


class SweepFileError(ValueError):
    """A sweep file that cannot be expanded: one line naming the file, the field and the fix."""


@dataclass(frozen=True)
class Point:
    """One simulation of the sweep. ``inputs`` is what the worker needs (and what is stored as ``point``)."""

    key: str
    inputs: Mapping[str, Any]


def load_grid(path: str | Path, *, deepspeed: DeepSpeedReader | None = None) -> list[Point]:
    """Read and expand a sweep file (see the module docstring); raises :class:`SweepFileError`."""
    p = Path(path)
    try:
        data = userfiles.read_yaml(p, "sweep")  # size, UTF-8, duplicate keys, aliases, depth, numbers
    except UserFileError as e:
        raise SweepFileError(str(e)) from e
    return expand_grid(data, label=str(path), base=p.parent, deepspeed=deepspeed)


def expand_grid(data: object, *, label: str = "sweep", base: Path | None = None,
                deepspeed: DeepSpeedReader | None = None) -> list[Point]:
    """Expand a parsed sweep mapping into points (in file order, the product of every axis, no duplicates);
    ``deepspeed`` reads the files of a ``deepspeed`` section (each one more policy entry, with its workload)."""
    base = base or Path.cwd()
    if not isinstance(data, Mapping):
        raise SweepFileError(f"{label}: expected a mapping with {', '.join(SECTIONS)}; see examples/sweep.yaml")
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise SweepFileError(f"{label}: unknown section {unknown[0]!r}; sections are {', '.join(SECTIONS)}")
    for required in ("hardware", "models") if data.get("deepspeed") else ("hardware", "models", "policies"):
        if not data.get(required):
            raise SweepFileError(f"{label}: {required}: missing or empty; list at least one")
    hardware = _hardware_axis(data["hardware"], label, base)
    models = _models_axis(data["models"], label, base)
    policies = _policies_axis(data["policies"], label) if data.get("policies") else []
    workloads = _workload_axis(data.get("workload") or {}, label)
    _check_workloads(hardware, models, workloads, label)
    points: dict[str, Point] = {}
    combos = [(hw, m, w, pol) for hw, m, w, pol in itertools.product(hardware, models, workloads, policies)]
    combos += _deepspeed_axis(data.get("deepspeed"), hardware, models, workloads, label, base, deepspeed)
    for (hw_name, sets, spec), (model_name, model), workload, (policy, knobs, full_knobs) in combos:
        canonical = {"v": KEY_VERSION, "tiersim": tiersim_version(),  # another version: another run
                     "hardware": _hardware_figures(spec), "model": dataclasses.asdict(model),
                     "policy": policy, "knobs": full_knobs, "workload": workload}
        key = hashlib.sha256(_canonical_json(canonical).encode()).hexdigest()[:32]
        inputs = {"hardware": hw_name, "set": list(sets), "model": model_name, "policy": policy,
                  "knobs": dict(knobs), "workload": dict(workload)}
        points.setdefault(key, Point(key, inputs))
    return list(points.values())


def _deepspeed_axis(section: object, hardware: list[Any], models: list[Any], workloads: list[dict[str, Any]],
                    label: str, base: Path, reader: DeepSpeedReader | None) -> list[tuple[Any, ...]]:
    """(hardware, model, workload, (policy, knobs, full knobs)) of each DeepSpeed file on each machine and model."""
    if not section:
        return []
    if reader is None:
        raise SweepFileError(f"{label}: deepspeed: DeepSpeed configs are read by the tiersim CLI; run tiersim sweep")
    out = []
    for i, name in enumerate(_as_list(section)):
        if not isinstance(name, str) or not name.strip():
            raise SweepFileError(f"{label}: deepspeed[{i}]: expected a DeepSpeed config file")
        path = _file_or_name(name, base)
        for hw, model, flags in itertools.product(hardware, models, workloads):
            try:
                policy, knobs, workload = reader(path, hw[2], model[1], flags)
                full = dataclasses.asdict(parse_knobs(get_policy(policy), knobs))
            except ValueError as e:
                raise SweepFileError(f"{label}: deepspeed[{i}]: {_one_line(e)}") from None
            out.append((hw, model, workload, (policy, knobs, full)))
    return out


def _hardware_figures(spec: HardwareSpec) -> dict[str, Any]:
    """The spec's figures without their provenance (an override to a preset's own value changes nothing)."""
    d = spec.to_dict()
    d.pop("sources", None)
    return d


def _canonical_json(x: object) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), default=str)


def _as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _axis(value: object, where: str) -> list[Any]:
    """The values of one axis; an empty list would make the grid empty, so it is refused."""
    values = _as_list(value)
    if not values:
        raise SweepFileError(f"{where}: empty list, so the grid would have no point; give at least one value "
                             "(or drop the field for its default)")
    return values


def _file_or_name(name: str, base: Path) -> str:
    """A name that is a file relative to the sweep file becomes an absolute path (workers run elsewhere)."""
    candidate = (base / name).expanduser()
    looks_like_file = name.endswith((".yaml", ".yml", ".json")) or "/" in name
    return str(candidate.resolve()) if looks_like_file and candidate.exists() else name


def _hardware_axis(section: object, label: str, base: Path) -> list[tuple[str, tuple[str, ...], HardwareSpec]]:
    out = []
    for i, entry in enumerate(_as_list(section)):
        where = f"{label}: hardware[{i}]"
        sets_map: Mapping[str, Any]
        if isinstance(entry, str):
            name, sets_map = entry, {}
        elif isinstance(entry, Mapping):
            bad = [k for k in entry if k not in ("preset", "set")]
            if bad or "preset" not in entry or not isinstance(entry["preset"], str):
                raise SweepFileError(f"{where}: expected a preset name or {{preset: NAME, set: {{PATH: VALUE(S)}}}}")
            name, sets_map = entry["preset"], entry.get("set") or {}
            if not isinstance(sets_map, Mapping):
                raise SweepFileError(f"{where}.set: expected a mapping PATH: VALUE or PATH: [VALUES], "
                                     "e.g. {pcie.gen: [4, 5]}")
        else:
            raise SweepFileError(f"{where}: expected a preset name or {{preset: NAME, set: {{...}}}}")
        name = _file_or_name(name, base)
        axes = [[f"{path}={_yaml_scalar(v, f'{where}.set.{path}')}" for v in _axis(values, f"{where}.set.{path}")]
                for path, values in sets_map.items()]
        for sets in itertools.product(*axes):
            try:
                spec = load_hardware(name, list(sets))
            except HardwareInputError as e:
                raise SweepFileError(f"{where}: {_one_line(e)}") from None
            out.append((name, tuple(sets), spec))
    return out


def _yaml_scalar(v: object, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Mapping | list):
        raise SweepFileError(f"{where}: {v!r} is not a value; give a number or a string such as 1TB or 25GB/s")
    return str(v)


def _models_axis(section: object, label: str, base: Path) -> list[tuple[str, ModelSpec]]:
    out = []
    for i, entry in enumerate(_as_list(section)):
        if not isinstance(entry, str) or not entry.strip():
            raise SweepFileError(f"{label}: models[{i}]: expected a model preset (tiersim models list) or a file")
        name = _file_or_name(entry, base)
        try:
            out.append((name, load_model(name)))
        except WorkloadInputError as e:
            raise SweepFileError(f"{label}: models[{i}]: {_one_line(e)}") from None
    return out


def _policies_axis(section: object, label: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(policy, knobs as written, every knob with defaults filled in) for each policy × knob combination."""
    if section == "all":
        section = list(POLICIES)
    if isinstance(section, list):
        if not all(isinstance(n, str) for n in section):
            raise SweepFileError(f"{label}: policies: expected policy names or a mapping name -> knobs")
        section = dict.fromkeys(section)
    if not isinstance(section, Mapping):
        raise SweepFileError(f"{label}: policies: expected a list of names, 'all', or a mapping name -> {{knob: "
                             "value(s)}}")
    out = []
    for name, knob_axes in section.items():
        where = f"{label}: policies.{name}"
        try:
            info = get_policy(str(name))
        except KnobError as e:
            raise SweepFileError(f"{where}: {_one_line(e)}") from None
        knob_axes = knob_axes or {}
        if not isinstance(knob_axes, Mapping):
            raise SweepFileError(f"{where}: expected a mapping knob -> value or [values] "
                                 f"(tiersim policies show {name})")
        names = list(knob_axes)
        for values in itertools.product(*(_axis(knob_axes[k], f"{where}.{k}") for k in names)):
            knobs = dict(zip(names, values, strict=True))
            try:
                full = dataclasses.asdict(parse_knobs(info, knobs))
            except (KnobError, TypeError, ValueError) as e:
                raise SweepFileError(f"{where}: {_one_line(e)} (tiersim policies show {name})") from None
            out.append((info.name, knobs, full))
    return out


def _workload_axis(section: object, label: str) -> list[dict[str, Any]]:
    if not isinstance(section, Mapping):
        raise SweepFileError(f"{label}: workload: expected a mapping field -> value(s), fields: "
                             f"{', '.join(WORKLOAD_FIELDS)}")
    names = list(section)
    for name in names:
        if name not in WORKLOAD_FIELDS:
            raise SweepFileError(f"{label}: workload.{name}: unknown field; fields: {', '.join(WORKLOAD_FIELDS)}")
        kind, choices = WORKLOAD_FIELDS[name]
        for v in _axis(section[name], f"{label}: workload.{name}"):
            ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
            if ok and kind is int:
                ok = v > 0
            if ok and choices is not None:
                ok = v in choices
            if not ok:
                want = f"one of {', '.join(map(str, choices))}" if choices else (
                    "true or false" if kind is bool else "a positive integer")
                raise SweepFileError(f"{label}: workload.{name}: {v!r} is not valid; give {want} or a list of them")
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(_as_list(section[n])
                                                                                    for n in names))]


def _check_workloads(hardware: list[tuple[str, tuple[str, ...], HardwareSpec]], models: list[tuple[str, ModelSpec]],
                     workloads: list[dict[str, Any]], label: str) -> None:
    """Refuse up front, as ``simulate`` refuses the same flags, a workload that contradicts itself, its model or a
    machine of the grid (each point would otherwise be stored as a failure). A global batch that does not
    divide by micro-batch x the data-parallel degree is left to the point: the degree is the policy's, and a
    grid's product of axes may hold such points beside good ones; each is stored as failed with its reason."""
    for w in workloads:
        seq, prec = w.get("seq_len"), w.get("precision")
        for model_name, model in models:
            if seq is not None and model.learned_pos and seq > model.max_pos:
                raise SweepFileError(f"{label}: workload.seq_len: {seq} exceeds the max_pos {model.max_pos} of model "
                                     f"{model_name!r} (learned position embeddings); give seq_len <= {model.max_pos}")
        for hw_name, sets, spec in hardware:
            if prec is not None and prec not in spec.gpu.peak_flops:
                where = f"{hw_name}{' with ' + ', '.join(sets) if sets else ''}"
                raise SweepFileError(f"{label}: workload.precision: {where} ({spec.gpu.model}) lists no peak for "
                                     f"{prec}; give one of {', '.join(spec.gpu.peak_flops)}")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
