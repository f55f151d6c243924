"""``tiersim results --where``: a grammar of its own (tiersim.row_filter), never Python.

Table-driven cases of the grammar on a small frame, the attack strings that once reached ``os.system``
through ``DataFrame.query`` (nothing runs: a marker file is never created), and two Hypothesis properties:
any string raises nothing but the one-line WhereError, and valid expressions agree with a reference
evaluation written with plain Python comparisons on rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.sweep.store import COLUMNS, SweepStore, column_kinds
from tiersim.cli import main
from tiersim.row_filter import BOOLEAN, NUMBER, TEXT, WhereError, filter_frame

KINDS = {"model": TEXT, "policy": TEXT, "micro_batch": NUMBER, "tokens_per_s": NUMBER, "feasible": BOOLEAN}
ROWS: list[dict[str, Any]] = [
    {"model": "gpt2", "policy": "none", "micro_batch": 1, "tokens_per_s": 9.0e4, "feasible": True},
    {"model": "gpt2", "policy": "zero-offload", "micro_batch": 2, "tokens_per_s": 6.0e4, "feasible": True},
    {"model": "opt-1.3b", "policy": "none", "micro_batch": 4, "tokens_per_s": None, "feasible": False},
    {"model": "llama2-7b", "policy": "tinypipe", "micro_batch": 8, "tokens_per_s": None, "feasible": None},
]


def frame_of(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as ``results_frame`` types them: floats with NaN, text with None, nullable booleans."""
    df = pd.DataFrame(rows, columns=list(KINDS))
    for name, kind in KINDS.items():
        if kind == NUMBER:
            df[name] = pd.to_numeric(df[name], errors="coerce").astype(float)
        elif kind == BOOLEAN:
            df[name] = df[name].astype("boolean")
    return df


FRAME = frame_of(ROWS)


def models(expr: str) -> list[str]:
    return list(filter_frame(FRAME, expr, KINDS)["model"] + ":" + filter_frame(FRAME, expr, KINDS)["policy"])


@pytest.mark.parametrize(("expr", "want"), [
    ("feasible", ["gpt2:none", "gpt2:zero-offload"]),
    ("not feasible", ["opt-1.3b:none", "llama2-7b:tinypipe"]),  # a missing verdict is not feasible
    ("feasible == false", ["opt-1.3b:none"]),
    ("feasible != true", ["opt-1.3b:none"]),                   # missing satisfies no comparison
    ("model == 'gpt2'", ["gpt2:none", "gpt2:zero-offload"]),
    ('model == "gpt2" and policy != none', ["gpt2:zero-offload"]),
    ("model == opt-1.3b", ["opt-1.3b:none"]),                  # a bare word may hold '-' and '.'
    ("tokens_per_s > 5e4", ["gpt2:none", "gpt2:zero-offload"]),
    ("tokens_per_s >= 60000 and tokens_per_s <= 6e4", ["gpt2:zero-offload"]),
    ("tokens_per_s != 1", ["gpt2:none", "gpt2:zero-offload"]),  # NaN rows: no comparison holds
    ("not tokens_per_s != 1", ["opt-1.3b:none", "llama2-7b:tinypipe"]),
    ("micro_batch in (1, 8)", ["gpt2:none", "llama2-7b:tinypipe"]),
    ("micro_batch not in (1, 8)", ["gpt2:zero-offload", "opt-1.3b:none"]),
    ("policy in ('none', tinypipe)", ["gpt2:none", "opt-1.3b:none", "llama2-7b:tinypipe"]),
    ("micro_batch < 2 or micro_batch > 4", ["gpt2:none", "llama2-7b:tinypipe"]),
    ("(micro_batch < 2 or micro_batch > 4) and feasible", ["gpt2:none"]),
    ("micro_batch < 2 or micro_batch > 4 and feasible", ["gpt2:none"]),  # and binds tighter than or
    ("NOT (model == gpt2) AND micro_batch<=4", ["opt-1.3b:none"]),        # keywords in any case
    ("model > 'h'", ["opt-1.3b:none", "llama2-7b:tinypipe"]),            # text orders alphabetically
    ("micro_batch == -1 or micro_batch == +2.0", ["gpt2:zero-offload"]),
    ("not not feasible", ["gpt2:none", "gpt2:zero-offload"]),
])
def test_the_grammar(expr: str, want: list[str]) -> None:
    assert models(expr) == want


@pytest.mark.parametrize(("expr", "words"), [
    ("speed > 3", ["unknown field 'speed'", "fields: model, policy, micro_batch, tokens_per_s, feasible"]),
    ("model ===", ["position 9", "unexpected character"]),
    ("model = 'gpt2'", ["position 7", "compare with =="]),
    ("model == 'gpt2", ["position 10", "not closed"]),
    ("(feasible", ["position 10", "')'"]),
    ("feasible)", ["position 9", "the end of the expression"]),
    ("feasible and", ["position 13", "a field name"]),
    ("model", ["position 6", "a comparison after 'model'"]),
    ("tokens_per_s > fast", ["position 16", "is a number"]),
    ("feasible == 1", ["position 13", "true or false"]),
    ("feasible < true", ["position 10", "== or !="]),
    ("micro_batch in 1", ["position 16", "'('"]),
    ("micro_batch in (1 2)", ["position 19", "',' or ')'"]),
    ("micro_batch not 1", ["position 17", "'in' after 'not'"]),
    ("feasible && model == gpt2", ["position 10", "and / or / not"]),
    ("tokens_per_s > 1e999", ["out of range"]),
    ("model == 1.3b", ["position 10", "unexpected character '1'"]),
    ("(" * 100 + "feasible" + ")" * 100, ["nested deeper than 64"]),
    ("x" * 10_001, ["10,001 characters"]),
    ("   ", ["empty expression"]),
])
def test_errors_are_one_line_with_the_position(expr: str, words: list[str]) -> None:
    with pytest.raises(WhereError) as err:
        filter_frame(FRAME, expr, KINDS)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


# -- through the command line, on a real store ----------------------------------------------------------
def _result(tokens: float | None, feasible: bool) -> dict[str, Any]:
    return {"feasible": feasible, "verdict": "FEASIBLE" if feasible else "INFEASIBLE: gpu0 ...",
            "oom": None if feasible else {"pool": "gpu0"}, "n_gpus": 1, "model": {"params": 1.2e8},
            "step_time_s": 0.1 if feasible else None, "tokens_per_s": tokens, "tflops_per_gpu": 100.0 if feasible
            else None, "mfu": 0.3 if feasible else None, "peak_bytes": {"gpu0": 1e9}, "sim": {"events": 1}}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "runs.sqlite"
    with SweepStore(path) as s:
        for i, (model, policy, mb, tokens, ok) in enumerate([("gpt2", "none", 1, 9.0e4, True),
                                                              ("gpt2", "zero-offload", 2, 6.0e4, True),
                                                              ("llama2-7b", "none", 1, None, False)]):
            point = {"hardware": "a100", "set": [], "model": model, "policy": policy, "knobs": {},
                     "workload": {"micro_batch": mb, "global_batch": 8}}
            s.add(f"k{i}", point, {"status": "done", "result": _result(tokens, ok)})
        s.add("k9", {"hardware": "a100", "set": [], "model": "gpt2", "policy": "none", "knobs": {"stage": 9},
                     "workload": {}}, {"status": "failed", "error": "KnobError: stage"})
    return path


def run_results(store: Path, *where: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    argv = ["results", str(store), "--json"]
    for w in where:
        argv += ["--where", w]
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_where_on_a_store(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_results(store, "feasible and micro_batch in (2, 3)", capsys=capsys)
    assert rc == 0
    assert [(r["model"], r["policy"]) for r in json.loads(out)["rows"]] == [("gpt2", "zero-offload")]
    rc, out, _ = run_results(store, "status == failed or tokens_per_s < 7e4", "model == gpt2", capsys=capsys)
    assert rc == 0
    assert sorted(r["key"] for r in json.loads(out)["rows"]) == ["k1", "k9"]
    rc, out, _ = run_results(store, "knobs == 'stage=9'", capsys=capsys)  # text columns hold what the table shows
    assert rc == 0 and [r["key"] for r in json.loads(out)["rows"]] == ["k9"]


def test_every_store_column_is_a_field(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert set(column_kinds()) == set(COLUMNS)
    for name, kind in column_kinds().items():
        expr = {"number": f"{name} >= 0 or not {name} >= 0", "text": f"{name} != 'x' or not {name} != 'x'",
                "boolean": f"{name} or not {name}"}[kind]
        rc, out, err = run_results(store, expr, capsys=capsys)
        assert rc == 0, err
        assert json.loads(out)["count"] == 4


ATTACKS = [
    "@__import__('os').system('touch {m}')",
    "model == @__import__('os').system('touch {m}')",
    "__import__('os').system('touch {m}')",
    "os.system('touch {m}')",
    "feasible and @os.system('touch {m}')",
    "model.__class__.__mro__[1].__subclasses__()",
    "policy == 'none'; import os; os.system('touch {m}')",
    "`touch {m}`",
    "model == \"x\" or __import__(\"subprocess\").call(['touch', '{m}'])",
    "tokens_per_s > 0 | @pd.io.common.os.system('touch {m}')",
    "lambda: open('{m}', 'w')",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_nothing_of_the_expression_runs(store: Path, tmp_path: Path, attack: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "PWNED"
    rc, out, err = run_results(store, attack.format(m=marker), capsys=capsys)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiersim: error: --where "), err
    assert "Traceback" not in err
    assert not marker.exists()


def test_an_attack_in_a_subprocess_runs_nothing(store: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    marker = tmp_path / "PWNED"
    proc = subprocess.run([sys.executable, "-m", "tiersim", "results", str(store), "--where",
                           f"@__import__('os').system('touch {marker}')"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


# -- properties ------------------------------------------------------------------------------------------
TOKENS = ["model", "policy", "micro_batch", "tokens_per_s", "feasible", "speed", "and", "or", "not", "in", "AND",
          "(", ")", ",", "==", "!=", "<", "<=", ">", ">=", "=", "'gpt2'", '"x y"', "'", '"', "1", "-2.5", "5e4",
          "1e999", ".5", "1.", "gpt2", "opt-1.3b", "true", "false", "@x", "__import__", "os.system", "(", ";",
          "\\", "`", "[", "]", "{", "}", "é", "\x00", "\n", "&", "|", "~", "!", "1.3b", "+", "-"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=12), st.sampled_from(["", " "]))
def test_token_soup_raises_only_where_errors(tokens: list[str], sep: str) -> None:
    try:
        filter_frame(FRAME, sep.join(tokens), KINDS)
    except WhereError as e:
        assert "\n" not in str(e)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_any_text_raises_only_where_errors(text: str) -> None:
    try:
        filter_frame(FRAME, text, KINDS)
    except WhereError as e:
        assert "\n" not in str(e)


# random expressions, rendered to text and evaluated by a reference on plain rows
_WORD = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,6}", fullmatch=True).filter(
    lambda w: w.lower() not in ("and", "or", "not", "in"))
_TEXT_VALUE = st.one_of(st.sampled_from(["gpt2", "none", "opt-1.3b", "tinypipe", "zero-offload"]), _WORD,
                        st.text(alphabet="abc xyz-1.", max_size=6))
_NUMBER_VALUE = st.one_of(st.integers(-3, 10).map(float),
                          st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))


def _render_value(v: Any, kind: str, draw: Any) -> str:
    if kind == NUMBER:
        return repr(float(v))
    if draw(st.booleans()) and _is_word(v):
        return str(v)  # a bare word
    return draw(st.sampled_from(["'", '"'])).join(["", str(v), ""])


def _is_word(v: str) -> bool:
    import re
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", v) is not None and v.lower() not in ("and", "or", "not", "in")


@st.composite
def comparison(draw: Any) -> tuple[str, Any]:
    field = draw(st.sampled_from(list(KINDS)))
    kind = KINDS[field]
    if kind == BOOLEAN:
        if draw(st.booleans()):
            return field, ("truth", field)
        op = draw(st.sampled_from(["==", "!="]))
        v = draw(st.booleans())
        return f"{field} {op} {'true' if v else 'false'}", ("cmp", field, op, v)
    values = _NUMBER_VALUE if kind == NUMBER else _TEXT_VALUE
    if draw(st.integers(0, 4)) == 0:
        vs = draw(st.lists(values, min_size=1, max_size=3))
        neg = draw(st.booleans())
        text = ", ".join(_render_value(v, kind, draw) for v in vs)
        return f"{field} {'not in' if neg else 'in'} ({text})", ("in", field, neg, tuple(vs))
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
    v = draw(values)
    spaced = draw(st.sampled_from([" ", ""]))
    return f"{field}{spaced}{op}{spaced}{_render_value(v, kind, draw)}", ("cmp", field, op, v)


def expression(depth: int = 0) -> Any:
    if depth >= 3:
        return comparison()
    sub = st.deferred(lambda: expression(depth + 1))
    return st.one_of(
        comparison(),
        sub.map(lambda e: (f"not ({e[0]})", ("not", e[1]))),
        sub.map(lambda e: (f"({e[0]})", e[1])),
        st.tuples(sub, sub, st.sampled_from(["and", "or"])).map(
            lambda t: (f"({t[0][0]}) {t[2]} ({t[1][0]})", (t[2], t[0][1], t[1][1]))),
    )


def reference(tree: Any, row: dict[str, Any]) -> bool:
    """Plain Python: a missing value satisfies no comparison; ``not`` turns the result over."""
    op = tree[0]
    if op == "not":
        return not reference(tree[1], row)
    if op in ("and", "or"):
        a, b = reference(tree[1], row), reference(tree[2], row)
        return (a and b) if op == "and" else (a or b)
    v = row[tree[1]]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return False
    if op == "truth":
        return v is True
    if op == "in":
        return (v in tree[3]) != tree[2]
    x = tree[3]
    return {"==": v == x, "!=": v != x, "<": v < x, "<=": v <= x, ">": v > x, ">=": v >= x}[tree[2]]


ROW = st.fixed_dictionaries({
    "model": st.one_of(st.none(), _TEXT_VALUE), "policy": st.one_of(st.none(), _TEXT_VALUE),
    "micro_batch": st.one_of(st.none(), st.integers(-3, 10)),
    "tokens_per_s": st.one_of(st.none(), _NUMBER_VALUE), "feasible": st.one_of(st.none(), st.booleans())})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression(), st.lists(ROW, min_size=1, max_size=6))
def test_valid_expressions_agree_with_a_reference(expr: tuple[str, Any], rows: list[dict[str, Any]]) -> None:
    text, tree = expr
    got = filter_frame(frame_of(rows), text, KINDS).index.tolist()
    want = [i for i, r in enumerate(rows) if reference(tree, r)]
    assert got == want, text
