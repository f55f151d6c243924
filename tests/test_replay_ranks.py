"""Multi-rank replay: a plan with N GPUs runs as N processes (torch.distributed, gloo on CPU) and trains
exactly what one process trains on the same micro-batches (the reference of replay.reference).

Each 2-rank case spawns two rank processes (forked from one fork server per test session) on a tiny model;
the data-parallel sum of two ranks is exact in any order, so every 2-rank case matches bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from policies import get_policy, parse_knobs  # noqa: E402
from replay.dist_launch import run_ranks  # noqa: E402
from replay.dist_merge import replica_spread  # noqa: E402
from replay.errors import ReplayError, ReplayTimeout  # noqa: E402
from replay.model import Dims  # noqa: E402
from replay.ranks import rank_view, shared_groups, stream_owners  # noqa: E402
from replay.reference import (  # noqa: E402
    compare,
    partitioned_layers,
    rtol_for,
    tied_sync_split,
    train_reference,
    weights_gated,
)
from replay.store import Batching  # noqa: E402
from simulator import Plan  # noqa: E402
from tiersim.api import JobRequest, make_job  # noqa: E402
from tiersim.cli import main  # noqa: E402
from workloads import ModelSpec  # noqa: E402

LLAMA = dict(name="tiny-llama", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=192,
             vocab=256, max_pos=128, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False,
             learned_pos=False)
GPT = dict(name="tiny-gpt", family="custom", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn=256, vocab=256,
           max_pos=128, tied_embeddings=True, mlp="gelu", norm="layernorm", bias=True, learned_pos=True)
SEED = 1234


def ranks_plan(policy: str, gpus: int = 2, model: dict | None = None, knobs: dict | None = None,
               per_rank_batch: int = 2) -> Plan:
    job, _ = make_job("a100", ModelSpec(**(model or LLAMA)),
                      JobRequest(micro_batch=1, seq_len=32, global_batch=per_rank_batch * gpus, precision="bf16",
                                 checkpointing="full", flash_attention=True),
                      hw_overrides=[f"gpu.count={gpus}"])
    info = get_policy(policy)
    return info.plan(job, parse_knobs(info, knobs or {}))


def replay_and_verify(plan: Plan, timeout_s: float | None = None):  # type: ignore[no-untyped-def]
    got = run_ranks(plan, plan.hardware, device="cpu", seed=SEED, verify=True, timeout_s=timeout_s)
    assert got is not None
    meas, ranks = got
    cfg = plan.workload.config
    world = ranks[0].dp_world  # the data-parallel replicas (pipeline stages share their micro-batches)
    delayed = bool(plan.knobs.get("delayed_update"))
    dims = Dims.from_model(plan.workload.model)
    ref_losses, ref_weights = train_reference(dims, Batching(SEED, cfg.micro_batch, cfg.seq_len, cfg.precision),
                                              plan.steps, ranks[0].accum, delayed=delayed,
                                              device=torch.device("cpu"), world=world,
                                              tied_split=tied_sync_split(plan),
                                              partitioned=partitioned_layers(plan, dims.n_layers + 2))
    verdict = compare(meas.losses, meas.weights, ref_losses, ref_weights, "dp", rtol_for(world, cfg.precision),
                      gate_weights=weights_gated(cfg.precision, 1, world))
    return meas, ranks, verdict


def _collectives(plan: Plan) -> set[str | None]:
    return {t.coll for seg in plan.segments for t in seg.tasks if t.op == "collective" and len(t.ranks) > 1}


@pytest.mark.parametrize("policy,colls", [
    ("none", {"all_reduce"}),
    ("zero-offload", {"reduce_scatter", "all_gather"}),
    ("zero-infinity", {"reduce_scatter", "all_gather"}),
    ("tinypipe", {"all_reduce"}),
    ("lazytrain", {"all_reduce"}),
    ("synergyscale", {"reduce_scatter", "all_gather"}),
])
def test_two_ranks_train_like_one_process(policy: str, colls: set[str]) -> None:
    plan = ranks_plan(policy)
    assert _collectives(plan) == colls  # what the replay really runs: partitions where the plan partitions
    meas, ranks, verdict = replay_and_verify(plan)
    assert verdict.ok, verdict
    assert verdict.max_weight_rel_err == 0.0 and verdict.max_loss_rel_err == 0.0  # two ranks: exact
    assert replica_spread(ranks) == 0.0
    assert len(meas.losses) == plan.steps * 4  # 2 ranks x 2 micro-steps, each its own batch
    assert not meas.leaked
    sharded = {frozenset(r.sharded) for r in ranks}
    assert sharded == ({frozenset(range(4))} if "reduce_scatter" in colls else {frozenset()})
    # every task ran once, a collective once for all its ranks, none before its dependencies ended
    from simulator.unroll import Unroller

    tasks = Unroller(plan).unroll()
    start = {r.uid: r.start for r in meas.records}
    end = {r.uid: r.end for r in meas.records}
    assert len(meas.records) == len(tasks) and set(end) == {t.uid for t in tasks}
    early = [(d, t.uid, end[d] - start[t.uid]) for t in tasks for d in t.deps if end[d] > start[t.uid] + 5e-3]
    assert not early, early[:3]  # 5 ms: a rank sees another's end through the store, polled
    # each GPU pool holds its own rank's timeline over its persistent tensors (peaks themselves depend on
    # timing: how many gradients are in flight), every dynamic tensor freed by the end
    for g in ("gpu0", "gpu1"):
        home = sum(ts.bytes for ts in plan.tensors if ts.home == g)
        pool = meas.memory.pools[g]
        assert home > 0 and pool.peak > home and pool.used == pytest.approx(home)


def test_two_stage_pipeline_sends_and_receives() -> None:
    """tinypipe with two stages: each rank computes its stage's layers; activations go forward and input
    gradients back by real send/recv (both ends run the plan's copy); one replica, so the reference is
    one process training the same micro-batches."""
    plan = ranks_plan("tinypipe", knobs={"stages": 2}, per_rank_batch=1)
    sends = {t.tags.get("phase") for seg in plan.segments for t in seg.tasks if t.op == "copy" and t.src != t.dst
             and str(t.src).startswith("gpu") and str(t.dst).startswith("gpu")}
    assert sends == {"send-act", "send-grad"} and not _collectives(plan)
    meas, ranks, verdict = replay_and_verify(plan)
    assert verdict.ok and verdict.max_weight_rel_err == 0.0, verdict
    assert [sorted(r.owned) for r in ranks] == [[0, 1], [2, 3]] and ranks[0].dp_world == 1
    assert len(meas.losses) == plan.steps * 2 and not meas.leaked
    assert sum(meas.real_link_bytes.values()) > 0


def test_four_ranks_zero_offload() -> None:
    """Four ranks (more than this machine's cores: exact training, meaningless timing): ZeRO-Offload's
    partitions of four; beyond two ranks a collective may sum in another order, and in bf16 each partial sum
    rounds to 16 bits, so the losses are held to the tolerance and the weights reported (weights_gated)."""
    plan = ranks_plan("zero-offload", gpus=4)
    meas, ranks, verdict = replay_and_verify(plan)
    assert verdict.ok, verdict
    assert not weights_gated("bf16", 1, 4) and weights_gated("bf16", 1, 2) and weights_gated("fp32", 1, 4)
    assert verdict.max_loss_rel_err <= verdict.rtol
    assert len(ranks) == 4 and len(meas.losses) == plan.steps * 8
    assert set(meas.memory.pools) >= {"gpu0", "gpu1", "gpu2", "gpu3", "cpu"}


def test_cli_two_ranks_json_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ranks_plan("zero-offload", model=GPT).save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--verify", "--json", "--device", "cpu",
               "--trace", str(tmp_path / "t.json")])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["verify"]["ok"] and d["verify"]["replicas"] == 2
    assert d["measured"]["ranks"] == 2 and d["measured"]["replica_spread"] == 0.0
    assert {"gpu0.compute", "gpu1.compute", "cpu.adam0", "cpu.adam1", "dp0.grad"} <= set(d["error"]["stream_busy"])
    assert d["measured"]["peak_bytes"]["cpu"] == d["simulated"]["peak_bytes"]["cpu"]  # both ranks' host states
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"fwd1.gpu0", "fwd1.gpu1"} <= names


def test_stream_owners_and_groups() -> None:
    plan = ranks_plan("zero-offload")
    owners = stream_owners(plan)
    assert owners["gpu1.compute"] == {1} and owners["cpu.adam1"] == {1} and owners["cpu.adam0"] == {0}
    assert owners["dp0.grad"] == {0, 1} and owners["dp0.param"] == {0, 1}
    assert [s for s, _ in shared_groups(plan)] == ["dp0.grad", "dp0.param"]
    view = rank_view(plan, 1)
    assert view.gpu == "gpu1" and view.world == 2 and "gpu0.compute" not in view.streams
    with pytest.raises(ReplayError, match="rank 2 is not a rank"):
        rank_view(plan, 2)


def test_host_stream_without_a_rank_is_refused() -> None:
    """A host stream belongs to the one GPU its tasks work with, else to the one rank its tasks' tags name."""
    d = ranks_plan("zero-offload").to_dict()
    first = next(t for seg in d["segments"] for t in seg["tasks"] if t["stream"] == "cpu.adam0")
    first["stream"] = "cpu.adam1"  # rank 0's Adam of a layer on rank 1's host stream: it works for both GPUs
    # (its tasks' dependencies are gpu0's and gpu1's copies) and its tags name both ranks: no single owner
    with pytest.raises(ReplayError, match=r"stream 'cpu.adam1' on 'cpu': its tasks carry no single 'rank' tag"):
        stream_owners(Plan.from_dict(d))


def test_a_failing_rank_stops_the_replay_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's data is not where its plan says: the child's error comes back as the run's one line (exit 2),
    and rank 0, blocked in a collective rank 1 never enters, is stopped rather than waited for."""
    d = ranks_plan("none").to_dict()
    for seg in d["segments"]:
        for t in seg["tasks"]:
            if t["id"] == "bwd1.gpu1":
                t["reads"] = [["act1.gpu1", "cpu"]]
    (tmp_path / "p.json").write_text(json.dumps(d))
    rc = main(["replay", str(tmp_path / "p.json"), "--device", "cpu", "--verify"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "bwd1.gpu1[s0.0]" in err and "not there" in err


def test_more_ranks_than_cores_needs_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ranks_plan("none").save(tmp_path / "p.json")
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    rc = main(["replay", str(tmp_path / "p.json"), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert rc == 2 and "2 GPUs" in err and "--verify" in err


def test_tensor_parallel_it_cannot_split_is_refused_before_any_rank_starts(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Tensor-parallel plans replay (tests/test_replay_tp.py); one whose vocabulary does not split over its
    ranks (the vocab-parallel embedding) is refused in one line before any process starts."""
    ranks_plan("none", model=dict(LLAMA, vocab=255), knobs={"tp": 2}).save(tmp_path / "p.json")
    rc = main(["replay", str(tmp_path / "p.json"), "--device", "cpu", "--verify"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "the vocabulary of 255 does not split over 2 ranks" in err


def test_ranks_that_do_not_answer_in_time_are_stopped() -> None:
    """A deadline on a spawned replay (what the validation matrix uses so one hung case cannot stop the
    matrix): ranks without a result by then are killed and the run raises one ReplayError naming them."""
    with pytest.raises(ReplayTimeout, match=r"ranks \[0, 1\] gave no result within 0 s"):
        run_ranks(ranks_plan("none"), ranks_plan("none").hardware, device="cpu", seed=SEED, timeout_s=0.01)


def test_gradients_are_reduced_in_the_plans_16_bit_dtype() -> None:
    """A bf16 plan prices its gradient all-reduces at 2 B per parameter: the replay's reductions send that
    (each rank's fp32 gradient divided by the ranks and rounded to bf16, Precision.wire_gradients), not the fp32
    gradients it holds: per ring hop the runner's real bytes are the plan's (twice them before)."""
    plan = ranks_plan("none")
    assert _collectives(plan) == {"all_reduce"}
    meas, _, verdict = replay_and_verify(plan)
    assert verdict.ok and verdict.max_weight_rel_err == 0.0, verdict
    priced, real = sum(meas.link_bytes.values()), sum(meas.real_link_bytes.values())
    assert priced > 0 and real == pytest.approx(priced)


def test_partitioned_parameters_are_gathered_in_the_plans_16_bit_dtype() -> None:
    """A bf16 ZeRO plan prices its parameter all-gathers at 2 B per parameter: the replay gathers the bf16
    copies of its fp32 master shards (Precision.wire_params) and computes with them widened back, from the
    first step (its initial versions rounded alike), so every byte it moves is the plan's; the reference rounds
    the same layers' parameters (partitioned_layers) and still matches to the last bit. Without that rounding
    it does not: the rounding is what the replay computes with."""
    plan = ranks_plan("zero-offload")
    n_layers = Dims.from_model(plan.workload.model).n_layers + 2
    assert partitioned_layers(plan, n_layers) == frozenset(range(4))
    meas, ranks, verdict = replay_and_verify(plan)
    assert verdict.ok and verdict.max_weight_rel_err == 0.0 and verdict.max_loss_rel_err == 0.0, verdict
    # every byte the collectives move is the plan's; the gradient and parameter copies between a GPU and its
    # host still move the runner's fp32 (twice the 2 B priced: replay.compare prints both), one link each
    copies = sum(r.bytes for r in meas.records if r.op == "copy")
    priced, real = sum(meas.link_bytes.values()), sum(meas.real_link_bytes.values())
    assert copies > 0 and priced > copies and real == pytest.approx(priced + copies)
    cfg = plan.workload.config
    ref_l, ref_w = train_reference(Dims.from_model(plan.workload.model),
                                   Batching(SEED, cfg.micro_batch, cfg.seq_len, cfg.precision), plan.steps,
                                   ranks[0].accum, delayed=False, device=torch.device("cpu"), world=2)
    unrounded = compare(meas.losses, meas.weights, ref_l, ref_w, "dp", 0.0)
    assert unrounded.max_loss_rel_err > 0.0


def test_a_shared_pools_peak_with_the_ranks_aligned_is_the_simulated_one() -> None:
    """Two ranks share the host's pool: how their short-lived buffers line up depends on the processes'
    timing to the millisecond, while the simulation runs them in lockstep. The pool's initial tensors plus
    each rank's own peak on it (``aligned_peaks``) is the simulated peak; what the merged tracker saw is
    never above it. Per-GPU pools (one rank each) are not in it."""
    from simulator.simulate import simulate_plan

    plan = ranks_plan("zero-infinity", knobs={"param_device": "nvme", "optimizer_device": "nvme"})
    got = run_ranks(plan, plan.hardware, device="cpu", seed=SEED)
    assert got is not None
    meas, _ = got
    sim = simulate_plan(plan, plan.hardware)
    assert "cpu" in meas.aligned_peaks and not {"gpu0", "gpu1"} & set(meas.aligned_peaks)
    assert meas.memory.pools["cpu"].peak <= meas.aligned_peaks["cpu"] + 1e-6
    assert meas.aligned_peaks["cpu"] == pytest.approx(sim.peak_bytes["cpu"])
    # a pipeline's two stages are not replicas: they peak apart in a simulation too, so no aligned figure
    pipe = ranks_plan("tinypipe", knobs={"stages": 2}, per_rank_batch=1)
    got = run_ranks(pipe, pipe.hardware, device="cpu", seed=SEED)
    assert got is not None and got[0].aligned_peaks == {}


def test_the_validation_compares_shared_pools_aligned_and_notes_the_merged_peak() -> None:
    from replay.validation import aligned_measured_peaks

    peaks, note = aligned_measured_peaks({"gpu0": 5e6, "cpu": 74.97e6}, {"cpu": 78.92e6})
    assert peaks["cpu"] == 78.92e6 and peaks["gpu0"] == 5e6 and peaks["nvme"] == 0.0
    assert note == "shared pools' merged peaks: cpu 74.97 MB as the ranks lined up"
    assert aligned_measured_peaks({"cpu": 3e6}, {}) == ({"gpu0": 0.0, "cpu": 3e6, "nvme": 0.0}, "")
