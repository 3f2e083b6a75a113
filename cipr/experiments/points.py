"""A point of an experiment: one arm trained and evaluated with one seed.

`label` (`<arm>_s<seed>`) names the point's run folder, log and records in every experiment runner
(`cipr.experiments.evidence`, `cipr.experiments.transfer`); the arm's definition (its overrides) stays in
the experiment's config, found by name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """Arm `arm` (its name) with seed `seed`."""

    arm: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.arm}_s{self.seed}"
