"""Transformer model description (:class:`ModelSpec`) and how to obtain one (:func:`load_model`).

Parameter counts are exact sums over the weight tensors of the reference implementations
(HF ``transformers`` modules of every family in :data:`FAMILIES`); the formulas, block by block, are in
:mod:`workloads.model_params`. For the original families (GPT-2, OPT, LLaMA, Mistral, Mixtral)::

    attention   q: h*h, k and v: h*d_kv each (d_kv = n_kv_heads*head_dim, GQA), o: h*h
                (+ biases h + 2*d_kv + h when ``bias``)
    mlp         gelu: 2*h*f (+ f + h bias); swiglu: 3*h*f (+ 2f + h bias)
                MoE: n_experts such MLPs + a router h*n_experts (no bias)
    norms       2 per block; layernorm 2h (weight+bias), rmsnorm h (weight)

plus the token embedding V*h, learned position embeddings (``max_pos`` rows; OPT keeps 2 extra
offset rows, so ``max_pos + 2``), the final norm, and an LM head V*h when the embeddings are untied.
These reproduce the reference totals of ``hardware_models/reference/hardware_specs.yaml`` exactly for
all presets (tests/test_workload_params.py); the GPT-2 linear/LayerNorm biases and OPT's 2 offset rows are part
of the exact count, not a residual. The fields added for today's architectures (explicit ``head_dim``,
expert widths, shared experts, dense first layers, latent attention, sliding windows, qk-norm, extra
norms, parallel blocks, per-projection biases, ALiBi, embedding norm) default to values that leave those
counts, and every figure derived from them, unchanged; :class:`ModelSpec`'s docstring gives each one
in a line.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from workloads import custom_model, model_params, presets
from workloads.checks import boolean, choice, dataclass_kwargs, non_negative_int, positive_int, suggest
from workloads.errors import WorkloadInputError
from workloads.files import check_model_size
from workloads.hf_inventory import route as hf_route

__all__ = ["FAMILIES", "MLP_KINDS", "NORM_KINDS", "QK_NORM_KINDS", "ROUTES", "ModelSpec", "list_models",
           "load_model"]

FAMILIES = ("gpt2", "opt", "gpt3", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3",
            "gemma2", "gemma3", "olmo2", "falcon", "gpt_neox", "bloom", "deepseek_v3", "custom")
"""Families the formula route knows by name; any other lower-case identifier (a ``model_type`` described
by the model-definition route) is accepted as a label."""
MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
QK_NORM_KINDS = ("none", "head", "full")
ROUTES = ("formula", "model definition")
_FAMILY_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")



@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a decoder-only transformer; validated on construction. Change dimensions with
    :meth:`with_shape` (it re-resolves the implied widths), never ``dataclasses.replace``.

    ``dropout`` (an addition to the original contract, default False) says whether training applies
    dropout (GPT-2/GPT-3/OPT: yes; LLaMA/Mistral: no); it changes the saved activations (masks).

    Fields for today's architectures (defaults keep the original families' figures identical):

    - ``head_dim``: width of one query/key head (0: hidden // n_heads); Q is n_heads*head_dim wide,
      K n_kv_heads*head_dim, and the output projection maps n_heads*v_head_dim back to hidden.
    - ``v_head_dim``: width of one value head (0: head_dim); differs only for latent attention.
    - ``expert_ffn``: width of each routed expert's MLP (0: ffn); ``ffn`` stays the dense MLP width.
    - ``shared_experts`` / ``shared_expert_ffn``: experts every token passes through (DeepSeek), and
      the width of each (0: expert_ffn).
    - ``first_dense_layers``: the first k blocks of an MoE model use a dense MLP of width ``ffn``.
    - ``q_lora_rank`` / ``kv_lora_rank`` / ``qk_rope_head_dim``: multi-head latent attention (MLA,
      DeepSeek-V2/V3); kv_lora_rank 0 means ordinary (GQA) attention. With MLA ``head_dim`` is
      qk_nope_head_dim + qk_rope_head_dim and q_lora_rank 0 projects Q straight from hidden.
    - ``sliding_window`` / ``sliding_layers``: attention window in tokens (0: none) and the 0-based block
      indices that use it (every other block attends to the whole sequence).
    - ``qk_norm``: "none", "head" (one norm of head_dim shared by all heads, Qwen3/Gemma3) or "full"
      (a norm over the whole Q and K projections, OLMo-2).
    - ``block_norms``: hidden-wide norms per block (2; Gemma-2/3: 4; Falcon-7B's parallel block: 1).
    - ``parallel_blocks``: attention and MLP read the same block input (Falcon, GPT-NeoX, GPT-J).
    - ``qkv_bias`` / ``o_bias`` / ``mlp_bias``: biases of those projections where ``bias`` (all linear
      layers) is false (Qwen2: qkv only).
    - ``alibi``: ALiBi position biases (BLOOM): no position parameters and no rotary embedding.
    - ``embedding_norm``: a norm right after the token embedding (BLOOM).
    - ``route``: how the model was described ("formula" or "model definition").
    - ``notes``: keys of the source that change cost but are not modelled, each named once.
    """

    name: str
    family: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    max_pos: int
    tied_embeddings: bool
    mlp: str
    norm: str
    bias: bool
    learned_pos: bool
    n_experts: int = 1
    experts_per_token: int = 1
    dropout: bool = False
    source: str = ""
    head_dim: int = 0
    v_head_dim: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    shared_expert_ffn: int = 0
    first_dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    qk_norm: str = "none"
    block_norms: int = 2
    parallel_blocks: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    alibi: bool = False
    embedding_norm: bool = False
    route: str = "formula"
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        where = f"model '{self.name}'"
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab", "max_pos",
                     "n_experts", "experts_per_token"):
            positive_int(getattr(self, name), name, where)
        for name in ("head_dim", "v_head_dim", "expert_ffn", "shared_experts", "shared_expert_ffn",
                     "first_dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "sliding_window",
                     "block_norms"):
            non_negative_int(getattr(self, name), name, where)
        for name in ("tied_embeddings", "bias", "learned_pos", "dropout", "parallel_blocks", "qkv_bias", "o_bias",
                     "mlp_bias", "alibi", "embedding_norm"):
            boolean(getattr(self, name), name, where)
        self._check_family(where)
        choice(self.mlp, "mlp", MLP_KINDS, where)
        choice(self.norm, "norm", NORM_KINDS, where)
        choice(self.qk_norm, "qk_norm", QK_NORM_KINDS, where)
        choice(self.route, "route", ROUTES, where)
        self._resolve_derived(where)
        self._check_lists(where)
        self._check_shapes(where)

    def _check_family(self, where: str) -> None:
        if not isinstance(self.family, str) or not _FAMILY_RE.match(self.family):
            raise WorkloadInputError(
                f"{where}: field 'family' must be a lower-case identifier such as "
                f"{', '.join(FAMILIES[:6])} (got {self.family!r})"
            )

    def _resolve_derived(self, where: str) -> None:
        if self.head_dim == 0:
            if self.hidden % self.n_heads:
                raise WorkloadInputError(
                    f"{where}: field 'hidden' ({self.hidden}) must be divisible by 'n_heads' ({self.n_heads}), "
                    "or give 'head_dim' explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.expert_ffn == 0 or not self.is_moe:  # a dense model has no expert apart from its MLP
            object.__setattr__(self, "expert_ffn", self.ffn)
        if self.shared_expert_ffn == 0 or not self.is_moe:
            object.__setattr__(self, "shared_expert_ffn", self.expert_ffn)

    def _check_lists(self, where: str) -> None:
        layers = self.sliding_layers
        if not isinstance(layers, list | tuple) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise WorkloadInputError(
                f"{where}: field 'sliding_layers' must be a list of block indices (got {layers!r})")
        object.__setattr__(self, "sliding_layers", tuple(sorted(set(layers))))
        if layers and (min(layers) < 0 or max(layers) >= self.n_layers):
            raise WorkloadInputError(
                f"{where}: field 'sliding_layers' holds {min(layers) if min(layers) < 0 else max(layers)}; "
                f"block indices run 0..{self.n_layers - 1}"
            )
        if bool(layers) != bool(self.sliding_window):
            raise WorkloadInputError(
                f"{where}: fields 'sliding_window' ({self.sliding_window}) and 'sliding_layers' go together: "
                "give both (a window and the blocks that use it) or neither"
            )
        notes = self.notes
        if not isinstance(notes, list | tuple) or not all(isinstance(n, str) for n in notes):
            raise WorkloadInputError(f"{where}: field 'notes' must be a list of strings (got {notes!r})")
        object.__setattr__(self, "notes", tuple(notes))

    def _check_shapes(self, where: str) -> None:
        if self.n_heads % self.n_kv_heads:
            raise WorkloadInputError(
                f"{where}: field 'n_heads' ({self.n_heads}) must be a multiple of 'n_kv_heads' "
                f"({self.n_kv_heads}) (grouped-query attention)"
            )
        if self.experts_per_token > self.n_experts:
            raise WorkloadInputError(
                f"{where}: field 'experts_per_token' ({self.experts_per_token}) must be <= "
                f"'n_experts' ({self.n_experts})"
            )
        if not self.is_moe and (self.shared_experts or self.first_dense_layers):
            raise WorkloadInputError(
                f"{where}: fields 'shared_experts' and 'first_dense_layers' need a mixture of experts "
                "(n_experts > 1); remove them for a dense model"
            )
        if self.first_dense_layers > self.n_layers:
            raise WorkloadInputError(
                f"{where}: field 'first_dense_layers' ({self.first_dense_layers}) must be <= 'n_layers' "
                f"({self.n_layers})"
            )
        if self.is_mla:
            if not 0 < self.qk_rope_head_dim < self.head_dim:
                raise WorkloadInputError(
                    f"{where}: latent attention needs 0 < 'qk_rope_head_dim' ({self.qk_rope_head_dim}) < "
                    f"'head_dim' ({self.head_dim}, = qk_nope_head_dim + qk_rope_head_dim)"
                )
            if self.n_kv_heads != self.n_heads or self.bias or self.qkv_bias or self.qk_norm != "none":
                raise WorkloadInputError(
                    f"{where}: latent attention (kv_lora_rank > 0) takes n_kv_heads = n_heads, no attention "
                    "bias and qk_norm none (as DeepSeek-V2/V3)"
                )
        elif self.q_lora_rank or self.qk_rope_head_dim:
            raise WorkloadInputError(
                f"{where}: fields 'q_lora_rank' and 'qk_rope_head_dim' belong to latent attention; give "
                "'kv_lora_rank' too, or remove them"
            )
        if self.alibi and self.learned_pos:
            raise WorkloadInputError(f"{where}: fields 'alibi' and 'learned_pos' exclude each other; pick one")

    # ---- derived dimensions -------------------------------------------------------------------
    @property
    def kv_dim(self) -> int:
        """Width of the K projection: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the Q projection (and of K after a GQA/MLA expansion): n_heads * head_dim."""
        return self.n_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the V projection: n_kv_heads * v_head_dim."""
        return self.n_kv_heads * self.v_head_dim

    @property
    def context_dim(self) -> int:
        """Width of the attention output fed to the output projection: n_heads * v_head_dim."""
        return self.n_heads * self.v_head_dim

    @property
    def qk_nope_head_dim(self) -> int:
        """Latent attention: the part of a query/key head without rotary embedding (0 without MLA)."""
        return self.head_dim - self.qk_rope_head_dim if self.is_mla else 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def rotary(self) -> bool:
        """Rotary position embeddings (neither learned positions nor ALiBi)."""
        return not self.learned_pos and not self.alibi

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (OPT: max_pos + 2 offset rows); 0 for rotary."""
        if not self.learned_pos:
            return 0
        return self.max_pos + 2 if self.family == "opt" else self.max_pos

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices h<->ffn per MLP (expert): 2 for gelu, 3 for swiglu."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias or self.qkv_bias

    @property
    def has_o_bias(self) -> bool:
        return self.bias or self.o_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.bias or self.mlp_bias

    @property
    def uniform(self) -> bool:
        """True when every block has the same shape (no dense first layers, no partial sliding window)."""
        return (not self.is_moe or self.first_dense_layers == 0) and len(self.sliding_layers) in (0, self.n_layers)

    # ---- per-block variants -------------------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        """Block ``layer`` (0-based) routes its tokens to experts."""
        return self.is_moe and layer >= self.first_dense_layers

    def window(self, layer: int) -> int:
        """Attention window of block ``layer`` in tokens (0: the whole sequence)."""
        return self.sliding_window if layer in self.sliding_layers else 0

    def block_kind(self, layer: int) -> tuple[bool, int]:
        """What distinguishes blocks: (routes to experts, attention window)."""
        return self.is_moe_layer(layer), self.window(layer)

    def default_layer(self) -> int:
        """The block a per-block figure describes when no block is named: the last one."""
        return self.n_layers - 1

    # ---- parameter counts (see workloads.model_params) ----------------------------------------
    def norm_params(self) -> int:
        """Parameters of one hidden-wide normalisation layer."""
        return model_params.norm(self, self.hidden)

    def embedding_params(self) -> int:
        return model_params.embedding(self)

    def attention_params(self) -> int:
        return model_params.attention(self)

    def expert_params(self) -> int:
        """Parameters of one routed expert's MLP (the MLP of a dense block when the model is dense)."""
        return model_params.mlp(self, self.expert_ffn)

    def router_params(self) -> int:
        return self.hidden * self.n_experts if self.is_moe else 0

    def block_params(self, active: bool = False, layer: int | None = None) -> int:
        """One transformer block (``layer``, 0-based; default the last); ``active`` counts only
        experts_per_token routed experts (shared experts and router included)."""
        return model_params.block(self, self.default_layer() if layer is None else layer, active)

    def head_params(self) -> int:
        """Final norm plus the LM head matrix (0 extra when tied to the token embedding)."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def blocks_params(self, active: bool = False) -> int:
        """All blocks together."""
        dense = self.first_dense_layers if self.is_moe else 0
        total = (self.n_layers - dense) * self.block_params(active)
        return total + (dense * self.block_params(active, layer=0) if dense else 0)

    def params(self) -> int:
        """Total parameter count (all experts)."""
        return self.embedding_params() + self.blocks_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters touched per token (MoE: experts_per_token experts + shared experts + router);
        = params() if dense."""
        return self.embedding_params() + self.blocks_params(active=True) + self.head_params()

    # ---- derived shapes -----------------------------------------------------------------------
    def with_shape(self, **changes: object) -> ModelSpec:
        """This model with ``changes`` applied and every derived width re-resolved from the new shape.

        Use it (never ``dataclasses.replace``) to change a dimension: ``replace`` passes the widths resolved
        for the old shape (``head_dim`` = old hidden / old heads, ``v_head_dim``, ``expert_ffn``,
        ``shared_expert_ffn``) on as if they had been given, so ``replace(spec, hidden=.., n_heads=..)``
        keeps a stale head width unless the caller also passes ``head_dim=0, v_head_dim=0``. Here a width
        that the old shape implied is implied again by the new one; a width given explicitly (Gemma-2's
        head_dim 256, an MoE's expert_ffn) stays as given unless ``changes`` names it (0 re-derives it).
        An unknown field is refused with the list of fields."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise WorkloadInputError(f"model '{self.name}': unknown field(s) {', '.join(unknown)} for with_shape; "
                                     f"fields are {', '.join(sorted(names))}")
        data = self.to_dict()  # leaves out the widths the current shape implies
        data.update(changes)
        return ModelSpec.from_dict(data)

    # ---- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        """All fields; the fields added after the original contract only where they differ from what
        their default gives (so a plan of an original-family model is unchanged)."""
        data = asdict(self)
        data["sliding_layers"], data["notes"] = list(self.sliding_layers), list(self.notes)
        implied = {"head_dim": self.hidden // self.n_heads if self.hidden % self.n_heads == 0 else None,
                   "v_head_dim": self.head_dim, "expert_ffn": self.ffn, "shared_expert_ffn": self.expert_ffn}
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name in implied and value == implied[f.name]) or (f.name in _ADDED and value == f.default):
                del data[f.name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ModelSpec:
        return cls(**dataclass_kwargs(cls, data, "model spec"))


# fields added after the original contract: left out of to_dict() at their default
_ADDED = ("shared_experts", "first_dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
          "sliding_window", "sliding_layers", "qk_norm", "block_norms", "parallel_blocks", "qkv_bias", "o_bias",
          "mlp_bias", "alibi", "embedding_norm", "route", "notes")


def list_models() -> list[str]:
    """Preset names, in the order of ``workloads/presets/models.yaml``."""
    return list(presets.preset_table())


def load_model(name_or_path: str, route: str | None = None) -> ModelSpec:
    """A preset or shorthand (case-insensitive), an HF ``config.json`` (or a folder holding one), or a
    YAML file of dimensions (see :mod:`workloads.custom_model`). For a config.json, ``route`` picks the
    formulas or the model definition (None: automatic; :mod:`workloads.hf_inventory.route`)."""
    text = str(name_or_path).strip()
    path = Path(text).expanduser()
    looks_like_path = path.suffix.lower() in (".json", ".yaml", ".yml") or "/" in text or "\\" in text
    if path.is_dir() and (path / "config.json").is_file():
        path, looks_like_path = path / "config.json", True
    if looks_like_path or path.is_file():
        if not path.is_file():
            raise WorkloadInputError(f"model file not found: {text}; give an existing config.json or YAML")
        if path.suffix.lower() == ".json":
            model = hf_route.load_hf_model(path, route)
        else:
            model = ModelSpec(**custom_model.parse_custom_yaml(path))  # type: ignore[arg-type]
        check_model_size(model.params(), model.n_layers, str(path))  # impossible sizes: the bound named
        return model

    table = presets.preset_table()
    shorthands = presets.shorthands()
    key = text.lower()
    key = shorthands.get(key, key)
    if key in table:
        return ModelSpec(name=key, **table[key])  # type: ignore[arg-type]
    raise WorkloadInputError(
        f"unknown model {text!r}; known: {', '.join(table)} (shorthands {', '.join(shorthands)}) "
        f"or a path to a config.json / YAML{suggest(key, [*table, *shorthands])}"
    )

