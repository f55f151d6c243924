"""replay.compare: the bytes the replay moved against the plan's, said where they differ (never silently)."""

from __future__ import annotations

from replay.compare import BYTES_NOTE_AT, bytes_moved_lines


def test_nothing_moved_says_nothing() -> None:
    assert bytes_moved_lines(0.0, 0.0) == []


def test_bytes_that_agree_are_printed_without_a_note() -> None:
    (line,) = bytes_moved_lines(472.69e6, 472.69e6 * (1 + BYTES_NOTE_AT / 2))
    assert "priced 472.69 MB" in line and "(+2.5%)" in line and "fp32" not in line


def test_twice_the_priced_bytes_are_explained() -> None:
    (line,) = bytes_moved_lines(472.69e6, 945.38e6)
    assert "(+100.0%)" in line and "fp32 working parameters and gradients" in line and "replay.precision" in line


def test_real_bytes_where_the_plan_prices_none_are_explained() -> None:
    (line,) = bytes_moved_lines(0.0, 1e6)
    assert "priced 0 B" in line and "fp32" in line


def test_fewer_real_bytes_are_not_blamed_on_fp32_copies() -> None:
    (line,) = bytes_moved_lines(1e9, 0.5e9)
    assert "(-50.0%)" in line and "fp32" not in line and "moved less than the plan prices" in line
