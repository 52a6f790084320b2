"""A cut's charge by bytes (`collage_farm.core.cutcharge`): the robust fit and the floored
line, against figures computed by hand."""

from __future__ import annotations

import pytest

from collage_farm.core.cutcharge import CutCharge, fit_cut_charge


def test_charge_is_a_line_in_the_bytes_floored_at_zero() -> None:
    c = CutCharge(-20e-6, 1e-9)  # 1 us per KB (1000 bytes), 0 below 20 KB
    assert c.cost(100_000) == pytest.approx(80e-6)
    assert c.cost(20_000) == 0.0 and c.cost(0) == 0.0 and c.cost(-5) == 0.0
    assert CutCharge(3e-5).cost(10**9) == 3e-5  # no per-byte part: the fixed figure
    assert c.to_json() == {"fixed_s": -20e-6, "per_byte_s": 1e-9}
    capped = CutCharge(-20e-6, 1e-9, cap_s=50e-6)  # never more than 50 us
    assert capped.cost(60_000) == pytest.approx(40e-6) and capped.cost(10**6) == 50e-6
    assert capped.to_json() == {"fixed_s": -20e-6, "per_byte_s": 1e-9, "cap_s": 50e-6}


def test_fit_is_theil_sen_and_ignores_an_outlier() -> None:
    # on the line 10 us + 2 us per KB, but for one point 900 us off (a noisy difference)
    pts = [(0, 10e-6), (1000, 12e-6), (2000, 14e-6), (3000, 916e-6), (4000, 18e-6)]
    # pairwise slopes (us/byte): 10 pairs, 6 of them exactly 2e-9; the median is 2e-9
    fit = fit_cut_charge(pts)
    assert fit.per_byte_s == pytest.approx(2e-9)
    # residuals 10, 10, 10, 910, 10 us: median 10 us; capped at the largest point, 916 us
    assert fit.fixed_s == pytest.approx(10e-6) and fit.cap_s == pytest.approx(916e-6)
    # least squares would tilt: slope 0.2055 us/byte (not asserted elsewhere; why Theil-Sen)


def test_fit_by_hand_with_repeated_sizes() -> None:
    # two partners at each of two sizes: (1000: 100, 140 us), (3000: 300, 260 us)
    pts = [(1000, 100e-6), (1000, 140e-6), (3000, 300e-6), (3000, 260e-6)]
    # slopes of the four pairs with different sizes: 0.1, 0.08, 0.08, 0.06 us/byte -> 0.08
    fit = fit_cut_charge(pts)
    assert fit.per_byte_s == pytest.approx(0.08e-6)
    # residuals 20, 60, 60, 20 us -> median 40 us
    assert fit.fixed_s == pytest.approx(40e-6)
    assert fit.cost(2000) == pytest.approx(200e-6)
    assert fit.cost(10_000) == pytest.approx(300e-6)  # 840 us on the line: capped at 300 us


def test_a_falling_fit_is_a_constant_and_one_size_is_its_median() -> None:
    falling = fit_cut_charge([(1000, 300e-6), (2000, 200e-6), (3000, 100e-6)])
    # slope floored at 0: the median
    assert falling == CutCharge(pytest.approx(200e-6), 0.0, pytest.approx(300e-6))
    one = fit_cut_charge([(4096, 50e-6), (4096, 70e-6), (4096, -10e-6)])
    assert one == CutCharge(pytest.approx(50e-6), 0.0, pytest.approx(70e-6))
    assert fit_cut_charge([(10, -5e-6), (20, -1e-6)]).cap_s == 0.0  # every point negative
    assert fit_cut_charge([]) == CutCharge(0.0, 0.0)

