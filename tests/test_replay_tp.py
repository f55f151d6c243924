"""Tensor-parallel replay (replay.tensor_parallel): a plan with tp=2 runs as two ranks that each hold their
Megatron shards, with the plan's all-reduces real, and trains what one process trains (fp32, within
replay.reference.RTOL_TP); and a pipeline whose head shares the embedding's table on another stage sums
the two copies' gradients as the plan says (bit-exact at two ranks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from policies import get_policy, parse_knobs  # noqa: E402
from replay.dist_launch import run_ranks  # noqa: E402
from replay.dist_merge import replica_spread  # noqa: E402
from replay.errors import ReplayError  # noqa: E402
from replay.model import Dims, build_layers  # noqa: E402
from replay.ranks import check_multi_rank, rank_view, shared_groups  # noqa: E402
from replay.reference import (  # noqa: E402
    RTOL_TP,
    compare,
    noise_only,
    not_compared,
    rtol_for,
    tied_sync_split,
    train_reference,
    weights_gated,
)
from replay.store import Batching  # noqa: E402
from replay.tensor_parallel import TpPlace, shard_layers, unshard  # noqa: E402
from simulator import Plan  # noqa: E402
from tiersim.api import JobRequest, make_job  # noqa: E402
from tiersim.cli import main  # noqa: E402
from workloads import ModelSpec  # noqa: E402

LLAMA: dict[str, Any] = dict(name="tiny-llama", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
             ffn=192, vocab=256, max_pos=128, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False,
             learned_pos=False)
GPT: dict[str, Any] = dict(name="tiny-gpt", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256,
           vocab=256, max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True, learned_pos=True)
SEED = 1234


def tp_plan(policy: str, model: dict, knobs: dict, gpus: int = 2, precision: str = "fp32",
            checkpointing: str = "full") -> Plan:
    job, _ = make_job("a100", ModelSpec(**model),
                      JobRequest(micro_batch=1, seq_len=32, global_batch=2 * gpus, precision=precision,
                                 checkpointing=checkpointing, flash_attention=True),
                      hw_overrides=[f"gpu.count={gpus}"])
    info = get_policy(policy)
    return info.plan(job, parse_knobs(info, {k: str(v) for k, v in knobs.items()}))


def test_shards_join_back_to_the_model() -> None:
    """Each rank's shards (heads, MLP columns, vocab rows) join back to the whole model; replicated tensors
    (norms, the row-parallel biases, the head) are every rank's."""
    for model in (LLAMA, GPT):
        d = Dims.from_model(ModelSpec(**model))
        whole = build_layers(d, SEED)
        parts = []
        for j in range(2):
            layers = build_layers(d, SEED)
            shard_layers(layers, d, TpPlace(j, 2, not d.tied))
            parts.append(layers)
        assert parts[0][1].get_parameter("q.weight").shape == (32, 64)
        assert parts[1][1].get_parameter("down.weight").shape == (64, d.ffn // 2)
        for i, m in enumerate(whole):
            got = unshard(i, len(whole), [dict(p[i].named_parameters()) for p in parts], not d.tied)
            assert set(got) == set(dict(m.named_parameters()))
            for n, t in m.named_parameters():
                assert torch.equal(got[n], t), (i, n)


def test_tp2_llama_trains_like_one_process() -> None:
    """none with tp=2 (one tensor-parallel group of two, no data parallelism): every block's two all-reduces
    forward, recomputation and backward, the vocab-parallel embedding, the vocab-parallel head and cross-entropy."""
    plan = tp_plan("none", LLAMA, {"tp": 2})
    check_multi_rank(plan)
    assert [s for s, _ in shared_groups(plan)] == ["tp0"]
    got = run_ranks(plan, plan.hardware, device="cpu", seed=SEED, verify=True)
    assert got is not None
    meas, ranks = got
    assert [r.tp for r in ranks] == [TpPlace(0, 2, True), TpPlace(1, 2, True)] and ranks[0].dp_world == 1
    cfg = plan.workload.config
    dims = Dims.from_model(plan.workload.model)
    ref_l, ref_w = train_reference(dims, Batching(SEED, cfg.micro_batch, cfg.seq_len, cfg.precision), plan.steps,
                                   ranks[0].accum, delayed=False, device=torch.device("cpu"), world=1)
    v = compare(meas.losses, meas.weights, ref_l, ref_w, "plain", rtol_for(1, "fp32", 2))
    assert v.ok and v.rtol == RTOL_TP, v
    assert v.max_loss_rel_err < 1e-6  # the forward is right to a few ulps; weights: Adam amplifies them
    assert replica_spread(ranks) == 0.0 and not meas.leaked
    # the shards really are halves, and every tp collective of the plan ran on both ranks
    q = dict(ranks[0].shapes[1])["q.weight"]
    assert q == (32, 64)
    tp_tasks = {t.id for seg in plan.segments for t in seg.tasks if str(t.tags.get("phase")).startswith("tp-")}
    ran = {r.id for r in meas.records if str(r.tags.get("phase")).startswith("tp-")}
    # Megatron's collectives, each its own task: a block's two in each use, the embedding's forward one (none in its
    # backward), the head's max / target-logit / exp-sum all-reduces forward and its input gradient's backward
    assert ran == tp_tasks and {"tpf1a.k0", "tpf1.k0", "tpr1a.k0", "tpr1.k0", "tpb1a.k0", "tpb1.k0", "tpf0.k0",
                                "tpf3a.k0", "tpf3b.k0", "tpf3.k0", "tpb3.k0"} <= ran and "tpb0.k0" not in ran
    assert sum(meas.real_link_bytes.values()) > 0


def test_cli_tp2_zero_offload_tied_gpt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The user's workflow: simulate's plan with --knob tp=2, then `tiersim replay --verify`: ZeRO-Offload's
    CPU Adam of each rank's shards, a GPT-style model (biases, LayerNorm, learned positions, tied head)."""
    tp_plan("zero-offload", GPT, {"tp": 2}).save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--verify", "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["verify"]["ok"], d["verify"]
    assert d["verify"]["tensor_parallel"] == 2 and d["verify"]["not_compared"] == ["k.bias"]
    assert d["verify"]["rtol"] == RTOL_TP and d["verify"]["max_loss_rel_err"] < 1e-6
    assert d["measured"]["ranks"] == 2 and d["measured"]["replica_spread"] == 0.0
    assert {"tp0", "cpu.adam0", "cpu.adam1"} <= set(d["error"]["stream_busy"])
    assert noise_only(Dims.from_model(ModelSpec(**GPT))) == {"k.bias"}
    assert noise_only(Dims.from_model(ModelSpec(**LLAMA))) == frozenset()


def test_tied_head_on_the_last_stage_sums_the_table_gradients() -> None:
    """tinypipe with two stages of a tied model: the last stage keeps its own copy of the table, the plan's
    tied-grad-sync all-reduce sums the two copies' gradients, and both copies stay equal to one process's."""
    plan = tp_plan("tinypipe", GPT, {"stages": 2}, precision="bf16")
    ties = [t for seg in plan.segments for t in seg.tasks if t.tags.get("phase") == "tied-grad-sync"]
    assert ties and all(t.op == "collective" for t in ties)
    got = run_ranks(plan, plan.hardware, device="cpu", seed=SEED, verify=True)
    assert got is not None
    meas, ranks = got
    cfg = plan.workload.config
    ref_l, ref_w = train_reference(Dims.from_model(plan.workload.model),
                                   Batching(SEED, cfg.micro_batch, cfg.seq_len, cfg.precision), plan.steps,
                                   ranks[0].accum, delayed=False, device=torch.device("cpu"), world=1,
                                   tied_split=tied_sync_split(plan))
    v = compare(meas.losses, meas.weights, ref_l, ref_w, "plain", rtol_for(1, cfg.precision))
    assert tied_sync_split(plan) and v.ok and v.max_weight_rel_err == 0.0, v
    assert "wte" in ranks[1].weights[-1] and replica_spread(ranks) == 0.0  # the copy is the table, bit for bit
    assert {r.id for r in meas.records} >= {t.id for t in ties}


def test_tied_sum_on_the_host_is_refused_in_one_line() -> None:
    d = tp_plan("tinypipe", GPT, {"stages": 2}).to_dict()
    for seg in d["segments"]:
        for t in seg["tasks"]:
            if t["tags"].get("phase") == "tied-grad-sync":
                t.update(op="noop", coll=None, bytes=0, ranks=[])
                t["tags"]["on"] = "cpu"
    with pytest.raises(ReplayError, match="summed on the host .* each copy lives in its own rank's process"):
        check_multi_rank(Plan.from_dict(d))
    for seg in d["segments"]:
        seg["tasks"] = [t for t in seg["tasks"] if t["tags"].get("phase") != "tied-grad-sync"]
        for t in seg["tasks"]:
            t["deps"] = [x for x in t.get("deps", []) if not str(x).startswith("tie.")]
    with pytest.raises(ReplayError, match="never sums the two copies' gradients"):
        check_multi_rank(Plan.from_dict(d))


def test_a_vocab_that_does_not_split_is_refused() -> None:
    plan = tp_plan("none", dict(LLAMA, vocab=255), {"tp": 2})
    with pytest.raises(ReplayError, match=r"tp=2: the vocabulary of 255 does not split over 2 ranks"):
        check_multi_rank(plan)


def test_a_host_stream_serving_every_rank_is_refused_in_one_line() -> None:
    """NVMe reads of every rank's slices on one host stream, with no rank tag (what zero-infinity planned before
    each rank's swapper got its own read): refused in one line."""
    d = tp_plan("zero-infinity", LLAMA, {"param_device": "nvme"}).to_dict()
    d["streams"] = [s for s in d["streams"] if s["id"] != "cpu.pread1"]
    for seg in d["segments"]:
        for t in seg["tasks"]:
            if t["stream"] in ("cpu.pread0", "cpu.pread1"):
                t["stream"] = "cpu.pread0"
                t["tags"].pop("rank", None)
    with pytest.raises(ReplayError, match=r"stream 'cpu.pread0' on 'cpu' serves every rank at once .* "
                                          r"per-rank host tasks"):
        rank_view(Plan.from_dict(d), 0)


def test_cli_tp2_in_bf16_is_verified_by_its_losses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """simulate's default precision (bf16): the losses are held to bf16's tolerance, the weights reported (16-bit
    split sums round unlike one process's and Adam amplifies it: replay.reference.weights_gated)."""
    tp_plan("none", LLAMA, {"tp": 2}, precision="bf16").save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--verify", "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["verify"]
    assert rc == 0 and d["ok"] and d["weights_gated"] is False and d["tensor_parallel"] == 2, d
    assert d["max_loss_rel_err"] < 1e-3 and d["max_weight_rel_err"] > 0
    assert weights_gated("fp32", 2) and weights_gated("bf16", 1) and not weights_gated("fp16", 2)


def test_what_verify_leaves_out() -> None:
    """Exact replays compare every weight; a tensor-parallel one, or one of more than two replicas, leaves out
    the key bias of a model without rotary positions (its gradient is rounding noise)."""
    gpt, llama = Dims.from_model(ModelSpec(**GPT)), Dims.from_model(ModelSpec(**LLAMA))
    assert not_compared(gpt, 2, 1) == frozenset() and not_compared(gpt, 1, 2) == {"k.bias"}
    assert not_compared(gpt, 8, 1) == {"k.bias"} and not_compared(llama, 8, 2) == frozenset()
    assert rtol_for(2, "fp32") < rtol_for(8, "fp32") < rtol_for(2, "fp32", tp=2) == RTOL_TP


def test_selective_recomputation_reuses_the_forward_sum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Selective checkpointing: the plan recomputes each block with no all-reduce (Megatron reruns the attention
    core alone); the replay rebuilds the block from the forward's summed attention output and still trains what
    one process trains."""
    plan = tp_plan("none", GPT, {"tp": 2}, checkpointing="selective")
    phases = {t.tags.get("phase") for seg in plan.segments for t in seg.tasks}
    assert "recompute" in phases and "tp-recompute" not in phases
    plan.save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--verify", "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["verify"]
    assert rc == 0 and d["ok"] and d["tensor_parallel"] == 2 and d["max_loss_rel_err"] < 1e-6, d


def test_tp2_by_dp2_zero_offload_reduces_after_the_tp_sum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four ranks (tp=2 x dp=2), ZeRO-Offload on a grouped-query LLaMA: each layer's reduce-scatter waits for the
    tp-bwd all-reduce that completes its gradients (the plan says so now), and the run trains what one process
    trains."""
    plan = tp_plan("zero-offload", LLAMA, {"tp": 2}, gpus=4)
    tasks = {t.id: t for seg in plan.segments for t in seg.tasks}
    assert {"tpb1.k0", "tpb1.k1"} <= {str(d) for d in tasks["red1.d0"].deps}
    plan.save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--verify", "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["verify"]["ok"] and d["measured"]["ranks"] == 4, d["verify"]
    assert d["verify"]["tensor_parallel"] == 2 and d["verify"]["max_loss_rel_err"] < 1e-6
