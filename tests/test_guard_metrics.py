"""Guard metrics on a fixture whose counts are worked out by hand."""

from __future__ import annotations

import pytest

from cipr.guard.metrics import (
    ItemOutcome,
    accuracy,
    drift_failures,
    harms,
    latency_stats,
    recovered,
    summarize,
    token_overhead,
)

# id, clean, drift, guard, status, triggered, guard_tokens, drift_tokens, latency
ROWS = [
    ("a", True, True, True, "valid", False, 0, 100, 0.0),          # fine throughout
    ("b", True, False, True, "repaired", True, 50, 100, 1.0),      # drift failure, recovered
    ("c", True, False, True, "repaired", True, 70, 100, 2.0),      # drift failure, recovered
    ("d", True, False, False, "unresolved", True, 40, 100, 3.0),   # drift failure, unresolved
    ("e", True, True, False, "repaired", True, 30, 100, 4.0),      # harm: a valid-looking mistaken repair
    ("f", False, False, True, "repaired", True, 10, 100, 0.0),     # wrong even without drift, fixed
    ("g", False, False, False, "valid", False, 0, 100, 0.0),       # validator-invisible wrong call
    ("h", True, True, True, "valid", False, 0, 100, 0.0),
    ("i", False, False, False, "unresolved", True, 0, 100, 0.0),
    ("j", True, False, False, "valid", False, 0, 100, 0.0),        # drift failure the validator cannot see
]
ITEMS = [ItemOutcome(r[0], clean=r[1], drift=r[2], guard=r[3], status=r[4], triggered=r[5], guard_tokens=r[6],
                     drift_tokens=r[7], added_latency_s=r[8]) for r in ROWS]


def test_summary_matches_hand_counts():
    s = summarize(ITEMS)
    assert s["n"] == 10
    assert s["accuracy_clean"] == pytest.approx(0.7)      # a b c d e h j
    assert s["accuracy_before"] == pytest.approx(0.3)     # a e h
    assert s["accuracy_after"] == pytest.approx(0.5)      # a b c f h
    assert s["drift_failures"] == 4                       # b c d j
    assert s["drift_failures_recovered"] == 2             # b c
    assert s["harms"] == 1                                # e
    assert s["unresolved"] == 2                           # d i
    assert s["repair_triggered"] == 6 and s["repair_trigger_rate"] == pytest.approx(0.6)
    assert s["guard_tokens"] == 200 and s["drift_tokens"] == 1000 and \
        s["token_overhead"] == pytest.approx(0.2)
    # latencies sorted: 0 x6, 1, 2, 3, 4 -> p50 = 0; p95 at rank 8.55 = 3 + 0.55 * (4 - 3)
    assert s["added_latency_p50_s"] == 0.0 and s["added_latency_p95_s"] == pytest.approx(3.55)
    assert s["added_latency_mean_s"] == pytest.approx(1.0)


def test_pieces_and_edge_cases():
    assert accuracy([]) == 0.0 and latency_stats([]) == {"p50": 0.0, "p95": 0.0, "mean": 0.0}
    assert drift_failures([True, True], [False, True]) == 1
    assert recovered([True, False], [False, False], [True, True]) == 1  # only the clean-correct one counts
    assert harms([True, True, False], [False, True, False]) == 1
    assert latency_stats([1.0, 3.0])["p50"] == 2.0
    with pytest.raises(ValueError, match="differ in length"):
        harms([True], [True, False])
    with pytest.raises(ValueError, match="positive"):
        token_overhead([5], [0])


def test_without_clean_runs_drift_failure_figures_are_absent():
    s = summarize([ItemOutcome("x", drift=False, guard=True, status="repaired", triggered=True)])
    assert "drift_failures" not in s and s["token_overhead"] is None and s["accuracy_after"] == 1.0
