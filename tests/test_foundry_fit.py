"""The Ampere and Hopper presets' compute figures are the printed fit (tiersim/foundry_fit.py), not hand-set."""

from __future__ import annotations

import pytest

from hardware_models import load_hardware
from tiersim import foundry_fit
from tiersim.validate_table import FIT_H100_SIZES, load_rows

PRESETS = {"a100_80gb": ("a100", "a100-40g", "a100x8"), "h100_80gb": ("h800", "h800x8", "h200", "h200x8")}


@pytest.fixture(scope="module")
def fits() -> dict:
    return foundry_fit.fits()


def test_the_presets_carry_the_fit(fits: dict) -> None:
    for gpu, names in PRESETS.items():
        fitted, groups = fits[gpu]
        shape = foundry_fit.SHAPES[gpu]
        for name in names:
            g = load_hardware(name).gpu
            assert g.elementwise_efficiency == round(fitted.elementwise, 3), name
            assert g.attention_efficiency is not None
            for curve, top in ((g.gemm_efficiency, fitted.gemm), (g.attention_efficiency, fitted.attention)):
                assert [x for x, _ in curve.points] == [x for x, _ in shape]
                assert [y for _, y in curve.points] == pytest.approx([round(s * round(top, 3), 3) for _, s in shape],
                                                                     abs=1.5e-3), name


def test_the_fit_sees_only_its_own_rows(fits: dict) -> None:
    """A100: the 2023-10 table's rows less tiersim validate's; H100: three model sizes; everything else held out."""
    rows = load_rows()
    a100 = [r for r in rows if r.gpu == "a100_80gb"]
    _, groups = fits["a100_80gb"]
    fitted = [r for r, _ in groups["fitted"]]
    assert len(fitted) == sum(1 for r in a100 if r.table == "2023-10" and not r.in_validate)
    assert all(r.table == "2023-10" and not r.in_validate for r in fitted)
    _, groups = fits["h100_80gb"]
    assert {r.model for r, _ in groups["fitted"]} == set(FIT_H100_SIZES)
    assert not any(r.in_validate for r, _ in groups["fitted"])


def test_features_add_up_to_the_price_at_unit_ceilings() -> None:
    """A row's predicted step is linear in the three inverse ceilings, so the fit is a least-squares problem."""
    row = next(r for r in load_rows() if r.in_validate and r.gpu == "a100_80gb")
    f = foundry_fit.row_features(row)
    one = foundry_fit.Fit(1.0, 1.0, 1.0)
    assert one.predict(f) == pytest.approx(f.gemm_s + f.attention_s + f.elementwise_s)
    half = foundry_fit.Fit(0.5, 0.5, 0.5)
    assert half.predict(f) == pytest.approx(2 * one.predict(f))
    assert f.measured_s > 0 and f.gemm_s > f.attention_s > 0 and f.elementwise_s > 0
