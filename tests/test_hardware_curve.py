"""hardware_models.Curve: log-linear interpolation, clamping, validation, properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware_models import Curve, HardwareInputError


def test_interpolates_linearly_in_log10() -> None:
    curve = Curve(((1e8, 0.1), (1e10, 0.3)))
    assert curve(1e9) == pytest.approx(0.2)  # half-way in log space, not in linear space
    assert curve(10**9.5) == pytest.approx(0.25)
    assert curve(1e8) == pytest.approx(0.1)
    assert curve(1e10) == pytest.approx(0.3)


def test_clamps_at_both_ends() -> None:
    curve = Curve(((1e8, 0.1), (1e10, 0.3)))
    assert curve(1.0) == 0.1
    assert curve(0.0) == 0.1
    assert curve(-5.0) == 0.1
    assert curve(1e20) == 0.3
    assert curve(math.inf) == 0.3


def test_single_point_is_constant_and_lists_are_normalised() -> None:
    assert Curve.constant(0.5)(1e3) == 0.5
    assert Curve([[1e9, 0.5]])(1e12) == 0.5  # type: ignore[arg-type]
    assert Curve([[1e9, 0.5]]) == Curve(((1e9, 0.5),))  # type: ignore[arg-type]
    assert hash(Curve(((1.0, 0.5),))) == hash(Curve(((1.0, 0.5),)))


@pytest.mark.parametrize(
    ("points", "needle"),
    [
        ((), "at least one"),
        (((1e9, 0.5), (1e8, 0.6)), "strictly ascending"),
        (((1e9, 0.5), (1e9, 0.6)), "strictly ascending"),
        (((1e9, 1.2),), "(0, 1]"),
        (((1e9, 0.0),), "(0, 1]"),
        (((0.0, 0.5),), "> 0"),
        (((1e9,),), "pair"),
        (((1e9, "x"),), "finite numbers"),
        (((math.nan, 0.5),), "finite numbers"),
    ],
)
def test_rejects_bad_points(points: tuple[tuple[float, ...], ...], needle: str) -> None:
    with pytest.raises(HardwareInputError, match=None) as info:
        Curve(points)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_nan_query_is_an_error() -> None:
    with pytest.raises(HardwareInputError):
        Curve.constant(0.5)(math.nan)


_effs = st.floats(min_value=1e-3, max_value=1.0, allow_nan=False)
_log_xs = st.lists(
    st.floats(min_value=-3, max_value=18, allow_nan=False), min_size=1, max_size=8, unique=True
)


@st.composite
def curves(draw: st.DrawFn, monotone: bool = False) -> Curve:
    xs = sorted({10**lx for lx in draw(_log_xs)})
    ys = draw(st.lists(_effs, min_size=len(xs), max_size=len(xs)))
    if monotone:
        ys = sorted(ys)
    return Curve(tuple(zip(xs, ys, strict=True)))


@given(curves(monotone=True), st.floats(min_value=1e-6, max_value=1e20, allow_nan=False))
def test_output_stays_within_the_y_range(curve: Curve, x: float) -> None:
    ys = [y for _, y in curve.points]
    assert min(ys) <= curve(x) <= max(ys)


@given(curves(), st.floats(min_value=1e-6, max_value=1e20, allow_nan=False))
def test_output_stays_within_the_y_range_for_any_curve(curve: Curve, x: float) -> None:
    ys = [y for _, y in curve.points]
    assert min(ys) - 1e-12 <= curve(x) <= max(ys) + 1e-12


@given(
    curves(monotone=True), st.floats(min_value=1e-6, max_value=1e20), st.floats(min_value=1.0, max_value=1e6)
)
def test_monotone_points_give_a_monotone_curve(curve: Curve, x: float, factor: float) -> None:
    assert curve(x) <= curve(x * factor) + 1e-12


@given(curves())
def test_passes_through_its_points(curve: Curve) -> None:
    for x, y in curve.points:
        assert curve(x) == pytest.approx(y, abs=1e-12)
