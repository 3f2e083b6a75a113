"""The objective's numbers stay those recorded (issue 56, item 7): `scripts/objective_fingerprint.py --check`
against tests/data/objective_fingerprint.json, every algorithm x regime for two steps on the tiny model.

The record was taken on one machine; here the numbers must agree within a tolerance (another CPU's kernels
round differently, so weight digests are reported, not required). A change to the objective that should
not move the numbers fails here; one that should, re-records the file in the same commit and says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


@pytest.mark.extended(seconds=240, name="the objective fingerprint")
def test_every_algorithm_and_regime_trains_to_the_recorded_numbers():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "objective_fingerprint.py"), "--check",
                             str(ROOT / "tests" / "data" / "objective_fingerprint.json"), "--rtol", "1e-3",
                             "--atol", "1e-6"], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    lines = [x for x in result.stdout.splitlines() if "largest relative difference" in x]
    assert len(lines) == 13, result.stdout[-4000:]
