"""The documented bounds on what a user file (or flag) may ask for, so that every run is bounded.

Two kinds of bound live here (docs/design.md, "Bounded inputs", lists them with their reasons):

- the form of a file: its size in bytes, how deep it nests, how far YAML aliases may expand it, how large an
  integer may be; a file beyond one is refused while it is read, before any of it is used;
- impossible sizes: what no machine or run this tool models can have (GPUs in one machine, parameters of a
  model, tasks and steps of a plan, steps of a replay), refused up front with the limit named, instead of
  a run that does not end.

Each bound is a plain constant; an error names it as ``LIMIT_NAME = value``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "KINDS",
    "MAX_DEPTH",
    "MAX_GPUS_PER_MACHINE",
    "MAX_INT_DIGITS",
    "MAX_MODEL_LAYERS",
    "MAX_MODEL_PARAMS",
    "MAX_PLAN_SIMULATED_TASKS",
    "MAX_PLAN_STEPS",
    "MAX_PLAN_TASKS",
    "MAX_REPLAY_STEPS",
    "FileKind",
    "kind",
    "limit_text",
]

MiB = 1 << 20

# ---------------------------------------------------------------------------------------- form
MAX_DEPTH = 64
"""Containers nested inside one another (a plan nests 5 deep, a hardware YAML 4, an HF config 3-4)."""
MAX_INT_DIGITS = 19
"""Digits of an integer literal: every integer a user file needs fits 64 bits (|n| < 2**63)."""
MAX_INT = 2**63 - 1
MAX_YAML_EXPANSION = 2
"""A YAML document may expand through its aliases to at most this many times its own length (nodes plus
characters of scalars): an alias-free document stays below 2x, an alias bomb is far above."""


@dataclass(frozen=True)
class FileKind:
    """One kind of user file: what it is called in messages, its format, its size bound and what to give."""

    name: str
    title: str       # how a message names the file: "cannot read plan (...)"
    fmt: str         # "yaml" or "json"
    max_bytes: int
    expect: str      # how the fix names a good file of this kind

    @property
    def limit_name(self) -> str:
        return f"MAX_{self.name.upper().replace(' ', '_').replace('-', '_')}_BYTES"


KINDS: dict[str, FileKind] = {k.name: k for k in (
    FileKind("hardware", "hardware file", "yaml", 1 * MiB, "a hardware YAML like hardware_models/presets/a100.yaml"),
    FileKind("model", "model file", "yaml", 1 * MiB, "a model YAML of dimensions (see workloads/custom_model.py)"),
    FileKind("hf-config", "config.json", "json", 16 * MiB, "a Hugging Face config.json"),
    FileKind("plan", "plan", "json", 512 * MiB, "a plan written by `simulate --plan-out`"),
    FileKind("sweep", "sweep file", "yaml", 1 * MiB, "a sweep YAML like examples/sweep.yaml"),
    FileKind("report-input", "report input", "json", 512 * MiB,
             "a result, what-if or coverage JSON written by tiersim with --json"),
    FileKind("deepspeed", "DeepSpeed config", "json", 16 * MiB, "a DeepSpeed config JSON"),
    FileKind("training-yaml", "training config", "yaml", 1 * MiB,
             "an accelerate config or HF Trainer arguments YAML holding a DeepSpeed config"),
    FileKind("trace", "trace file", "json", 64 * MiB, "a workload trace written by tiersim"),
    FileKind("spec-json", "hardware spec", "json", 16 * MiB, "a hardware spec JSON written by tiersim"),
)}


def kind(name: str) -> FileKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown user-file kind {name!r}; known: {', '.join(KINDS)}") from None


# ------------------------------------------------------------------------------ impossible sizes
MAX_GPUS_PER_MACHINE = 65_536
"""GPUs in one machine description (``gpu.count``). The largest single NVLink domains built hold 72-576
GPUs; a cluster is machines times nodes, not one machine of a million GPUs."""
MAX_MODEL_PARAMS = 10**14
"""Parameters of a model (100 T): 50x the largest models trained (~2 T); beyond it no run answers."""
MAX_MODEL_LAYERS = 1024
"""Transformer blocks of a model: 8x the deepest published LLMs (~128); plans hold tasks per layer, and
`--policy all` on 120 layers already takes ~30 s here (4,000 layers: more than 200 s)."""
MAX_PLAN_TASKS = 2_000_000
"""Tasks in a plan file (all segments): a 70B plan on 8 GPUs holds ~8,500."""
MAX_PLAN_STEPS = 100
"""`steps` of a plan file: warm-up and measured steps; the steady state is reached by the second."""
MAX_PLAN_SIMULATED_TASKS = 100_000_000
"""Task executions a plan file asks for (steps x segment repeats x tasks): ~15 minutes of simulation at
~100 k events/s; a 70B plan on 8 GPUs asks for ~70,000."""
MAX_REPLAY_STEPS = 10_000
"""`tiersim replay --steps`: real training steps of one plan."""


def limit_text(name: str, value: int) -> str:
    """``MAX_GPUS_PER_MACHINE = 65,536`` for a message."""
    return f"{name} = {value:,}"
