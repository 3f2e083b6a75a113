"""The package runs from a wheel, installed anywhere: configs travel inside it as `cipr.configs`.

`pip wheel .` builds the wheel, a fresh virtual environment gets it with no editable install (its other
dependencies are those already installed in this one, reached through a `.pth` file), and every command
runs from an empty temporary directory: `--help` of each console script, a user's own config folder
through Hydra's search path (`--config-dir`), and one tiny CIPR training step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from support.tiny_models import save_tiny

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The `bin/` of a fresh venv holding the wheel of this checkout (built here) and no other cipr."""
    base = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w",
                    str(base / "dist")], check=True, timeout=600)
    (wheel,) = (base / "dist").glob("cipr-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # this venv's packages, not its cipr
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300)
    return venv / "bin"


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_the_configs_and_no_editable_path(installed, tmp_path):
    out = run([str(installed / "python"), "-c", "import cipr, cipr.core.config as c; print(cipr.__file__); "
               "print(c.CONFIG_ROOT); print(sorted(p.name for p in c.TRAIN_CONFIG_DIR.iterdir()))"], tmp_path)
    assert out.returncode == 0, out.stderr
    module, root, groups = out.stdout.splitlines()
    venv = str(installed.parent)
    assert module.startswith(venv) and root.startswith(venv) and "'algo'" in groups and \
        "'train.yaml'" in groups


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_command_answers_help_from_anywhere(installed, tmp_path, script):
    out = run([str(installed / script), "--help"], tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # options with their defaults, and the name
    assert "=" in out.stdout and script in out.stdout + out.stderr
    assert not list(tmp_path.iterdir()), "--help wrote into the working directory"


def test_one_training_step_from_the_wheel_with_a_users_config_folder(installed, tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    mine = tmp_path / "my_configs" / "experiment"
    mine.mkdir(parents=True)
    (mine / "wheel_smoke.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: tiny\n  - override /algo: cipr\n"
        "  - override /trainer: smoke\n\ntrainer:\n  max_steps: 1\n  warm_start:\n    steps: 0\n")
    work = tmp_path / "work"
    work.mkdir()
    out = run([str(installed / "cipr-train"), "--config-dir", str(tmp_path / "my_configs"),
               "experiment=wheel_smoke", f"model.name_or_path={tiny}", "data.n=12", "data.eval_examples=2",
               "rollout.num_generations=2", "rollout.max_completion_length=8",
               "trainer.per_device_train_batch_size=4", "++trainer.torch_threads=1",
               "logging.progress_bar=false", "trainer.run_dir=run"], work)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("stage") == "grpo" and r.get("kind") == "step" and "consistency/rescore/kl" in r
               for r in steps)
    assert (work / "run" / "summary.json").is_file() and not (tmp_path / "outputs").exists()
