"""The training schedule (`trainer=`): run folder, resume, steps, batches, optimizer, precision, saves.

Batch sizes follow TRL: `per_device_train_batch_size` counts *completions* in a GRPO micro-batch
(prompts x G) and examples in SFT. In a paired algorithm a micro-batch must hold whole units of
2G completions (a canonical prompt's group and its perturbed copy's group), which
`validate_schedule` checks. Prompts per optimizer step = per_device_train_batch_size x
gradient_accumulation_steps x processes / G.

The GRPO defaults follow ToolRL's recipe where the paper keeps it (its Table 3 did not survive
extraction): AdamW, learning rate 1e-6, no reference-model KL (`beta: 0`), clip ε 0.2, one update
per generation (`num_iterations: 1`), per-sequence token mean (`loss_type: grpo`, the GRPO objective
as ToolRL writes it), group-normalized advantages. The CPU config raises the learning rate so a few
steps move a 135M model; its header says so.

`precision: auto` trains in float32 on CPU (TRL's GRPOConfig would default to bf16) and in bf16
mixed precision on a CUDA device that supports it. Gradient checkpointing is off unless asked for
(TRL turns it on by default); when on it is non-reentrant, which also works when the bottom layers
are frozen (their outputs need no gradient, and a reentrant checkpoint would then cut the graph).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from cipr.train.config import ConfigError


@dataclass
class WarmStartConfig:
    """The SFT warm start that precedes a GRPO algorithm (`steps: 0` skips it)."""

    steps: int = 0
    learning_rate: float = 1e-5
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    max_length: int | None = 2048
    eval_examples: int = 0


@dataclass
class TrainerConfig:
    """Optimization and bookkeeping of the main stage (GRPO, or SFT for algo=sft)."""

    run_dir: str = "runs/default"
    resume: str = "auto"
    seed: int = 0
    max_steps: int = 10
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    gradient_checkpointing: bool = False
    save_steps: int = 5
    save_total_limit: int | None = 2
    num_iterations: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    mask_truncated_completions: bool = False
    torch_threads: int | None = None
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class DistributedConfig:
    """Sharding of several processes (`distributed=`): none/DDP, or a DeepSpeed config given inline."""

    deepspeed: dict[str, Any] | None = None
    ddp_find_unused_parameters: bool | None = None


@dataclass
class LauncherConfig:
    """`num_processes > 1`: `cipr-train` re-launches itself under `accelerate launch` (one node)."""

    num_processes: int = 1
    main_process_port: int = 29500
    accelerate_config: str | None = None


def precision_flags(precision: str) -> dict[str, bool]:
    """`bf16`/`fp16` TrainingArguments flags for a precision name (`auto`: see module docstring)."""
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    if precision in ("bf16", "fp16") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.precision={precision} needs a CUDA device; use trainer.precision=fp32 on CPU")
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def common_args(cfg: TrainerConfig, dist: DistributedConfig, *, output_dir: str, max_steps: int,
                learning_rate: float, batch: int, accumulation: int, scheduler: str, warmup: int,
                progress_bar: bool) -> dict[str, Any]:
    """TrainingArguments fields shared by the SFT and GRPO stages."""
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "learning_rate": learning_rate,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
        "lr_scheduler_type": scheduler,
        "warmup_steps": warmup,
        "weight_decay": cfg.weight_decay,
        "adam_beta1": cfg.adam_beta1,
        "adam_beta2": cfg.adam_beta2,
        "max_grad_norm": cfg.max_grad_norm,
        "optim": cfg.optim,
        "gradient_checkpointing": cfg.gradient_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False} if cfg.gradient_checkpointing else None,
        "seed": cfg.seed,
        "data_seed": cfg.seed,
        "logging_steps": 1,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": cfg.save_steps,
        "save_total_limit": cfg.save_total_limit,
        "report_to": "none",
        "disable_tqdm": not progress_bar,
        "include_num_input_tokens_seen": "all",
        "dataloader_num_workers": 0,
        "use_cpu": not torch.cuda.is_available(),
        # DDP would broadcast buffers at every forward, a collective: ranks whose CIPR steps run a different
        # number of forwards (folded or not, rescoring or not) would then wait on each other forever. The
        # models keep no running statistics (their buffers, e.g. rotary frequencies, are constants).
        "ddp_broadcast_buffers": False,
        **precision_flags(cfg.precision),
    }
    if dist.deepspeed is not None:
        args["deepspeed"] = dist.deepspeed
    if dist.ddp_find_unused_parameters is not None:
        args["ddp_find_unused_parameters"] = dist.ddp_find_unused_parameters
    return args


def validate_schedule(cfg: TrainerConfig, unit_completions: int) -> None:
    """Checks that need no model or data (`unit_completions`: 2G for paired algorithms, else G)."""
    if cfg.max_steps < 1:
        raise ConfigError("trainer.max_steps must be >= 1")
    if cfg.save_steps < 1:
        raise ConfigError("trainer.save_steps must be >= 1")
    if cfg.per_device_train_batch_size % unit_completions:
        raise ConfigError(
            f"trainer.per_device_train_batch_size={cfg.per_device_train_batch_size} must be a multiple of "
            f"{unit_completions} (the completions of one sampling unit: G per prompt, x2 when each prompt is "
            f"paired with its perturbed copy), so a micro-batch never splits a group or a pair")
    if cfg.save_total_limit is not None and cfg.save_total_limit < 2:
        raise ConfigError("trainer.save_total_limit must be >= 2 (or null): the tracked checkpoint has to survive "
                          "while the next one is written and rotated")
    if cfg.warm_start.steps < 0:
        raise ConfigError("trainer.warm_start.steps must be >= 0")
