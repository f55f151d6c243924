"""DeepSpeed configs in and out, checked against DeepSpeed itself (``deepspeed`` is a dev dependency; it imports
on a CPU-only machine). DeepSpeed is imported once for the module; its import time is measured and printed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from planner.job import JobRequest, make_job, make_plan
from policies.job import resolve_hardware
from tiersim.cli import main
from tiersim.deepspeed_config import map_config
from tiersim.deepspeed_export import export_plan, to_deepspeed
from tiersim.deepspeed_keys import get_path
from tiersim.deepspeed_source import DeepSpeedConfigError, DeepSpeedSource, load_source
from workloads import load_model

_t0 = time.perf_counter()
import deepspeed.runtime.config as ds_config  # noqa: E402  (a dev dependency; imported once, timed)

DS_IMPORT_S = time.perf_counter() - _t0

MODEL = "gpt2"
HIDDEN = load_model(MODEL).hidden


class _DataParallel:
    """The ``mpu`` DeepSpeedConfig asks for its world size (the data-parallel ranks)."""

    def __init__(self, n: int):
        self.n = n

    def get_data_parallel_world_size(self) -> int:
        return self.n


def deepspeed_parses(cfg: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """DeepSpeed's own parser on ``cfg`` for ``world`` ranks, without a distributed world: ``dist.get_rank``
    answers 0 (it raises outside one, and DeepSpeedConfig then takes world size 1) and ``mpu`` gives the size."""
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    return ds_config.DeepSpeedConfig(json.loads(json.dumps(cfg)), mpu=_DataParallel(world))


def test_deepspeed_import_time_is_measured() -> None:
    print(f"deepspeed.runtime.config imported in {DS_IMPORT_S:.2f} s")
    assert DS_IMPORT_S >= 0


ZERO3_NVME = {
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "sub_group_size": 1e8,
                          "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 5},
                          "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme",
                                                "pipeline_read": True, "pipeline_write": True},
                          "stage3_prefetch_bucket_size": 5e7, "overlap_comm": True},
    "activation_checkpointing": {"cpu_checkpointing": True, "partition_activations": False},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
}
ZERO_OFFLOAD = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                      "reduce_bucket_size": 5e8}}
ZERO1 = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}


def mapped(cfg: dict[str, Any], hw: str = "a100x8", flags: JobRequest | None = None) -> Any:
    return map_config(DeepSpeedSource("ds.json", json.loads(json.dumps(cfg))),
                      n_gpus=resolve_hardware(hw).gpu.count, hidden=HIDDEN, flags=flags)


def test_zero3_on_nvme_is_zero_infinity_on_nvme() -> None:
    job = mapped(ZERO3_NVME)
    assert job.policy == "zero-infinity"
    assert job.knobs["param_device"] == job.knobs["optimizer_device"] == "nvme"
    assert job.knobs["sub_group_size"] == 100_000_000 and job.knobs["pipeline_io"] is True
    assert job.knobs["offload_checkpoints"] is True
    assert (job.request.micro_batch, job.request.global_batch, job.request.precision) == (1, 16, "bf16")
    status = {e.path: e.status for e in job.entries}
    assert status["zero_optimization.stage3_prefetch_bucket_size"] == "ignored"
    assert status["optimizer.type"] == "checked"


def test_cli_simulates_zero3_nvme_config_as_zero_infinity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(ZERO3_NVME))
    rc = main(["simulate", "--deepspeed", str(ds), "--hw", "a100x8", "--model", MODEL, "--seq-len", "256", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["policy"] == "zero-infinity"
    assert (d["knobs"]["param_device"], d["knobs"]["optimizer_device"]) == ("nvme", "nvme")
    assert d["peak_bytes"]["nvme"] > 0
    assert d["deepspeed"]["input"]["policy"] == "zero-infinity" and "tiersim_version" in d


@pytest.mark.parametrize(("cfg", "policy"), [(ZERO3_NVME, "zero-infinity"), (ZERO_OFFLOAD, "zero-offload"),
                                            (ZERO1, "none")])
def test_round_trip_keeps_every_mapped_key_and_deepspeed_accepts(cfg: dict[str, Any], policy: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    job = mapped(cfg)
    assert job.policy == policy
    j, _ = make_job("a100x8", MODEL, JobRequest(**{**job.request.__dict__, "seq_len": 128}))
    exported = export_plan(make_plan(j, job.policy, job.knobs))
    for path in job.mapped_paths():
        if path == "activation_checkpointing":
            assert "activation_checkpointing" in exported.config
            continue
        assert get_path(exported.config, path) == get_path(job.config, path), path
    parsed = deepspeed_parses(exported.config, job.world_size, monkeypatch)
    assert parsed.zero_optimization_stage == get_path(exported.config, "zero_optimization.stage")
    assert parsed.train_batch_size == job.request.global_batch
    again = mapped(exported.config)
    expected = job.request if job.request.checkpointing is not None else \
        JobRequest(**{**job.request.__dict__, "checkpointing": j.config.checkpointing})  # the default picked
    assert (again.policy, again.request) == (job.policy, expected)
    assert {k: again.knobs[k] for k in job.knobs} == job.knobs


def test_exported_zero_offload_passes_deepspeeds_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    exported = to_deepspeed("zero-offload", {"tp": 1}, micro_batch=2, global_batch=32, precision="bf16",
                            checkpointing="full", n_gpus=8)
    parsed = deepspeed_parses(exported.config, 8, monkeypatch)
    assert parsed.zero_optimization_stage == 2
    assert parsed.zero_config.offload_optimizer.device == "cpu"
    assert (parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == (2, 2)
    assert parsed.bfloat16_config.enabled


@pytest.mark.parametrize("policy,knobs", [("none", {"stage": 0, "tp": 1}), ("none", {"stage": 3, "tp": 1}),
                                          ("none", {"stage": 1, "tp": 2}),
                                          ("zero-infinity", {"param_device": "cpu", "optimizer_device": "nvme",
                                                             "pipeline_io": False, "sub_group_size": 10**8})])
def test_every_exportable_policy_passes_deepspeeds_parser(policy: str, knobs: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    exported = to_deepspeed(policy, knobs, micro_batch=1, global_batch=16, precision="fp16", checkpointing="none",
                            n_gpus=8)
    world = 8 // knobs.get("tp", 1)
    assert deepspeed_parses(exported.config, world, monkeypatch).train_batch_size == 16


def test_batch_keys_are_checked_as_deepspeed_checks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    with pytest.raises(DeepSpeedConfigError, match="10 != 1 x 1 x 8"):
        mapped(bad)
    with pytest.raises(AssertionError, match="10 != 1 \\* 1 \\* 8"):
        deepspeed_parses(bad, 8, monkeypatch)
    derived = mapped({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2})
    assert derived.request.global_batch == 64 and derived.config["train_batch_size"] == 64
    assert deepspeed_parses({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 8,
                            monkeypatch).gradient_accumulation_steps == 4


def test_hf_auto_values_resolve_as_transformers_does() -> None:
    cfg = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "bf16": {"enabled": "auto"}, "gradient_clipping": "auto",
           "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"},
                                 "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}}
    job = mapped(cfg)  # no flags: TrainingArguments' defaults (per_device 8, accumulation 1, bf16 False)
    assert (job.request.micro_batch, job.request.global_batch, job.request.precision) == (8, 64, "fp32")
    assert job.config["zero_optimization"]["stage3_prefetch_bucket_size"] == int(0.9 * HIDDEN * HIDDEN)
    assert job.config["zero_optimization"]["reduce_bucket_size"] == HIDDEN * HIDDEN
    flagged = mapped(cfg, flags=JobRequest(micro_batch=2, precision="bf16", global_batch=32))
    assert (flagged.request.micro_batch, flagged.request.global_batch, flagged.request.precision) == (2, 32, "bf16")
    assert sum(e.status == "auto" for e in flagged.entries) == 7


def test_hf_trainer_and_accelerate_files(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto",
                                                  "zero_optimization": {"stage": 2}}))
    trainer = tmp_path / "train.yaml"
    trainer.write_text("per_device_train_batch_size: 4\nbf16: true\ndeepspeed: ds.json\n")
    src = load_source(str(trainer))
    job = map_config(src, n_gpus=1, hidden=HIDDEN)
    assert (job.policy, job.request.micro_batch, job.request.precision) == ("none", 4, "bf16")
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 8\ndeepspeed_config:\n"
                   "  zero_stage: 3\n  offload_optimizer_device: nvme\n  offload_param_device: cpu\n"
                   "  gradient_accumulation_steps: 2\n  zero3_init_flag: true\n")
    job = map_config(load_source(str(acc)), n_gpus=8, hidden=HIDDEN)
    assert (job.policy, job.knobs["param_device"], job.knobs["optimizer_device"]) == ("zero-infinity", "cpu", "nvme")
    assert (job.request.global_batch, job.request.precision) == (8 * 8 * 2, "bf16")
    with pytest.raises(DeepSpeedConfigError, match="num_processes 8"):
        map_config(load_source(str(acc)), n_gpus=1, hidden=HIDDEN)


@pytest.mark.parametrize("cfg,key", [
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}},
     "zero_optimization.offload_optimizer.device"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
     "zero_optimization.offload_optimizer.device"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "zero_quantized_weights": True}},
     "zero_optimization.zero_quantized_weights"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "stgae3_prefetch": 1}},
     "zero_optimization.stgae3_prefetch"),
    ({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lion"}}, "optimizer.type"),
    ({"train_micro_batch_size_per_gpu": 1, "activation_checkpointing": {"cpu_checkpointing": True},
      "zero_optimization": {"stage": 2}}, "activation_checkpointing.cpu_checkpointing"),
    ({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": "auto"}}, "zero_optimization.stage"),
])
def test_unrepresentable_keys_are_refused_in_one_line(cfg: dict[str, Any], key: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(cfg))
    rc = main(["simulate", "--deepspeed", str(ds), "--hw", "a100x8", "--model", MODEL])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and key in err


def test_deepspeed_out_refuses_policies_without_an_equivalent(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--hw", "a100", "--model", MODEL, "--policy", "tinypipe", "--deepspeed-out",
               str(tmp_path / "ds.json")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "tiersim replay" in err and not (tmp_path / "ds.json").exists()


def test_flags_that_contradict_the_config_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(ZERO1))
    assert main(["simulate", "--deepspeed", str(ds), "--model", MODEL, "--micro-batch", "2"]) == 2
    assert "train_micro_batch_size_per_gpu" in capsys.readouterr().err
    assert main(["simulate", "--deepspeed", str(ds), "--model", MODEL, "--policy", "none"]) == 2
    assert "--policy" in capsys.readouterr().err


def test_a_sweep_takes_deepspeed_configs(tmp_path: Path) -> None:
    from planner.sweep import SweepFileError, expand_grid
    from tiersim.deepspeed_cli import sweep_reader

    (tmp_path / "ds.json").write_text(json.dumps(ZERO3_NVME))
    grid = {"hardware": ["a100", "a100x8"], "models": [MODEL], "deepspeed": ["ds.json"], "workload": {"seq_len": 128}}
    points = expand_grid(grid, base=tmp_path, deepspeed=sweep_reader)
    assert [(p.inputs["hardware"], p.inputs["policy"], p.inputs["workload"]["global_batch"]) for p in points] == \
        [("a100", "zero-infinity", 2), ("a100x8", "zero-infinity", 16)]
    assert points[0].inputs["knobs"]["param_device"] == "nvme" and points[0].inputs["workload"]["seq_len"] == 128
    with pytest.raises(SweepFileError, match="run tiersim sweep"):
        expand_grid(grid, base=tmp_path)
    with pytest.raises(SweepFileError, match="deepspeed\\[0\\].*train_micro_batch_size_per_gpu"):
        expand_grid({**grid, "workload": {"micro_batch": 4}}, base=tmp_path, deepspeed=sweep_reader)


def test_the_readme_example_maps_to_zero_infinity_on_nvme() -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "ds_zero3_nvme.json"
    job = map_config(load_source(str(example)), n_gpus=8, hidden=HIDDEN, flags=JobRequest(micro_batch=2))
    assert (job.policy, job.knobs["param_device"], job.knobs["optimizer_device"]) == ("zero-infinity", "nvme", "nvme")
    assert (job.request.micro_batch, job.request.global_batch) == (2, 16)


def test_approximations_and_unknown_keys_are_said() -> None:
    job = mapped({"train_micro_batch_size_per_gpu": 1, "my_launcher_key": 3,
                  "zero_optimization": {"stage": 1, "overlap_comm": False, "offload_optimizer": {"device": "cpu",
                                                                                                 "pin_memory": False}}})
    assert job.policy == "zero-offload"
    status = {e.path: e.status for e in job.entries}
    assert status["zero_optimization.stage"] == status["zero_optimization.overlap_comm"] == "approx"
    assert status["zero_optimization.offload_optimizer.pin_memory"] == "approx"
    assert status["my_launcher_key"] == "ignored"
    assert "zero_optimization.stage" not in job.mapped_paths()  # an approximation is not round-tripped
