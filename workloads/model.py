"""Transformer model description (:class:`ModelSpec`) and how to obtain one (:func:`load_model`).

Parameter counts are exact sums over the weight tensors of the reference implementations
(HF ``transformers`` GPT2/OPT/Llama/Mistral/Mixtral modules), per block::

    attention   q: h*h, k and v: h*d_kv each (d_kv = n_kv_heads*head_dim, GQA), o: h*h
                (+ biases h + 2*d_kv + h when ``bias``)
    mlp         gelu: 2*h*f (+ f + h bias); swiglu: 3*h*f (+ 2f + h bias)
                MoE: n_experts such MLPs + a router h*n_experts (no bias)
    norms       2 per block; layernorm 2h (weight+bias), rmsnorm h (weight)

plus the token embedding V*h, learned position embeddings (``max_pos`` rows; OPT keeps 2 extra
offset rows, so ``max_pos + 2``), the final norm, and an LM head V*h when the embeddings are untied.
These reproduce the reference totals of ``hardware_models/reference/hardware_specs.yaml`` exactly for
all presets (tests/test_workload_params.py); the GPT-2 linear/LayerNorm biases and OPT's 2 offset rows are part
of the exact count, not a residual.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from workloads import custom_model, hf_config, presets
from workloads.checks import boolean, choice, dataclass_kwargs, positive_int, suggest
from workloads.errors import WorkloadInputError
from workloads.files import check_model_size

__all__ = ["FAMILIES", "MLP_KINDS", "NORM_KINDS", "ModelSpec", "list_models", "load_model"]

FAMILIES = ("gpt2", "opt", "gpt3", "llama", "mistral", "mixtral", "custom")
MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a decoder-only transformer; validated on construction.

    ``dropout`` (an addition to the original contract, default False) says whether training applies
    dropout (GPT-2/GPT-3/OPT: yes; LLaMA/Mistral: no); it changes the saved activations (masks).
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

    def __post_init__(self) -> None:
        where = f"model '{self.name}'"
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab", "max_pos",
                     "n_experts", "experts_per_token"):
            positive_int(getattr(self, name), name, where)
        for name in ("tied_embeddings", "bias", "learned_pos", "dropout"):
            boolean(getattr(self, name), name, where)
        choice(self.family, "family", FAMILIES, where)
        choice(self.mlp, "mlp", MLP_KINDS, where)
        choice(self.norm, "norm", NORM_KINDS, where)
        if self.hidden % self.n_heads:
            raise WorkloadInputError(
                f"{where}: field 'hidden' ({self.hidden}) must be divisible by 'n_heads' ({self.n_heads})"
            )
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

    # ---- derived dimensions -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

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

    # ---- parameter counts (see module docstring) ----------------------------------------------
    def norm_params(self) -> int:
        """Parameters of one normalisation layer."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.position_rows * self.hidden

    def attention_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        weights = 2 * h * h + 2 * h * kv
        return weights + (2 * h + 2 * kv if self.bias else 0)

    def expert_params(self) -> int:
        """Parameters of one MLP (one expert for MoE)."""
        h, f = self.hidden, self.ffn
        biases = ((self.mlp_matrices - 1) * f + h) if self.bias else 0
        return self.mlp_matrices * h * f + biases

    def router_params(self) -> int:
        return self.hidden * self.n_experts if self.is_moe else 0

    def block_params(self, active: bool = False) -> int:
        """One transformer block; ``active`` counts only experts_per_token experts (router included)."""
        experts = self.experts_per_token if active else self.n_experts
        return (self.attention_params() + experts * self.expert_params() + self.router_params()
                + 2 * self.norm_params())

    def head_params(self) -> int:
        """Final norm plus the LM head matrix (0 extra when tied to the token embedding)."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def params(self) -> int:
        """Total parameter count (all experts)."""
        return self.embedding_params() + self.n_layers * self.block_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters touched per token (MoE: experts_per_token experts + router); = params() if dense."""
        return (self.embedding_params() + self.n_layers * self.block_params(active=True)
                + self.head_params())

    # ---- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ModelSpec:
        return cls(**dataclass_kwargs(cls, data, "model spec"))


def list_models() -> list[str]:
    """Preset names, in the order of ``workloads/presets/models.yaml``."""
    return list(presets.preset_table())


def load_model(name_or_path: str) -> ModelSpec:
    """A preset or shorthand (case-insensitive), an HF ``config.json`` (or a folder holding one), or a
    YAML file of dimensions (see :mod:`workloads.custom_model`)."""
    text = str(name_or_path).strip()
    path = Path(text).expanduser()
    looks_like_path = path.suffix.lower() in (".json", ".yaml", ".yml") or "/" in text or "\\" in text
    if path.is_dir() and (path / "config.json").is_file():
        path, looks_like_path = path / "config.json", True
    if looks_like_path or path.is_file():
        if not path.is_file():
            raise WorkloadInputError(f"model file not found: {text}; give an existing config.json or YAML")
        if path.suffix.lower() == ".json":
            model = ModelSpec(**hf_config.parse_hf_config(path))  # type: ignore[arg-type]
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
