"""The job's flags (hardware, model, ``--set`` and the workload), declared once with their validation.

Every command that takes a job declares its flags here: ``simulate`` and ``plan`` with
:func:`add_job_flags`; ``whatif``, ``coverage`` and ``max-model`` with :func:`add_hardware_flags`,
(``whatif``) :func:`add_model_flag` and :func:`add_workload_flags`. What differs between them is only the
default and its help text (``simulate`` picks it, a search searches it): a :class:`JobFlags`. The checks go
with the declaration (argparse types), so a bad value is bad input (exit 2, one line naming the flag) in
every command alike; :func:`request_from_args` turns the parsed flags into a ``JobRequest``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from policies.job import DEFAULT_SEQ_CAP, DEFAULT_SEQS_PER_GPU, JobRequest
from tiersim.errors import UsageError
from userfiles.limits import MAX_GPUS_PER_MACHINE
from workloads.config import CHECKPOINTING_MODES, DTYPE_BYTES

DEFAULT_HW, DEFAULT_MODEL, DEFAULT_POLICY = "a100x8", "70b", "zero-offload"


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (micro-batch, sequence length, global batch)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int (a whole number >= 1), got {text!r}")
    return value


def nonempty(hint: str) -> Callable[[str], str]:
    """An argparse type: any text but an empty one (``hint`` says what to give instead)."""

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty value; give {hint}")
        return text

    return check


hardware_name = nonempty("a preset (tiersim hardware list) or a YAML file")
model_name = nonempty("a preset (tiersim models list), a config.json or a YAML file")


@dataclass(frozen=True)
class JobFlags:
    """How a kind of command declares the job flags: the defaults and help texts that differ."""

    hw_default: str | None       # None: the command picks the default and reports it ("default picked: ...")
    model_default: str | None
    hw_help: str
    set_help: str
    model_help: str
    micro_batch_help: str
    global_batch_help: str
    checkpointing_help: str


SIMULATE = JobFlags(
    hw_default=None,
    model_default=None,
    hw_help=f"hardware preset or YAML file (default: {DEFAULT_HW}; with --plan: the plan's own)",
    set_help="override a hardware field, e.g. --set host.dram=1TB --set pcie.gen=5",
    model_help=f"model preset/shorthand, config.json or YAML (default: {DEFAULT_MODEL})",
    micro_batch_help="sequences per micro-batch per GPU (default: 1)",
    global_batch_help=f"sequences per optimizer step over all GPUs (default: {DEFAULT_SEQS_PER_GPU} per GPU "
                      "x micro-batch)",
    checkpointing_help="activation checkpointing (default: full)",
)
PLAN = JobFlags(  # tiersim plan: micro-batch and checkpointing are searched unless given
    hw_default=None,
    model_default=None,
    hw_help=SIMULATE.hw_help,
    set_help=SIMULATE.set_help,
    model_help=SIMULATE.model_help,
    micro_batch_help="sequences per micro-batch per GPU (default: searched)",
    global_batch_help=f"sequences per optimizer step over all GPUs (default: {DEFAULT_SEQS_PER_GPU} per GPU)",
    checkpointing_help="activation checkpointing (default: searched)",
)
SEARCH = JobFlags(  # whatif, coverage, max-model: one search per scenario, cell or size
    hw_default=DEFAULT_HW,
    model_default=DEFAULT_MODEL,
    hw_help=f"hardware preset or YAML file (default: {DEFAULT_HW})",
    set_help="override a hardware field for every run, e.g. --set host.dram=1TB",
    model_help=f"model preset/shorthand or file (default: {DEFAULT_MODEL})",
    micro_batch_help="fix the micro-batch (default: the search picks it)",
    global_batch_help=PLAN.global_batch_help,
    checkpointing_help="fix activation checkpointing (default: the search picks it)",
)


def add_hw_flag(p: argparse.ArgumentParser, flags: JobFlags) -> None:
    p.add_argument("--hw", default=flags.hw_default, type=hardware_name, help=flags.hw_help)


def node_count(text: str) -> int:
    """An argparse type: a whole number of nodes, 1 .. MAX_GPUS_PER_MACHINE (the GPUs of all nodes together are
    bounded by it too, checked where the hardware is loaded, with the limit named)."""
    value = positive_int(text)
    if value > MAX_GPUS_PER_MACHINE:
        raise argparse.ArgumentTypeError(f"{value:,} nodes is beyond the bound MAX_GPUS_PER_MACHINE = "
                                         f"{MAX_GPUS_PER_MACHINE:,} (GPUs of all nodes together); give fewer")
    return value


class _NodesAction(argparse.Action):
    """``--nodes N`` is the hardware override ``nodes=N``: appended to ``--set``'s list, so every command and the
    planner see it as one more override (and ``--set nodes=M`` beside it is refused as given twice)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        sets = list(getattr(namespace, "sets", None) or [])
        sets.append(f"nodes={values}")
        namespace.sets = sets
        namespace.nodes = values


def add_set_flag(p: argparse.ArgumentParser, help: str | None) -> None:
    """``--set PATH=VALUE`` (repeatable): hardware overrides, checked where the hardware is loaded; and
    ``--nodes N``: N machines of the hardware joined by its network (the override ``nodes=N``)."""
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE", help=help)
    add_nodes_flag(p)


def add_nodes_flag(p: argparse.ArgumentParser) -> None:
    """``--nodes N`` (default 1): the job runs on N machines of the hardware, joined by its ``network``."""
    p.add_argument("--nodes", type=node_count, action=_NodesAction, default=None, metavar="N",
                   help="run on N machines of the hardware, joined by its inter-node network (default: 1; "
                        "the same as --set nodes=N; tiersim hardware show NAME lists the network)")


def add_model_flag(p: argparse.ArgumentParser, flags: JobFlags) -> None:
    p.add_argument("--model", default=flags.model_default, type=model_name, help=flags.model_help)


def add_hardware_flags(p: argparse.ArgumentParser, flags: JobFlags) -> None:
    """``--hw`` and ``--set``."""
    add_hw_flag(p, flags)
    add_set_flag(p, flags.set_help)


def add_calibration_precision_flag(p: argparse.ArgumentParser) -> None:
    """``calibrate --precision``: the training precision whose rates are measured (simulate's default)."""
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"),
                   help="training precision whose GEMM curve and per-operator figures are measured, as the replay "
                        "computes it (default bf16, simulate's default; every dtype's peak is measured)")


def add_workload_flags(p: argparse.ArgumentParser, flags: JobFlags) -> None:
    """The workload: micro-batch, sequence length, global batch, precision, checkpointing, flash attention."""
    p.add_argument("--micro-batch", type=positive_int, help=flags.micro_batch_help)
    p.add_argument("--seq-len", type=positive_int,
                   help=f"tokens per sequence (default: the model's context, <= {DEFAULT_SEQ_CAP})")
    p.add_argument("--global-batch", type=positive_int, help=flags.global_batch_help)
    p.add_argument("--precision", choices=tuple(DTYPE_BYTES))
    p.add_argument("--checkpointing", choices=CHECKPOINTING_MODES, help=flags.checkpointing_help)
    p.add_argument("--no-flash-attention", dest="flash", action="store_false", default=None)
    p.add_argument("--flash-attention", dest="flash", action="store_true", default=None,
                   help="fused attention on (default: on from Ampere on, off on Volta/Turing)")
    p.add_argument("--no-checkpoint-early-stop", dest="early_stop", action="store_false", default=None)
    p.add_argument("--checkpoint-early-stop", dest="early_stop", action="store_true", default=None,
                   help="full checkpointing as PyTorch's non-reentrant checkpoint runs it (torch >= 2.1): the "
                        "recomputation stops before each block's last linear (default: off, the whole block is "
                        "recomputed, as Megatron-LM and DeepSpeed do)")


def add_job_flags(p: argparse.ArgumentParser, flags: JobFlags) -> None:
    """``--hw``, ``--model``, ``--set``, the workload flags and ``--deepspeed`` (``simulate``, ``plan``)."""
    add_hw_flag(p, flags)
    add_model_flag(p, flags)
    add_set_flag(p, flags.set_help)
    add_workload_flags(p, flags)
    add_deepspeed_flag(p)


def add_deepspeed_flag(p: argparse.ArgumentParser) -> None:
    """``--deepspeed DS.json``: the job from a DeepSpeed config (``tiersim.deepspeed_cli.apply_deepspeed``)."""
    p.add_argument("--deepspeed", metavar="DS.json", type=nonempty("a DeepSpeed config file"),
                   help="take the policy, knobs and workload from a DeepSpeed config (JSON, or HF Trainer "
                        "arguments / an accelerate config holding one); prints what became of each key")


def add_deepspeed_out_flag(p: argparse.ArgumentParser) -> None:
    """``--deepspeed-out DS.json``: write the plan as a DeepSpeed config (``simulate``, ``plan``)."""
    p.add_argument("--deepspeed-out", metavar="DS.json",
                   help="write the plan as a DeepSpeed config (policies none, zero-offload, zero-infinity)")


def request_from_args(args: argparse.Namespace) -> JobRequest:
    """The workload flags as a request (``None``: not given, a default is picked and reported)."""
    return JobRequest(micro_batch=args.micro_batch, seq_len=args.seq_len, global_batch=args.global_batch,
                      precision=args.precision, checkpointing=args.checkpointing, flash_attention=args.flash,
                      checkpoint_early_stop=args.early_stop)


# the flags that describe the job, so make no sense with ``simulate --plan`` (dest -> flag)
JOB_FLAGS = {"model": "--model", "policy": "--policy", "knobs": "--knob", "micro_batch": "--micro-batch",
             "seq_len": "--seq-len", "global_batch": "--global-batch", "precision": "--precision",
             "checkpointing": "--checkpointing", "flash": "--no-flash-attention/--flash-attention",
             "early_stop": "--no-checkpoint-early-stop/--checkpoint-early-stop", "deepspeed": "--deepspeed",
             "nodes": "--nodes"}


def check_no_job_flags(args: argparse.Namespace) -> None:
    """With ``--plan FILE`` the plan fixes model, workload, policy and knobs: giving one of them is bad input."""
    for dest, flag in JOB_FLAGS.items():
        value = getattr(args, dest, None)
        if value not in (None, []):
            raise UsageError(f"{flag} cannot be combined with --plan (the plan fixes model, workload, policy and "
                             f"knobs); drop {flag} or plan afresh without --plan")
