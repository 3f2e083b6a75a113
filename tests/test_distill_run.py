"""`algo=distill` end to end on train's engine with the tiny model: run folder, metrics, checkpoints,
evaluation table, resume, errors."""

import json

import pytest
from support.tiny_models import save_tiny

from cipr.core.config import ConfigError
from cipr.train.run import config_from_dict, run

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _cfg(model_dir, run_dir, **algo):
    return {"model": {"name_or_path": str(model_dir), "gguf_package": None, "gguf_file": None,
                      "call_format": "hermes"},
            "data": {"n": 6, "eval_examples": 2, "max_observation_chars": 60, "max_turns": 2},
            "algo": {"name": "distill", "eval": {"namings": ["canonical", "synonyms", "swapped"]}, **algo},
            "trainer": {"run_dir": str(run_dir), "max_steps": 2, "per_device_train_batch_size": 2,
                        "learning_rate": 1e-3, "save_steps": 1, "save_total_limit": 2},
            "logging": {"progress_bar": False},
            "rollout": {"backend": "hf", "num_generations": 4}}  # rollout=hf's values: not set, so accepted


def run_distill(cfg):
    return run(config_from_dict(cfg))


def test_run_trains_checkpoints_evaluates_and_resumes(tiny_dir, tmp_path):
    out = run_distill(_cfg(tiny_dir, tmp_path / "run"))
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step_lines = [r for r in steps if r.get("kind") == "step"]
    assert [r["step"] for r in step_lines] == [1, 2]
    assert all(r["stage"] == "distill" and r["loss"] >= 0 and "consistency/rescore/kl" in r
               and "distill/token_kl" in r for r in step_lines)
    assert json.loads((out / "distill" / "latest.json").read_text())["step"] == 2
    assert (out / "distill" / "final").is_dir() and (out / "distill" / "stage.json").is_file()
    table = (out / "eval" / "table.md").read_text()
    assert "| teacher |" in table and "| student |" in table and "synonyms agree" in table
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert set(report["offline"]) == {"teacher", "student"}
    assert set(report["offline"]["student"]) == {"canonical", "synonyms", "swapped"}
    assert report["offline"]["teacher"]["canonical"]["decisions"] == 4.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_trajectories"] == 4 and summary["held_out_trajectories"] == 2
    assert summary["stages"]["distill"]["steps"] == 2 and summary["final"]["distill"]["step"] == 2
    assert summary["eval"]["offline"]["student"]["canonical"]["decisions"] == 4.0
    before = (out / "metrics.jsonl").read_text()
    run_distill(_cfg(tiny_dir, tmp_path / "run"))  # complete: nothing to redo
    assert (out / "metrics.jsonl").read_text() == before


def test_a_changed_config_is_refused_for_an_existing_run(tiny_dir, tmp_path):
    run_distill(_cfg(tiny_dir, tmp_path / "run"))
    with pytest.raises(ConfigError, match="different config"):
        run_distill(_cfg(tiny_dir, tmp_path / "run", terms={"rescore": {"weight": 0.5}}))


def test_config_errors_name_the_key(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="algo.rescore_wieght"):
        config_from_dict(_cfg(tiny_dir, tmp_path, rescore_wieght=1.0))
    with pytest.raises(ConfigError, match="both 0"):
        run_distill(_cfg(tiny_dir, tmp_path, token_weight=0.0, action_weight=0.0))
    with pytest.raises(ConfigError, match="rollout.num_generations=2: algo=distill samples no rollouts"):
        config_from_dict({**_cfg(tiny_dir, tmp_path), "rollout": {"num_generations": 2}})
    bad = _cfg(tiny_dir, tmp_path)
    bad["data"]["path"] = str(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="cipr-data trajectories"):
        run_distill(bad)


def test_cipr_train_dispatches_algo_distill(tiny_dir, tmp_path):
    from hydra import compose, initialize_config_dir

    from cipr.cli.train import CONFIG_DIR, _main

    overrides = ["algo=distill", "data=trajectories", "model=tiny", f"model.name_or_path={tiny_dir}",
                 "trainer=smoke", f"trainer.run_dir={tmp_path / 'cli'}",
                 "trainer.per_device_train_batch_size=2",
                 "data.n=5", "data.eval_examples=1", "data.max_observation_chars=60", "data.max_turns=1",
                 "logging.progress_bar=false", "algo.eval.namings=[canonical,synonyms]"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    assert _main(cfg) == 0
    assert (tmp_path / "cli" / "eval" / "table.md").is_file()
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["algo"] == "distill"
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*overrides, "algo.terms.rescore.weight=-1"])
    assert _main(cfg) == 2
