"""Golden results for a few canonical runs (regenerate: `.venv/bin/python tests/golden_cases.py`)."""

from __future__ import annotations

import json

import pytest
from golden_cases import CASES, GOLDEN_DIR, run_case


@pytest.mark.parametrize("name", sorted(CASES))
def test_canonical_run_matches_its_golden_result(name: str) -> None:
    expected = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    got = run_case(name)
    assert got["feasible"] == expected["feasible"]
    assert got["sim_method"] == expected["sim_method"]
    for key in ("step_time_s", "tokens_per_s", "mfu", "exposed_transfer_s"):
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key
    for group in ("peak_bytes", "link_bytes"):
        assert got[group].keys() == expected[group].keys(), group
        for k, v in expected[group].items():
            assert got[group][k] == pytest.approx(v, rel=1e-6), (group, k)
