"""CI's time budget for `extended` tests: which of them still fit before CIPR_TEST_DEADLINE.

`extended(seconds=S, name=N, after=A)` marks a long end-to-end test: S is its measured wall time (with the
module fixtures it is the first to build), N names what later tests build on (a training run, a server) and
A names what this test builds on. A test runs when SLOWEST x S seconds are left; a test whose `after` was left
out is left out too, since running it would build that fixture anyway."""

from __future__ import annotations

SLOWEST = 1.6
"""The slowest 2-core machine seen ran tests up to 1.6x as long as the one where the `extended` seconds were
measured (28.8 against 17.6 s and 16.1 against 9.7 s for two default-tier tests)."""


def budget_verdict(left: float, seconds: float, after: str | None, left_out: set[str],
                   slowest: float = SLOWEST) -> str | None:
    """None when the test fits, else the one-line reason it is skipped. `left`: seconds before the deadline;
    `left_out`: the names earlier verdicts skipped."""
    if after is not None and after in left_out:
        return (f"time budget: it needs {after}, which the time budget left out (run it without "
                "CIPR_TEST_DEADLINE)")
    if left < slowest * seconds:
        return (f"time budget: {left:.0f} s left before CIPR_TEST_DEADLINE; this test took {seconds:.0f} s "
                f"on a 2-core AMD EPYC (AVX2) and may take {slowest:g}x that on a slower one. Run it without "
                "the deadline")
    return None
