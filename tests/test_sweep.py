"""Sweeps: `cipr-train -m +sweep=consistency` with the basic launcher (launcher=local) gives every point its
own run folder, and a rerun resumes each point on its own; launcher=slurm selects Hydra's submitit
launcher with its cluster settings from the environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cipr.cli.train import CONFIG_DIR

pytestmark = pytest.mark.integration  # subprocesses / end-to-end runs: the integration tier


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def test_sweep_config_lists_the_points_and_names_each_run_folder_by_them():
    cfg = _compose("+sweep=consistency", "algo.terms.rescore.weight=0.05", "trainer.seed=2")
    params = cfg.hydra.sweeper.params
    assert [len(str(params[k]).split(",")) for k in ("algo.terms.rescore.weight", "algo.terms.rollout.weight",
                                                     "trainer.seed")] == [4, 2, 3]
    assert cfg.trainer.run_dir == "runs/sweeps/consistency/smollm2-135m/rs0.05_ro0.1_s2"
    assert cfg.algo.name == "cipr"


def test_launcher_slurm_selects_submitit_with_settings_from_the_environment(monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.setenv("CIPR_SLURM_PARTITION", "gpu-long")
    monkeypatch.setenv("CIPR_SLURM_GPUS_PER_NODE", "null")
    cfg = _compose("launcher=slurm", "+sweep=consistency")
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)  # the launcher node interpolates hydra.* values
    try:
        resolved = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    finally:
        HydraConfig.instance().cfg = None
    assert resolved["partition"] == "gpu-long" and resolved["gpus_per_node"] is None and \
        resolved["account"] is None
    assert resolved["max_num_timeout"] > 0 and resolved["signal_delay_s"] > 0
    assert dict(cfg.launcher) == {"num_processes": 1, "main_process_port": 29500, "accelerate_config": None}
    import hydra_plugins.hydra_submitit_launcher  # noqa: F401  (the dependency is installed)


def test_local_sweep_runs_each_point_in_its_own_folder_and_resumes_each_on_its_own(tmp_path):
    from support.tiny_models import save_tiny

    tiny = save_tiny(tmp_path / "tiny")
    cmd = [sys.executable, "-m", "cipr.cli.train", "-m", "+sweep=consistency", "model=tiny",
           f"model.name_or_path={tiny}", "data.n=4", "data.tools_per_example=[1,1]", "data.eval_examples=0",
           "rollout.num_generations=2", "rollout.max_completion_length=16", "trainer=smoke",
           "trainer.resume=auto", "trainer.max_steps=1", "trainer.save_steps=1",
           "trainer.per_device_train_batch_size=4", "trainer.warm_start.steps=0", "++trainer.torch_threads=1",
           "logging.progress_bar=false", "algo.terms.rescore.weight=0.1", "algo.terms.rollout.weight=0.1",
           "trainer.seed=0,1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}

    def sweep() -> str:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stdout + proc.stderr

    sweep()
    root = tmp_path / "runs/sweeps/consistency/tiny"
    points = {s: root / f"rs0.1_ro0.1_s{s}" for s in (0, 1)}
    for seed, run_dir in points.items():
        assert json.loads((run_dir / "config.json").read_text())["trainer"]["seed"] == seed
        assert json.loads((run_dir / "grpo" / "stage.json").read_text())["steps"] == 1
    # point s1 as if killed after its checkpoint was tracked: the rerun resumes it and skips s0
    (points[1] / "grpo" / "stage.json").unlink()
    shutil.rmtree(points[1] / "grpo" / "final")
    untouched = (points[0] / "metrics.jsonl").read_text()
    out = sweep()
    assert f"every stage of {Path('runs/sweeps/consistency/tiny/rs0.1_ro0.1_s0')} is already complete" in out
    assert "resuming grpo from runs/sweeps/consistency/tiny/rs0.1_ro0.1_s1/grpo/checkpoint-1 (step 1)" in out
    assert (points[1] / "grpo" / "stage.json").is_file() and (points[1] / "grpo" / "final").is_dir()
    assert (points[0] / "metrics.jsonl").read_text() == untouched
