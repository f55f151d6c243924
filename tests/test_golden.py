"""Golden results for canonical runs (regenerate: `.venv/bin/python tests/golden_cases.py`).

Each golden pins the plan's fingerprint (sha256 of its JSON) and the headline result, so a refactoring
that claims to move code without changing behaviour is checked on every policy.
"""

from __future__ import annotations

import json

import pytest
from golden_cases import CASES, GOLDEN_DIR, run_case


@pytest.mark.parametrize("name", sorted(CASES))
def test_canonical_run_matches_its_golden_result(name: str) -> None:
    expected = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    got = run_case(name)
    assert got["feasible"] == expected["feasible"]
    if "plan_infeasible" in expected:
        assert got.get("plan_infeasible") == expected["plan_infeasible"]
        return
    assert got["plan_sha256"] == expected["plan_sha256"], "the plan changed: regenerate the goldens on purpose"
    assert got["sim_method"] == expected["sim_method"]
    for key in ("step_time_s", "tokens_per_s", "mfu", "exposed_transfer_s"):
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key
    for group in ("peak_bytes", "link_bytes"):
        assert got[group].keys() == expected[group].keys(), group
        for k, v in expected[group].items():
            assert got[group][k] == pytest.approx(v, rel=1e-6), (group, k)


def test_every_policy_has_a_golden_on_one_and_on_eight_gpus() -> None:
    from golden_cases import POLICY_NAMES

    from policies import POLICIES

    assert set(POLICY_NAMES) == set(POLICIES)
    for policy in POLICIES:
        hws = {c["hw"] for c in CASES.values() if c["policy"] == policy}
        assert {"a100", "a100x8"} <= hws, policy
