"""One command registry, job flags declared once, exit codes in one module."""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest

from tiersim import exit_codes
from tiersim.cli import COMMANDS, build_parser, main, simulate_parser
from tiersim.command import Command

ROOT = Path(__file__).resolve().parent.parent
COMMAND_DIR = ROOT / "tiersim" / "commands"
PACKAGES = ("hardware_models", "workloads", "costs", "policies", "simulator", "planner", "reports", "replay",
            "tiersim")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_module_is_registered_once() -> None:
    modules = sorted(p.stem for p in COMMAND_DIR.glob("*.py") if p.stem != "__init__")
    registered = [c.name.replace("-", "_") for c in COMMANDS]
    assert sorted(registered) == modules  # a module per command, a command per module
    assert len(set(registered)) == len(registered)
    for name in modules:
        command = importlib.import_module(f"tiersim.commands.{name}").COMMAND
        assert isinstance(command, Command) and command in COMMANDS


def test_the_parser_is_built_from_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    subs = _subparsers(build_parser())
    assert list(subs) == [c.name for c in COMMANDS]
    for command in COMMANDS:
        assert subs[command.name].get_default("command") is command
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    for command in COMMANDS:
        assert command.help in " ".join(listing.split()), command.name


def _options(parser: argparse.ArgumentParser) -> list[tuple[tuple[str, ...], str, object]]:
    return [(tuple(a.option_strings), a.dest, a.default) for a in parser._actions if a.dest != "help"]


def test_the_simulate_entry_point_is_tiersim_simulate() -> None:
    sub = _subparsers(build_parser())["simulate"]
    assert _options(simulate_parser()) == _options(sub)
    assert simulate_parser().get_default("command") is sub.get_default("command")


JOB_FLAGS = ("--micro-batch", "--seq-len", "--global-batch", "--precision", "--checkpointing",
             "--no-flash-attention", "--hw", "--set")


@pytest.mark.parametrize("name", ["simulate", "plan", "whatif", "coverage", "max-model"])
def test_job_flags_are_declared_alike(name: str) -> None:
    """Same dest, type (and so the same check) and choices in every command that takes them."""
    reference = {a.option_strings[0]: a for a in _subparsers(build_parser())["simulate"]._actions
                 if a.option_strings}
    actions = {a.option_strings[0]: a for a in _subparsers(build_parser())[name]._actions if a.option_strings}
    for flag in JOB_FLAGS:
        a, ref = actions[flag], reference[flag]
        assert (a.dest, a.type, a.choices, a.nargs) == (ref.dest, ref.type, ref.choices, ref.nargs), (name, flag)


def test_job_flags_are_declared_in_one_module() -> None:
    """No module but tiersim/job_flags.py declares a job flag (the workload check has its own meaning)."""
    offenders = []
    for path in sorted((ROOT / "tiersim").rglob("*.py")):
        if path.name in ("job_flags.py", "workload.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in JOB_FLAGS):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.args[0].value}")
    assert not offenders, offenders


def test_exit_codes_are_defined_in_one_module() -> None:
    """An ``EXIT_*`` name is assigned only in tiersim/exit_codes.py."""
    offenders = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []:
            if path == ROOT / "tiersim" / "exit_codes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.startswith("EXIT_")]
    assert not offenders, offenders


def test_exit_code_values() -> None:
    assert (exit_codes.EXIT_OK, exit_codes.EXIT_BAD_INPUT, exit_codes.EXIT_INFEASIBLE) == (0, 2, 3)
    assert exit_codes.EXIT_INVARIANT == exit_codes.EXIT_MISMATCH == exit_codes.EXIT_FAILED == 1
    assert exit_codes.EXIT_INTERRUPTED == 130
