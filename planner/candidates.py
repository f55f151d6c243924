"""The candidate space of a plan search: policy x knobs x micro-batch x checkpointing, in a fixed order.

Knob grids live with each policy (``PolicyInfo.search_grid``): the knobs that change how it runs (not
the byte details that model a DeepSpeed version, which stay at their defaults). A knob with an ``auto``
value (0 or "auto") that the policy resolves itself is searched as auto *and* as a grid of explicit
values. Every grid knob must be one of the policy's declared knobs (``check_grids``; tested). A policy
that decides recomputation itself names the one checkpointing setting searched
(``PolicyInfo.fixed_checkpointing``).

Micro-batch: powers of two dividing the global batch per GPU (the largest data-parallel degree),
at most MAX_MICRO_BATCH; a micro-batch that does not divide a policy's own per-rank batch is rejected
when its plan is built. Checkpointing: none, selective, full. The user fixes either with a flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from policies import POLICIES, get_policy
from policies.base import KnobError, parse_knobs, pow2_divisors

CHECKPOINTING = ("none", "selective", "full")
MAX_MICRO_BATCH = 16


@dataclass(frozen=True)
class Candidate:
    """One point of the search space; ``index`` is its place in the deterministic enumeration."""

    index: int
    policy: str
    knobs: tuple[tuple[str, Any], ...]
    micro_batch: int
    checkpointing: str

    @property
    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    def label(self) -> str:
        k = ",".join(f"{n}={v}" for n, v in self.knobs)
        return f"{self.policy}[{k}] mb={self.micro_batch} ckpt={self.checkpointing}"


def memory_frugal(c: Candidate) -> tuple[int, int, int]:
    """Sort key: the candidates likeliest to fit first (full checkpointing, then selective, then none;
    smaller micro-batches), ties by enumeration order."""
    return len(CHECKPOINTING) - 1 - CHECKPOINTING.index(c.checkpointing), c.micro_batch, c.index


def knob_grid(policy: str, n_gpus: int) -> dict[str, tuple[Any, ...]]:
    """Values searched per knob of ``policy`` on ``n_gpus`` GPUs (knobs not named keep their defaults)."""
    return dict(get_policy(policy).search_grid(n_gpus))


def check_grids(n_gpus: int = 8) -> list[str]:
    """Grid knobs a policy does not declare (empty when every grid is valid)."""
    bad = []
    for name, info in POLICIES.items():
        declared = {f.name for f in dataclasses.fields(info.knobs_type)}
        bad += [f"{name}.{k}" for k in knob_grid(name, n_gpus) if k not in declared]
    return bad


def micro_batches(global_batch: int, n_gpus: int) -> tuple[int, ...]:
    per_gpu = global_batch // n_gpus if global_batch % n_gpus == 0 else global_batch
    return pow2_divisors(max(per_gpu, 1), MAX_MICRO_BATCH)


def _knob_name(item: str) -> str:
    if "=" not in item:
        raise KnobError(f"--knob {item!r}: expected name=value")
    return item.split("=", 1)[0].strip()


def check_fixed_knobs(policies: Sequence[str], items: Sequence[str]) -> None:
    """KnobError unless every ``name=value`` is a knob of at least one of ``policies`` (and parses there)."""
    for item in items:
        name = _knob_name(item)
        owners = [p for p in policies if name in {f.name for f in dataclasses.fields(get_policy(p).knobs_type)}]
        if not owners:
            raise KnobError(f"--knob {item!r}: no knob '{name}' in {', '.join(policies)} "
                            f"(tiersim policies show NAME lists each policy's knobs)")
    for policy in policies:
        fixed_knobs(policy, items)


def fixed_knobs(policy: str, items: Sequence[str]) -> dict[str, Any]:
    """The ``name=value`` knobs (``--knob``) that ``policy`` declares, parsed with its types and validated;
    the others are left to the policies that declare them."""
    info = get_policy(policy)
    declared = {f.name for f in dataclasses.fields(info.knobs_type)}
    mine = [it for it in items if _knob_name(it) in declared]
    if not mine:
        return {}
    parsed = parse_knobs(info, mine)
    return {_knob_name(it): getattr(parsed, _knob_name(it)) for it in mine}


def enumerate_candidates(policies: Sequence[str], n_gpus: int, global_batch: int, *,
                         micro_batch: int | None = None, checkpointing: str | None = None,
                         knobs: Sequence[str] = ()) -> Iterator[Candidate]:
    """Every candidate, policies in the given order, then knobs, micro-batch, checkpointing. ``knobs``
    (``name=value``) fix those knobs in every candidate of a policy that declares them (their grid is dropped)."""
    mbs = (micro_batch,) if micro_batch is not None else micro_batches(global_batch, n_gpus)
    i = 0
    for policy in policies:
        info = get_policy(policy)  # KnobError for an unknown name
        fixed = fixed_knobs(policy, knobs)
        grid = {k: v for k, v in knob_grid(policy, n_gpus).items() if k not in fixed}
        names = list(grid)
        if checkpointing is not None:
            ckpts: tuple[str, ...] = (checkpointing,)
        elif info.fixed_checkpointing is not None:
            ckpts = (info.fixed_checkpointing,)
        else:
            ckpts = CHECKPOINTING
        for values in product(*(grid[n] for n in names)):
            chosen = tuple(zip(names, values, strict=True)) + tuple(fixed.items())
            for mb in mbs:
                for ck in ckpts:
                    yield Candidate(i, policy, chosen, mb, ck)
                    i += 1
