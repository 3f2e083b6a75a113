"""A point of an experiment: one arm trained and evaluated with one seed.

`label` (`<arm>_s<seed>`) names the point's run folder, log and records in every experiment runner
(`cipr.experiments.evidence`, `cipr.experiments.transfer`); the arm's definition (its overrides) stays in
the experiment's config, found by name.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from cipr.core.io import read_json


@dataclass(frozen=True)
class Point:
    """Arm `arm` (its name) with seed `seed`."""

    arm: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.arm}_s{self.seed}"


def point_done(out: Path, point: Point, reads: int) -> bool:
    """Whether `out/records/<label>.json` (written last for a point) records `reads` reads."""
    path = out / "records" / f"{point.label}.json"
    return path.is_file() and read_json(path).get("reads") == reads


def drop_weights(run_dir: Path) -> None:
    """Delete a point's checkpoints and final weights, keeping its config, metrics and summary."""
    for stage in run_dir.iterdir() if run_dir.is_dir() else ():
        if stage.is_dir():
            for folder in [*stage.glob("checkpoint-*"), stage / "final"]:
                shutil.rmtree(folder, ignore_errors=True)
