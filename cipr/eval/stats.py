"""Confidence intervals for accuracies and paired differences (pure functions over floats).

Choices the paper leaves open ("95% confidence intervals over the shared item set, paired over items
for the gap"), made here:
- The accuracy of one perturbation type in one tool order is a proportion of independent items:
  Wilson score interval by default (inside [0, 1], accurate at small n and near 0 or 1, e.g. RoTBench's
  n = 105, near-zero cost-and-latency accuracy); the normal (Wald) one with `method="normal"`.
- Anything that averages several 0/1 outcomes per item (the two tool orders of a cost-and-latency
  type, the types of a group, the mean over groups) gives one score in [0, 1] per item; its mean gets
  the normal interval over those per-item scores (`z · sd / √n`, sd with ddof = 1), or Student's t
  with `method="t"`. The item is the unit, so the correlation between types on one item is respected.
- A difference (the gap, or run B minus run A) is paired over items: the per-item differences get the
  same interval. Only items on both sides enter; the unpaired count is returned for the report.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from scipy.stats import norm
from scipy.stats import t as student_t

ProportionMethod = Literal["wilson", "normal"]
MeanMethod = Literal["normal", "t"]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval; `n` counts the items it rests on."""

    value: float
    low: float
    high: float
    n: int
    method: str
    confidence: float = 0.95

    @property
    def half_width(self) -> float:
        """Half the interval's width (the ± the paper's tables print)."""
        return (self.high - self.low) / 2

    def to_json(self, scale: float = 1.0) -> dict[str, Any]:
        """A JSON-safe dict (NaN becomes null), values multiplied by `scale` (100 for percent)."""
        def f(x: float) -> float | None:
            return None if math.isnan(x) else x * scale

        return {"value": f(self.value), "low": f(self.low), "high": f(self.high),
                "half_width": f(self.half_width), "n": self.n, "method": self.method,
                "confidence": self.confidence}


_NAN = float("nan")


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return float(norm.ppf(0.5 + confidence / 2))


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (no continuity correction)."""
    if n <= 0:
        return _NAN, _NAN
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    z = _z(confidence)
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def wald_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Normal-approximation interval p ± z·√(p(1−p)/n), not clipped."""
    if n <= 0:
        return _NAN, _NAN
    z = _z(confidence)
    p = k / n
    half = z * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


def proportion(k: int, n: int, *, method: ProportionMethod = "wilson", confidence: float = 0.95) -> Estimate:
    """Accuracy k/n with its interval."""
    if method == "wilson":
        lo, hi = wilson_interval(k, n, confidence)
    elif method == "normal":
        lo, hi = wald_interval(k, n, confidence)
    else:
        raise ValueError(f"unknown proportion method {method!r} (wilson, normal)")
    return Estimate(k / n if n else _NAN, lo, hi, n, method, confidence)


def mean_estimate(values: Sequence[float], *, method: MeanMethod = "normal",
                  confidence: float = 0.95) -> Estimate:
    """Mean of per-item scores with a normal (z) or Student-t interval on the standard error."""
    n = len(values)
    if n == 0:
        return Estimate(_NAN, _NAN, _NAN, 0, method, confidence)
    mean = math.fsum(values) / n
    if n < 2:
        return Estimate(mean, _NAN, _NAN, n, method, confidence)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    se = math.sqrt(var / n)
    if method == "normal":
        q = _z(confidence)
    elif method == "t":
        q = float(student_t.ppf(0.5 + confidence / 2, n - 1))
    else:
        raise ValueError(f"unknown mean method {method!r} (normal, t)")
    return Estimate(mean, mean - q * se, mean + q * se, n, method, confidence)


def accuracy(values: Sequence[float], *, proportion_method: ProportionMethod = "wilson",
             mean_method: MeanMethod = "normal", confidence: float = 0.95) -> Estimate:
    """Accuracy over items: a proportion interval when every score is 0 or 1, else a mean interval."""
    if all(v in (0, 1) for v in values):
        return proportion(int(sum(values)), len(values), method=proportion_method, confidence=confidence)
    return mean_estimate(values, method=mean_method, confidence=confidence)


def paired_difference(a: Mapping[Hashable, float], b: Mapping[Hashable, float], *,
                      method: MeanMethod = "normal", confidence: float = 0.95) -> tuple[Estimate, int]:
    """Mean of a[i] − b[i] over the items in both, with its paired interval, and the unpaired count."""
    common = [k for k in a if k in b]
    unpaired = len(a) + len(b) - 2 * len(common)
    est = mean_estimate([a[k] - b[k] for k in common], method=method, confidence=confidence)
    return est, unpaired
