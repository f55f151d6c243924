"""LazyTrain's speed work keeps its results: the pruned exposure rows are the reference's, scipy loads lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.lazytrain.milp import Window, _undominated

ROOT = Path(__file__).resolve().parent.parent


def _reference_undominated(w: Window) -> list[tuple[float, dict[tuple[int, int], float]]]:
    """The plain all-pairs test the fast version must agree with, row for row and in order."""
    rows = []
    for r in sorted(set(w.load_const) | set(w.load_var)):
        var: dict[tuple[int, int], float] = {}
        for i, o, c in w.load_var.get(r, ()):
            var[(i, o)] = var.get((i, o), 0.0) + c
        rows.append((w.load_const.get(r, 0.0), var))

    def bounds(b: int, a: int) -> bool:
        (ca, va), (cb, vb) = rows[a], rows[b]
        if a == b or cb < ca or any(vb.get(k, 0.0) < v for k, v in va.items()):
            return False
        return b < a or cb > ca or any(vb.get(k, 0.0) > va.get(k, 0.0) for k in vb)

    return [row for a, row in enumerate(rows) if not any(bounds(b, a) for b in range(len(rows)))]


# small value sets make equal and dominating rows common; zero and negative coefficients probe the set filter
_coef = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0])
_terms = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), _coef), max_size=5).map(tuple)
_resources = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@settings(max_examples=150, deadline=None)
@given(const=st.dictionaries(_resources, st.sampled_from([0.0, 1.0, 2.0]), max_size=6),
       var=st.dictionaries(_resources, _terms, max_size=6))
def test_undominated_agrees_with_the_all_pairs_reference(const: dict[str, float],
                                                          var: dict[str, tuple[tuple[int, int, float], ...]]) -> None:
    w = Window("w", 1.0, load_const=const, load_var=var)
    assert _undominated(w) == _reference_undominated(w)


def test_dominated_row_is_dropped_and_equal_rows_keep_the_first() -> None:
    w = Window("w", 1.0, load_const={"big": 2.0, "small": 1.0, "twin": 2.0},
               load_var={"big": ((0, 0, 1.0), (1, 0, 1.0)), "small": ((0, 0, 1.0),),
                         "twin": ((0, 0, 1.0), (1, 0, 1.0))})
    assert _undominated(w) == [(2.0, {(0, 0): 1.0, (1, 0): 1.0})]


def test_importing_the_policies_does_not_import_scipy() -> None:
    """scipy's cold import costs seconds; only a MILP solve needs it."""
    code = ("import sys; import tiersim.cli, policies.lazytrain, policies.lazytrain.milp; "
            "print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.stdout.strip() == "False"
