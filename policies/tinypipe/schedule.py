"""Micro-batch schedules of ``tinypipe`` as segments: 1F1B (PipeDream-flush) and GPipe.

1F1B: stage s runs ``S - 1 - s`` warm-up forwards, then pairs (forward, backward), then the remaining
backwards. Segments: ``warmup`` (explicit), ``steady`` (``M - S`` uniform pairs, one per iteration),
``cooldown`` (explicit: the remaining ``s + 1`` pairs and ``S - 1 - s`` backwards of stage s); the
optimizer segment follows. GPipe: ``gpipe-stash``, ``forward`` (M), ``backward`` (M).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    kind: str   # "F" | "B"
    mb: int
    seg: int
    it: int
    slot: int   # position of the op in its iteration (template ops)


@dataclass(frozen=True)
class Schedule:
    segments: tuple[tuple[str, int], ...]   # (name, repeat), the optimizer excluded
    ops: tuple[tuple[Op, ...], ...]         # per stage, in execution order

    def repeated(self, seg: int) -> bool:
        return self.segments[seg][1] > 1 or self.segments[seg][0] in ("steady", "forward", "backward")


def _one_f_one_b_order(S: int, M: int, steady: int) -> list[list[tuple[str, int, str]]]:
    """Per stage, its ops in order as (kind, micro-batch, part): W warm-up, S steady, C cool-down."""
    per: list[list[tuple[str, int, str]]] = []
    for s in range(S):
        w = min(S - 1 - s, M)
        seq = [("F", m, "W") for m in range(w)]
        f, b, pairs = w, 0, 0
        while f < M:
            part = "S" if pairs < steady else "C"
            seq += [("F", f, part), ("B", b, part)]
            f, b, pairs = f + 1, b + 1, pairs + 1
        seq += [("B", k, "C") for k in range(b, M)]
        per.append(seq)
    return per


def one_f_one_b(S: int, M: int) -> Schedule:
    R = max(0, M - S)
    per = _one_f_one_b_order(S, M, R)
    names = []
    if any(p == "W" for seq in per for _, _, p in seq):
        names.append(("warmup", "W", 1))
    if R:
        names.append(("steady", "S", R))
    names.append(("cooldown", "C", 1))
    index = {part: i for i, (_, part, _) in enumerate(names)}
    ops = []
    for seq in per:
        out = []
        steady_pos = 0
        for kind, mb, part in seq:
            if part == "S":
                out.append(Op(kind, mb, index[part], steady_pos // 2, steady_pos % 2))
                steady_pos += 1
            else:
                out.append(Op(kind, mb, index[part], 0, 0))
        ops.append(tuple(out))
    return Schedule(tuple((n, r) for n, _, r in names), tuple(ops))


def gpipe(S: int, M: int) -> Schedule:
    """All forwards (one micro-batch per iteration), then all backwards. Nothing holds stage 0's forwards
    back, so the phase is not in lockstep and the simulator rightly simulates GPipe plans whole."""
    ops = tuple(tuple([Op("F", m, 1, m, 0) for m in range(M)] + [Op("B", m, 2, m, 0) for m in range(M)])
                for _ in range(S))
    return Schedule((("gpipe-stash", 1), ("forward", M), ("backward", M)), ops)


def make_schedule(name: str, S: int, M: int) -> Schedule:
    return gpipe(S, M) if name == "gpipe" else one_f_one_b(S, M)
