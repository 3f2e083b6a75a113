"""The drift study's metrics, as pure functions over per-item outcomes.

Per item (`ItemOutcome`): correct without drift (`clean`), under drift before (`drift`) and after
the guard (`guard`), the guard's status, whether it called the model, its tokens, the drifted call's
tokens, and the latency it added. From those:

- accuracy before / after: mean of `drift` / `guard`.
- drift failures: items correct without drift and wrong under it; recovered: those the guard fixed.
- harms: items correct before the guard and wrong after it (a mistaken repair).
- unresolved: items whose guard status is `unresolved`.
- repair trigger rate: share of items where the guard called the model.
- token overhead: guard tokens over drifted-call tokens, both summed over all items; which tokens
  count (prompt + completion in the harness) is the caller's, as long as both sides count alike.
- added latency: p50 and p95 over all items (linear interpolation; p50 is usually near zero, since
  untriggered items add almost nothing), and the mean, the study's statistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ItemOutcome:
    """One evaluated item. `clean` is None when the undrifted run was not made."""

    id: str
    drift: bool
    guard: bool
    status: str
    triggered: bool
    guard_tokens: int = 0
    drift_tokens: int = 0
    added_latency_s: float = 0.0
    clean: bool | None = None


def accuracy(correct: Sequence[bool]) -> float:
    """Share of correct items (0.0 for no items)."""
    return sum(map(bool, correct)) / len(correct) if correct else 0.0


def _check(*columns: Sequence[Any]) -> None:
    if len({len(c) for c in columns}) > 1:
        raise ValueError(f"per-item columns differ in length: {[len(c) for c in columns]}")


def drift_failures(clean: Sequence[bool], drift: Sequence[bool]) -> int:
    """Items correct without drift and wrong under it."""
    _check(clean, drift)
    return sum(1 for c, d in zip(clean, drift, strict=True) if c and not d)


def recovered(clean: Sequence[bool], drift: Sequence[bool], guard: Sequence[bool]) -> int:
    """Drift failures the guard turned correct."""
    _check(clean, drift, guard)
    return sum(1 for c, d, g in zip(clean, drift, guard, strict=True) if c and not d and g)


def harms(drift: Sequence[bool], guard: Sequence[bool]) -> int:
    """Items correct before the guard and wrong after it."""
    _check(drift, guard)
    return sum(1 for d, g in zip(drift, guard, strict=True) if d and not g)


def unresolved(statuses: Sequence[str]) -> int:
    return sum(1 for s in statuses if s == "unresolved")


def trigger_rate(triggered: Sequence[bool]) -> float:
    return accuracy(triggered)


def token_overhead(guard_tokens: Sequence[int], drift_tokens: Sequence[int]) -> float:
    """Guard tokens relative to drifted-call tokens (a ratio: 0.326 is 32.6%)."""
    _check(guard_tokens, drift_tokens)
    base = sum(drift_tokens)
    if base <= 0:
        raise ValueError("token overhead needs a positive number of drifted-call tokens")
    return sum(guard_tokens) / base


def latency_stats(latencies: Sequence[float]) -> dict[str, float]:
    """p50, p95 and mean of the added latency, in seconds (zeros for no items)."""
    if not latencies:
        return {"p50": 0.0, "p95": 0.0, "mean": 0.0}
    arr = np.asarray(latencies, dtype=float)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
            "mean": float(arr.mean())}


def summarize(items: Sequence[ItemOutcome]) -> dict[str, Any]:
    """Every metric of one run (drift-failure figures only when every item has a `clean` result)."""
    drift = [i.drift for i in items]
    guard = [i.guard for i in items]
    out: dict[str, Any] = {
        "n": len(items),
        "accuracy_before": accuracy(drift),
        "accuracy_after": accuracy(guard),
        "harms": harms(drift, guard),
        "unresolved": unresolved([i.status for i in items]),
        "repair_trigger_rate": trigger_rate([i.triggered for i in items]),
        "repair_triggered": sum(i.triggered for i in items),
        "guard_tokens": sum(i.guard_tokens for i in items),
        "drift_tokens": sum(i.drift_tokens for i in items),
    }
    out["token_overhead"] = (token_overhead([i.guard_tokens for i in items], [i.drift_tokens for i in items])
                             if out["drift_tokens"] > 0 else None)
    lat = latency_stats([i.added_latency_s for i in items])
    out.update({"added_latency_p50_s": lat["p50"], "added_latency_p95_s": lat["p95"],
                "added_latency_mean_s": lat["mean"]})
    if items and all(i.clean is not None for i in items):
        clean = [bool(i.clean) for i in items]
        out.update({"accuracy_clean": accuracy(clean), "drift_failures": drift_failures(clean, drift),
                    "drift_failures_recovered": recovered(clean, drift, guard)})
    return out
