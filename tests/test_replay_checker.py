"""A replay doubles as a plan checker: data not where the plan put it stops the run with one line naming
the task; the CLI's bad input exits 2 with one line on stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from policies import get_policy, parse_knobs  # noqa: E402
from replay.errors import ReplayError, ReplayOom  # noqa: E402
from replay.runner import Runner  # noqa: E402
from simulator import Plan  # noqa: E402
from tiersim.api import JobRequest, make_job  # noqa: E402
from tiersim.cli import main  # noqa: E402
from workloads import ModelSpec  # noqa: E402

GPT = dict(name="tiny-gpt", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256, vocab=256,
           max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True, learned_pos=True)


def plan_dict(hw: str = "a100", batch: int = 2) -> dict[str, Any]:
    job, _ = make_job(hw, ModelSpec(**GPT), JobRequest(micro_batch=1, seq_len=32, global_batch=batch,
                                                       precision="bf16", checkpointing="full", flash_attention=True))
    info = get_policy("zero-offload")
    return info.plan(job, parse_knobs(info, {})).to_dict()


def task(d: dict[str, Any], tid: str) -> dict[str, Any]:
    return next(t for s in d["segments"] for t in s["tasks"] if t["id"] == tid)


def replay(d: dict[str, Any]) -> None:
    plan = Plan.from_dict(d)
    Runner(plan, plan.hardware).run()


def test_copy_from_a_pool_where_the_tensor_is_not() -> None:
    d = plan_dict()
    task(d, "d2h1.gpu0")["tensor"] = "param32.r0"  # lives on the cpu, the copy reads it from gpu0
    with pytest.raises(ReplayError, match=r"task 'd2h1.gpu0\[s0.0\]': copies tensor 'param32.r0' from 'gpu0', "
                                          r"but it is not there"):
        replay(d)


def test_compute_reading_a_missing_tensor() -> None:
    d = plan_dict()
    task(d, "bwd1.gpu0")["reads"] = [["act1.gpu0", "cpu"]]  # the activation is on the GPU
    with pytest.raises(ReplayError, match=r"task 'bwd1.gpu0\[s0.0\]': reads tensor 'act1.gpu0\[s0.0.0\]' on 'cpu'"):
        replay(d)


def test_backward_of_activations_never_allocated() -> None:
    d = plan_dict()
    task(d, "fwd2.gpu0")["allocs"] = []
    with pytest.raises(ReplayError, match=r"task 'bwd2.gpu0\[s0.0\]': frees tensor 'act2.gpu0\[s0.0.0\]'"):
        replay(d)


def test_optimizer_without_its_gradients() -> None:
    d = plan_dict()
    seg = d["segments"][0]
    seg["tasks"] = [t for t in seg["tasks"] if t["id"] != "d2h1.gpu0"]  # layer 1's gradients never leave the GPU
    for t in seg["tasks"]:  # and nothing waits for that copy (the backward's double-buffering dep), so it is valid
        t["deps"] = [x for x in t.get("deps", []) if x.split("@")[0].split("^")[0] != "d2h1.gpu0"]
    assert task(d, "gfree1.gpu0")["frees"] == [["gb1.gpu0", "gpu0"]]  # released on the compute stream: no leak
    with pytest.raises(ReplayError, match=r"task 'adam1.r0\[s0.0\]': the gradients of layer 1 \(step 0, micro-step 0\)"
                                          r" are not on 'cpu'"):
        replay(d)


def test_deadlock_is_named_before_running() -> None:
    d = plan_dict()
    task(d, "fwd0.gpu0")["deps"] = ["bwd0.gpu0"]
    with pytest.raises(ReplayError, match=r"deadlock: task 'fwd0.gpu0\[s0.0\]'"):
        replay(d)


def test_gpu_over_the_plans_capacity() -> None:
    d = plan_dict()
    next(t for t in d["tensors"] if t["id"] == "act1.gpu0")["bytes"] = 1e12
    with pytest.raises(ReplayOom, match=r"task 'fwd1.gpu0\[s0.0\]': out of memory on gpu0"):
        replay(d)


def test_copies_through_nvme_files(tmp_path: Path) -> None:
    d = plan_dict()
    d["tensors"].append({"id": "spill", "bytes": 4096.0, "kind": "buffer", "home": "cpu", "persistent": True})
    d["streams"].append({"id": "nvme.io", "device": "nvme", "kind": "io"})
    d["segments"][1]["tasks"] += [
        {"id": "out", "op": "copy", "stream": "nvme.io", "tensor": "spill", "src": "cpu", "dst": "nvme",
         "alloc_dst": True, "free_src": True},
        {"id": "back", "op": "copy", "stream": "nvme.io", "tensor": "spill", "src": "nvme", "dst": "cpu",
         "alloc_dst": True, "free_src": True}]
    plan = Plan.from_dict(d)
    meas = Runner(plan, plan.hardware, nvme_dir=str(tmp_path)).run()
    nvme_links = [ln for ln in meas.real_link_bytes if "nvme" in ln]
    assert nvme_links and all(meas.real_link_bytes[ln] == 4096 * 2 * plan.steps for ln in nvme_links)
    assert not list(tmp_path.iterdir())  # the file read back and freed is gone


def _one_line_error(capsys: pytest.CaptureFixture[str], rc: int, *words: str) -> None:
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0]


def test_cli_missing_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_error(capsys, main(["replay", str(tmp_path / "nope.json")]), "nope.json", "cannot read plan")


def test_cli_multi_gpu_plan_beyond_the_cores(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """More ranks than CPU cores replay only for --verify (exact training, meaningless timing)."""
    (tmp_path / "p.json").write_text(json.dumps(plan_dict("a100x8", batch=8)))
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    _one_line_error(capsys, main(["replay", str(tmp_path / "p.json"), "--device", "cpu"]), "8 GPUs", "--verify")


def test_cli_broken_plan_names_the_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = plan_dict()
    task(d, "bwd1.gpu0")["reads"] = [["act1.gpu0", "cpu"]]
    (tmp_path / "p.json").write_text(json.dumps(d))
    _one_line_error(capsys, main(["replay", str(tmp_path / "p.json")]), "bwd1.gpu0[s0.0]", "not there")


@pytest.mark.parametrize("flags,words", [
    (["--steps", "0"], ["--steps"]),
    (["--nvme-dir", "/nonexistent/dir"], ["--nvme-dir", "create it"]),
    (["--trace", "/nonexistent/dir/t.json"], ["--trace", "does not exist"]),
])
def test_cli_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]) -> None:
    (tmp_path / "p.json").write_text(json.dumps(plan_dict()))
    _one_line_error(capsys, main(["replay", str(tmp_path / "p.json"), *flags]), *words)
