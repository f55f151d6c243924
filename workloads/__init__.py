"""Workloads: model descriptions (:class:`ModelSpec`) and per-layer cost traces (:class:`WorkloadTrace`).

Imports nothing else of tiersim; units are bytes and FLOP. No I/O at import: presets are read when
:func:`load_model` / :func:`list_models` are called.
"""

from workloads.config import WorkloadConfig
from workloads.errors import WorkloadInputError
from workloads.model import ModelSpec, list_models, load_model
from workloads.trace import LayerTrace, WorkloadTrace, build_trace

__all__ = [
    "LayerTrace",
    "ModelSpec",
    "WorkloadConfig",
    "WorkloadInputError",
    "WorkloadTrace",
    "build_trace",
    "list_models",
    "load_model",
]
