"""Laws of the round-by-round ("paired") comparison behind never-worse and refinement.

Why these laws: on a shared VM the machine's speed drifts between the turns of an interleaved
run, and the never-worse decision must not depend on that drift. Each round's drift scales
both sides alike, so the paired ratio must be invariant to it, antisymmetric, and never say
that each side beats the other.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_farm.postsearch.never_worse import VerifyResult
from collage_farm.postsearch.noise import NOISE_FLOOR, Paired, noise_threshold, paired
from runners.base import Summary

rounds_st = st.lists(st.floats(0.5, 2.0), min_size=3, max_size=12)


def _summary(rounds: list[float]) -> Summary:
    return Summary.of(rounds, rounds)


@settings(max_examples=200, deadline=None)
@given(base=rounds_st, ratio=st.floats(0.5, 1.5), drift=st.lists(st.floats(0.5, 2.0),
                                                                 min_size=12, max_size=12),
       jitter=st.lists(st.floats(0.97, 1.03), min_size=12, max_size=12))
def test_paired_laws(base: list[float], ratio: float, drift: list[float],
                     jitter: list[float]) -> None:
    a = [x * ratio * j for x, j in zip(base, jitter)]
    b = list(base)
    ab = paired(_summary(a), _summary(b), a, b)
    ba = paired(_summary(b), _summary(a), b, a)
    # antisymmetric, and never both faster
    assert ab.ratio * ba.ratio == pytest.approx(1.0, rel=1e-9)
    assert ab.threshold == pytest.approx(ba.threshold, rel=1e-9)
    assert not (ab.a_faster and ba.a_faster)
    assert ab.threshold >= NOISE_FLOOR and ab.pairs == len(base)
    # a per-round drift that scales both sides alike changes nothing
    da = [x * d for x, d in zip(a, drift)]
    db = [x * d for x, d in zip(b, drift)]
    moved = paired(_summary(da), _summary(db), da, db)
    assert moved.ratio == pytest.approx(ab.ratio, rel=1e-9)
    assert moved.threshold == pytest.approx(ab.threshold, rel=1e-9)
    assert moved.a_faster == ab.a_faster


def test_drift_hides_a_real_gain_from_the_unpaired_rule_only() -> None:
    """5% faster in every round while the machine drifts +-30% between rounds."""
    drift = [1.0, 1.3, 0.8, 1.25, 0.75, 1.1, 0.9]
    b = [1e-3 * d for d in drift]
    a = [0.95 * x for x in b]
    sa, sb = _summary(a), _summary(b)
    assert noise_threshold(sa, sb, len(a)) > 0.2  # unpaired: the drift is the noise
    p = paired(sa, sb, a, b)
    assert p.ratio == pytest.approx(0.95) and p.threshold == NOISE_FLOOR and p.a_faster
    # the same medians without round data: the unpaired rule decides, and says no
    q = paired(sa, sb)
    assert q.pairs == 0 and not q.a_faster
    assert q.ratio == pytest.approx(sa.median / sb.median)


def test_noisy_ratios_widen_the_threshold() -> None:
    b = [1e-3] * 5
    a = [0.80e-3, 1.05e-3, 0.85e-3, 1.10e-3, 0.90e-3]  # median 0.9, but all over the place
    p = paired(_summary(a), _summary(b), a, b)
    sd = float(np.std([math.log(x / 1e-3) for x in a], ddof=1))
    assert p.threshold == pytest.approx(2.5 * 1.2533 * sd / math.sqrt(5))
    assert p.threshold > 0.1 and not p.a_faster


def test_verify_result_compares_by_round_and_aliases_share_rounds() -> None:
    drift = [1.0, 1.3, 0.8, 1.25]
    best = [2e-3 * d for d in drift]
    mix = [0.9 * x for x in best]
    v = VerifyResult({"mix": _summary(mix), "ort-cpu": _summary(best)}, {}, ("ort-cpu",), 4,
                     round_medians={"mix": tuple(mix), "ort-cpu": tuple(best)})
    c = v.compare("mix", "ort-cpu")
    assert isinstance(c, Paired) and c.pairs == 4 and c.ratio == pytest.approx(0.9)
    assert v.beats("mix", "ort-cpu") and not v.beats("ort-cpu", "mix")
    assert v.threshold("mix", "ort-cpu") == c.threshold
    assert c.to_json() == {"ratio": c.ratio, "threshold": c.threshold, "pairs": 4,
                           "low": c.low, "high": c.high}
    assert c.low <= c.ratio <= c.high  # a 95% interval of the per-round ratio
