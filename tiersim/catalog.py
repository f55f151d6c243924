"""What ``tiersim hardware``, ``models`` and ``policies`` share: the ``list|show [NAME]`` arguments."""

from __future__ import annotations

import argparse

from tiersim.errors import UsageError


def add_list_show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "show"])
    p.add_argument("name", nargs="?")


def need_name(args: argparse.Namespace, what: str, known: list[str]) -> str:
    """``show`` needs a NAME."""
    if not args.name:
        raise UsageError(f"'{what} show' needs a NAME, e.g. 'tiersim {what} show {known[0]}'; known: "
                         f"{', '.join(known)}")
    return str(args.name)


def no_name(args: argparse.Namespace, what: str) -> None:
    """``list`` takes none."""
    if args.name:
        raise UsageError(f"'{what} list' takes no NAME; to see one, run 'tiersim {what} show {args.name}'")
