"""Build a ``config.json``'s model on the meta device with ``transformers`` and walk its module tree.

``torch.device("meta")`` gives every tensor a shape and no storage, so the full-size model definition
(DeepSeek-V3's 671 B parameters included) is built in seconds with no memory and no weights. The
configuration is built from the file's own fields with the ``transformers`` class registered for its
``model_type`` (``AutoConfig.for_model``), and the model with ``AutoModelForCausalLM.from_config``:
no network access, and never ``trust_remote_code`` (a model whose code is not in ``transformers`` is
refused with one line). ``torch`` and ``transformers`` are imported inside the functions: they are the
optional ``hf`` extra (``pip install 'tiersim[hf]'``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from workloads.errors import WorkloadInputError
from workloads.hf_inventory.classify import classify
from workloads.hf_inventory.inventory import (
    AttentionShape,
    LayerInventory,
    ModelInventory,
    MoeShape,
    ParamTensor,
)

__all__ = ["HF_EXTRA_HINT", "build_meta_model", "inventory_and_config", "inventory_from_config",
           "transformers_available", "walk_model"]

HF_EXTRA_HINT = "pip install 'tiersim[hf]'"
MAX_LAYERS = 2048
"""Layers a definition is built with at most: building costs ~10 ms a layer, the largest published models have
~100 (a hostile or mistyped count would otherwise keep the process busy for hours)."""
_TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "moe_topk", "top_k",
               "n_activated_experts", "moe_k", "num_selected_experts")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def transformers_available() -> bool:
    """True when ``transformers`` (>= 5) and ``torch`` can be imported."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return False
    return int(str(transformers.__version__).split(".")[0]) >= 5


def _modules() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise WorkloadInputError(
            f"describing a model from its definition needs transformers and torch ({exc.name} is not "
            f"installed); install the optional extra: {HF_EXTRA_HINT}"
        ) from None
    if int(str(transformers.__version__).split(".")[0]) < 5:
        raise WorkloadInputError(
            f"describing a model from its definition needs transformers >= 5 (found {transformers.__version__}); "
            f"upgrade it: {HF_EXTRA_HINT}"
        )
    return torch, transformers


def _config_int(cfg: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def build_meta_model(config: Mapping[str, Any], where: str) -> tuple[Any, Any, list[str]]:
    """(model on the meta device, its transformers config, notes) for a config.json's fields."""
    torch, transformers = _modules()
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    notes: list[str] = []
    fields = dict(config)
    model_type = fields.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise WorkloadInputError(f"{where}: missing field 'model_type' (needed to build the model definition)")
    if model_type not in CONFIG_MAPPING:
        raise WorkloadInputError(
            f"{where}: model_type {model_type!r} is not defined in transformers {transformers.__version__} "
            "(its code would have to come from the Hub; trust_remote_code is never used); upgrade transformers "
            "or describe the model in a YAML of dimensions"
        )
    text = fields.get("text_config")
    if (isinstance(text, Mapping) and text.get("model_type") not in (None, model_type)
            and text["model_type"] in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        model, cfg, inner = build_meta_model(text, f"{where} (text_config)")
        return model, cfg, [f"{model_type}: only its language model ({text['model_type']}, from text_config) is "
                            "described; the vision/audio towers are not modelled", *inner]
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()   # config sanity warnings (token ids) are not ours to print
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fields.pop("model_type")
            try:
                hf_config = AutoConfig.for_model(model_type, **fields)
            except Exception as exc:  # any refusal of transformers is the user's input at fault
                raise WorkloadInputError(f"{where}: transformers refused the configuration: {_one_line(exc)}") from None
            layers = _config_int(_text_config(hf_config), "num_hidden_layers", "n_layer", "num_layers")
            if layers is not None and layers > MAX_LAYERS:
                raise WorkloadInputError(
                    f"{where}: field 'num_hidden_layers' ({layers}) is above the {MAX_LAYERS} layers the model "
                    "definition is built with (about 10 ms a layer); check the value or use the formulas "
                    "(a YAML of dimensions)"
                )
            if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
                raise WorkloadInputError(
                    f"{where}: model_type {model_type!r} has no causal language model in transformers "
                    f"{transformers.__version__}; tiersim describes decoder language models"
                )
            try:
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=False)
            except Exception as exc:  # the definition's own checks of the configuration
                raise WorkloadInputError(
                    f"{where}: transformers could not build the {model_type} model from this configuration: "
                    f"{_one_line(exc)}"
                ) from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    return model, hf_config, notes


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _decoder_layers(model: Any, n_layers: int | None) -> tuple[str, Any]:
    import torch

    found = [(name, mod) for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0 and (n_layers is None or len(mod) == n_layers)]
    if not found:
        raise WorkloadInputError(
            f"{type(model).__name__}: no list of {n_layers} decoder layers found in the module tree"
        )
    return found[0]


def _out_in(module: Any, shape: tuple[int, ...]) -> tuple[int, int]:
    """(output, input) width of a 2-D weight; GPT-2's Conv1D stores (input, output)."""
    if hasattr(module, "nf") and len(shape) == 2 and shape[1] == module.nf:
        return shape[1], shape[0]
    return shape[0], shape[-1]


def _layer_params(layer: Any) -> Iterator[tuple[list[str], list[str], str, Any, Any, bool]]:
    """(path parts, class names along the path, parameter name, parameter, owner module, beside experts)."""
    modules = dict(layer.named_modules())
    for path, module in modules.items():
        parts = path.split(".") if path else []
        classes = [type(modules[".".join(parts[:i + 1])]).__name__ for i in range(len(parts))]
        parent = modules.get(".".join(parts[:-1])) if parts else None
        beside = parent is not None and "experts" in dict(parent.named_children())
        for pname, param in module.named_parameters(recurse=False):
            yield parts, classes, pname, param, module, beside


def _expert_index(parts: list[str]) -> int | None:
    for i, p in enumerate(parts[:-1]):
        if p == "experts" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


_Unknown = dict[tuple[str, tuple[int, ...], bool], list[int]]


def _walk_layer(index: int, prefix: str, layer: Any, cfg: Any, seen: set[int], unknown: _Unknown) -> LayerInventory:
    tensors: list[ParamTensor] = []
    widths: dict[str, tuple[int, int]] = {}     # kind -> (out, in) of its weight
    lead = 0
    expert_ids: set[int] = set()
    attn_module = None
    for parts, classes, pname, param, module, beside in _layer_params(layer):
        if id(param) in seen:
            continue
        seen.add(id(param))
        shape = tuple(int(d) for d in param.shape)
        place = classify(parts, classes, pname, shape, beside_experts=beside)
        name = f"{prefix}.{'.'.join([*parts, pname])}"
        tensors.append(ParamTensor(name, place.kind, shape, place.matrix))
        lead = max(lead, place.routed_experts)
        if place.kind.startswith("expert."):
            idx = _expert_index(parts)
            if idx is not None:
                expert_ids.add(idx)
        if place.matrix and len(shape) == 2 and place.kind not in widths:
            widths[place.kind] = _out_in(module, shape)
        if place.kind.startswith("attn.") and attn_module is None:
            attn_module = _attention_module(layer, parts)
        if place.kind in ("other", "attn.other", "mlp.other", "expert.other", "shared.other"):
            unknown.setdefault((".".join([*parts, pname]), shape, place.matrix), []).append(index)
    hidden = int(cfg.hidden_size)
    moe = _moe_shape(index, tensors, lead or len(expert_ids), cfg, hidden)
    dense_down = sum(t.numel for t in tensors if t.kind == "mlp.down" and t.matrix)
    mlp_kinds = {t.kind.split(".", 1)[1] for t in tensors
                 if t.kind.split(".")[0] in ("mlp", "expert") and t.matrix}
    gated = bool(mlp_kinds & {"gate", "gate_up"})
    return LayerInventory(
        index=index, tensors=tuple(tensors),
        attention=_attention_shape(index, widths, attn_module, cfg),
        moe=moe, ffn=dense_down // hidden, mlp_matrices=(3 if gated else 2) if mlp_kinds else 0,
    )


def _attention_module(layer: Any, parts: list[str]) -> Any:
    modules = dict(layer.named_modules())
    for i in range(len(parts) - 1, -1, -1):
        mod = modules.get(".".join(parts[:i + 1]))
        if mod is not None and ("attention" in type(mod).__name__.lower() or parts[i] in ("self_attn", "attn")):
            return mod
    return None


def _attention_shape(index: int, widths: dict[str, tuple[int, int]], attn: Any, cfg: Any) -> AttentionShape | None:
    heads = _config_int(cfg, "num_attention_heads", "n_head", "num_heads")
    if heads is None or "attn.o" not in widths:
        return None
    v_head = widths["attn.o"][1] // heads
    q_lora = kv_lora = None
    if "attn.qkv" in widths:
        head_dim = _config_int(attn, "head_dim") or _config_int(cfg, "head_dim") or int(cfg.hidden_size) // heads
        qk_head = head_dim
        kv_heads = (widths["attn.qkv"][0] - heads * head_dim) // (2 * head_dim)
    elif "attn.q_up" in widths or "attn.kv_up" in widths:     # latent attention (MLA)
        q_out = widths["attn.q_up"][0] if "attn.q_up" in widths else widths["attn.q"][0]
        qk_head = q_out // heads
        kv_heads = heads
        q_lora = widths["attn.q_down"][0] if "attn.q_down" in widths else None
        kv_lora = _config_int(cfg, "kv_lora_rank") or widths["attn.kv_up"][1]
    elif "attn.q" in widths:
        qk_head = widths["attn.q"][0] // heads
        kv_heads = widths["attn.k"][0] // qk_head if "attn.k" in widths else heads
    else:
        return None
    return AttentionShape(n_heads=heads, n_kv_heads=max(kv_heads, 1), qk_head_dim=qk_head, v_head_dim=v_head,
                          sliding_window=_sliding_window(index, attn, cfg), q_lora_rank=q_lora, kv_lora_rank=kv_lora)


def _sliding_window(index: int, attn: Any, cfg: Any) -> int | None:
    """The layer's window: the attention module's own (Gemma, Qwen2), else the config's layer types, else
    the config's ``sliding_window`` for every layer (Mistral v0.1, Mixtral, Starcoder2) -- only where the
    configuration class declares the field: a stray ``sliding_window`` key in a Llama config is not used."""
    if attn is not None and hasattr(attn, "sliding_window"):
        value = attn.sliding_window
    elif "sliding_window" not in getattr(type(cfg), "__dataclass_fields__", {"sliding_window": None}):
        value = None
    else:
        layer_types = getattr(cfg, "layer_types", None)
        window = getattr(cfg, "sliding_window", None)
        if isinstance(layer_types, list | tuple) and index < len(layer_types):
            value = window if layer_types[index] == "sliding_attention" else None
        else:
            value = window
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _moe_shape(index: int, tensors: list[ParamTensor], n_experts: int, cfg: Any, hidden: int) -> MoeShape | None:
    routed = [t for t in tensors if t.routed]
    if not routed:
        return None
    configured = _config_int(cfg, *_EXPERT_KEYS)
    if n_experts <= 0:
        n_experts = configured or 0
    top_k = _config_int(cfg, *_TOP_K_KEYS)
    if n_experts <= 0 or top_k is None:
        raise WorkloadInputError(
            f"layer {index}: routed experts found but the config names no expert count / top-k "
            f"(looked for {', '.join(_TOP_K_KEYS)})"
        )
    down = sum(t.numel for t in routed if t.kind == "expert.down" and t.matrix) // n_experts
    shared_down = sum(t.numel for t in tensors if t.kind == "shared.down" and t.matrix)
    expert_ffn = down // hidden
    shared_ffn = shared_down // hidden
    n_shared = shared_ffn // expert_ffn if expert_ffn and shared_ffn % expert_ffn == 0 else (1 if shared_ffn else 0)
    return MoeShape(n_experts=n_experts, top_k=min(top_k, n_experts), n_shared=n_shared,
                    expert_ffn=expert_ffn, shared_ffn=shared_ffn)


def _outside_kind(name: str, module: Any, model: Any) -> str:
    import torch

    cls = type(module).__name__.lower()
    leaf = name.rsplit(".", 1)[-1]
    if module is model.get_input_embeddings():
        return "embedding"
    if module is model.get_output_embeddings():
        return "lm_head"
    if isinstance(module, torch.nn.Embedding) or "position" in cls or leaf in ("wpe", "embed_positions"):
        return "position"
    if "norm" in cls or "norm" in leaf or leaf.startswith("ln"):
        return "embedding.norm" if "embed" in leaf else "norm"
    return "other"


def _persistent_buffers(model: Any) -> dict[str, int]:
    """Elements of the buffers saved with the weights (not the rotary tables), by buffer name."""
    out: dict[str, int] = {}
    for module in model.modules():
        skip: set[str] = getattr(module, "_non_persistent_buffers_set", set())
        for bname, buf in module.named_buffers(recurse=False):
            if buf is None or bname in skip:
                continue
            out[bname] = out.get(bname, 0) + int(buf.numel())
    return out


def _text_config(cfg: Any) -> Any:
    """The decoder's configuration (a multimodal config keeps the language model's dimensions in it)."""
    text_config = getattr(cfg, "get_text_config", None)
    return text_config(decoder=True) if callable(text_config) else cfg


def walk_model(model: Any, cfg: Any, model_type: str, notes: list[str] | None = None) -> ModelInventory:
    """The inventory of a built model (any device; the meta device costs nothing)."""
    notes = list(notes or [])
    cfg = _text_config(cfg)
    n_layers = _config_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    layers_name, layer_list = _decoder_layers(model, n_layers)
    seen: set[int] = set()
    unknown: _Unknown = {}
    layers = tuple(_walk_layer(i, f"{layers_name}.{i}", layer, cfg, seen, unknown)
                   for i, layer in enumerate(layer_list))
    for (where, shape, matrix), indices in unknown.items():
        notes.append(f"tensor '{where}' {shape} of {len(indices)} layer(s) not recognised; counted in the "
                     f"parameters{' and as a dense matmul' if matrix else ''}")
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    tied = out is not None and inp is not None and out.weight is inp.weight
    embedding: list[ParamTensor] = []
    head: list[ParamTensor] = []
    other: list[ParamTensor] = []
    inside = re.compile(rf"^{re.escape(layers_name)}(\.|$)")
    for name, module in model.named_modules():
        if inside.match(name):
            continue
        for pname, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            kind = _outside_kind(name, module, model)
            tensor = ParamTensor(f"{name}.{pname}", kind, tuple(int(d) for d in param.shape),
                                 matrix=kind in ("lm_head", "other") and param.dim() >= 2)
            if kind in ("embedding", "position", "embedding.norm"):
                embedding.append(tensor)
            elif kind in ("norm", "lm_head"):
                head.append(tensor)
            else:
                other.append(tensor)
                notes.append(f"tensor '{tensor.name}' {tensor.shape} outside the layers not recognised; counted")
    if inp is None:
        raise WorkloadInputError(f"{type(model).__name__}: the model has no input embedding")
    vocab, hidden = (int(d) for d in inp.weight.shape)
    rotary = any("rotary" in type(mod).__name__.lower() for mod in model.modules())
    buffers = _persistent_buffers(model)
    if buffers:
        total = sum(buffers.values())
        names = ", ".join(f"{n} ({c:,})" for n, c in sorted(buffers.items()))
        notes.append(f"persistent buffers are in the checkpoint but not trained, so not counted as parameters: "
                     f"{total:,} elements ({names})")
    return ModelInventory(
        model_type=model_type, architecture=type(model).__name__, hidden=hidden, vocab=vocab, layers=layers,
        embedding=tuple(embedding), head=tuple(head), other=tuple(other), tied_embeddings=tied, rotary=rotary,
        notes=tuple(notes),
    )


def inventory_and_config(config: Mapping[str, Any], *, where: str = "config.json") -> tuple[ModelInventory, Any]:
    """Build the config's model on the meta device: (its inventory, the transformers config object)."""
    model, cfg, notes = build_meta_model(config, where)
    try:
        inventory = walk_model(model, cfg, str(getattr(cfg, "model_type", config.get("model_type"))), notes)
    except WorkloadInputError as exc:
        raise WorkloadInputError(f"{where}: {exc}") from None
    except Exception as exc:   # a definition whose layout the walk does not know: one line, not a traceback
        raise WorkloadInputError(
            f"{where}: the {type(model).__name__} definition could not be inventoried ({type(exc).__name__}: "
            f"{_one_line(exc)}); describe the model in a YAML of dimensions"
        ) from None
    return inventory, _text_config(cfg)


def inventory_from_config(config: Mapping[str, Any], *, where: str = "config.json") -> ModelInventory:
    """Build the config's model on the meta device and return its inventory."""
    return inventory_and_config(config, where=where)[0]
