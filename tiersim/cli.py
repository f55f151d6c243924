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

Exit codes (``tiersim.exit_codes``):
    0  success; for ``simulate``: the job fits (feasible)
    1  ``simulate --check`` found a violated simulator invariant (a bug in tiersim, not in the input)
    2  bad input: exactly ONE line on stderr naming the field or file and the fix, nothing on stdout
    3  infeasible: printed on stdout as an answer (which pool overflows, by how many GB)
    130, 143  interrupted by SIGINT (Ctrl-C) / SIGTERM: one line on stderr; no output file is half-written
    141  standard output closed (``>&-``) or its reader gone (``| head -1``): one line on stderr

``simulate --json`` prints ONE JSON object with the same keys whether the job fits, runs out of memory in
the simulation, or is found infeasible by the policy before any simulation:

    feasible            bool
    verdict             str: "FEASIBLE" or "INFEASIBLE: <pool> ... over by <N> GB"
    policy, knobs       str, {knob: value}
    hardware            str (preset name)
    model               {name, params, ...dimensions}
    workload            {global_batch, micro_batch, seq_len, precision, checkpointing, flash_attention,
                         checkpoint_early_stop, assumed: [every default picked], ...}
    n_gpus              int
    step_time_s, tokens_per_s, tflops_per_gpu, mfu, hw_tflops_per_gpu, hfu, compute_busy_s, exposed_transfer_s
                        (tflops_per_gpu/mfu count model FLOPs, no recompute; hw_tflops_per_gpu/hfu count
                        the hardware FLOPs, checkpointing recompute included)
                        float; null when the policy found the job infeasible (nothing simulated)
    peak_bytes, peak_by_kind, link_bytes, link_busy_s, stream_busy_s
                        {pool|link|stream: ...}; null when nothing was simulated
    capacity_bytes      {pool: usable bytes}; reserved_bytes {pool: {what: bytes}}
    oom                 null when feasible, else {stage: "simulation"|"plan", pool, requested_bytes,
                         capacity_bytes, over_by_bytes, total_demand_bytes, free_bytes, time_s, task,
                         tensor, what, message}; fields a stage cannot know are null (a policy's verdict
                         has no time, task, tensor or free bytes; requested = total demand = its need)
    ooms                [every oom, first one first]
    sim                 {events, wall_s, method, simulated_tasks, reduction} (zeros when nothing was simulated;
                        reduction: "N ranks simulated as 1 class of N" where symmetric ranks ran once)
    notes, info         [str], {...} from the policy
    invariant_violations  [str], only with --check

``--plan-out`` and ``--trace`` are written when a plan exists (also when its simulation runs out of
memory); their directories must exist, which is checked before any work is done.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from planner.result_json import infeasible_json
from policies import PlanInfeasible
from tiersim import signals
from tiersim.command import Command
from tiersim.commands import (
    calibrate,
    coverage,
    hardware,
    max_model,
    models,
    plan,
    policies,
    replay,
    report,
    results,
    simulate,
    sweep,
    validate,
    whatif,
    workload,
)
from tiersim.errors import INPUT_ERRORS, one_line
from tiersim.exit_codes import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_OK, EXIT_STDOUT_CLOSED

# every command, in the order ``tiersim --help`` lists them; each module declares its flags and its run
COMMANDS: tuple[Command, ...] = (
    simulate.COMMAND, hardware.COMMAND, models.COMMAND, policies.COMMAND, validate.COMMAND, replay.COMMAND,
    calibrate.COMMAND, workload.COMMAND, plan.COMMAND, whatif.COMMAND, max_model.COMMAND, coverage.COMMAND,
    sweep.COMMAND, results.COMMAND, report.COMMAND,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up when asked (``planner.version``), not when the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from planner.version import tiersim_version

        print(f"tiersim {tiersim_version()}")
        parser.exit(EXIT_OK)


def _command_parser(p: argparse.ArgumentParser, command: Command) -> argparse.ArgumentParser:
    command.add_args(p)
    p.set_defaults(command=command)
    return p


def build_parser(prog: str = "tiersim") -> argparse.ArgumentParser:
    ap = _Parser(prog=prog, description="Simulate and plan LLM training across GPU HBM, CPU DRAM and NVMe.",
                 epilog="exit codes: 0 feasible/success, 1 invariant violated (--check), 2 bad input, "
                        "3 infeasible")
    ap.add_argument("--version", action=_VersionAction, help="print tiersim's version and exit")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for command in COMMANDS:
        _command_parser(sub.add_parser(command.name, help=command.help), command)
    return ap


def simulate_parser() -> argparse.ArgumentParser:
    """The ``simulate`` entry point's parser: ``tiersim simulate`` under its own name."""
    p = _Parser(prog="simulate", description="Simulate one training step (same as `tiersim simulate`).",
                epilog="exit codes: 0 feasible, 1 invariant violated (--check), 2 bad input, 3 infeasible, "
                       "4 no answer within --budget")
    return _command_parser(p, simulate.COMMAND)


def main(argv: Sequence[str] | None = None) -> int:
    return _run(build_parser(), argv)


def simulate_main(argv: Sequence[str] | None = None) -> int:
    """The ``simulate`` entry point: ``simulate --hw a100x8 --model 70b --policy tinypipe``."""
    return _run(simulate_parser(), sys.argv[1:] if argv is None else list(argv))


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error already printed (2): return, don't raise
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    prog = f"{parser.prog} {args.cmd}" if getattr(args, "cmd", None) else parser.prog
    if signals.stdout_closed():  # `>&-`: refuse before any work (a file opened later could take fd 1)
        print(signals.stdout_closed_line(prog, broken_pipe=False), file=sys.stderr)
        return EXIT_STDOUT_CLOSED
    with signals.handled(prog):  # SIGINT/SIGTERM raise signals.Interrupted, caught below
        try:
            rc = args.command.run(args)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's shutdown
            return rc
        except KeyboardInterrupt as e:  # SIGINT or SIGTERM (signals.Interrupted), whatever the command was doing
            print(signals.interrupted_line(prog, e), file=sys.stderr, flush=True)
            return signals.as_interrupted(e).exit_code
        except INPUT_ERRORS as e:
            print(f"{parser.prog}: error: {one_line(str(e))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except PlanInfeasible as e:  # raised outside `simulate` (which reports it with the job's context)
            if getattr(args, "json", False):
                print(json.dumps(infeasible_json(e), indent=1))
            else:
                print(f"INFEASIBLE: {e}")
            return EXIT_INFEASIBLE
        except BrokenPipeError:  # e.g. `tiersim hardware list | head -1`
            signals.silence_stdout()
            print(signals.stdout_closed_line(prog, broken_pipe=True), file=sys.stderr)
            return EXIT_STDOUT_CLOSED
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            print(f"{parser.prog}: error: {where}{e.strerror or e}", file=sys.stderr)
            return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
