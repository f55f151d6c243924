"""`tiersim validate` runs and every published figure is within its stated tolerance."""

from __future__ import annotations

import pytest

from tiersim.cli import main
from tiersim.validate import CASES, run_cases


def test_every_validation_case_is_within_tolerance() -> None:
    outcomes = run_cases()
    assert len(outcomes) == len(CASES) >= 10
    bad = [f"{o.case.name}: {o.error:+.1%} (tolerance {o.case.tolerance:.1%})" for o in outcomes if not o.ok]
    assert bad == []


def test_validate_command_prints_the_errors_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "mean |error|" in out and "max |error|" in out
    assert "0 of" in out and "outside tolerance" in out
