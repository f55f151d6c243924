"""Read a Hugging Face ``config.json`` into :class:`~workloads.model.ModelSpec` keyword arguments.

Supported ``model_type`` values (or ``architectures`` entries): see :data:`SUPPORTED_MODEL_TYPES`; the
keys each family reads, and the defaults used where a key is absent (those of the family's
``transformers`` configuration class, as ``transformers`` itself does), are in
:mod:`workloads.hf_families`. Every value is type-checked (a count must be a positive integer, a flag
true or false, a rate a finite number >= 0, ``architectures`` a list of names): a wrong one is one line
naming the file and the key.

Keys that change the cost of training but that the formulas do not model (``rope_scaling`` that
stretches the trained context, attention/final logit soft-capping, a vision tower, DeepSeek's
multi-token-prediction layers, quantised weights) are never dropped silently: each is named in one line
of the spec's ``notes`` (shown by ``tiersim models show`` and ``simulate --json``).

No network access: the file must be on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads import hf_families
from workloads.checks import boolean, finite_number, non_negative_int, positive_int
from workloads.errors import WorkloadInputError
from workloads.files import read_json

__all__ = ["SUPPORTED_MODEL_TYPES", "Fields", "parse_hf_config", "parse_hf_dict"]

SUPPORTED_MODEL_TYPES = tuple(hf_families.PARSERS)
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2", "OPTForCausalLM": "opt", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "Phi3ForCausalLM": "phi3", "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3", "Olmo2ForCausalLM": "olmo2",
    "FalconForCausalLM": "falcon", "GPTNeoXForCausalLM": "gpt_neox", "BloomForCausalLM": "bloom",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise WorkloadInputError(f"{path}: expected a JSON object of model settings")
    return data


class Fields:
    """Typed access to one config's keys, with one-line errors naming the file and the key.

    A key may be given as several spellings (``("num_hidden_layers", "n_layer")``): the first present
    and not null is read, as ``transformers``' ``attribute_map`` does. ``notes`` collects what the
    formulas do not model.
    """

    def __init__(self, where: str, data: dict[str, Any]) -> None:
        self.where, self.data = where, data
        self.notes: list[str] = []

    def _get(self, keys: str | tuple[str, ...]) -> tuple[str, Any]:
        names = (keys,) if isinstance(keys, str) else keys
        for key in names:
            if self.data.get(key) is not None:
                return key, self.data[key]
        return names[0], None

    def require(self, keys: str | tuple[str, ...], purpose: str) -> int:
        key, value = self._get(keys)
        if value is None:
            raise WorkloadInputError(f"{self.where}: missing field '{key}' (needed for {purpose})")
        return positive_int(value, key, self.where)

    def optional_int(self, keys: str | tuple[str, ...], default: int) -> int:
        key, value = self._get(keys)
        return default if value is None else positive_int(value, key, self.where)

    def count(self, keys: str | tuple[str, ...], default: int = 0) -> int:
        """An integer >= 0 (null reads as ``default``)."""
        key, value = self._get(keys)
        return default if value is None else non_negative_int(value, key, self.where)

    def optional_bool(self, keys: str | tuple[str, ...], default: bool) -> bool:
        key, value = self._get(keys)
        return default if value is None else boolean(value, key, self.where)

    def rate(self, keys: str | tuple[str, ...], default: float) -> float:
        key, value = self._get(keys)
        return default if value is None else finite_number(value, key, self.where)

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise WorkloadInputError(f"{self.where}: field '{key}' must be a list of integers (got {value!r})")
        return [non_negative_int(v, f"{key}[{i}]", self.where) for i, v in enumerate(value)]

    def string_list(self, key: str) -> list[str] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise WorkloadInputError(f"{self.where}: field '{key}' must be a list of strings (got {value!r})")
        return value

    def nested(self, key: str, defaults: dict[str, Any]) -> Fields:
        """The keys of the object under ``key`` (e.g. a multimodal config's text_config) over ``defaults``."""
        value = self.data.get(key)
        if not isinstance(value, dict):
            raise WorkloadInputError(f"{self.where}: field '{key}' must be an object of settings (got {value!r})")
        return Fields(f"{self.where} ({key})", {**defaults, **value})

    def note(self, text: str) -> None:
        self.notes.append(text)


def _model_type(where: str, data: dict[str, Any]) -> str:
    arches = data.get("architectures")
    if arches is not None and (not isinstance(arches, list) or not all(isinstance(a, str) for a in arches)):
        raise WorkloadInputError(
            f"{where}: field 'architectures' must be a list of class names such as [\"LlamaForCausalLM\"] "
            f"(got {arches!r})"
        )
    model_type = data.get("model_type")
    if model_type is None:
        for arch in arches or []:
            if arch in _ARCHITECTURES:
                return _ARCHITECTURES[arch]
        raise WorkloadInputError(
            f"{where}: missing field 'model_type' (needed to know the architecture; one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if not isinstance(model_type, str):
        raise WorkloadInputError(f"{where}: field 'model_type' must be a string such as \"llama\" (got {model_type!r})")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise WorkloadInputError(
            f"{where}: unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)} "
            "(describe other models in a YAML of dimensions: layers, hidden, heads, head_dim, ffn, experts, "
            "expert_ffn, ...; see the README's Models section)"
        )
    return model_type


def _name(path: Path, data: dict[str, Any]) -> str:
    name = data.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    return path.parent.name or path.stem


def parse_hf_dict(data: dict[str, Any], where: str) -> tuple[dict[str, object], list[str]]:
    """ModelSpec keyword arguments (without name and source) and the notes, for a parsed config."""
    model_type = _model_type(where, data)
    fields = Fields(where, data)
    spec = hf_families.PARSERS[model_type](fields)
    hf_families.common_notes(fields)
    return spec, fields.notes


def parse_hf_config(path: Path) -> dict[str, object]:
    """Return ModelSpec keyword arguments for the HF config at ``path``."""
    data = _read_json(path)
    spec, notes = parse_hf_dict(data, str(path))
    return {"name": _name(path, data), **spec, "source": f"HF config.json: {path}", "notes": tuple(notes)}
