"""Confidence intervals against scipy and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st
from hypothesis import given, settings
from hypothesis import strategies as hs

from cipr.eval.stats import (
    accuracy,
    mean_estimate,
    paired_difference,
    proportion,
    wald_interval,
    wilson_interval,
)


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(1, 3000), frac=hs.floats(0, 1), conf=hs.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_wilson_matches_scipy(n, frac, conf):
    k = round(frac * n)
    ref = st.binomtest(k, n).proportion_ci(confidence_level=conf, method="wilson")
    lo, hi = wilson_interval(k, n, conf)
    assert lo == pytest.approx(ref.low, abs=1e-12)
    assert hi == pytest.approx(ref.high, abs=1e-12)


def test_wilson_hand_computed():
    # k=7, n=20, z=1.959964: center=(0.35+z²/40)/(1+z²/20), half=z/(1+z²/20)·√(0.35·0.65/20+z²/1600)
    z = 1.959963984540054
    center = (0.35 + z * z / 40) / (1 + z * z / 20)
    half = z / (1 + z * z / 20) * math.sqrt(0.35 * 0.65 / 20 + z * z / 1600)
    lo, hi = wilson_interval(7, 20)
    assert (lo, hi) == pytest.approx((center - half, center + half))
    assert (lo, hi) == pytest.approx((0.18119, 0.56715), abs=1e-5)


def test_wald_and_edges():
    lo, hi = wald_interval(50, 100)
    assert (lo, hi) == pytest.approx((0.5 - 1.959964 * 0.05, 0.5 + 1.959964 * 0.05), abs=1e-6)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    e = proportion(0, 0)
    assert math.isnan(e.value) and e.to_json()["value"] is None
    with pytest.raises(ValueError):
        wilson_interval(5, 3)
    with pytest.raises(ValueError):
        proportion(1, 2, method="exact")


def test_mean_estimate_matches_scipy_normal_and_t():
    rng = np.random.default_rng(0)
    x = rng.choice([0.0, 0.5, 1.0], size=57)
    sem = st.sem(x)
    e = mean_estimate(list(x), method="normal")
    ref = st.norm.interval(0.95, loc=x.mean(), scale=sem)
    assert (e.low, e.high) == pytest.approx(ref)
    et = mean_estimate(list(x), method="t", confidence=0.9)
    ref_t = st.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=sem)
    assert (et.low, et.high) == pytest.approx(ref_t)
    assert et.n == 57 and et.value == pytest.approx(x.mean())


def test_paired_difference_matches_ttest_rel():
    a = {"i1": 1.0, "i2": 0.0, "i3": 1.0, "i4": 1.0, "i5": 0.5, "only_a": 1.0}
    b = {"i1": 0.0, "i2": 0.0, "i3": 1.0, "i4": 0.0, "i5": 0.5, "only_b": 0.0}
    est, unpaired = paired_difference(a, b, method="t")
    keys = ["i1", "i2", "i3", "i4", "i5"]
    ref = st.ttest_rel([a[k] for k in keys], [b[k] for k in keys]).confidence_interval(0.95)
    assert unpaired == 2 and est.n == 5
    assert est.value == pytest.approx(0.4)
    assert (est.low, est.high) == pytest.approx((ref.low, ref.high))


def test_accuracy_picks_interval_by_data():
    assert accuracy([1, 0, 1, 1]).method == "wilson"
    assert accuracy([1, 0.5, 1, 0]).method == "normal"
    assert accuracy([1, 0, 1, 1], proportion_method="normal").half_width == pytest.approx(
        1.959964 * math.sqrt(0.75 * 0.25 / 4), abs=1e-6)
    single = mean_estimate([0.5])
    assert single.value == 0.5 and math.isnan(single.low)
