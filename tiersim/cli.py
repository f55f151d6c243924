"""Command line: ``tiersim simulate|hardware|models|policies|validate|replay`` and ``simulate`` on its own.

    simulate --hw a100x8 --model 70b --policy zero-offload          # same as `tiersim simulate ...`
    simulate --hw a100 --model 7b --json                             # one JSON object on stdout
    simulate --hw a100 --model 7b --plan-out plan.json --trace t.json
    simulate --plan plan.json                                        # re-simulate a saved plan
    tiersim hardware list | hardware show NAME [--set PATH=VALUE]
    tiersim models list | models show NAME
    tiersim policies list | policies show NAME
    tiersim replay plan.json [--steps N] [--verify] [--json] [--trace t.json]   # run a plan for real (torch)

Defaults: ``--hw a100x8``, ``--model 70b``, ``--policy zero-offload`` when planning; every default that is
picked (these and the workload's: sequence length, micro- and global batch, precision, checkpointing,
flash attention) is listed in the report ("default picked: ...") and in ``workload.assumed`` of the JSON.
With ``--plan FILE`` the plan fixes model, workload and policy (giving ``--model``, ``--policy``,
``--knob`` or a workload flag as well is bad input) and its embedded hardware is used unless ``--hw``
is given; ``--set`` overrides apply to whichever hardware is used.

Exit codes:
    0  success; for ``simulate``: the job fits (feasible)
    1  ``simulate --check`` found a violated simulator invariant (a bug in tiersim, not in the input)
    2  bad input: exactly ONE line on stderr naming the field or file and the fix, nothing on stdout
    3  infeasible: printed on stdout as an answer (which pool overflows, by how many GB)

``simulate --json`` prints ONE JSON object with the same keys whether the job fits, runs out of memory in
the simulation, or is found infeasible by the policy before any simulation:

    feasible            bool
    verdict             str: "FEASIBLE" or "INFEASIBLE: <pool> ... over by <N> GB"
    policy, knobs       str, {knob: value}
    hardware            str (preset name)
    model               {name, params, ...dimensions}
    workload            {global_batch, micro_batch, seq_len, precision, checkpointing, flash_attention,
                         assumed: [every default picked], ...}
    n_gpus              int
    step_time_s, tokens_per_s, tflops_per_gpu, mfu, compute_busy_s, exposed_transfer_s
                        float; null when the policy found the job infeasible (nothing simulated)
    peak_bytes, peak_by_kind, link_bytes, link_busy_s, stream_busy_s
                        {pool|link|stream: ...}; null when nothing was simulated
    capacity_bytes      {pool: usable bytes}; reserved_bytes {pool: {what: bytes}}
    oom                 null when feasible, else {stage: "simulation"|"plan", pool, requested_bytes,
                         capacity_bytes, over_by_bytes, total_demand_bytes, free_bytes, time_s, task,
                         tensor, what, message}; fields a stage cannot know are null (a policy's verdict
                         has no time, task, tensor or free bytes; requested = total demand = its need)
    ooms                [every oom, first one first]
    sim                 {events, wall_s, method, simulated_tasks} (zeros when nothing was simulated)
    notes, info         [str], {...} from the policy
    invariant_violations  [str], only with --check

``--plan-out`` and ``--trace`` are written when a plan exists (also when its simulation runs out of
memory); their directories must exist, which is checked before any work is done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from hardware_models import HardwareInputError
from policies import KnobError, PlanInfeasible
from simulator import PlanError
from workloads import WorkloadInputError

EXIT_OK, EXIT_INVARIANT, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3
DEFAULT_HW, DEFAULT_MODEL, DEFAULT_POLICY = "a100x8", "70b", "zero-offload"


class UsageError(ValueError):
    """A bad combination of command-line arguments (one line naming the flag and the fix)."""


INPUT_ERRORS = (HardwareInputError, WorkloadInputError, PlanError, KnobError, UsageError)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def _add_job_args(p: argparse.ArgumentParser, *, searched: bool = False) -> None:
    """The job's flags; with ``searched`` (``tiersim plan``) micro-batch and checkpointing are searched unless given."""
    p.add_argument("--hw", default=None,
                   help=f"hardware preset or YAML file (default: {DEFAULT_HW}; with --plan: the plan's own)")
    p.add_argument("--model", default=None,
                   help=f"model preset/shorthand, config.json or YAML (default: {DEFAULT_MODEL})")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE",
                   help="override a hardware field, e.g. --set host.dram=1TB --set pcie.gen=5")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch per GPU (default: "
                   + ("searched" if searched else "1") + ")")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's context, <= 4096)")
    p.add_argument("--global-batch", type=int,
                   help="sequences per optimizer step over all GPUs (default: 8 per GPU"
                        + ("" if searched else " x micro-batch") + ")")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--checkpointing", choices=["none", "selective", "full"],
                   help="activation checkpointing (default: " + ("searched" if searched else "full") + ")")
    p.add_argument("--no-flash-attention", dest="flash", action="store_false", default=None)


# flags that describe the job and so make no sense with --plan (dest -> flag)
JOB_FLAGS = {"model": "--model", "policy": "--policy", "knobs": "--knob", "micro_batch": "--micro-batch",
             "seq_len": "--seq-len", "global_batch": "--global-batch", "precision": "--precision",
             "checkpointing": "--checkpointing", "flash": "--no-flash-attention"}


def build_parser(prog: str = "tiersim") -> argparse.ArgumentParser:
    ap = _Parser(prog=prog, description="Simulate and plan LLM training across GPU HBM, CPU DRAM and NVMe.",
                 epilog="exit codes: 0 feasible/success, 1 invariant violated (--check), 2 bad input, "
                        "3 infeasible")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sim = sub.add_parser("simulate", help="simulate one training step of a policy")
    _add_simulate_args(sim)
    hw = sub.add_parser("hardware", help="list or show hardware presets")
    hw.add_argument("action", choices=["list", "show"])
    hw.add_argument("name", nargs="?")
    hw.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE")
    mo = sub.add_parser("models", help="list or show model presets")
    mo.add_argument("action", choices=["list", "show"])
    mo.add_argument("name", nargs="?")
    po = sub.add_parser("policies", help="list policies or show one with its knobs")
    po.add_argument("action", choices=["list", "show"])
    po.add_argument("name", nargs="?")
    va = sub.add_parser("validate", help="compare the simulator with published figures")
    va.add_argument("--json", action="store_true")
    rp = sub.add_parser("replay", help="execute a plan for real with torch; compare with its simulation",
                        epilog="exit codes: 0 replayed (and verified), 1 --verify mismatch, 2 bad input, "
                               "3 over a pool's capacity")
    from tiersim.commands.replay import add_replay_args

    add_replay_args(rp)
    ca = sub.add_parser("calibrate", help="measure this machine and write a hardware spec (torch)")
    ca.add_argument("-o", "--output", required=True, help="the hardware YAML file to write")
    ca.add_argument("--dir", default=None, help="directory whose disk is measured (default: a temporary one)")
    ca.add_argument("--base", default=None,
                    help="preset whose unmeasured fields (prices of links this machine lacks) are kept")
    ca.add_argument("--json", action="store_true", help="also print the measurements as one JSON object")
    wl = sub.add_parser("workload", help="check the workload formulas against torch on the meta device")
    wl.add_argument("action", choices=["check"])
    wl.add_argument("--model", required=True, help="model preset/shorthand, config.json or YAML")
    wl.add_argument("--micro-batch", type=int, default=1)
    wl.add_argument("--seq-len", type=int, default=None, help="default: the model's context, capped at 4096")
    wl.add_argument("--json", action="store_true")
    for name, (module, help_text) in MODULE_COMMANDS.items():
        _command_module(module).add_args(sub.add_parser(name, help=help_text))
    return ap


# Commands that live wholly in their own module under tiersim/commands/: name -> (module, help).
# Each module defines add_args(parser) and run(args) -> exit code.
MODULE_COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "search every policy, its knobs, micro-batch and checkpointing for the best plan"),
    "whatif": ("whatif", "plan a job on a grid of hardware changes; rank each single change"),
    "max-model": ("max_model", "the largest model each policy can train (bisection over layers or width)"),
    "coverage": ("coverage", "policy x model matrix: feasible with throughput, or the binding pool"),
    "sweep": ("sweep", "simulate a grid (YAML) on a process pool or Dask into a resumable SQLite store"),
    "results": ("results", "list, filter or export the runs of a sweep store (table, --csv, --json)"),
    "report": ("report", "write a comparison report (HTML, Markdown, PNG/SVG figures, CSV) from result files"),
}


def _command_module(module: str) -> Any:
    import importlib

    return importlib.import_module(f"tiersim.commands.{module}")


def _add_simulate_args(p: argparse.ArgumentParser) -> None:
    _add_job_args(p)
    p.add_argument("--policy", default=None, help=f"policy name (tiersim policies list; default: {DEFAULT_POLICY})")
    p.add_argument("--knob", dest="knobs", action="append", default=[], metavar="NAME=VALUE",
                   help="policy knob (tiersim policies show NAME)")
    p.add_argument("--plan", dest="plan_in", help="simulate this plan file instead of planning")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plan-out", help="write the plan (JSON) here")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the simulated step here")
    p.add_argument("--report", metavar="DIR", help="also write a report (HTML, Markdown, figures, CSV) into DIR")
    p.add_argument("--check", action="store_true", help="also check the simulator's invariants")
    p.add_argument("--no-extrapolate", dest="extrapolate", action="store_false",
                   help="simulate every micro-step even in a steady state")


def main(argv: Sequence[str] | None = None) -> int:
    return _run(build_parser(), argv)


def simulate_main(argv: Sequence[str] | None = None) -> int:
    """The ``simulate`` entry point: ``simulate --hw a100x8 --model 70b --policy tinypipe``."""
    p = _Parser(prog="simulate", description="Simulate one training step (same as `tiersim simulate`).",
                epilog="exit codes: 0 feasible, 1 invariant violated (--check), 2 bad input, 3 infeasible")
    _add_simulate_args(p)
    args = sys.argv[1:] if argv is None else list(argv)
    return _run(p, args, command="simulate")


def infeasible_json(e: PlanInfeasible) -> dict[str, Any]:
    """The JSON of a PlanInfeasible raised where the job is unknown (same keys as ``simulate --json``)."""
    from tiersim.commands.simulate import plan_infeasible_dict

    return plan_infeasible_dict(e)


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None, command: str | None = None) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error already printed (2): return, don't raise
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    cmd = command or args.cmd
    try:
        rc = _dispatch(parser, args, cmd)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's shutdown
        return rc
    except INPUT_ERRORS as e:
        print(f"{parser.prog}: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PlanInfeasible as e:  # raised outside `simulate` (which reports it with the job's context)
        if getattr(args, "json", False):
            print(json.dumps(infeasible_json(e), indent=1))
        else:
            print(f"INFEASIBLE: {e}")
        return EXIT_INFEASIBLE
    except BrokenPipeError:  # e.g. `tiersim hardware list | head -1`
        _silence_stdout()
        return EXIT_OK
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"{parser.prog}: error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (tests capture it)
        pass


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace, cmd: str) -> int:
    if cmd == "simulate":
        from tiersim.commands.simulate import run_simulate
        return run_simulate(args)
    if cmd == "hardware":
        from tiersim.commands.catalog import run_hardware
        return run_hardware(args)
    if cmd == "models":
        from tiersim.commands.catalog import run_models
        return run_models(args)
    if cmd == "policies":
        from tiersim.commands.catalog import run_policies
        return run_policies(args)
    if cmd == "validate":
        from tiersim.commands.validate import run_validate
        return run_validate(args)
    if cmd == "replay":
        from tiersim.commands.replay import run_replay
        return run_replay(args)
    if cmd == "calibrate":
        from tiersim.commands.calibrate import run_calibrate
        return run_calibrate(args)
    if cmd == "workload":
        from tiersim.commands.workload import run_workload
        return run_workload(args)
    if cmd in MODULE_COMMANDS:
        return _command_module(MODULE_COMMANDS[cmd][0]).run(args)
    parser.error(f"unknown command {cmd!r}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
