"""CI's time budget for `extended` tests (tests/support/budget.py), by hand-computed values."""

from __future__ import annotations

from support.budget import budget_verdict


def test_a_test_runs_when_the_slowest_machine_would_finish_it():
    # 1.6 x 100 = 160 <= 161
    assert budget_verdict(left=161.0, seconds=100.0, after=None, left_out=set()) is None
    reason = budget_verdict(left=159.0, seconds=100.0, after=None, left_out=set())
    assert reason is not None and "159 s left" in reason and "took 100 s" in reason and "1.6x" in reason


def test_a_test_whose_fixture_was_left_out_is_left_out_too():
    reason = budget_verdict(left=10_000.0, seconds=1.0, after="the server", left_out={"the server"})
    assert reason is not None and "needs the server" in reason
    assert budget_verdict(left=10_000.0, seconds=1.0, after="the server", left_out={"another"}) is None


def test_the_factor_is_a_parameter():
    assert budget_verdict(left=100.0, seconds=100.0, after=None, left_out=set(), slowest=1.0) is None
    assert budget_verdict(left=99.0, seconds=100.0, after=None, left_out=set(), slowest=1.0) is not None
