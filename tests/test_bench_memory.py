"""scripts/bench_memory.py: the overrides of each regime's benchmarked step, the step recorder, the table, and
one regime end to end on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "scripts" / "bench_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_regime_runs_its_example_for_one_step(bench, tmp_path):
    sup = bench.regime_overrides("supervised", tmp_path / "s", batch=2, extra=("trainer.seed=3",))
    assert sup[:2] == ["experiment=smoke", "algo=cipr_sft"] and sup[-1] == "trainer.seed=3"
    assert {"trainer.max_steps=1", "trainer.warm_start.steps=0", "trainer.warm_start.eval_examples=0",
            "trainer.per_device_train_batch_size=2", f"trainer.run_dir={tmp_path / 's'}"} <= set(sup)
    grpo = bench.regime_overrides("grpo", tmp_path / "g", warm_start=True)
    assert grpo[0] == "experiment=smoke" and "trainer.warm_start.steps=0" not in grpo
    assert not any(o.startswith("trainer.per_device_train_batch_size") for o in grpo)
    distill = bench.regime_overrides("distill", tmp_path / "d")
    assert distill[0] == "experiment=smollm2_distill_toyshop" and "data.eval_examples=0" in distill
    assert not any(o.startswith("trainer.warm_start") for o in distill)  # distillation has none
    assert bench.regime_overrides("multi_turn", tmp_path / "m")[0] == "experiment=smollm2_toyshop_cipr"
    for regime in bench.REGIMES:  # every example config exists
        experiment = bench.REGIMES[regime][0].removeprefix("experiment=")
        assert (ROOT / "configs" / "train" / "experiment" / f"{experiment}.yaml").is_file()
    with pytest.raises(ValueError, match="unknown regime"):
        bench.regime_overrides("ppo", tmp_path)


def test_the_recorder_keeps_each_stages_first_step(bench, monkeypatch):
    sizes = iter([1.0, 1.5, 2.0, 3.0])  # begin and end of stage a's first step, then of b's
    monkeypatch.setattr(bench, "rss_gb", lambda: next(sizes))
    memory = bench.StepMemory(interval=None)
    a = SimpleNamespace(output_dir="a", per_device_train_batch_size=4, gradient_accumulation_steps=1)
    b = SimpleNamespace(output_dir="b", per_device_train_batch_size=16, gradient_accumulation_steps=2)
    memory.on_step_begin(a, None, None)
    memory.on_step_end(a, None, None)
    memory.on_step_begin(b, None, None)
    memory.on_step_end(b, None, None)
    memory.on_step_begin(b, None, None)  # a second step of the same stage is not recorded
    memory.on_step_end(b, None, None)
    first, second = memory.stages
    assert first["rss_before_step_gb"] == 1.0 and first["step_peak_rss_gb"] == 1.5
    assert second["rss_before_step_gb"] == 2.0 and second["per_device_train_batch_size"] == 16
    assert second["step_growth_gb"] == second["step_peak_rss_gb"] - 2.0 and second["step_seconds"] >= 0
    line = bench.table([{"regime": "supervised", "main": second, "process_peak_rss_gb": 4.0},
                        {"regime": "grpo", "error": "exit 1: boom"}])
    assert "supervised" in line and "16" in line and "grpo" in line and "failed: exit 1: boom" in line


@pytest.mark.integration
def test_the_supervised_regime_on_the_tiny_model(tmp_path, tiny_dir):
    out = tmp_path / "mem.json"
    model = [f"model.name_or_path={tiny_dir}", "model.gguf_package=null", "model.gguf_file=null",
             "model.freeze_bottom_layers=0", "model.short_name=tiny"]
    script = str(ROOT / "scripts" / "bench_memory.py")
    proc = subprocess.run([sys.executable, script, "--regimes", "supervised", "--batch", "2",
                           "--work", str(tmp_path / "work"), "--out", str(out),
                           *[f"--set={o}" for o in model]], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    (record,) = json.loads(out.read_text())
    main = record["main"]
    assert main["per_device_train_batch_size"] == 4  # 2 examples and their copies
    assert 0 < main["rss_before_step_gb"] <= main["step_peak_rss_gb"] <= record["process_peak_rss_gb"] + 0.05
    assert "supervised" in proc.stdout.splitlines()[-1]
