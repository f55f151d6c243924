"""Check the workload formulas against torch on the meta device (``tiersim workload check``).

The replay model (:mod:`replay.model`) is built at full size under ``torch.device("meta")``: tensors
have shapes and dtypes but no storage, so a 70B block costs no memory and no compute. One layer of
each kind is measured (embedding, ONE block -- all blocks are built from the same dimensions and are
identical, so one is measured and multiplied by the count -- and the head), and compared with the
formula trace (:func:`workloads.build_trace`):

* parameter bytes: ``sum(p.numel() * p.element_size())`` of the layer's parameters, in the trace's
  precision, vs ``LayerTrace.param_bytes`` (exact match expected);
* FLOPs: :class:`torch.utils.flop_counter.FlopCounterMode` over the layer's forward, then over its
  backward from a dummy upstream gradient, vs ``fwd_flops`` / ``bwd_flops``. A block is split by op:
  ``mm``/``addmm`` (projections and MLP) vs ``bmm`` and SDPA kernels (the attention core);
* operators (``workloads.ops``, what the simulator prices a layer task by on a calibrated spec): every
  ATen call that does work (views are free), counted with a ``TorchDispatchMode`` over each layer's
  forward and backward, and the bytes the non-matmul ones read and write (informative: in bf16/fp16 the
  composite RMSNorm, the rotary tables and the loss upcast to fp32, which the fp32 inventory does not
  count; ``tests/test_replay_ops.py`` checks the inventory exactly in fp32 on real tensors);
* saved activations: :func:`torch.autograd.graph.saved_tensors_hooks` during the forward, summing the
  bytes of each distinct storage saved for backward (views of one storage count once; storages of
  the layer's parameters are not activations and are skipped), vs ``activation_bytes_nockpt``.
  A block is measured twice: as written (``F.scaled_dot_product_attention``, which on meta/CPU takes
  the *math* path and keeps the s x s probabilities), compared with the trace without
  FlashAttention; and with the SDPA call routed to the CPU flash kernel
  (``aten._scaled_dot_product_flash_attention_for_cpu``, which keeps only a logsumexp), compared with
  the trace with FlashAttention.

Differences are findings, not failures: each row carries the reason we expect (see :data:`NOTES`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from replay.errors import ReplayError
from replay.model import Block, Dims, Embedding, Head
from workloads import ModelSpec, WorkloadConfig, WorkloadTrace, build_trace
from workloads import activations as act
from workloads import flops as wflops
from workloads.ops import layer_ops

__all__ = ["CheckRow", "MetaCheck", "OpCount", "block_flops_by_kind", "build_meta_layers", "count_ops",
           "meta_check", "saved_activation_bytes"]

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ATTENTION_OPS = ("bmm", "scaled_dot_product", "_flash_attention", "_efficient_attention")
MATMUL_TOLERANCE = 1e-9  # relative; matmul FLOPs are integers computed the same way on both sides
BLOCK_COMPONENTS = ("norms", "attention", "attention_core", "mlp")

NOTES = {
    "param_bytes": "exact match expected",
    "embedding_flops": "gather/scatter-add: no matmul, 0 on both sides",
    "block_matmul_flops": "Q,K,V,O projections + MLP matmuls (aten.mm)",
    "block_attention_flops": ("Q.K^T and P.V (aten.bmm of the math SDPA): full s x s on both sides "
                              "(is_causal masks, it does not skip; Narayanan convention); a causal flash "
                              "kernel executes ~half"),
    "head_flops": "LM-head matmul; norm and cross-entropy are element-wise, uncounted on both sides",
}


@dataclass(frozen=True)
class CheckRow:
    """One compared item: the formula's value, torch's, and the relative difference (torch/formula - 1)."""

    layer: str
    item: str
    formula: float
    torch: float
    note: str = ""
    tolerance: float | None = None  # None: informative only (a difference is reported, not judged)

    @property
    def rel_diff(self) -> float | None:
        if self.formula == 0:
            return 0.0 if self.torch == 0 else None
        return self.torch / self.formula - 1.0

    @property
    def ok(self) -> bool | None:
        if self.tolerance is None:
            return None
        diff = self.rel_diff
        return diff is not None and abs(diff) <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rel_diff"], d["ok"] = self.rel_diff, self.ok
        return d


@dataclass
class SavedBytes:
    """Bytes saved for backward during one forward, by block component and by dtype."""

    total: int = 0
    by_component: dict[str, int] = field(default_factory=dict)
    by_dtype: dict[str, int] = field(default_factory=dict)
    tensors: int = 0
    duplicates: int = 0  # saves of a storage already counted (views, the same tensor twice)


@dataclass(frozen=True)
class MetaCheck:
    model: ModelSpec
    config: WorkloadConfig
    n_blocks: int
    rows: tuple[CheckRow, ...]
    block_saved_math: SavedBytes
    block_saved_flash: SavedBytes | None
    notes: tuple[str, ...]

    @property
    def params_match(self) -> bool:
        return all(r.ok for r in self.rows if r.item == "param bytes")

    @property
    def flops_match(self) -> bool:
        return all(r.ok for r in self.rows if "FLOPs" in r.item and r.ok is not None)

    @property
    def verdict(self) -> str:
        if self.params_match and self.flops_match:
            return ("OK: parameter bytes exact, matmul FLOPs match; activation differences are "
                    "reported with their reasons")
        bad = [f"{r.layer} {r.item}" for r in self.rows if r.ok is False]
        return "MISMATCH: " + "; ".join(bad)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "config": {"micro_batch": self.config.micro_batch, "seq_len": self.config.seq_len,
                       "precision": self.config.precision},
            "blocks": {"count": self.n_blocks, "checked": 1, "identical": True},
            "rows": [r.to_dict() for r in self.rows],
            "block_saved_math": asdict(self.block_saved_math),
            "block_saved_flash": None if self.block_saved_flash is None else asdict(self.block_saved_flash),
            "params_match": self.params_match,
            "flops_match": self.flops_match,
            "verdict": self.verdict,
            "notes": list(self.notes),
        }


def dims_of(model: ModelSpec) -> Dims:
    try:
        return Dims.from_model(model)
    except ReplayError as e:
        raise ValueError(str(e)) from None


def build_meta_layers(model: ModelSpec, dtype: torch.dtype = torch.bfloat16) -> tuple[Embedding, Block, Head]:
    """Embedding, one block and the head of the replay model, on the meta device (no storage)."""
    d = dims_of(model)
    with torch.device("meta"):
        emb, blk, head = Embedding(d), Block(d), Head(d)
    return emb.to(dtype), blk.to(dtype), head.to(dtype)


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _storage_key(t: Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _Scope:
    """Which part of a block is running (set by module hooks and by the SDPA interception)."""

    def __init__(self) -> None:
        self.name = "block"
        self.after_attention = False
        self.core_keys: set[int] = set()  # storages of FlashAttention's logsumexp


@contextlib.contextmanager
def _block_scopes(block: nn.Module, scope: _Scope) -> Iterator[None]:
    handles = []
    for name, child in block.named_children():
        def pre(_m: nn.Module, _a: Any, name: str = name) -> None:
            scope.name = name

        def post(_m: nn.Module, _a: Any, _o: Any, name: str = name) -> None:
            scope.name = "block"
            if name == "o":
                scope.after_attention = True

        handles += [child.register_forward_pre_hook(pre), child.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _component(scope: str, after_attention: bool, shape: tuple[int, ...], key: int, seq_len: int,
               core_keys: set[int]) -> str:
    """Block component of one saved tensor (see :class:`workloads.activations.BlockActivations`)."""
    if scope in ("ln1", "ln2"):
        return "norms"
    if scope in ("q", "k", "v", "o"):
        return "attention"
    if scope in ("gate", "up", "down"):
        return "mlp"
    if scope == "sdpa":
        square = len(shape) >= 2 and shape[-1] == seq_len and shape[-2] == seq_len
        return "attention_core" if square or key in core_keys else "attention"
    return "mlp" if after_attention else "attention"


class _SdpaMode(TorchFunctionMode):
    """Marks the SDPA call in the scope; with ``flash`` routes it to the CPU flash kernel."""

    def __init__(self, scope: _Scope, flash: bool) -> None:
        super().__init__()
        self.scope, self.flash = scope, flash

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.scope.name = "sdpa"
        try:
            if self.flash:
                q, k, v = args[:3]
                out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, 0.0, bool(kwargs.get("is_causal", False)))
                self.scope.core_keys.add(_storage_key(lse))
                return out
            return func(*args, **kwargs)
        finally:
            self.scope.name = "block"


def saved_activation_bytes(layer: nn.Module, run: Callable[[], Tensor], seq_len: int,
                           extra_params: tuple[Tensor, ...] = (), flash: bool = False) -> tuple[SavedBytes, Tensor]:
    """Bytes of distinct storages saved for backward while ``run()`` runs ``layer``'s forward."""
    skip = {_storage_key(p) for p in (*layer.parameters(), *extra_params)}
    seen: dict[int, Any] = {}  # storage key -> storage (kept alive so keys are not reused)
    out = SavedBytes()
    scope = _Scope()

    records: list[tuple[int, str, bool, tuple[int, ...], str, int]] = []

    def pack(t: Tensor) -> Tensor:
        key = _storage_key(t)
        if key in skip:
            return t
        out.tensors += 1
        if key in seen:
            out.duplicates += 1
            return t
        storage = t.untyped_storage()
        seen[key] = storage
        records.append((key, scope.name, scope.after_attention, tuple(t.shape),
                        str(t.dtype).removeprefix("torch."), int(storage.nbytes())))
        return t

    block = isinstance(layer, Block)
    with contextlib.ExitStack() as stack:
        if block:
            stack.enter_context(_block_scopes(layer, scope))
            stack.enter_context(_SdpaMode(scope, flash))
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        y = run()
    for key, name, after, shape, dt, nbytes in records:
        comp = _component(name, after, shape, key, seq_len, scope.core_keys) if block else "total"
        out.total += nbytes
        out.by_component[comp] = out.by_component.get(comp, 0) + nbytes
        out.by_dtype[dt] = out.by_dtype.get(dt, 0) + nbytes
    return out, y


def _flops(run: Callable[[], Tensor]) -> tuple[dict[str, int], dict[str, int]]:
    """FLOPs by aten op of ``run()``'s forward and of the backward from a dummy gradient."""
    with FlopCounterMode(display=False) as fc:
        y = run()
    fwd = {str(op): int(n) for op, n in fc.get_flop_counts().get("Global", {}).items()}
    with FlopCounterMode(display=False) as fc:
        torch.autograd.backward([y], [torch.empty_like(y)])
    bwd = {str(op): int(n) for op, n in fc.get_flop_counts().get("Global", {}).items()}
    return fwd, bwd


def block_flops_by_kind(counts: dict[str, int]) -> tuple[int, int]:
    """(matmul FLOPs of projections and MLP, attention-core FLOPs) of a FlopCounterMode count."""
    attn = sum(n for op, n in counts.items() if any(k in op for k in ATTENTION_OPS))
    return sum(counts.values()) - attn, attn


VIEW_OPS = frozenset({"view", "_unsafe_view", "transpose", "t", "expand", "reshape", "slice", "select", "unsqueeze",
                      "squeeze", "permute", "detach", "alias", "as_strided", "split", "unbind", "_reshape_alias",
                      "lift_fresh"})
MATMUL_OPS = frozenset({"mm", "addmm", "bmm"})


class OpCount(TorchDispatchMode):
    """Operators that do work (views are free), each matmul's FLOPs, and the bytes (inputs + outputs) of the
    other operators except the attention kernel; a gather reads the rows it picks, not its whole table."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.elementwise = 0
        self.matmuls: list[float] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name in VIEW_OPS:
            return out
        self.n += 1
        if name in MATMUL_OPS:
            a, b = args[-2], args[-1]
            self.matmuls.append(2.0 * a.shape[0] * a.shape[1] * b.shape[1])
            return out
        if any(k in name for k in ATTENTION_OPS):
            return out
        outs = list(out) if isinstance(out, tuple | list) else [out]
        ins = (*args[1:], *outs) if name == "embedding" else args
        self.elementwise += sum(x.numel() * x.element_size() for x in (*ins, *outs) if isinstance(x, Tensor))
        return out


def count_ops(layer: nn.Module, inputs: tuple[Tensor, ...]) -> tuple[OpCount, OpCount]:
    """Operators of ``layer(*inputs)`` forward, and of its backward to the inputs that need gradients and
    the parameters (``torch.autograd.grad``: nothing accumulates into ``.grad``)."""
    with OpCount() as fwd:
        y = layer(*inputs)
    grad = torch.empty_like(y)
    wrt = [x for x in inputs if x.requires_grad] + list(layer.parameters())
    with OpCount() as bwd:
        torch.autograd.grad(y, wrt, grad, allow_unused=True)
    return fwd, bwd


def _dropout_note(model: ModelSpec, what: str) -> str:
    return f"; formula's dropout {what} absent (replay applies no dropout)" if model.dropout else ""


def _component_notes(model: ModelSpec, precision: str, flash: bool) -> dict[str, str]:
    """Why torch's saved bytes of each block component differ from the formula's (measured on meta)."""
    low = precision != "fp32"
    if model.norm == "rmsnorm":
        norms = ("RMSNorm composite (meta/CPU) keeps fp32 x and fp32 x*rstd per norm: "
                 "8 B/elem vs formula's e" if low else
                 "RMSNorm composite keeps x and x*rstd per norm (formula: x only)")
    else:
        norms = "LayerNorm keeps its input (as formula) + fp32 mean and rstd per row (formula ignores)"
    rotary = "; rotary cos/sin tables (formula: none)" if not model.learned_pos else ""
    gqa = model.n_kv_heads != model.n_heads
    if flash:
        attention = ("norm output, flash's q, k, v and out (= o-projection input, one storage)"
                     + ("; K, V expanded to all heads by replay's repeat_interleave (formula: native GQA, "
                        "unexpanded d_kv)" if gqa else "") + rotary + _dropout_note(model, "mask sbh"))
        core = "fp32 logsumexp 4*a*s*b, as formula"
    else:
        upcast = "fp32 (math SDPA upcasts bf16/fp16 on CPU)" if low else "fp32"
        attention = (f"norm output, context; math SDPA's Q (scaled), K^T, V copies in {upcast}"
                     + rotary + _dropout_note(model, "mask sbh"))
        core = (f"s x s probabilities kept in {upcast} vs formula's e*a*s^2*b"
                + _dropout_note(model, "mask and output (3*a*s^2*b)"))
    if model.mlp == "swiglu":
        mlp = "unfused SwiGLU: x, gate(x), silu(gate(x)), up(x), product e*sb*(h+4f), as formula"
    else:
        mlp = "x, GeLU input, GeLU output (down's input), as formula" + _dropout_note(model, "mask sbh")
    return {"norms": norms, "attention": attention, "attention_core": core, "mlp": mlp}


def _x(model: ModelSpec, cfg: WorkloadConfig, dtype: torch.dtype) -> Tensor:
    return torch.empty(cfg.micro_batch, cfg.seq_len, model.hidden, device="meta", dtype=dtype,
                       requires_grad=True)


def _tokens(cfg: WorkloadConfig) -> Tensor:
    return torch.zeros(cfg.micro_batch, cfg.seq_len, dtype=torch.long, device="meta")


def meta_check(model: ModelSpec, micro_batch: int, seq_len: int, precision: str = "bf16") -> MetaCheck:
    """Compare the replay model on the meta device with the formula trace (module docstring)."""
    dtype = TORCH_DTYPES[precision]
    base = dict(micro_batch=micro_batch, seq_len=seq_len, precision=precision, checkpointing="none")
    cfg_math = WorkloadConfig(**base, flash_attention=False)  # type: ignore[arg-type]
    cfg_flash = WorkloadConfig(**base, flash_attention=True)  # type: ignore[arg-type]
    trace: WorkloadTrace = build_trace(model, cfg_math)
    trace_flash = build_trace(model, cfg_flash)
    emb_t, blk_t, head_t = trace.layers[0], trace.layers[1], trace.layers[-1]
    blk_flash_t = trace_flash.layers[1]
    emb, blk, head = build_meta_layers(model, dtype)
    b, s, e = micro_batch, seq_len, cfg_math.dtype_bytes
    rows: list[CheckRow] = []
    notes: list[str] = [f"{model.n_layers} blocks, all built from the same dimensions: block0 measured, "
                        f"totals are {model.n_layers} x block0"]

    # ---- parameter bytes -----------------------------------------------------------------------
    for name, layer, lt in (("embedding", emb, emb_t), ("block", blk, blk_t), ("head", head, head_t)):
        rows.append(CheckRow(name, "param bytes", lt.param_bytes, param_bytes(layer), NOTES["param_bytes"], 0.0))
    rows.append(CheckRow("model", "param bytes", sum(lt.param_bytes for lt in trace.layers),
                         param_bytes(emb) + model.n_layers * param_bytes(blk) + param_bytes(head),
                         f"embedding + {model.n_layers} x block + head", 0.0))

    # ---- embedding -----------------------------------------------------------------------------
    tokens = _tokens(cfg_math)
    fwd, bwd = _flops(lambda: emb(tokens))
    rows.append(CheckRow("embedding", "fwd FLOPs", emb_t.fwd_flops, sum(fwd.values()), NOTES["embedding_flops"], 0.0))
    rows.append(CheckRow("embedding", "bwd FLOPs", emb_t.bwd_flops, sum(bwd.values()), NOTES["embedding_flops"], 0.0))
    saved, _ = saved_activation_bytes(emb, lambda: emb(tokens), s)
    pos = " and position ids (8*s)" if emb.wpe is not None else ""
    rows.append(CheckRow("embedding", "saved activations", emb_t.activation_bytes_nockpt, saved.total,
                         f"torch keeps the int64 token ids (8*b*s){pos} for the scatter-add (formula: input "
                         "data, not counted)" + _dropout_note(model, "sbh mask")))

    # ---- one block -----------------------------------------------------------------------------
    bf = wflops.block_forward_flops(model, b, s, cfg_math.causal_attention_factor)
    fwd, bwd = _flops(lambda: blk(_x(model, cfg_math, dtype)))
    mm_f, attn_f = block_flops_by_kind(fwd)
    mm_b, attn_b = block_flops_by_kind(bwd)
    non_attn = bf.total - bf.attention_core
    k = wflops.BACKWARD_FACTOR
    rows += [
        CheckRow("block", "fwd FLOPs matmuls", non_attn, mm_f, NOTES["block_matmul_flops"], MATMUL_TOLERANCE),
        CheckRow("block", "fwd FLOPs attention", bf.attention_core, attn_f, NOTES["block_attention_flops"],
                 MATMUL_TOLERANCE),
        CheckRow("block", "bwd FLOPs matmuls", k * non_attn, mm_b, "2 x forward (input and weight gradients)",
                 MATMUL_TOLERANCE),
        CheckRow("block", "bwd FLOPs attention", k * bf.attention_core, attn_b,
                 "2 x forward (one gradient per operand)", MATMUL_TOLERANCE),
        CheckRow("block", "fwd FLOPs", blk_t.fwd_flops, mm_f + attn_f, "", MATMUL_TOLERANCE),
        CheckRow("block", "bwd FLOPs", blk_t.bwd_flops, mm_b + attn_b, "", MATMUL_TOLERANCE),
    ]

    math, _ = saved_activation_bytes(blk, lambda: blk(_x(model, cfg_math, dtype)), s)
    acts = act.block_activations(model, b, s, e, flash_attention=False)
    rows.append(CheckRow("block", "saved act. (math SDPA)", blk_t.activation_bytes_nockpt, math.total,
                         "vs formula without FlashAttention; SDPA on meta/CPU takes the math path"))
    notes_math = _component_notes(model, precision, flash=False)
    for comp in BLOCK_COMPONENTS:
        rows.append(CheckRow("block", f"  {comp}", getattr(acts, comp), math.by_component.get(comp, 0),
                             notes_math[comp]))

    flash: SavedBytes | None = None
    try:
        flash, _ = saved_activation_bytes(blk, lambda: blk(_x(model, cfg_math, dtype)), s, flash=True)
    except (RuntimeError, NotImplementedError) as exc:  # a torch without the CPU flash kernel on meta
        notes.append(f"flash-attention measurement skipped: {' '.join(str(exc).split())[:160]}")
    if flash is not None:
        acts_f = act.block_activations(model, b, s, e, flash_attention=True)
        rows.append(CheckRow("block", "saved act. (flash SDPA)", blk_flash_t.activation_bytes_nockpt,
                             flash.total, "vs formula with FlashAttention; SDPA routed to "
                             "aten._scaled_dot_product_flash_attention_for_cpu; norms and mlp as above"))
        notes_flash = _component_notes(model, precision, flash=True)
        for comp in ("attention", "attention_core"):
            rows.append(CheckRow("block", f"  {comp}", getattr(acts_f, comp), flash.by_component.get(comp, 0),
                                 notes_flash[comp]))

    # ---- head ----------------------------------------------------------------------------------
    wte = emb.wte if model.tied_embeddings else None
    targets = _tokens(cfg_math)
    fwd, bwd = _flops(lambda: head(_x(model, cfg_math, dtype), targets, wte))
    rows.append(CheckRow("head", "fwd FLOPs", head_t.fwd_flops, sum(fwd.values()), NOTES["head_flops"],
                         MATMUL_TOLERANCE))
    rows.append(CheckRow("head", "bwd FLOPs", head_t.bwd_flops, sum(bwd.values()), "2 x forward",
                         MATMUL_TOLERANCE))
    extra = (emb.wte,) if wte is not None else ()
    saved, _ = saved_activation_bytes(head, lambda: head(_x(model, cfg_math, dtype), targets, wte), s,
                                      extra_params=extra)
    norm = ("RMSNorm (composite on meta/CPU) keeps fp32 x and fp32 x*rstd" if model.norm == "rmsnorm"
            else "LayerNorm keeps its input + fp32 mean/rstd")
    rows.append(CheckRow("head", "saved activations", head_t.activation_bytes_nockpt, saved.total,
                         f"formula: norm input + LM-head input (e*sbh each) + fp32 logits 4*s*b*V; torch: "
                         f"{norm}, the LM-head input, the log-softmax in {precision} ({e}*s*b*V: "
                         "cross-entropy keeps no fp32 copy of the logits) and the int64 targets"))
    # ---- operators (workloads.ops), the attention on the CPU flash kernel as the replay runs it ------------
    cfg_ops = WorkloadConfig(micro_batch=micro_batch, seq_len=seq_len, precision=precision, checkpointing="none")
    low = precision != "fp32"
    for index, name, layer, inputs in (
            (0, "embedding", emb, (_tokens(cfg_ops),)),
            (1, "block", blk, (_x(model, cfg_ops, dtype),)),
            (model.n_layers + 1, "head", head, (_x(model, cfg_ops, dtype), _tokens(cfg_ops))
             + ((emb.wte,) if model.tied_embeddings else ()))):
        try:
            with _SdpaMode(_Scope(), flash=True):
                counted = count_ops(layer, inputs)
        except (RuntimeError, NotImplementedError) as exc:  # a torch without that kernel on meta
            notes.append(f"{name} operator count skipped: {' '.join(str(exc).split())[:160]}")
            continue
        for phase, c in zip(("fwd", "bwd"), counted, strict=True):
            want = layer_ops(model, cfg_ops, index, phase)
            upcast = low and name != "embedding"
            why = ("eager PyTorch inventory (workloads.ops)" + (f"; in {precision} torch adds fp32 up/down casts "
                                                                 "(composite RMSNorm, rotary, loss)" if upcast else ""))
            rows.append(CheckRow(name, f"{phase} operators", want.n_ops, c.n, why, None if low else 0.0))
            rows.append(CheckRow(name, f"{phase} element-wise bytes", want.elementwise_bytes, c.elementwise,
                                 "bytes read + written by the non-matmul operators" + (
                                     f"; {precision}: fp32 upcasts, and the loss's logits in {precision} "
                                     "(inventory: fp32)" if upcast else "")))
    return MetaCheck(model=model, config=cfg_math, n_blocks=model.n_layers, rows=tuple(rows),
                     block_saved_math=math, block_saved_flash=flash, notes=tuple(notes))
