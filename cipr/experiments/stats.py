"""The statistics every study reports: paired intervals over seeds, a seed × item bootstrap, the design's
detectable difference, and rliable's secondary summaries.

All pure functions over floats and arrays. A study's design is paired by seed (arm and control train on the
same data and copies) and crossed with items (every point is read on the same items), so a difference has two
sources of noise, seeds and items:
- `paired_t`: the mean of per-seed differences with its Student-t interval (the seeds' noise only, items
  averaged within a seed);
- `two_way_bootstrap`: the mean of the per-(seed, item) differences [S, I] with a percentile interval from
  resampling seeds and items independently, with replacement (both sources);
- `detectable`: the smallest true difference a paired t over `n` seeds detects with the given power, from the
  per-seed SD of the differences (`statsmodels`' power solver);
- `iqm` (the interquartile mean: 25% trimmed, `scipy.stats.trim_mean`) and `probability_of_improvement`
  (P(X > Y) + P(X = Y) / 2 over all pairs of runs, the Mann-Whitney U statistic / (n·m)): rliable's
  definitions (Agarwal et al., 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def paired_t(diffs: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean of `diffs` with its Student-t interval over len(diffs) units, the t statistic and two-sided p."""
    from scipy import stats

    x = np.asarray(diffs, dtype=float)
    n, mean = len(x), float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)) if n > 1 else float("nan")
    t = mean / (sd / math.sqrt(n)) if n > 1 and sd > 0 else float("nan")
    p = float(2 * stats.t.sf(abs(t), n - 1)) if not math.isnan(t) else float("nan")
    return {"mean": mean, "sd": sd, "n": n, "low": mean - half, "high": mean + half, "t": t, "p": p}


def two_way_bootstrap(d: np.ndarray, *, draws: int = 4000, seed: int = 0,
                      confidence: float = 0.95) -> dict[str, float]:
    """Mean of the [seeds, items] differences `d` and its percentile interval from resampling seeds and
    items independently (with replacement), `draws` times."""
    rng = np.random.default_rng(seed)
    s, i = d.shape
    means = np.empty(draws)
    for b in range(draws):
        rows, cols = rng.integers(0, s, s), rng.integers(0, i, i)
        means[b] = d[np.ix_(rows, cols)].mean()
    tail = (1 - confidence) / 2 * 100
    return {"mean": float(d.mean()), "low": float(np.percentile(means, tail)),
            "high": float(np.percentile(means, 100 - tail)), "seeds": s, "items": i, "draws": draws}


def detectable(sd: float, n: int, *, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean difference a two-sided paired t test over `n` seeds detects with probability
    `power` at level `alpha`, given the per-seed SD `sd` of the differences (NaN for n < 2 or sd NaN)."""
    if n < 2 or not sd == sd:
        return float("nan")
    from statsmodels.stats.power import TTestPower

    effect = TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative="two-sided")
    return float(effect) * sd


def item_adjusted_sd(sd: float, item_se: float, items_then: int, items_now: int) -> float:
    """The per-seed SD of a difference when each seed reads `items_now` items instead of `items_then`: the
    item part of the variance (`item_se`², the squared SE of a seed's mean over its items) scales by
    items_then / items_now, the seed part stays (floored at 0)."""
    seed_var = max(sd * sd - item_se * item_se, 0.0)
    return math.sqrt(seed_var + item_se * item_se * items_then / items_now)


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean (the mean of the middle 50%, `scipy.stats.trim_mean(x, 0.25)`)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    return float(stats.trim_mean(x, 0.25)) if len(x) else float("nan")


def probability_of_improvement(x: Sequence[float], y: Sequence[float]) -> float:
    """P(X > Y) + P(X = Y) / 2 over every pair of one value of `x` and one of `y` (rliable's probability of
    improvement of X over Y; the Mann-Whitney U statistic of x divided by len(x)·len(y))."""
    from scipy import stats

    if not len(x) or not len(y):
        return float("nan")
    return float(stats.mannwhitneyu(x, y).statistic) / (len(x) * len(y))
