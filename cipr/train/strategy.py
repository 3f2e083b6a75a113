"""How several processes share a run (`distributed=`), and the check that the run is the one asked for.

    distributed=none    one process; under several processes (`launcher.num_processes=N`), plain DDP
    distributed=ddp     data parallel: every process holds the whole model, gradients are all-reduced
    distributed=fsdp    FSDP2 (`torch.distributed.fsdp.fully_shard`), full sharding: parameters,
                        gradients and optimizer state split across the processes
    distributed=zero2   DeepSpeed ZeRO-2: optimizer state and gradients split
                        (`pip install -e '.[distributed]'`)
    distributed=zero3   DeepSpeed ZeRO-3: parameters split too

The strategy reaches the Trainer as TrainingArguments (`trainer_arguments`: `fsdp`/`fsdp_config`, or
`deepspeed`), and accelerate builds the wrapper. accelerate 1.15 silently drops FSDP and DeepSpeed where
it cannot run them (FSDP only for MULTI_GPU-like process types, DeepSpeed not on CPU; neither on one
process), which would leave a run unsharded under a sharded label. So every stage checks, once its
accelerator exists, what it runs against what was asked (`check_strategy`): the strategy (`distributed=`
or an accelerate config: `ACCELERATE_USE_FSDP`, `ACCELERATE_USE_DEEPSPEED`) and the processes
(`WORLD_SIZE`); a mismatch is one ConfigError line naming both. On CPU processes the Trainer does build
ZeRO-2/3 (DeepSpeed falls back to its CPU accelerator over gloo); FSDP stays MULTI_CPU and is refused.
The `distributed` test tier runs FSDP2 on two CPU processes through tests/support/cpu_sharding.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cipr.core.config import ConfigError

log = logging.getLogger("cipr.train")

Strategy = Literal["none", "ddp", "fsdp", "zero2", "zero3"]
SHARDED = ("fsdp", "zero2", "zero3")


@dataclass
class DistributedConfig:
    """`distributed=`: the strategy and what the Trainer needs for it.

    - `strategy`: module docstring.
    - `deepspeed`: the DeepSpeed config (zero2/zero3), handed to TrainingArguments as is.
    - `fsdp`: TrainingArguments' `fsdp_config` (fsdp; `version: 2` is FSDP2).
    - `ddp_find_unused_parameters`: DDP's flag (null: the Trainer's default).
    """

    strategy: Strategy = "none"
    deepspeed: dict[str, Any] | None = None
    fsdp: dict[str, Any] | None = None
    ddp_find_unused_parameters: bool | None = None


def validate_distributed(cfg: DistributedConfig) -> None:
    """The strategy and its settings agree (a config that says zero3 must carry a ZeRO-3 config)."""
    if cfg.strategy in ("zero2", "zero3"):
        stage = ((cfg.deepspeed or {}).get("zero_optimization") or {}).get("stage")
        if stage != int(cfg.strategy[-1]):
            raise ConfigError(
                f"distributed.strategy={cfg.strategy} needs distributed.deepspeed.zero_optimization.stage="
                f"{cfg.strategy[-1]} (got {stage}); use distributed={cfg.strategy}")
        zero = (cfg.deepspeed or {}).get("zero_optimization") or {}
        if stage == 3 and not zero.get("stage3_gather_16bit_weights_on_model_save", False):
            raise ConfigError(
                "distributed.deepspeed.zero_optimization.stage3_gather_16bit_weights_on_model_save must be "
                "true: each stage's final/ (read by the next stage, cipr-export and cipr-eval) needs whole "
                "weights, which ZeRO-3 gathers only with it")
    elif cfg.deepspeed is not None:
        raise ConfigError(f"distributed.deepspeed is set but distributed.strategy={cfg.strategy}: use "
                          f"distributed=zero2 or distributed=zero3")
    if (cfg.strategy == "fsdp") != (cfg.fsdp is not None):
        raise ConfigError(f"distributed.strategy={cfg.strategy} with distributed.fsdp "
                          f"{'unset' if cfg.fsdp is None else 'set'}: use distributed=fsdp for FSDP")


def trainer_arguments(cfg: DistributedConfig) -> dict[str, Any]:
    """TrainingArguments fields of the strategy."""
    args: dict[str, Any] = {}
    if cfg.deepspeed is not None:
        args["deepspeed"] = cfg.deepspeed
    if cfg.fsdp is not None:
        args["fsdp"] = "full_shard"
        args["fsdp_config"] = dict(cfg.fsdp)
    if cfg.ddp_find_unused_parameters is not None:
        args["ddp_find_unused_parameters"] = cfg.ddp_find_unused_parameters
    return args


def asked_strategy(strategy: str, env: Mapping[str, str]) -> tuple[str, int]:
    """(strategy, processes) a run asks for: `distributed=`, else the accelerate config's; `WORLD_SIZE`."""
    world = int(env.get("WORLD_SIZE", "1"))
    if strategy == "none":
        if env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
            strategy = "fsdp"
        elif env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            strategy = f"zero{env.get('ACCELERATE_DEEPSPEED_ZERO_STAGE', '?')}"
        elif world > 1:
            strategy = "ddp"
    return strategy, world


def strategy_mismatch(asked: str, asked_processes: int, ran: str, ran_processes: int) -> str | None:
    """Why the run that was built is not the one asked for (None when it is). Strategies as in `Strategy`."""
    if ran_processes != asked_processes:
        return (f"the launcher started {asked_processes} processes (WORLD_SIZE) but this one sees a group of "
                f"{ran_processes}: the processes did not form one group "
                "(check the rendezvous address and port)")
    if asked in SHARDED and asked_processes == 1:
        return (f"distributed={asked} shards over several processes, and this run has one: launch it with "
                f"launcher.num_processes=N (N > 1)")
    if asked == "ddp" and asked_processes == 1:
        return "distributed=ddp with one process: launch it with launcher.num_processes=N (N > 1)"
    if ran != asked:
        return (f"asked for distributed={asked} on {asked_processes} processes, but accelerate built {ran}: "
                f"it drops FSDP and DeepSpeed without a word where it cannot run them (on CPU processes, or "
                f"on one process); run {asked} on GPUs, or use distributed=ddp here")
    return None


def built_strategy(accelerator: Any) -> tuple[str, int]:
    """(strategy, processes) of an accelerate `Accelerator` as built."""
    from accelerate.utils import DistributedType

    state = accelerator.state
    kind = state.distributed_type
    if kind == DistributedType.FSDP:
        plugin = state.fsdp_plugin
        name = "fsdp" if getattr(plugin, "fsdp_version", 1) == 2 else "fsdp1"
    elif kind == DistributedType.DEEPSPEED:
        stage = state.deepspeed_plugin.zero_stage if state.deepspeed_plugin is not None else "?"
        name = f"zero{stage}"
    elif kind == DistributedType.NO:
        name = "none"
    else:
        name = "ddp"  # MULTI_CPU, MULTI_GPU and the other data-parallel process types
    return name, accelerator.num_processes


def check_strategy(accelerator: Any, strategy: str, env: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError when the accelerator does not run `strategy` over the launcher's processes."""
    asked, asked_processes = asked_strategy(strategy, os.environ if env is None else env)
    ran, ran_processes = built_strategy(accelerator)
    if asked == "none" and ran == "none" and ran_processes == asked_processes:
        return
    problem = strategy_mismatch(asked, asked_processes, ran, ran_processes)
    if problem is not None:
        raise ConfigError(problem)
    log.info("distributed=%s: accelerate built %s over %d processes", strategy, ran, ran_processes)


def sharded(strategy: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether this run's weights are split across processes (FSDP2, ZeRO-3): outside the training step a
    model is then whole only after reloading a saved `final/`."""
    asked, processes = asked_strategy(strategy, os.environ if env is None else env)
    return asked in ("fsdp", "zero3") and processes > 1


def reset_accelerator_state() -> None:
    """Forget the previous stage's accelerator before the next Trainer is built (keeping the process group).

    accelerate refuses a second Accelerator with a DeepSpeed plugin in one process, which a warm start
    followed by GRPO under ZeRO builds; transformers' hyperparameter search resets it the same way."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
