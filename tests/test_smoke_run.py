"""The README's first run, as written (`cipr-train experiment=smoke`, the embedded SmolLM2-135M), learns
something a newcomer can see: no sampled row over the completion limit, a warm start that raises the held-out
probes' format score from its start, and reward variance in the GRPO step (a step whose samples all score the
same has no gradient). About 2 minutes on 2 cores (integration tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_the_smoke_run_visibly_learns(tmp_path):
    run_dir = tmp_path / "smoke"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, "-m", "cipr.cli.train", "experiment=smoke",
                             f"trainer.run_dir={run_dir}", "logging.progress_bar=false"],
                            capture_output=True, text=True, env=env, timeout=900,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "exceed rollout.max_completion_length" not in output
    assert "held-out probes" in output and "cipr-train: done" in output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    probes = {(r["stage"], r["tag"]): r for r in rows if r.get("kind") == "eval"}
    before, after = probes[("warm_start", "before")], probes[("warm_start", "after")]
    # measured (2 cores, AVX-512): format 0 -> 0.5, no-call rate 1 -> 0, reward -3.0 -> -0.94
    assert after["eval/format"] > before["eval/format"], (before, after)
    assert after["eval/no_call_rate"] < before["eval/no_call_rate"], (before, after)
    assert after["eval/reward"] > before["eval/reward"] + 1.0, (before, after)
    steps = [r for r in rows if r.get("stage") == "grpo" and r.get("kind") == "step"]
    assert steps and all(r["frac_reward_zero_std"] < 1.0 for r in steps), steps
