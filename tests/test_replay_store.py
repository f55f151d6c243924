"""replay.store's buffer handling: an on-device parameter version aliases the master until the next update
(copied only while saved activations still use it), and copies reuse recycled buffers (replay.pools)."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from replay.model import Dims, build_layers  # noqa: E402
from replay.pools import Pools  # noqa: E402
from replay.store import Batching, Store  # noqa: E402
from workloads import ModelSpec  # noqa: E402

TINY = ModelSpec(name="t", family="custom", n_layers=1, hidden=32, n_heads=4, n_kv_heads=4, ffn=64, vocab=64,
                 max_pos=64, tied_embeddings=False, mlp="swiglu", norm="rmsnorm", bias=False, learned_pos=False)


def _store() -> Store:
    dims = Dims.from_model(TINY)
    n = dims.n_layers + 2
    return Store(dims, build_layers(dims, 7), "gpu0", ["gpu0"] * n, Pools(torch.device("cpu")),
                 Batching(7, 1, 8))


def _micro_step(store: Store, step: int, versions: list[int]) -> None:
    n = len(store.layers)
    for i in range(n):
        store.forward(f"f{i}", (step, 0, i), versions[i], keep_graph=True)
    for i in reversed(range(n)):
        store.backward(f"b{i}", (step, 0, i), 1, "gpu0")


def test_new_version_aliases_the_master_and_is_copied_only_while_in_use() -> None:
    store = _store()
    n = len(store.layers)
    _micro_step(store, 0, [0] * n)
    store.optimizer("opt0", "gpu0", list(range(n)), 0, 1)
    v1 = store.versions[1][1]
    master = store.master[1]
    assert all(v1[k].data_ptr() == master[k].data_ptr() for k in master)  # no copy made
    _micro_step(store, 1, [1] * n)
    # the next step's forward of layer 1 already ran (its graph holds version 1) when step 1's update comes
    store.forward("f1.next", (2, 0, 0), 1, keep_graph=True)
    store.forward("f1.next", (2, 0, 1), 1, keep_graph=True)
    before = {k: t.clone() for k, t in v1.items()}
    store.optimizer("opt1", "gpu0", list(range(n)), 1, 1)
    held = store.versions[1][1]
    assert all(torch.equal(held[k], before[k]) for k in before)  # version 1 kept its values
    assert any(not torch.equal(master[k], before[k]) for k in before)  # the master moved on
    assert all(held[k].data_ptr() != master[k].data_ptr() for k in master)
    graph = store.saved[(2, 0, 1)].graph
    assert graph is not None
    torch.autograd.grad(graph.out.sum(), list(graph.params.values()))  # its graph is intact (no in-place error)
    # the head's version 1 was used by nothing any more: dropped before the in-place update, and version 2
    # is the master itself
    head = store.versions[2]
    assert 1 not in head and all(head[2][k].data_ptr() == p.data_ptr() for k, p in store.master[2].items())


def test_pools_reuse_recycled_buffers_of_the_same_shape() -> None:
    pools = Pools(torch.device("cpu"))
    src = {"a": torch.randn(4, 4), "b": torch.randn(3)}
    first = pools.put("cpu", src, "x")
    assert isinstance(first, dict)
    ptrs = {k: t.data_ptr() for k, t in first.items()}
    pools.recycle(first)
    again = pools.put("cpu", {"a": src["a"] * 2, "b": src["b"] * 2}, "y")
    assert isinstance(again, dict)
    assert {k: t.data_ptr() for k, t in again.items()} == ptrs
    assert torch.equal(again["a"], src["a"] * 2) and torch.equal(again["b"], src["b"] * 2)
    other = pools.put("cpu", {"a": torch.randn(5, 4)}, "z")  # another shape: a fresh buffer
    assert isinstance(other, dict) and other["a"].data_ptr() not in ptrs.values()


def test_pools_keep_no_more_spares_than_put_had_out_at_once() -> None:
    """Recycled buffers serve later copies; a key keeps at most as many as put() ever had out at once, none for
    a key it never copied to (autograd's gradients handed back by a plan that copies nothing, `none`, grew the
    process by its parameters' bytes every micro-step)."""
    pools = Pools(torch.device("cpu"))
    key = ("cpu", torch.float32, (4, 4))
    for _ in range(5):  # a plan that never copies: nothing is kept
        pools.recycle({"g": torch.zeros(4, 4)})
    assert not pools._free.get(key)
    a = pools.put("gpu0", {"w": torch.ones(4, 4)}, "a")
    b = pools.put("gpu0", {"w": torch.ones(4, 4)}, "b")  # two out at once
    pools.recycle(a)
    pools.recycle(b)
    for _ in range(5):
        pools.recycle({"g": torch.zeros(4, 4)})
    assert len(pools._free[key]) == 2
    spare = pools._free[key][-1]
    c = pools.put("gpu0", {"w": torch.full((4, 4), 3.0)}, "c")
    assert c["w"] is spare and torch.equal(c["w"], torch.full((4, 4), 3.0))  # reused, and holds the copy


def test_a_retired_buffer_is_reused_only_once_nothing_else_holds_it() -> None:
    """A parameter version dropped while something may still use it (a running task's dict, an autograd graph
    that saved it, a view) goes back to put() only once nothing but the pool holds it."""
    pools = Pools(torch.device("cpu"))
    key = ("cpu", torch.float32, (8, 8))
    got = pools.put("gpu0", {"w": torch.ones(8, 8)}, "v0")
    assert isinstance(got, dict)
    ptr = got["w"].data_ptr()
    task = got  # a task still holds the version's dict
    pools.retire(got)
    del got
    w = torch.randn(8, 8, requires_grad=True)
    assert pools.put("gpu0", {"w": torch.zeros(8, 8)}, "x")["w"].data_ptr() != ptr  # type: ignore[index]
    out = (w * task["w"]).sum()  # an autograd graph saves it
    del task
    assert pools.put("gpu0", {"w": torch.zeros(8, 8)}, "y")["w"].data_ptr() != ptr  # type: ignore[index]
    view = pools._retired[key][0].view(64)
    del out
    assert pools.put("gpu0", {"w": torch.zeros(8, 8)}, "z")["w"].data_ptr() != ptr  # type: ignore[index]
    del view
    again = pools.put("gpu0", {"w": torch.full((8, 8), 2.0)}, "v1")
    assert isinstance(again, dict)
    assert again["w"].data_ptr() == ptr and torch.equal(again["w"], torch.full((8, 8), 2.0))


def test_an_upload_of_a_version_already_held_retires_the_earlier_copy() -> None:
    """Tinypipe uploads one version for each micro-step: the earlier upload's buffers are retired (reused once
    unused), not dropped (a fresh 400 MB buffer faulted in for seconds every step)."""
    dims = Dims.from_model(TINY)
    n = dims.n_layers + 2
    pools = Pools(torch.device("cpu"))
    store = Store(dims, build_layers(dims, 7), "gpu0", ["cpu"] * n, pools, Batching(7, 1, 8))
    store.upload("up.a", 1, "cpu", "gpu0")
    first = {k: t.data_ptr() for k, t in store.versions[1][0].items()}
    store.upload("up.b", 1, "cpu", "gpu0")
    assert {k: t.data_ptr() for k, t in store.versions[1][0].items()} != first
    assert sum(len(v) for v in pools._retired.values()) == len(first)
    store.upload("up.c", 1, "cpu", "gpu0")  # the first copy is unused by now: its buffers are written again
    third = {k: t.data_ptr() for k, t in store.versions[1][0].items()}
    assert third == first
    master = store.master[1]
    assert all(torch.equal(store.versions[1][0][k], master[k]) for k in master)


class _SumWithItself:
    """A comm whose all-reduce adds an equal peer's tensor (doubles it) and records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[torch.dtype, int]] = []

    def all_reduce(self, flat: torch.Tensor, stream: str) -> None:
        self.sent.append((flat.dtype, flat.numel()))
        flat.add_(flat)


def test_the_tied_table_is_summed_once_per_step_in_the_plans_gradient_dtype() -> None:
    """The plan prices one all-reduce of the step's tied-table gradient in 16 bits (tinypipe's tied-grad-sync):
    the stage sums its micro-steps' table gradients in order, sends that sum once in bf16, and the optimizer's
    sum over the micro-steps then sees the total in the first and zeros in the others. Before: one fp32
    all-reduce per micro-step, 8x the priced bytes at 4 micro-steps."""
    dims = Dims.from_model(replace(TINY, tied_embeddings=True))
    n = dims.n_layers + 2
    store = Store(dims, build_layers(dims, 7), "gpu0", ["gpu0"] * n, Pools(torch.device("cpu")),
                  Batching(7, 1, 8, "bf16"))
    g = [torch.randn(dims.vocab, dims.hidden) for _ in range(3)]
    for m in range(3):
        store.grads[("gpu0", 0, 0, m)] = {"wte": g[m].clone()}
    comm = _SumWithItself()
    moved = store.sync_tied("tie", comm, "tie0", 0, "gpu0")
    assert comm.sent == [(torch.bfloat16, dims.vocab * dims.hidden)] and moved == 2 * dims.vocab * dims.hidden
    expect = ((g[0] + g[1]) + g[2]).to(torch.bfloat16)
    assert torch.equal(store.grads[("gpu0", 0, 0, 0)]["wte"], (expect + expect).float())
    assert all(not store.grads[("gpu0", 0, 0, m)]["wte"].any() for m in (1, 2))


def test_gradients_are_summed_as_they_arrive_where_the_optimizer_runs() -> None:
    """ZeRO-Offload's micro-steps: each copy of a layer's gradients to the CPU (where its optimizer runs) is
    added to the earlier micro-steps' as it lands, in their order, so the host holds one gradient buffer per
    layer (the plan's), not one per micro-step, and the step's sum equals the optimizer's in-order sum bit for
    bit; a copy that skips a micro-step is held apart (no sum out of order)."""
    dims = Dims.from_model(TINY)
    n = dims.n_layers + 2
    store = Store(dims, build_layers(dims, 7), "gpu0", ["cpu"] * n, Pools(torch.device("cpu")), Batching(7, 1, 8))
    accum = 3
    for m in range(accum):
        for i in range(n):
            store.forward(f"f{i}.{m}", (0, m, i), 0, keep_graph=True)
        for i in reversed(range(n)):
            store.backward(f"b{i}.{m}", (0, m, i), accum, "gpu0")
    made = {(i, m): {k: t.clone() for k, t in store.grads[("gpu0", i, 0, m)].items()}
            for i in range(n) for m in range(accum)}
    for m in range(accum):
        for i in range(n):
            store.move_grads(f"d2h{i}.{m}", i, 0, m, "gpu0", "cpu")
    for i in range(n):
        assert [k for k in store.grads if k[1] == i] == [("cpu", i, 0, 0)]
        assert store.grad_upto[("cpu", i, 0, 0)] == accum - 1
        held = store.grads[("cpu", i, 0, 0)]
        for k, want in made[(i, 0)].items():
            want = want.clone()
            for m in range(1, accum):
                want.add_(made[(i, m)][k])
            assert torch.equal(held[k], want)
    store.optimizer("opt", "cpu", list(range(n)), 0, accum)
    assert not store.grads and not store.grad_upto
    # out of order: micro-step 2 lands before 1, so it is held apart and the optimizer sums 0+1, then 2
    store2 = Store(dims, build_layers(dims, 7), "gpu0", ["cpu"] * n, Pools(torch.device("cpu")),
                   Batching(7, 1, 8))
    for m in range(accum):
        for i in range(n):
            store2.forward(f"f{i}.{m}", (0, m, i), 0, keep_graph=True)
        for i in reversed(range(n)):
            store2.backward(f"b{i}.{m}", (0, m, i), accum, "gpu0")
    for m in (0, 2, 1):
        store2.move_grads(f"d2h0.{m}", 0, 0, m, "gpu0", "cpu")
    assert sorted(k for k in store2.grads if k[0] == "cpu") == [("cpu", 0, 0, 0), ("cpu", 0, 0, 2)]
    assert store2.grad_upto[("cpu", 0, 0, 0)] == 1
