"""`distributed=`: what a run asks for, what accelerate built, and the one-line refusal of a silent
downgrade."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cipr.core.config import ConfigError
from cipr.train.strategy import (
    DistributedConfig,
    asked_strategy,
    strategy_mismatch,
    trainer_arguments,
    validate_distributed,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "train" / "distributed"


@pytest.mark.parametrize(("strategy", "env", "expected"), [
    ("none", {}, ("none", 1)),
    ("none", {"WORLD_SIZE": "2"}, ("ddp", 2)),
    ("ddp", {"WORLD_SIZE": "4"}, ("ddp", 4)),
    ("none", {"WORLD_SIZE": "8", "ACCELERATE_USE_FSDP": "true"}, ("fsdp", 8)),
    ("none", {"WORLD_SIZE": "8", "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
     ("zero3", 8)),
    ("zero2", {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}, ("zero2", 2)),  # distributed= wins
])
def test_asked_strategy_reads_the_config_then_the_launcher(strategy, env, expected):
    assert asked_strategy(strategy, env) == expected


def test_mismatches_name_both_sides():
    assert strategy_mismatch("fsdp", 2, "fsdp", 2) is None
    assert strategy_mismatch("ddp", 2, "ddp", 2) is None
    message = strategy_mismatch("fsdp", 2, "ddp", 2)
    assert "distributed=fsdp" in message and "accelerate built ddp" in message
    message = strategy_mismatch("zero3", 2, "ddp", 2)
    assert "distributed=zero3" in message and "built ddp" in message
    assert "group of 1" in strategy_mismatch("ddp", 2, "none", 1)
    assert "launcher.num_processes" in strategy_mismatch("zero2", 1, "none", 1)
    assert "launcher.num_processes" in strategy_mismatch("ddp", 1, "none", 1)


@pytest.mark.parametrize("name", ["none", "ddp", "fsdp", "zero2", "zero3"])
def test_every_config_of_the_group_is_valid_and_says_what_it_is(name):
    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    cfg = DistributedConfig(**data)
    assert cfg.strategy == name
    validate_distributed(cfg)
    args = trainer_arguments(cfg)
    assert ("deepspeed" in args) == name.startswith("zero")
    assert (args.get("fsdp") == "full_shard") == (name == "fsdp")
    if name == "fsdp":
        assert args["fsdp_config"]["version"] == 2


def test_inconsistent_settings_are_refused():
    with pytest.raises(ConfigError, match="stage=3"):
        validate_distributed(DistributedConfig(strategy="zero3",
                                               deepspeed={"zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="distributed=zero2 or distributed=zero3"):
        validate_distributed(DistributedConfig(strategy="none",
                                               deepspeed={"zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="distributed=fsdp"):
        validate_distributed(DistributedConfig(strategy="fsdp"))


def test_zero3_without_gathered_saves_is_refused():
    cfg = DistributedConfig(strategy="zero3", deepspeed={"zero_optimization": {"stage": 3}})
    with pytest.raises(ConfigError, match="stage3_gather_16bit_weights_on_model_save"):
        validate_distributed(cfg)
