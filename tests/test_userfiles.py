"""One input layer for every user file (`userfiles`): each class of hostile file, for each kind of file, is
refused by the kind's real loader with ONE line naming the file, the key (where a key is known) and the fix.

Classes: too large, not UTF-8, truncated, duplicate key, YAML alias bomb (under a free-text key too),
nested thousands deep, a 5,000-digit integer, NaN / Infinity, unsupported YAML tags. Kinds: hardware YAML,
model YAML, HF config.json, plan JSON, sweep YAML, report input JSON, DeepSpeed config JSON. Then the
impossible sizes, refused up front with the bound named, and the CLI's exit 2 for each kind.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import simulator.plan_file
import userfiles
from hardware_models import load_hardware
from planner.sweep import load_grid
from reports.inputs import load_inputs
from simulator import Plan
from tiersim.cli import main, simulate_main
from userfiles import UserFileError
from userfiles.limits import (
    KINDS,
    MAX_DEPTH,
    MAX_GPUS_PER_MACHINE,
    MAX_MODEL_LAYERS,
    MAX_MODEL_PARAMS,
    MAX_PLAN_STEPS,
    MAX_REPLAY_STEPS,
)
from workloads import load_model
from workloads.files import read_json

ROOT = Path(__file__).resolve().parent.parent
SENTINEL = "SENTINEL_VALUE_0"
MODEL_YAML = {"name": "tiny", "layers": 2, "hidden": 64, "heads": 2, "vocab": 100, "mlp": "gelu"}
HF_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 128,
             "num_attention_heads": 2, "num_hidden_layers": 2, "vocab_size": 100}
SWEEP = {"hardware": ["a100"], "models": ["gpt2"], "policies": ["none"], "workload": {"micro_batch": 1}}
DEEPSPEED = {"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real plan and a real result of the smallest job, written by the CLI."""
    folder = tmp_path_factory.mktemp("made")
    plan = folder / "plan.json"
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = simulate_main(["--hw", "a100", "--model", "gpt2", "--policy", "none", "--plan-out", str(plan), "--json"])
    assert rc == 0
    return {"plan": json.loads(plan.read_text()), "result": json.loads(out.getvalue())}


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str                        # userfiles kind
    fmt: str                         # yaml | json
    suffix: str
    base: Callable[[dict[str, Any]], dict[str, Any]]
    key: tuple[str, ...]             # where the hostile value goes (mappings only)
    load: Callable[[Path], object]   # the real loader


def _hardware_base(_: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "hardware_models" / "presets" / "a100.yaml").read_text())


def _load_report(p: Path) -> object:
    return load_inputs([str(p)])


KIND_LIST = [
    Kind("hardware", "yaml", ".yaml", _hardware_base, ("gpu", "count"), load_hardware),
    Kind("model", "yaml", ".yaml", lambda _: dict(MODEL_YAML), ("layers",), lambda p: load_model(str(p))),
    Kind("hf-config", "json", ".json", lambda _: dict(HF_CONFIG), ("hidden_size",), lambda p: load_model(str(p))),
    Kind("plan", "json", ".json", lambda m: json.loads(json.dumps(m["plan"])), ("workload", "seq_len"), Plan.load),
    Kind("sweep", "yaml", ".yaml", lambda _: json.loads(json.dumps(SWEEP)), ("workload", "micro_batch"), load_grid),
    Kind("report-input", "json", ".json", lambda m: json.loads(json.dumps(m["result"])), ("step_time_s",),
         _load_report),
    Kind("deepspeed", "json", ".json", lambda _: json.loads(json.dumps(DEEPSPEED)), ("zero_optimization", "stage"),
         lambda p: read_json(p, kind="deepspeed")),
]
KINDS_BY_NAME = {k.name: k for k in KIND_LIST}


def _with_sentinel(kind: Kind, made: dict[str, Any]) -> str:
    doc = kind.base(made)
    node = doc
    for part in kind.key[:-1]:
        node = node[part]
    node[kind.key[-1]] = SENTINEL
    if kind.fmt == "json":
        return json.dumps(doc, indent=1)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _duplicate(text: str, kind: Kind) -> str:
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if SENTINEL in line)
    first = lines[i].replace(f'"{SENTINEL}"', "1").replace(SENTINEL, "1")
    if kind.fmt == "json":
        indent = first[: len(first) - len(first.lstrip())]
        return "\n".join([*lines[:i], first.rstrip(",") + ",", f'{indent}"{kind.key[-1]}": 2'
                          + ("," if lines[i].endswith(",") else ""), *lines[i + 1:]])
    return "\n".join([*lines[:i], first, first.replace(": 1", ": 2"), *lines[i + 1:]])


BOMB = "[" + ", ".join(
    ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]) + "]"
HUGE = "9" * 5000
DEEP = "[" * 5000 + "]" * 5000
DEEP_100 = "[" * 100 + "]" * 100  # deeper than MAX_DEPTH, shallow enough for the decoder's recursion guard

# class -> (text for yaml, text for json) replacing the sentinel (None: the class does not apply),
#          words the message holds besides the file, whether the key is named
CLASSES: dict[str, tuple[str | None, str | None, tuple[str, ...], bool]] = {
    "huge integer": (HUGE, HUGE, ("integer", "MAX_INT_DIGITS", "at most 19 digits"), True),
    "NaN": (".nan", "NaN", ("finite number",), True),
    "Infinity": (".inf", "Infinity", ("finite number",), True),
    "overflowing float": ("1.0e+999", "1e999", ("finite number",), True),
    "deep nesting (thousands)": (DEEP, DEEP, ("nested deeper than 64", "MAX_DEPTH = 64", "flatten"), False),
    "deep nesting (100)": (DEEP_100, DEEP_100, ("nested deeper than 64", "MAX_DEPTH = 64"), False),
    "alias bomb": (BOMB, None, ("aliases", "MAX_YAML_EXPANSION"), True),
    "recursive alias": ("&r [*r]", None, ("alias", "itself"), True),
    "python tag": ("!!python/object/apply:os.system [echo hi]", None, ("unsupported YAML tag", "plain data"),
                   True),
}


def _write(tmp: Path, kind: Kind, body: str | bytes) -> Path:
    p = tmp / f"input{kind.suffix}"
    p.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return p


def _refusal(kind: Kind, path: Path) -> str:
    with pytest.raises(ValueError) as err:  # each loader's own error type, all ValueErrors
        kind.load(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message, message
    assert "Traceback" not in message
    return message


CASES = [(c, k.name) for c, (y, j, _, _) in CLASSES.items() for k in KIND_LIST
         if (y if k.fmt == "yaml" else j) is not None]


@pytest.mark.parametrize(("cls", "kind_name"), CASES)
def test_each_class_for_each_kind(cls: str, kind_name: str, made: dict[str, Any], tmp_path: Path) -> None:
    kind = KINDS_BY_NAME[kind_name]
    yaml_text, json_text, words, names_key = CLASSES[cls]
    hostile = yaml_text if kind.fmt == "yaml" else json_text
    assert hostile is not None
    text = _with_sentinel(kind, made)
    body = text.replace(f'"{SENTINEL}"', hostile) if kind.fmt == "json" else text.replace(SENTINEL, hostile)
    start = time.perf_counter()
    message = _refusal(kind, _write(tmp_path, kind, body))
    assert time.perf_counter() - start < 5, "refused, but not at once"
    for w in words:
        assert w in message, (w, message)
    assert "line " in message, message
    if names_key:
        assert f"key '{'.'.join(kind.key)}" in message, message


@pytest.mark.parametrize("kind_name", [k.name for k in KIND_LIST])
def test_duplicate_key(kind_name: str, made: dict[str, Any], tmp_path: Path) -> None:
    kind = KINDS_BY_NAME[kind_name]
    message = _refusal(kind, _write(tmp_path, kind, _duplicate(_with_sentinel(kind, made), kind)))
    dotted = ".".join(kind.key)
    assert f"key '{dotted}': duplicate key '{kind.key[-1]}'" in message, message
    assert "line " in message and "keep the one you mean" in message


@pytest.mark.parametrize("kind_name", [k.name for k in KIND_LIST])
def test_not_utf8_names_the_byte(kind_name: str, made: dict[str, Any], tmp_path: Path) -> None:
    kind = KINDS_BY_NAME[kind_name]
    text = _with_sentinel(kind, made)
    raw = text.encode("utf-8").replace(SENTINEL.encode(), b"caf\xe9", 1)
    message = _refusal(kind, _write(tmp_path, kind, raw))
    offset = raw.index(b"\xe9")
    assert f"not UTF-8 text: byte 0xe9 at offset {offset}" in message, message
    line = raw.count(b"\n", 0, offset) + 1
    assert f"line {line}" in message and "save the file as UTF-8" in message


@pytest.mark.parametrize("kind_name", [k.name for k in KIND_LIST])
def test_truncated_names_the_line(kind_name: str, made: dict[str, Any], tmp_path: Path) -> None:
    kind = KINDS_BY_NAME[kind_name]
    text = _with_sentinel(kind, made).replace(SENTINEL, "1")
    cut = text[: len(text) // 2].rstrip() + ("" if kind.fmt == "json" else '\n"unterminated')
    message = _refusal(kind, _write(tmp_path, kind, cut))
    assert "malformed" in message and "line " in message, message


@pytest.mark.parametrize("kind_name", [k.name for k in KIND_LIST])
def test_too_large_names_the_bound(kind_name: str, made: dict[str, Any], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    kind = KINDS_BY_NAME[kind_name]
    text = _with_sentinel(kind, made).replace(SENTINEL, "1")
    small = dataclasses.replace(KINDS[kind_name], max_bytes=len(text.encode()) - 1)
    monkeypatch.setitem(KINDS, kind_name, small)
    message = _refusal(kind, _write(tmp_path, kind, text))
    assert f"larger than {small.max_bytes:,} bytes" in message and small.limit_name in message, message


def test_the_size_bounds_are_generous_for_real_files() -> None:
    for preset in (ROOT / "hardware_models" / "presets").glob("*.yaml"):
        assert preset.stat().st_size < KINDS["hardware"].max_bytes / 100
    assert KINDS["plan"].max_bytes >= 100 * 4_600_000  # a 70B plan on 8 GPUs is ~4.6 MB


def test_bomb_under_free_text_key_is_refused_at_once(tmp_path: Path) -> None:
    text = (ROOT / "hardware_models" / "presets" / "a100.yaml").read_text()
    levels = [f"&l0 [{', '.join(['lol'] * 10)}]"] + [
        f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 12)]  # 10**12 expanded
    body = text.replace("name: ", f"description: [{', '.join(levels)}]\nname: ", 1)
    path = tmp_path / "bomb.yaml"
    path.write_text(body)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"key 'description\[.*aliases.*MAX_YAML_EXPANSION") as err:
        load_hardware(path)
    assert time.perf_counter() - start < 2
    assert str(path) in str(err.value)


def test_aliases_within_the_bound_still_work(tmp_path: Path) -> None:
    p = tmp_path / "sweep.yaml"
    p.write_text("hardware: [a100]\nmodels: [gpt2]\npolicies: [none]\n"
                 "workload: {micro_batch: &mb [1, 2], global_batch: 8}\n")
    assert len(load_grid(p)) == 2
    doc = userfiles.parse_text("a: &x {k: 1, j: [1, 2]}\nb: *x\nc:\n  <<: *x\n  k: 2\n", "sweep", "s.yaml")
    assert doc == {"a": {"k": 1, "j": [1, 2]}, "b": {"k": 1, "j": [1, 2]}, "c": {"k": 2, "j": [1, 2]}}


def test_plain_data_only() -> None:
    doc = userfiles.parse_text("d: 2024-01-01\ne: =\nf: 0x10\ng: -9223372036854775807\n", "model", "m.yaml")
    assert doc == {"d": "2024-01-01", "e": "=", "f": 16, "g": -(2**63 - 1)}
    for text, word in [("? [a, b]\n: c\n", "a key must be a plain value"), ("a: !!binary aGk=\n", "unsupported"),
                       ("a: 1\n---\nb: 2\n", "malformed YAML"), ("a: \x07\n", "not allowed in YAML"),
                       ("a: 9223372036854775808\n", "out of range"), ("a: \x00\n", "not allowed")]:
        with pytest.raises(UserFileError, match=word):
            userfiles.parse_text(text, "model", "m.yaml")
    assert userfiles.parse_text('{"a": -9223372036854775807, "b": 1.5e300}', "plan", "p.json") == {
        "a": -(2**63 - 1), "b": 1.5e300}
    with pytest.raises(UserFileError, match="out of range"):
        userfiles.parse_text('{"a": 9223372036854775808}', "plan", "p.json")


def test_the_error_is_one_picklable_line_with_its_parts() -> None:
    import pickle
    err = UserFileError("duplicate key 'x'", file="f.yaml", key="a.x", line=3, column=2, fix="keep one")
    assert str(err) == "f.yaml: line 3, column 2: key 'a.x': duplicate key 'x'; keep one"
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.key, again.line) == (str(err), "a.x", 3)
    assert str(UserFileError("x", key="k" * 500)).count("...") == 1


# ------------------------------------------------------------------------------- impossible sizes


def test_gpu_count_beyond_the_bound(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"gpu.count.*beyond the bound MAX_GPUS_PER_MACHINE = "
                                         rf"{MAX_GPUS_PER_MACHINE:,}"):
        load_hardware("a100", [f"gpu.count={MAX_GPUS_PER_MACHINE + 1}"])
    assert load_hardware("a100", [f"gpu.count={MAX_GPUS_PER_MACHINE}"]).gpu.count == MAX_GPUS_PER_MACHINE
    doc = _hardware_base({})
    doc["gpu"]["count"] = 10**9
    p = tmp_path / "huge.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=rf"{p}.*gpu.count.*1,000,000,000.*MAX_GPUS_PER_MACHINE"):
        load_hardware(p)


def test_model_beyond_the_parameter_bound(tmp_path: Path) -> None:
    p = tmp_path / "huge.yaml"
    p.write_text(yaml.safe_dump({**MODEL_YAML, "layers": 1000, "hidden": 131072, "heads": 128}))
    bound = f"MAX_MODEL_PARAMS = {MAX_MODEL_PARAMS:,}"
    with pytest.raises(ValueError, match=rf"{p}.*parameters is beyond the bound {bound}"):
        load_model(str(p))
    p.write_text(yaml.safe_dump({**MODEL_YAML, "layers": MAX_MODEL_LAYERS + 1}))
    with pytest.raises(ValueError, match=rf"{MAX_MODEL_LAYERS + 1:,} layers is beyond the bound MAX_MODEL_LAYERS"):
        load_model(str(p))
    p.write_text(yaml.safe_dump({**MODEL_YAML, "layers": MAX_MODEL_LAYERS}))
    assert load_model(str(p)).n_layers == MAX_MODEL_LAYERS


def test_plan_steps_and_tasks_beyond_the_bounds(made: dict[str, Any], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan = json.loads(json.dumps(made["plan"]))
    plan["steps"] = 10**9
    p = tmp_path / "steps.json"
    p.write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=rf"'steps' is 1,000,000,000.*MAX_PLAN_STEPS = {MAX_PLAN_STEPS}"):
        Plan.load(p)
    plan["steps"] = 2
    plan["segments"][0]["repeat"] = 10**12
    p.write_text(json.dumps(plan))
    with pytest.raises(ValueError, match="MAX_PLAN_SIMULATED_TASKS"):
        Plan.load(p)
    plan["segments"][0]["repeat"] = 1
    p.write_text(json.dumps(plan))
    tasks = sum(len(s["tasks"]) for s in plan["segments"])
    monkeypatch.setattr(simulator.plan_file, "MAX_PLAN_TASKS", tasks - 1)
    with pytest.raises(ValueError, match=rf"{tasks:,} tasks, beyond the bound MAX_PLAN_TASKS = {tasks - 1:,}"):
        Plan.load(p)


CLI_BOUNDS = {
    "--set gpu.count=1000000000": (["simulate", "--hw", "a100", "--model", "gpt2", "--set", "gpu.count=1000000000"],
                                   "MAX_GPUS_PER_MACHINE"),
    "replay --steps 1000000000": (["replay", "nowhere.json", "--steps", "1000000000"],
                                  f"MAX_REPLAY_STEPS = {MAX_REPLAY_STEPS:,}"),
}


@pytest.mark.parametrize("case", list(CLI_BOUNDS))
def test_cli_refuses_impossible_sizes_at_once(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv, word = CLI_BOUNDS[case]
    start = time.perf_counter()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert time.perf_counter() - start < 10
    assert (rc, out) == (2, ""), err
    assert len(err.splitlines()) == 1 and word in err, err


# ----------------------------------------------------------------------------------- the CLI


CLI_KINDS = {
    "hardware": lambda p: ["simulate", "--hw", str(p), "--model", "gpt2"],
    "model": lambda p: ["simulate", "--hw", "a100", "--model", str(p)],
    "hf-config": lambda p: ["simulate", "--hw", "a100", "--model", str(p)],
    "plan": lambda p: ["simulate", "--plan", str(p)],
    "sweep": lambda p: ["sweep", str(p), "--store", str(p.parent / "store.sqlite")],
    "report-input": lambda p: ["report", str(p), "-o", str(p.parent / "out")],
}


@pytest.mark.parametrize("kind_name", list(CLI_KINDS))
def test_cli_exit_2_one_line(kind_name: str, made: dict[str, Any], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    kind = KINDS_BY_NAME[kind_name]
    text = _with_sentinel(kind, made)
    path = _write(tmp_path, kind, _duplicate(text, kind))
    rc = main(CLI_KINDS[kind_name](path))
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), (out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(path) in err and f"duplicate key '{kind.key[-1]}'" in err and "line " in err, err


def test_depth_bound_is_the_documented_one() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    for name in ("MAX_DEPTH", "MAX_GPUS_PER_MACHINE", "MAX_MODEL_PARAMS", "MAX_PLAN_TASKS", "MAX_PLAN_STEPS",
                 "MAX_PLAN_SIMULATED_TASKS", "MAX_REPLAY_STEPS", "MAX_INT_DIGITS", "MAX_YAML_EXPANSION"):
        assert name in text, f"{name} is not documented in docs/design.md"
    assert MAX_DEPTH == 64


WRONG_TYPES = {  # issue 17's examples of wrong types in user files: one line, exit 2
    "architectures: 5": ("config.json", {**{k: v for k, v in HF_CONFIG.items() if k != "model_type"},
                                         "architectures": 5}, ["workload", "check", "--model"], "architectures"),
    "a list as a plan tag": ("plan.json", None, ["simulate", "--plan"], "tag 'layer'"),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_wrong_types_are_one_line(case: str, made: dict[str, Any], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    name, doc, argv, word = WRONG_TYPES[case]
    if doc is None:
        doc = json.loads(json.dumps(made["plan"]))
        doc["segments"][0]["tasks"][0].setdefault("tags", {})["layer"] = []
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    rc = main([*argv, str(path)])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), (out, err)
    assert len(err.splitlines()) == 1 and str(path) in err and word in err, err


ISSUE_13 = {  # issue 13's hostile files: each one line and exit 2 at once (they were tracebacks)
    "hardware YAML with a 5,000-digit host.dram": (
        "hw.yaml", lambda: (ROOT / "hardware_models" / "presets" / "a100.yaml").read_text().replace(
            "dram: 256GB", "dram: " + "9" * 5000), ["simulate", "--model", "gpt2", "--hw"], "host.dram"),
    "HF config with a huge integer": (
        "config.json", lambda: json.dumps(HF_CONFIG).replace('"vocab_size": 100', '"vocab_size": ' + "9" * 5000),
        ["simulate", "--hw", "a100", "--model"], "vocab_size"),
    "plan with a huge integer (simulate)": (
        "plan.json", lambda: '{"schema": "tiersim.plan", "version": ' + "9" * 5000 + "}", ["simulate", "--plan"],
        "version"),
    "plan with a huge integer (replay)": (
        "plan.json", lambda: '{"schema": "tiersim.plan", "version": ' + "9" * 5000 + "}", ["replay"], "version"),
    "plan nested 5,000 deep (simulate)": ("plan.json", lambda: DEEP, ["simulate", "--plan"], "MAX_DEPTH"),
    "plan nested 5,000 deep (replay)": ("plan.json", lambda: DEEP, ["replay"], "MAX_DEPTH"),
}


@pytest.mark.parametrize("case", list(ISSUE_13))
def test_issue_13_hostile_files(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, text, argv, word = ISSUE_13[case]
    path = tmp_path / name
    path.write_text(text())
    start = time.perf_counter()
    rc = main([*argv, str(path)])
    out, err = capsys.readouterr()
    assert time.perf_counter() - start < 10
    assert (rc, out) == (2, ""), (out, err)
    assert len(err.splitlines()) == 1 and str(path) in err and word in err and "Traceback" not in err, err


def test_yaml_numbers_are_yaml_1_2() -> None:
    """No silent octal or base-60: ``010`` is 10 and ``1:30`` is text (YAML 1.1 reads 8 and 90)."""
    doc = userfiles.parse_text("a: 010\nb: 1:30\nc: 0o17\nd: 0x1F\ne: 1_000\nf: 190:20:30.5\n", "sweep", "s.yaml")
    assert doc == {"a": 10, "b": "1:30", "c": 15, "d": 31, "e": 1000, "f": "190:20:30.5"}
    with pytest.raises(UserFileError, match="key 'a': 'abc' is not an integer"):
        userfiles.parse_text("a: !!int abc\n", "sweep", "s.yaml")


def test_plan_metrics_and_notes_are_typed(made: dict[str, Any], tmp_path: Path) -> None:
    """Found by the fuzzer: a null metric reached the result builder, a list as a stream's device the
    plan check (TypeErrors)."""
    for field, value, word in [("metrics", {"n_gpus": None}, "'metrics.n_gpus' must be a finite number"),
                               ("metrics", [1], "'metrics' must be a mapping"),
                               ("notes", "text", "'notes' must be a list of texts"),
                               ("streams", None, r"streams\[0\]: field 'device' must be a text")]:
        plan = json.loads(json.dumps(made["plan"]))
        if field == "streams":  # found by the fuzzer: a list as a stream's device (TypeError in validate_plan)
            plan["streams"][0]["device"] = ["gpu0"]
        else:
            plan[field] = value
        p = tmp_path / "plan.json"
        p.write_text(json.dumps(plan))
        with pytest.raises(ValueError, match=word):
            Plan.load(p)
