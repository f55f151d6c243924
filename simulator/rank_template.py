"""A rank template: a data- and tensor-parallel plan written as rank 0's tasks only (issue 13, docs/scale.md).

A data-parallel plan of ``n`` ranks (in tensor-parallel groups or not) repeats one rank's tasks on every GPU,
and the symmetric simulation (``simulator.symmetry``) runs rank 0's tasks and the collectives of rank 0's groups
only. Emitting every rank's tasks to prove that and then drop them costs time in proportion to ``n`` (a quarter
of a million tasks at 1024 GPUs). A policy that opts in (``policies.kit.Layout(template=True)``) emits instead
what the symmetric simulation keeps: rank 0's tasks, tensors and streams, and the collectives of rank 0's groups
with their dependencies on rank 0's tasks; the plan carries a :class:`RankTemplate` saying how many ranks it
stands for. ``simulator.symmetry_template`` then builds the symmetry from the template (the collectives' copies in
the other groups, the shared resources' orbits, load check and pools still worked out from the topology) instead
of proving it task by task.

Names. Rank r's copy of a rank-0 name swaps rank 0's tokens (``RANK_TOKENS``: ``gpu0``, ``r0``, ``adam0`` and the
host streams' ``pread0``, ``gwrite0``, ``oread0``, ``owrite0``, ``io0``) with rank r's (``gpu{r}``, ``r{r}``, ...): a
transposition, rank 0's and rank r's names trade places and every other name stays; in a task or tensor id after
its first dot (``fwd3.gpu0``, ``adam3.r0``: ``adam3`` there is layer 3's step), anywhere in a stream id
(``gpu0.compute``, ``cpu.adam0``). Its groups' tokens likewise: its data-parallel group's (``d``, ``dp``: ``ag3.d0``,
``dp0.grad``) 0 and ``r mod tp``, its tensor-parallel group's (``k``, ``tp``: ``tpf3.k0``, ``tp0``) 0 and ``r div tp``.
A pipeline replica (``RankTemplate.width`` S > 1: a rank of S GPUs, stage s on its s-th) swaps
its GPUs' tokens block to block (``GPU_TOKENS``: rank 0's ``gpu{s}`` and ``cpu.adam{s}`` with rank r's
``gpu{r*S+s}``, ``cpu.adam{r*S+s}``) and its replica's (``REPLICA_TOKENS``: ``tie.r0``, ``tie0``) 0 and r; a
stage's data-parallel collective (``ar5.s2`` on ``dp2``) spans that stage of every replica and is kept whole.
That is the kit's naming; the tests check that a template and the full plan of the same job simulate identically
and that these images are the pairing the proof finds in the full plan, for every policy that emits templates.

A template is not a plan a user can save or replay: ``Plan.to_dict`` refuses it (build the full plan, as
``simulate --plan-out`` and ``tiersim replay`` do), and it is only simulated symmetrically.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

# a rank's own tokens: those of its GPUs and their host streams (CPU Adam, the NVMe swapper's reads and writes),
# numbered by GPU, and those numbered by rank (a pipeline replica's: its rank ``r`` and its tied-table stream ``tie``)
GPU_TOKENS = ("gpu", "adam", "pread", "gwrite", "oread", "owrite", "io")
REPLICA_TOKENS = ("r", "tie")
RANK_TOKENS = GPU_TOKENS + REPLICA_TOKENS
# with tensor parallelism, the groups a rank belongs to: its data-parallel group (position j in its tensor-parallel
# group: ``.d{j}`` collectives on ``dp{j}.*`` streams) and its tensor-parallel group (``.k{k}`` on ``tp{k}``)
DP_TOKENS, TP_TOKENS = ("d", "dp"), ("k", "tp")
_TOKEN = re.compile(rf"^({'|'.join(RANK_TOKENS + DP_TOKENS + TP_TOKENS)})(\d+)$")


@dataclass(frozen=True)
class RankTemplate:
    """The plan's tasks are rank 0's of ``ranks`` ranks, rank r on GPU ``gpu{r}``, in tensor-parallel groups of
    ``tp`` neighbouring GPUs (``policies.kit.Layout``): rank r is position ``r % tp`` of group ``r // tp``.

    ``width`` > 1 (with tp 1): a rank is a pipeline replica of ``width`` stages, rank r on GPUs
    ``gpu{r * width}`` .. ``gpu{r * width + width - 1}`` (stage s on the s-th); its GPUs' tokens map block to block
    (rank 0's ``gpu{s}`` and rank r's ``gpu{r * width + s}`` trade places), its replica tokens 0 and r."""

    ranks: int
    tp: int = 1
    width: int = 1

    def __post_init__(self) -> None:
        if self.width < 1 or (self.width > 1 and self.tp != 1):
            raise ValueError(f"a rank template of width {self.width} with tp {self.tp}: a pipeline replica's "
                             "template is data parallel only")

    def gpu(self, r: int) -> str:
        """Rank r's first GPU (its only one at width 1)."""
        return f"gpu{r * self.width}"

    def gpus_of(self, r: int) -> tuple[str, ...]:
        return tuple(f"gpu{r * self.width + s}" for s in range(self.width))

    def tp_group(self, k: int) -> tuple[str, ...]:
        return tuple(self.gpu(k * self.tp + j) for j in range(self.tp))

    def dp_group(self, j: int) -> tuple[str, ...]:
        return tuple(self.gpu(k * self.tp + j) for k in range(self.ranks // self.tp))


def _values(r: int, tp: int) -> dict[str, int]:
    """Rank r's value of each token (at width 1): itself, its position j and its tensor-parallel group k."""
    k, j = divmod(r, tp)
    out = dict.fromkeys(RANK_TOKENS, r)
    out.update(dict.fromkeys(DP_TOKENS, j))
    out.update(dict.fromkeys(TP_TOKENS, k))
    return out


def _swap(head: str, v: int, r: int, width: int, values: Mapping[str, int]) -> int:
    """Token ``head`` with value ``v`` in rank 0's name -> its value in rank r's copy (the transposition; ``values``:
    ``_values(r, tp)``)."""
    if width > 1 and head in GPU_TOKENS:  # GPU blocks 0 and r trade places
        lo = r * width
        return v + lo if v < width else (v - lo if lo <= v < lo + width else v)
    mine = values[head]
    return mine if v == 0 else (0 if v == mine else v)


def _parts(name: str, first: bool) -> tuple[str, ...] | None:
    """``name`` split at its dots, or None when it holds no rank token where one counts (``first``: the first
    part may be one; task and tensor ids begin with their own label)."""
    parts = name.split(".")
    start = 0 if first else 1
    if any(_TOKEN.match(p) for p in parts[start:]):
        return tuple(parts)
    return None


def image(name: str, r: int, *, tp: int = 1, stream: bool = False, width: int = 1) -> str:
    """Rank r's copy of rank 0's ``name`` (a task, tensor or, with ``stream``, stream id): the module docstring's
    transposition of each token's rank-0 value and rank r's (of GPU blocks at ``width`` > 1)."""
    parts = _parts(name, stream)
    if parts is None or r == 0:
        return name
    out, values = [], _values(r, tp)
    for i, p in enumerate(parts):
        m = _TOKEN.match(p) if (stream or i > 0) else None
        if m is not None:
            p = f"{m.group(1)}{_swap(m.group(1), int(m.group(2)), r, width, values)}"
        out.append(p)
    return ".".join(out)


def canonical(name: str, *, stream: bool = False, width: int = 1) -> str:
    """The rank-0 name of which ``name`` is some rank's copy: every token's value 0 (a GPU token's, at
    ``width`` > 1, its stage: the value modulo ``width``)."""
    parts = _parts(name, stream)
    if parts is None:
        return name

    def zero(m: re.Match[str]) -> str:
        head = m.group(1)
        return f"{head}{int(m.group(2)) % width}" if width > 1 and head in GPU_TOKENS else f"{head}0"

    return ".".join(zero(m) if (m := _TOKEN.match(p)) is not None and (stream or i > 0) else p
                    for i, p in enumerate(parts))


def group_copies(name: str, tokens: tuple[str, ...], values: Iterable[int]) -> list[str]:
    """``name`` (a collective of rank 0's group: its ``tokens`` at 0, no rank's own token) with those tokens at each
    of ``values``: the ids of its copies in the other groups, as ``image`` names them."""
    parts = name.split(".")
    at = [i for i, p in enumerate(parts) if i > 0 and (m := _TOKEN.match(p)) is not None and m.group(1) in tokens]
    if not at or names_a_rank(name):
        raise ValueError(f"{name!r} is not a group collective's id")
    heads = [_TOKEN.match(parts[i]).group(1) for i in at]  # type: ignore[union-attr]
    out = []
    for v in values:
        for i, h in zip(at, heads, strict=True):
            parts[i] = f"{h}{v}"
        out.append(".".join(parts))
    return out


def names_a_rank(name: str) -> bool:
    """Does the task or tensor id carry a rank's own token (``RANK_TOKENS``; not only a group's)?"""
    parts = _parts(name, False) or ()
    return any((m := _TOKEN.match(p)) is not None and m.group(1) in RANK_TOKENS for p in parts[1:])


class Images(Mapping[str, str]):
    """Rank k's names of rank 0's (``names``), worked out on first use (a 1024-rank result reads them only to
    expand its records)."""

    def __init__(self, names: frozenset[str], k: int, *, tp: int = 1, stream: bool = False, width: int = 1):
        self._names, self._k, self._tp, self._stream, self._width = names, k, tp, stream, width
        self._got: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        got = self._got.get(name)
        if got is None:
            if name not in self._names:
                raise KeyError(name)
            got = self._got[name] = image(name, self._k, tp=self._tp, stream=self._stream, width=self._width)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
