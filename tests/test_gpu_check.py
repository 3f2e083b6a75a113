"""scripts/gpu_check.py on CPU, in a process that sees only the packages of the lent GPU machine's image and
the wheels the script lists: every check passes, so the script cannot rot before a GPU is there to run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["action_reader", "grpo_step_hf_rollouts", "grpo_step_consistency", "supervised_step",
          "multi_turn_step", "memory_vs_plan", "supervised_memory_vs_plan", "export_and_eval"]


@pytest.mark.integration
def test_every_gpu_path_passes_on_cpu_with_only_the_gpu_images_packages(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu",
                           "--simulate-gpu-image", "--out", str(out), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["ok"] and report["shape"]["class"] == "Qwen2ForCausalLM"
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == CHECKS and all(c["ok"] and c["seconds"] >= 0 for c in checks.values())
    assert checks["action_reader"]["max_abs_diff"] <= 1e-5 and checks["action_reader"]["decisions"] > 0
    hf = checks["grpo_step_hf_rollouts"]
    assert hf["attention"] in ("sdpa", "eager") and hf["generation_tokens_per_second"] > 0
    assert checks["multi_turn_step"]["turns_per_episode"] >= 2
    assert checks["memory_vs_plan"]["planned_gb"] > 0 and checks["export_and_eval"]["records"] == 4
    assert checks["supervised_memory_vs_plan"]["planned_gb"] > 0
    assert "the run sees only the GPU image's packages" in proc.stdout
