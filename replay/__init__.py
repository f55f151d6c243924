"""The torch runner: executes a Plan for real (design.md: "the torch runner executes the same Plan").

The only package of tiersim that imports torch, and only inside its submodules (``replay.model``,
``replay.store``, ``replay.runner``, ``replay.reference``), so ``import replay`` stays cheap and
torch stays an optional extra (``pip install 'tiersim[replay]'``).
"""

from replay.errors import ReplayError, ReplayOom

__all__ = ["ReplayError", "ReplayOom"]
