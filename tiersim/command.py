"""What a command module declares: its name, its one-line help, its flags and the function that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One ``tiersim`` subcommand: ``add_args`` declares its flags on its parser (and may set the parser's
    description and epilog); ``run`` takes the parsed arguments and returns an exit code
    (:mod:`tiersim.exit_codes`), raising an input error (:data:`tiersim.errors.INPUT_ERRORS`) for bad input."""

    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
