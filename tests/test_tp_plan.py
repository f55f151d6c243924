"""Tensor-parallel plans as Megatron-LM runs them (``policies.kit.tp_steps`` / ``tp_layer``): each all-reduce
its own task where Megatron has it, none in the embedding's backward, the vocab-parallel head's three forward
all-reduces and its input gradient's backward one, gradient consumers after the collective that completes the
gradients, and Megatron's split rule for key/value heads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from policies import get_policy, parse_knobs
from policies.base import Job, KnobError
from policies.kit import Grads, Layout, check_tp, tp_steps
from simulator import Plan, TaskSpec, simulate_plan
from simulator.invariants import check_invariants
from simulator.phase import Phase
from tests.test_policy_kit import microstep, tasks_of, two_layer_job
from tiersim.api import JobRequest, make_job
from tiersim.cli import main
from workloads.flops import block_forward_flops
from workloads.model import load_model

TP = (Phase.TP_FWD, Phase.TP_RECOMPUTE, Phase.TP_BWD)


def collectives(tasks: list[TaskSpec], k: int = 0) -> list[tuple[str, float, str]]:
    """Group k's tensor-parallel collectives in plan order: (id, bytes, reduce op)."""
    return [(t.id, t.bytes, t.tags["reduce_op"]) for t in tasks
            if t.tags.get("phase") in TP and t.id.endswith(f".k{k}")]


def test_each_layer_use_has_megatrons_collectives_in_order() -> None:
    job = two_layer_job(checkpointing="full", gpus=2)
    tasks = tasks_of(microstep(job, Layout(2, 2), Grads(reduce="all_reduce", bucket=False, offload=False)))
    L = job.trace.layers
    h = float(L[1].output_bytes)  # b*s*h of the 16-bit residual stream
    tok = 4.0 * job.config.micro_batch * job.config.seq_len  # one fp32 per token
    assert collectives(tasks) == [
        ("tpf0.k0", float(L[0].output_bytes), "sum"),  # vocab-parallel embedding: forward only
        ("tpf1a.k0", h, "sum"), ("tpf1.k0", h, "sum"), ("tpf2a.k0", h, "sum"), ("tpf2.k0", h, "sum"),
        ("tpf3a.k0", tok, "max"), ("tpf3b.k0", tok, "sum"), ("tpf3.k0", tok, "sum"),  # cross-entropy
        ("tpb3.k0", h, "sum"),  # the head's input gradient (column-parallel)
        ("tpr2a.k0", h, "sum"), ("tpr2.k0", h, "sum"), ("tpb2a.k0", h, "sum"), ("tpb2.k0", h, "sum"),
        ("tpr1a.k0", h, "sum"), ("tpr1.k0", h, "sum"), ("tpb1a.k0", h, "sum"), ("tpb1.k0", h, "sum"),
    ]
    by_id = {t.id: t for t in tasks}
    # attention, its sum, the MLP, its sum; the backward the other way round
    assert [str(d) for d in by_id["fwd1.gpu1"].deps] == ["tpf1a.k0"]
    assert [str(d) for d in by_id["tpf1a.k0"].deps] == ["fwd1a.gpu0", "fwd1a.gpu1"]
    assert [str(d) for d in by_id["bwd1.gpu0"].deps] == ["tpb1a.k0"]
    assert [str(d) for d in by_id["bwd0.gpu0"].deps] == ["tpb1.k0"]  # the embedding waits for block 1's sum
    assert [str(d) for d in by_id["bwd2a.gpu0"].deps] == ["tpr2.k0"]
    assert by_id["fwd1a.gpu0"].allocs and not by_id["fwd1.gpu0"].allocs  # the use's memory: first part allocates
    assert by_id["bwd1.gpu0"].frees and not by_id["bwd1a.gpu0"].frees  # and the last frees


def test_compute_parts_split_the_block_as_its_flops_formula() -> None:
    job = two_layer_job(checkpointing="full", gpus=2)
    by_id = {t.id: t for t in tasks_of(microstep(job, Layout(2, 2), Grads(reduce="all_reduce", bucket=False,
                                                                              offload=False)))}
    c = job.config
    bf = block_forward_flops(job.model, c.micro_batch, c.seq_len, c.causal_attention_factor, 0)
    attn = (bf.qkv + bf.attention_core + bf.output_projection) / (bf.qkv + bf.attention_core + bf.output_projection
                                                                 + bf.mlp + bf.router)
    layer = job.trace.layers[1]
    assert by_id["fwd1a.gpu0"].flops == pytest.approx(layer.fwd_flops * attn / 2)
    assert by_id["fwd1.gpu0"].flops == pytest.approx(layer.fwd_flops * (1 - attn) / 2)
    assert by_id["bwd1a.gpu0"].flops == pytest.approx(layer.bwd_flops * (1 - attn) / 2)  # the MLP's first
    assert by_id["bwd1.gpu0"].flops == pytest.approx(layer.bwd_flops * attn / 2)
    assert (by_id["fwd1a.gpu0"].tags["part"], by_id["fwd1.gpu0"].tags["part"]) == (0, 1)
    assert by_id["fwd3.gpu0"].flops == pytest.approx(job.trace.layers[3].fwd_flops / 2)  # head: one part
    assert "part" not in by_id["fwd3.gpu0"].tags


def test_selective_recomputation_runs_no_collective() -> None:
    """Megatron's selective recomputation reruns the attention core alone: no all-reduce."""
    job = two_layer_job(checkpointing="selective", gpus=2)
    assert tp_steps(job, 1, "r") == [("compute", 1.0)]
    tasks = tasks_of(microstep(job, Layout(2, 2), Grads(reduce="all_reduce", bucket=False, offload=False)))
    assert not [t for t in tasks if t.tags.get("phase") == Phase.TP_RECOMPUTE]


@pytest.mark.parametrize("grads, consumer", [
    (Grads(reduce="all_reduce", bucket=False, offload=False), "red{i}.d{j}"),
    (Grads(reduce="reduce_scatter", bucket=True, offload=True, buckets_in_flight=2), "red{i}.d{j}"),
])
def test_gradient_reduction_waits_for_the_collective_that_completes_the_gradients(grads: Grads,
                                                                                 consumer: str) -> None:
    job = two_layer_job(checkpointing="full", gpus=4)
    by_id = {t.id: t for t in tasks_of(microstep(job, Layout(4, 2), grads))}
    for i in (1, 2, 3):
        for j in (0, 1):
            deps = {str(d) for d in by_id[consumer.format(i=i, j=j)].deps}
            assert {f"tpb{i}.k0", f"tpb{i}.k1", f"bwd{i}.gpu{j}", f"bwd{i}.gpu{j + 2}"} <= deps, (i, j, deps)
    assert not {d for d in map(str, by_id["red0.d0"].deps) if d.startswith("tp")}  # the embedding's is local


def test_offload_without_data_parallelism_waits_for_the_collective() -> None:
    job = two_layer_job(checkpointing="full", gpus=2)
    by_id = {t.id: t for t in tasks_of(microstep(job, Layout(2, 2), Grads(
        reduce="reduce_scatter", bucket=True, offload=True, buckets_in_flight=2)))}
    assert [str(d) for d in by_id["d2h2.gpu1"].deps] == ["bwd2.gpu1", "tpb2.k0"]
    assert [str(d) for d in by_id["d2h0.gpu1"].deps] == ["bwd0.gpu1"]


def _gqa_job(n_kv_heads: int, ffn: int | None = None) -> Job:
    m = load_model("7b")
    m = dataclasses.replace(m, n_kv_heads=n_kv_heads, ffn=ffn or m.ffn, n_layers=2)
    job, _ = make_job("a100x8", m, JobRequest(seq_len=128, global_batch=8))
    return job


def test_tp_must_divide_the_key_value_heads_and_the_mlp() -> None:
    """Megatron accepts fewer query groups than ranks only by all-gathering every block's QKV (not modelled):
    tp > key/value heads is refused in one line naming the fix; so is an MLP width tp does not divide."""
    check_tp(_gqa_job(4), 4, "none")
    with pytest.raises(KnobError, match=r"^none: knob 'tp' = 8 does not divide the model's 4 key/value heads .*"
                                        r"use a tp that divides 4$"):
        check_tp(_gqa_job(4), 8, "none")
    with pytest.raises(KnobError, match=r"MLP width 11006"):
        check_tp(_gqa_job(8, ffn=11006), 4, "none")


def test_a_tp_plan_simulates_within_its_invariants() -> None:
    """zero-offload and none with tp=2 x dp=2 on a small model: the engine runs the split plan and every
    invariant holds (bytes planned = bytes moved, no task before its dependencies, pools consistent)."""
    model = dataclasses.replace(load_model("gpt2"), n_layers=2)
    job, _ = make_job("a100x8", model, JobRequest(seq_len=128, global_batch=4, checkpointing="full"),
                      hw_overrides=["gpu.count=4"])
    for name in ("none", "zero-offload"):
        info = get_policy(name)
        plan: Plan = info.plan(job, parse_knobs(info, {"tp": "2"}))
        result = simulate_plan(plan, job.hw)
        assert result.feasible and result.step_time_s > 0, name
        assert check_invariants(result) == [], name


def test_zero_offload_auto_tp_keeps_to_megatrons_split() -> None:
    """A 70b with two key/value heads would want tp=4 for its 16-bit parameters; auto stops at 2 (check_tp's rule)."""
    from policies.zero_offload import auto_tp

    m = dataclasses.replace(load_model("70b"), n_kv_heads=2)
    job, _ = make_job("a100x8", m, JobRequest(seq_len=128, global_batch=8))
    assert auto_tp(job) == 2
    job8, _ = make_job("a100x8", "70b", JobRequest(seq_len=128, global_batch=8))
    assert auto_tp(job8) == 4


def test_cli_refuses_tp_beyond_the_key_value_heads_in_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gqa.yaml").write_text("name: gqa\nlayers: 2\nhidden: 64\nheads: 8\nkv_heads: 2\nffn: 256\n"
                                       "vocab: 256\nmax_pos: 128\nmlp: swiglu\nnorm: rmsnorm\nbias: false\n"
                                       "tied_embeddings: false\nlearned_pos: false\n")
    rc = main(["simulate", "--hw", "a100x8", "--model", str(tmp_path / "gqa.yaml"), "--policy", "none",
               "--knob", "tp=4"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "knob 'tp' = 4 does not divide the model's 2 key/value heads" in err and "use a tp that divides 2" in err
