"""The README's main job (`cipr-train` with its defaults), shrunk to a handful of steps on the tiny model.

Runs the real entry point (`python -m cipr.cli.train`, Hydra and all) with real HF-generate
rollouts: warm start and CIPR GRPO steps, held-out probes before and after each, then a rerun that
finds every stage complete. Only sizes and the model are overridden (its bottom layer frozen, as the
main job freezes SmolLM2's bottom 20: the weights folders then hold the trainable tensors only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # subprocesses / end-to-end runs: the integration tier

SHRINK = ["model=tiny", "++model.freeze_bottom_layers=1", "data.n=10", "data.eval_examples=2",
          "data.tools_per_example=[1,1]", "rollout.num_generations=2", "rollout.max_completion_length=16",
          "trainer.max_steps=2", "trainer.per_device_train_batch_size=4", "trainer.save_steps=1",
          "trainer.warm_start.steps=2", "trainer.warm_start.per_device_train_batch_size=2",
          "trainer.warm_start.eval_examples=2", "logging.progress_bar=false"]


def cli(*overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "cipr.cli.train", *overrides], capture_output=True,
                          text=True, env=env, timeout=600, cwd=Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    from support.tiny_models import save_tiny

    root = tmp_path_factory.mktemp("main_job")
    tiny = save_tiny(root / "tiny")
    run_dir = root / "run"
    overrides = [*SHRINK, f"model.name_or_path={tiny}", f"trainer.run_dir={run_dir}"]
    result = cli(*overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, overrides, result


def test_main_job_writes_a_complete_run_folder(main_job):
    run_dir, _, result = main_job
    assert "cipr-train: done" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "summary.json", ".hydra/config.yaml"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "grpo" / "latest.json").read_text()) == \
        {"step": 2, "checkpoint": "checkpoint-2"}
    assert sorted(p.name for p in (run_dir / "grpo").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    for name in ("model.safetensors", "optimizer.pt", "cipr_state.pt"):
        assert (run_dir / "grpo" / "checkpoint-2" / name).is_file(), name
    # the finished warm start keeps only its final weights (the GRPO stage loaded them; it is never resumed)
    assert (run_dir / "warm_start" / "stage.json").is_file()
    assert not (run_dir / "warm_start" / "latest.json").exists()
    assert not list((run_dir / "warm_start").glob("checkpoint-*"))
    from safetensors.torch import load_file

    for folder in (run_dir / "warm_start" / "final", run_dir / "grpo" / "final",
                   run_dir / "grpo" / "checkpoint-2"):
        saved = set(load_file(folder / "model.safetensors"))  # the frozen layer is left to the base model
        assert saved and all(k.startswith("model.layers.1.") or k == "model.norm.weight" for k in saved), \
            folder
        assert (folder / "cipr_frozen.json").is_file(), folder
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {(r["stage"], r["tag"]): r for r in records if r.get("kind") == "eval"}
    assert set(evals) == {(s, t) for s in ("warm_start", "grpo") for t in ("before", "after")}
    assert {r["examples"] for r in evals.values()} == {2}
    # same weights
    assert evals["grpo", "before"]["eval/reward"] == evals["warm_start", "after"]["eval/reward"]
    for key in ("eval/format", "eval/reward", "eval/no_call_rate"):
        assert all(key in r for r in evals.values()), key
    assert "held-out probes" in result.stdout + result.stderr
    grpo = [r for r in records if r.get("stage") == "grpo" and r.get("kind") == "step"]
    assert [r["step"] for r in grpo] == [1, 2]
    for key in ("reward", "reward/format", "reward/correctness", "rollout/no_call_rate",
                "rollout/decisions_per_response", "speed/tokens_per_second", "memory/peak_gb"):
        assert all(key in r for r in grpo), key
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "cipr" and set(summary["stages"]) == {"warm_start", "grpo"}
    assert set(summary["eval"]) == {"warm_start/before", "warm_start/after", "grpo/before", "grpo/after"}
    assert 0 < summary["peak_memory_gb"] < 8


def in_process(*overrides: str) -> int:
    """The CLI's body on a composed config (no new interpreter: the first test covers the real entry)."""
    from hydra import compose, initialize_config_dir

    from cipr.cli.train import CONFIG_DIR, _main

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return _main(compose("train", overrides=list(overrides)))


def test_rerun_finds_the_run_complete(main_job):
    run_dir, overrides, _ = main_job
    before = (run_dir / "metrics.jsonl").read_text()
    assert in_process(*overrides) == 0
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_a_changed_config_is_not_mixed_into_the_run(main_job, capsys):
    run_dir, overrides, _ = main_job
    assert in_process(*overrides, "algo.terms.rescore.weight=0.7") == 2
    assert "different config (algo.terms)" in capsys.readouterr().err
