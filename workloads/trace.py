"""The workload trace: one :class:`LayerTrace` per layer (embedding, blocks, head) of one micro-batch.

:func:`build_trace` computes it from formulas:

* FLOPs: :mod:`workloads.flops` (Narayanan et al. 2021, arXiv 2104.04473, eq. 3 convention, matmuls
  counted exactly, GQA/SwiGLU/MoE generalised);
* activations: :mod:`workloads.activations` (Korthikanti et al. 2022, arXiv 2205.05198, Table 2,
  re-derived for LLaMA-style blocks);
* model states: ZeRO (Rajbhandari et al., arXiv 1910.02054, Sec. 3.1) mixed-precision Adam,
  2 (16-bit weights) + 2 (16-bit grads) + 4 (fp32 master) + 8 (fp32 Adam m, v) = 16 bytes/param;
  in fp32 training the weights are the master copy: 4 + 4 + 0 + 8 = 16 bytes/param;
* HBM traffic and transient memory: :mod:`workloads.traffic` (our estimates).

Parameter ownership: the embedding layer owns the token (and learned position) embeddings; with tied
embeddings the head owns only the final norm but its matmul reads (and its backward writes the
gradient of) the embedding's table, so a placement policy must keep the two together.
A trace can also be measured (by the torch runner) and loaded with :meth:`WorkloadTrace.load`;
``provenance`` records which it is.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from workloads import activations as act
from workloads import flops, traffic
from workloads.checks import dataclass_kwargs, reject_unknown_keys
from workloads.config import WorkloadConfig
from workloads.errors import WorkloadInputError
from workloads.files import read_json
from workloads.model import ModelSpec

__all__ = ["SCHEMA", "SCHEMA_VERSION", "LayerTrace", "WorkloadConfig", "WorkloadTrace", "build_trace"]

SCHEMA = "tiersim.workload_trace"
SCHEMA_VERSION = 1
MASTER_BYTES_PER_PARAM = 4      # fp32 master weights (ZeRO Sec. 3.1)
OPTIMIZER_BYTES_PER_PARAM = 8   # fp32 Adam momentum + variance (ZeRO Sec. 3.1)


@dataclass(frozen=True)
class LayerTrace:
    """Costs of one layer for one micro-batch (bytes, FLOP); see the module docstrings for formulas."""

    index: int
    name: str                    # "embedding", "block0" .. "block{L-1}", "head"
    kind: str                    # "embedding" | "block" | "head"
    params: int
    param_bytes: int             # params * dtype bytes
    grad_bytes: int              # same dtype as the params
    master_bytes: int            # fp32 master copy, 0 when training in fp32
    optimizer_bytes: int         # Adam m + v, fp32
    fwd_flops: float
    bwd_flops: float             # 2 x forward (embedding: 0)
    recompute_flops: float       # extra backward FLOPs due to checkpointing
    activation_bytes: int        # saved for backward under the configured checkpointing
    activation_bytes_nockpt: int  # saved without checkpointing
    output_bytes: int            # tensor passed to the next layer (head: the fp32 loss, 4 bytes)
    peak_transient_bytes: int    # largest extra working memory during fwd/bwd of this layer
    fwd_hbm_bytes: float
    bwd_hbm_bytes: float

    @property
    def model_state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.master_bytes + self.optimizer_bytes

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> LayerTrace:
        return cls(**dataclass_kwargs(cls, data, "layer trace"))


@dataclass(frozen=True)
class WorkloadTrace:
    """A model and a workload config turned into per-layer costs of one micro-batch."""

    model: ModelSpec
    config: WorkloadConfig
    layers: tuple[LayerTrace, ...]
    provenance: str  # "formula: ..." or "measured: ..."

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.config.micro_batch * self.config.seq_len

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def bwd_flops(self) -> float:
        return sum(layer.bwd_flops for layer in self.layers)

    @property
    def recompute_flops(self) -> float:
        return sum(layer.recompute_flops for layer in self.layers)

    @property
    def activation_bytes(self) -> int:
        """Saved activations of all layers for one micro-batch (configured checkpointing)."""
        return sum(layer.activation_bytes for layer in self.layers)

    @property
    def model_state_bytes(self) -> int:
        """Parameters + gradients + master weights + optimizer states (16 bytes/param)."""
        return sum(layer.model_state_bytes for layer in self.layers)

    def model_flops_per_token(self) -> float:
        """Model FLOPs per token, forward + backward, no recompute (the MFU numerator)."""
        return (self.fwd_flops + self.bwd_flops) / self.tokens_per_micro_batch

    def hardware_flops_per_token(self) -> float:
        """FLOPs executed per token including the checkpointing recompute (the HFU numerator)."""
        return (self.fwd_flops + self.bwd_flops + self.recompute_flops) / self.tokens_per_micro_batch

    def flops_per_token_formula(self) -> float:
        """``6N + 12*l*h*s`` (PaLM/Narayanan style; N = active params for MoE).

        It exceeds :meth:`model_flops_per_token` by 6 x the parameters without matmul FLOPs: the
        token embedding table when untied (the head matmul is counted through the LM head; tied
        models count it once), learned position embeddings, norms and biases.
        """
        m = self.model
        return 6 * m.active_params() + 12 * m.n_layers * m.hidden * self.config.seq_len

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "provenance": self.provenance,
            "model": self.model.to_dict(),
            "config": self.config.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> WorkloadTrace:
        where = "workload trace"
        if not isinstance(data, dict):
            raise WorkloadInputError(f"{where}: expected a JSON object")
        reject_unknown_keys(data, ("schema", "version", "provenance", "model", "config", "layers"), where)
        if data.get("schema") != SCHEMA or data.get("version") != SCHEMA_VERSION:
            raise WorkloadInputError(
                f"{where}: schema {data.get('schema')!r} version {data.get('version')!r} is not "
                f"{SCHEMA!r} version {SCHEMA_VERSION}; regenerate the trace with this tiersim"
            )
        layers = data.get("layers")
        if not isinstance(layers, list) or not layers:
            raise WorkloadInputError(f"{where}: field 'layers' must be a non-empty list")
        model, config = data.get("model"), data.get("config")
        if not isinstance(model, dict) or not isinstance(config, dict):
            raise WorkloadInputError(f"{where}: fields 'model' and 'config' must be mappings")
        provenance = data.get("provenance")
        if not isinstance(provenance, str) or not provenance:
            raise WorkloadInputError(f"{where}: field 'provenance' must be a non-empty string")
        return cls(
            model=ModelSpec.from_dict(model),
            config=WorkloadConfig.from_dict(config),
            layers=tuple(LayerTrace.from_dict(layer) for layer in layers),
            provenance=provenance,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> WorkloadTrace:
        data = read_json(Path(path))
        return cls.from_dict(data)


_PROVENANCE = (
    "formula: FLOPs Narayanan 2021 arXiv 2104.04473 eq.3 convention (matmuls only); activations "
    "Korthikanti 2022 arXiv 2205.05198 Table 2, re-derived per block type; model states ZeRO "
    "arXiv 1910.02054 Sec.3.1 (16 B/param)"
)


def _states(params: int, config: WorkloadConfig) -> dict[str, int]:
    e = config.dtype_bytes
    return {
        "params": params,
        "param_bytes": e * params,
        "grad_bytes": e * params,
        "master_bytes": 0 if config.precision == "fp32" else MASTER_BYTES_PER_PARAM * params,
        "optimizer_bytes": OPTIMIZER_BYTES_PER_PARAM * params,
    }


def _block_figures(model: ModelSpec, config: WorkloadConfig, layer: int, layer_out: int) -> dict[str, object]:
    """LayerTrace fields (all but index, name, kind) of block ``layer`` (0-based)."""
    b, s, e = config.micro_batch, config.seq_len, config.dtype_bytes
    states = _states(model.block_params(layer=layer), config)
    bf = flops.block_forward_flops(model, b, s, config.causal_attention_factor, layer)
    fwd = bf.total
    recompute = {"full": fwd, "selective": bf.attention_core, "none": 0.0}[config.checkpointing]
    if config.checkpointing == "full" and config.checkpoint_early_stop:
        recompute -= flops.early_stop_skipped_flops(model, b, s, layer)
    acts = act.block_activations(model, b, s, e, config.flash_attention, layer)
    saved = act.saved_block_bytes(acts, config.checkpointing)
    largest = traffic.block_largest_tensor(model, b, s, e, config.flash_attention, layer)
    fwd_hbm, bwd_hbm = traffic.block_traffic(states["param_bytes"], states["grad_bytes"], acts.total, saved,
                                             layer_out, config.checkpointing)
    return {**states, "fwd_flops": float(fwd), "bwd_flops": float(flops.BACKWARD_FACTOR * fwd),
            "recompute_flops": float(recompute), "activation_bytes": saved, "activation_bytes_nockpt": acts.total,
            "output_bytes": layer_out, "peak_transient_bytes": acts.total - saved + 2 * largest,
            "fwd_hbm_bytes": float(fwd_hbm), "bwd_hbm_bytes": float(bwd_hbm)}


def build_trace(model: ModelSpec, config: WorkloadConfig) -> WorkloadTrace:
    """Per-layer FLOPs, memory and traffic of one micro-batch of ``model`` under ``config``."""
    b, s, e = config.micro_batch, config.seq_len, config.dtype_bytes
    if model.learned_pos and s > model.max_pos:
        raise WorkloadInputError(
            f"workload config: seq_len {s} exceeds model '{model.name}' max_pos {model.max_pos} "
            "(learned position embeddings); use seq_len <= max_pos"
        )
    layer_out = e * b * s * model.hidden
    layers: list[LayerTrace] = []

    emb_states = _states(model.embedding_params(), config)
    emb_acts = act.embedding_activation_bytes(model, b, s, e)
    emb_fwd_hbm, emb_bwd_hbm = traffic.embedding_traffic(model, b, s, e, emb_states["grad_bytes"], emb_acts)
    layers.append(LayerTrace(
        index=0, name="embedding", kind="embedding", **emb_states,
        fwd_flops=0.0, bwd_flops=0.0, recompute_flops=0.0,
        activation_bytes=emb_acts, activation_bytes_nockpt=emb_acts, output_bytes=layer_out,
        peak_transient_bytes=layer_out, fwd_hbm_bytes=float(emb_fwd_hbm), bwd_hbm_bytes=float(emb_bwd_hbm),
    ))

    kinds: dict[tuple[bool, int], dict[str, object]] = {}
    for i in range(model.n_layers):
        kind = model.block_kind(i)
        if kind not in kinds:  # blocks of one kind (dense/MoE, window) have the same figures
            kinds[kind] = _block_figures(model, config, i, layer_out)
        layers.append(LayerTrace(index=i + 1, name=f"block{i}", kind="block", **kinds[kind]))  # type: ignore[arg-type]

    head_states = _states(model.head_params(), config)
    head_fwd = flops.head_forward_flops(model, b, s)
    head_acts = act.head_activation_bytes(model, b, s, e)
    head_fwd_hbm, head_bwd_hbm = traffic.head_traffic(model, b, s, e, head_acts)
    layers.append(LayerTrace(
        index=model.n_layers + 1, name="head", kind="head", **head_states,
        fwd_flops=float(head_fwd), bwd_flops=float(flops.BACKWARD_FACTOR * head_fwd), recompute_flops=0.0,
        activation_bytes=head_acts, activation_bytes_nockpt=head_acts, output_bytes=act.FP32_BYTES,
        peak_transient_bytes=traffic.head_transient(model, b, s, e),
        fwd_hbm_bytes=float(head_fwd_hbm), bwd_hbm_bytes=float(head_bwd_hbm),
    ))
    return WorkloadTrace(model=model, config=config, layers=tuple(layers), provenance=_PROVENANCE)
