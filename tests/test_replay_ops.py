"""workloads.ops (the operator inventory of a layer task) against torch: the replay's modules, counted
with a TorchDispatchMode (every ATen call that does work; views are free), forward and backward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from replay.model import Block, Dims, Embedding, Head  # noqa: E402
from workloads import ModelSpec, WorkloadConfig  # noqa: E402
from workloads.ops import layer_ops  # noqa: E402

VIEWS = {"view", "_unsafe_view", "transpose", "t", "expand", "reshape", "slice", "select", "unsqueeze", "squeeze",
         "permute", "detach", "alias", "as_strided", "split", "unbind", "_reshape_alias", "lift_fresh"}
MATMULS = {"mm", "addmm", "bmm"}
ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"


class Count(TorchDispatchMode):
    """Operators, matmul FLOPs by kernel and the bytes (inputs + outputs) of the other operators."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.elementwise = 0
        self.matmuls: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name in VIEWS:
            return out
        self.n += 1
        if name in MATMULS:
            a, b = args[-2], args[-1]
            self.matmuls.append(2.0 * a.shape[0] * a.shape[1] * b.shape[1])
            return out
        if name.startswith(ATTENTION):
            return out
        outs = list(out) if isinstance(out, tuple | list) else [out]
        # a gather reads the rows it picks (as many bytes as it writes), not its whole table (argument 0)
        ins = (*args[1:], *outs) if name == "embedding" else args
        self.elementwise += sum(x.numel() * x.element_size() for x in (*ins, *outs) if isinstance(x, torch.Tensor))
        return out


def spec(style: str, h: int, heads: int, kv: int, f: int, vocab: int) -> ModelSpec:
    llama = style == "llama"
    return ModelSpec(name="t", family="llama" if llama else "gpt2", n_layers=2, hidden=h, n_heads=heads,
                     n_kv_heads=kv, ffn=f, vocab=vocab, max_pos=512, tied_embeddings=False,
                     mlp="swiglu" if llama else "gelu", norm="rmsnorm" if llama else "layernorm", bias=not llama,
                     learned_pos=not llama)


CASES = [("llama", 256, 8, 8, 688, 1024, 2, 128), ("llama", 384, 6, 3, 512, 4096, 1, 256),
         ("gpt2", 256, 8, 8, 1024, 1024, 2, 64), ("gpt2", 128, 4, 4, 512, 2048, 4, 32)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-h{c[1]}-kv{c[3]}")
def test_inventory_matches_torch(case: tuple) -> None:
    style, h, heads, kv, f, vocab, b, s = case
    m = spec(style, h, heads, kv, f, vocab)
    cfg = WorkloadConfig(micro_batch=b, seq_len=s, precision="fp32", checkpointing="full")
    d = Dims.from_model(m)
    tokens = torch.randint(0, vocab, (b, s))
    layers = [(0, Embedding(d), (tokens,)), (1, Block(d), (torch.randn(b, s, h, requires_grad=True),)),
              (3, Head(d), (torch.randn(b, s, h, requires_grad=True), tokens))]
    for index, module, inputs in layers:
        with Count() as fwd:
            out = module(*inputs)
        grad = torch.ones_like(out)
        wrt = [x for x in inputs if x.requires_grad] + list(module.parameters())
        with Count() as bwd:
            torch.autograd.grad(out, wrt, grad)
        for phase, got in (("fwd", fwd), ("bwd", bwd)):
            want = layer_ops(m, cfg, index, phase)
            where = f"{style} layer {index} {phase}"
            assert got.n == want.n_ops, where
            assert want.elementwise_bytes == pytest.approx(got.elementwise, rel=0.12), where
            # one entry per matmul kernel, each of its own size (a block's last entry is the attention kernel)
            mats = want.matmul_flops[:-1] if index == 1 else want.matmul_flops
            assert sorted(mats) == pytest.approx(sorted(got.matmuls)), where


def test_recompute_follows_checkpointing() -> None:
    m = spec("llama", 256, 8, 8, 688, 1024)
    full = layer_ops(m, WorkloadConfig(micro_batch=1, seq_len=64, checkpointing="full"), 1, "recompute")
    assert full == layer_ops(m, WorkloadConfig(micro_batch=1, seq_len=64, checkpointing="full"), 1, "fwd")
    sel = layer_ops(m, WorkloadConfig(micro_batch=1, seq_len=64, checkpointing="selective"), 1, "recompute")
    assert sel.n_ops == 1 and sel.elementwise_bytes == 0
    assert layer_ops(m, WorkloadConfig(micro_batch=1, seq_len=64, checkpointing="none"), 1, "recompute").n_ops == 0
    with pytest.raises(ValueError, match="phase"):
        layer_ops(m, WorkloadConfig(), 1, "opt")


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_workload_check_counts_operators_on_the_meta_device(style: str) -> None:
    """``tiersim workload check`` rows: in fp32 the inventory matches torch's count exactly (judged rows)."""
    from replay.meta_check import meta_check

    m = spec(style, 256, 8, 2 if style == "llama" else 8, 688, 1024)
    rows = {(r.layer, r.item): r for r in meta_check(m, 1, 64, precision="fp32").rows}
    for layer in ("embedding", "block", "head"):
        for phase in ("fwd", "bwd"):
            ops = rows[(layer, f"{phase} operators")]
            assert ops.ok is True, (layer, phase, ops.formula, ops.torch)
            ew = rows[(layer, f"{phase} element-wise bytes")]
            assert ew.rel_diff is not None and abs(ew.rel_diff) < 0.12, (layer, phase, ew.rel_diff)


@pytest.mark.parametrize("style", ["llama", "gpt2"])
@pytest.mark.parametrize("early_stop", [True, False])
def test_recompute_inventory_matches_torch_checkpoint(style: str, early_stop: bool) -> None:
    """What torch's non-reentrant checkpoint reruns in a block's backward (the operators counted there less
    those of the plain backward) is the inventory's recompute: with early stop (torch's default) the down
    projection and the last residual add are not rerun; without it the whole forward is."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    m = spec(style, 256, 8, 8, 688 if style == "llama" else 1024, 1024)
    b, s = 2, 64
    cfg = WorkloadConfig(micro_batch=b, seq_len=s, precision="fp32", checkpointing="full",
                         checkpoint_early_stop=early_stop)
    block = Block(Dims.from_model(m))
    x = torch.randn(b, s, m.hidden, requires_grad=True)
    wrt = [x, *block.parameters()]
    out = block(x)
    with Count() as plain:  # the backward alone
        torch.autograd.grad(out, wrt, torch.ones_like(out))
    with set_checkpoint_early_stop(early_stop):
        out = checkpoint(block, x, use_reentrant=False)
    with Count() as ckpt:  # the recomputation and the backward
        torch.autograd.grad(out, wrt, torch.ones_like(out))
    fwd, want = layer_ops(m, cfg, 1, "fwd"), layer_ops(m, cfg, 1, "recompute")
    assert ckpt.n - plain.n == want.n_ops
    rerun = sorted(ckpt.matmuls)
    for f in plain.matmuls:
        rerun.remove(next(g for g in rerun if g == pytest.approx(f)))
    assert sorted(rerun) == pytest.approx(sorted(want.matmul_flops[:-1]))  # [-1]: the attention kernel
    assert ckpt.elementwise - plain.elementwise == pytest.approx(want.elementwise_bytes, rel=0.12)
    skipped = sum(fwd.matmul_flops) - sum(want.matmul_flops)
    assert skipped == (2 * b * s * m.ffn * m.hidden if early_stop else 0)
