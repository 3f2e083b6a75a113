"""The training schedule (`trainer=`): run folder, resume, steps, batches, optimizer, precision, saves.

Batch sizes follow TRL: `per_device_train_batch_size` counts *completions* in a GRPO micro-batch
(prompts x G) and examples in SFT. In a paired algorithm a micro-batch must hold whole units of
2G completions (a canonical prompt's group and its perturbed copy's group), which
`validate_schedule` checks.

GRPO batch geometry (`grpo_batch`). With `prompts_per_step` set (the GPU recipe), one *step* is one
generation batch as in verl (ToolRL's `data.train_batch_size`): `prompts_per_step` canonical prompts
are sampled G times, and the batch is consumed by `updates_per_generation` optimizer updates (verl's
`train_batch_size / ppo_mini_batch_size`), whatever the number of processes W:

    units per step            = prompts_per_step                  (algo.pairing_budget=prompts)
                              = prompts_per_step / unit_size      (algo.pairing_budget=completions)
    completions per step      = units x unit_size x G
    completions per update    = completions per step / updates_per_generation
    gradient_accumulation     = completions per update / (per_device_train_batch_size x W)
    TRL steps_per_generation  = gradient_accumulation x updates_per_generation

so the accumulation absorbs the number of GPUs (W from `WORLD_SIZE`, else `launcher.num_processes`; a
W that does not divide evenly is refused with the sizes that would). Unpaired: unit_size = 1. Without
`prompts_per_step` (CPU and smoke configs) `gradient_accumulation_steps` is used as given and a step is
`updates_per_generation` updates of per_device x accumulation x W completions. `max_steps: -1` trains
`num_train_epochs` passes instead (HF's convention), incomplete final batches dropped (verl's `drop_last`).

`precision: auto` trains in float32 on CPU (TRL's GRPOConfig would default to bf16) and in bf16
mixed precision on a CUDA device that supports it. Gradient checkpointing is off unless asked for
(TRL turns it on by default); when on it is non-reentrant, which also works when the bottom layers
are frozen (a reentrant checkpoint would cut the graph). The GRPO recipe (ToolRL's settings and where
TRL differs from verl) is in `configs/train/trainer/gpu.yaml` and docs/method.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from cipr.core.config import ConfigError
from cipr.train.strategy import DistributedConfig, trainer_arguments


@dataclass
class WarmStartConfig:
    """The SFT warm start that precedes a GRPO algorithm (`steps: 0` skips it).

    `shared_dir`: train it once in that folder and load it from there in every run that names it
    (`cipr.train.warm_start`); `names`: its prompts' naming (null: the algorithm's own prompts);
    `seed`: its data order (null: `trainer.seed`); `action_weight`: > 0 adds the cross-entropy of the
    action distribution at the reference's calls to the SFT loss (`cipr.train.supervised`).
    """

    steps: int = 0
    shared_dir: str | None = None
    names: str | None = None
    seed: int | None = None
    learning_rate: float = 1e-5
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    max_length: int | None = 2048
    eval_examples: int = 0
    action_weight: float = 0.0


@dataclass
class TrainerConfig:
    """Optimization and bookkeeping of the main stage (GRPO, or SFT for algo=sft).

    `optim`/`optim_args`: TrainingArguments' optimizer name and its options string (e.g. `sgd` with
    `momentum=0.9`). `max_steps: -1` trains `num_train_epochs` instead. `prompts_per_step`,
    `updates_per_generation`: the GRPO batch geometry (module docstring); with `prompts_per_step` set,
    the gradient accumulation is derived and `gradient_accumulation_steps` must stay 1.
    `entropy_coeff`: weight of the mean token-entropy bonus (verl's `entropy_coeff`, TRL's
    `entropy_coef`). `max_prompt_length`: GRPO training units with a longer prompt (in tokens) are left
    out and counted, as verl's `filter_overlong_prompts`.

    GRPO's objective settings (`epsilon`/`epsilon_high` clipping, `beta` KL to the reference,
    `loss_type`, `num_iterations`, `scale_rewards`, `entropy_coeff`) live here, not in `algo`: they are
    the recipe (trainer=gpu: ToolRL's verl recipe; trainer=cpu), held equal across compared algorithms,
    while `algo` holds only what sets them apart (names, pairing, the λs); so swapping `algo=` (as
    sweep=ladder does) never changes the recipe.
    """

    run_dir: str = "runs/default"
    resume: str = "auto"
    seed: int = 0
    max_steps: int = 10
    num_train_epochs: float = 1.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    prompts_per_step: int | None = None
    updates_per_generation: int = 1
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    optim_args: str | None = None
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
    entropy_coeff: float = 0.0
    max_prompt_length: int | None = None
    torch_threads: int | None = None
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


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
        raise ConfigError(f"trainer.precision={precision} needs a CUDA device; use trainer.precision=fp32 on "
                          f"CPU")
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def common_args(cfg: TrainerConfig, dist: DistributedConfig, *, output_dir: str, progress_bar: bool,
                warm_start: bool = False) -> dict[str, Any]:
    """TrainingArguments fields shared by every stage: the main stage's schedule, or the warm start's."""
    ws = cfg.warm_start
    if warm_start:
        schedule = (ws.steps, ws.learning_rate, ws.per_device_train_batch_size,
                    ws.gradient_accumulation_steps, ws.lr_scheduler_type, ws.warmup_steps,
                    cfg.seed if ws.seed is None else ws.seed)
    else:
        schedule = (cfg.max_steps, cfg.learning_rate, cfg.per_device_train_batch_size,
                    cfg.gradient_accumulation_steps, cfg.lr_scheduler_type, cfg.warmup_steps, cfg.seed)
    keys = ("max_steps", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
            "lr_scheduler_type", "warmup_steps", "seed")
    args: dict[str, Any] = dict(zip(keys, schedule, strict=True))
    args.update({
        "output_dir": output_dir,
        "num_train_epochs": cfg.num_train_epochs,
        "weight_decay": cfg.weight_decay,
        "adam_beta1": cfg.adam_beta1,
        "adam_beta2": cfg.adam_beta2,
        "max_grad_norm": cfg.max_grad_norm,
        "optim": cfg.optim,
        "optim_args": cfg.optim_args,
        "gradient_checkpointing": cfg.gradient_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False} if cfg.gradient_checkpointing else None,
        "data_seed": args["seed"],
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
    })
    args.update(trainer_arguments(dist))
    return args


def _check(key: str, value: float | None, ok: bool, expected: str) -> None:
    if value is not None and (not ok or not math.isfinite(value)):
        raise ConfigError(f"trainer.{key}={value}: must be {expected}")


def check_numbers(cfg: TrainerConfig) -> None:
    """Every number of the optimization in its range (a negative learning rate would train backwards)."""
    ws = cfg.warm_start
    for key, value, ok, expected in [
        ("learning_rate", cfg.learning_rate, cfg.learning_rate > 0, "> 0"),
        ("per_device_train_batch_size", cfg.per_device_train_batch_size,
         cfg.per_device_train_batch_size >= 1, ">= 1"),
        ("gradient_accumulation_steps", cfg.gradient_accumulation_steps,
         cfg.gradient_accumulation_steps >= 1, ">= 1"),
        ("warmup_steps", cfg.warmup_steps, cfg.warmup_steps >= 0, ">= 0"),
        ("weight_decay", cfg.weight_decay, cfg.weight_decay >= 0, ">= 0"),
        ("adam_beta1", cfg.adam_beta1, 0 <= cfg.adam_beta1 < 1, "in [0, 1)"),
        ("adam_beta2", cfg.adam_beta2, 0 <= cfg.adam_beta2 < 1, "in [0, 1)"),
        ("max_grad_norm", cfg.max_grad_norm, cfg.max_grad_norm > 0, "> 0"),
        ("num_iterations", cfg.num_iterations, cfg.num_iterations >= 1, ">= 1"),
        ("epsilon", cfg.epsilon, cfg.epsilon > 0, "> 0"),
        ("epsilon_high", cfg.epsilon_high, cfg.epsilon_high is None or cfg.epsilon_high > 0, "> 0 (or null)"),
        ("beta", cfg.beta, cfg.beta >= 0, ">= 0"),
        ("torch_threads", cfg.torch_threads, cfg.torch_threads is None or cfg.torch_threads >= 1,
         ">= 1 (or null)"),
        ("warm_start.learning_rate", ws.learning_rate, ws.steps == 0 or ws.learning_rate > 0, "> 0"),
        ("warm_start.per_device_train_batch_size", ws.per_device_train_batch_size,
         ws.steps == 0 or ws.per_device_train_batch_size >= 1, ">= 1"),
        ("warm_start.gradient_accumulation_steps", ws.gradient_accumulation_steps,
         ws.steps == 0 or ws.gradient_accumulation_steps >= 1, ">= 1"),
        ("warm_start.warmup_steps", ws.warmup_steps, ws.warmup_steps >= 0, ">= 0"),
    ]:
        _check(key, value, ok, expected)


def validate_schedule(cfg: TrainerConfig, unit_completions: int) -> None:
    """Checks that need no model or data (`unit_completions`: 2G for paired algorithms, else G)."""
    check_numbers(cfg)
    if cfg.max_steps < 1 and cfg.max_steps != -1:
        raise ConfigError("trainer.max_steps must be >= 1, or -1 to train trainer.num_train_epochs epochs")
    if cfg.max_steps == -1 and cfg.num_train_epochs <= 0:
        raise ConfigError("trainer.max_steps=-1 trains trainer.num_train_epochs epochs, which must be > 0")
    if cfg.updates_per_generation < 1:
        raise ConfigError("trainer.updates_per_generation must be >= 1")
    if cfg.entropy_coeff < 0:
        raise ConfigError("trainer.entropy_coeff must be >= 0 (an entropy bonus)")
    if cfg.max_prompt_length is not None and cfg.max_prompt_length < 1:
        raise ConfigError("trainer.max_prompt_length must be >= 1 or null")
    if cfg.prompts_per_step is not None:
        if cfg.prompts_per_step < 1:
            raise ConfigError("trainer.prompts_per_step must be >= 1 or null")
        if cfg.gradient_accumulation_steps != 1:
            raise ConfigError(
                f"trainer.gradient_accumulation_steps={cfg.gradient_accumulation_steps} with "
                f"trainer.prompts_per_step={cfg.prompts_per_step}: the accumulation is derived from "
                f"prompts_per_step and the number of processes; leave gradient_accumulation_steps at 1, or "
                f"set trainer.prompts_per_step=null")
    if cfg.save_steps < 1:
        raise ConfigError("trainer.save_steps must be >= 1")
    if cfg.per_device_train_batch_size % unit_completions:
        raise ConfigError(
            f"trainer.per_device_train_batch_size={cfg.per_device_train_batch_size} must be a multiple of "
            f"{unit_completions} (the completions of one sampling unit: G per prompt, x2 when each prompt is "
            f"paired with its perturbed copy), so a micro-batch never splits a group or a pair")
    if cfg.save_total_limit is not None and cfg.save_total_limit < 2:
        raise ConfigError("trainer.save_total_limit must be >= 2 (or null): the tracked checkpoint has to "
                          "survive while the next one is written and rotated")
    if cfg.warm_start.steps < 0:
        raise ConfigError("trainer.warm_start.steps must be >= 0")


@dataclass(frozen=True)
class GrpoBatch:
    """The effective GRPO batch geometry of a run (module docstring); summary.json records it."""

    world_size: int
    unit_size: int
    num_generations: int
    pairing_budget: str
    prompts_per_step: int
    rows_per_step: int
    completions_per_step: int
    updates_per_generation: int
    completions_per_update: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def world_size(launcher: LauncherConfig) -> int:
    """Processes of this run: `WORLD_SIZE` inside a launched process, else `launcher.num_processes`."""
    return int(os.environ.get("WORLD_SIZE") or launcher.num_processes)


def grpo_batch(cfg: TrainerConfig, *, num_generations: int, unit_size: int, pairing_budget: str,
               world: int) -> GrpoBatch:
    """Prompts, completions, accumulation and TRL's `steps_per_generation` for `world` processes."""
    per_device, updates = cfg.per_device_train_batch_size, cfg.updates_per_generation
    unit_rows = unit_size * num_generations
    if cfg.prompts_per_step is None:
        accumulation = cfg.gradient_accumulation_steps
        per_update = per_device * world * accumulation
        completions = per_update * updates
        units = completions // unit_rows
    else:
        if pairing_budget == "prompts":
            units = cfg.prompts_per_step
        elif cfg.prompts_per_step % unit_size:
            raise ConfigError(f"algo.pairing_budget=completions pairs {cfg.prompts_per_step} prompts per "
                              f"step into units of {unit_size}: trainer.prompts_per_step must be a multiple "
                              f"of {unit_size}")
        else:
            units = cfg.prompts_per_step // unit_size
        completions = units * unit_rows
        per_update, rest = divmod(completions, updates)
        accumulation, rest2 = divmod(per_update, per_device * world) if not rest else (0, 1)
        if rest or rest2 or accumulation < 1:
            raise ConfigError(
                f"{completions} completions per step ({units} units x {unit_rows}) cannot be split into "
                f"trainer.updates_per_generation={updates} updates of whole micro-batches of "
                f"trainer.per_device_train_batch_size={per_device} on {world} process(es): completions per "
                f"update ({completions}/{updates}) must be a multiple of per_device_train_batch_size x "
                f"processes ({per_device * world}); change per_device_train_batch_size or the number of "
                f"processes")
    return GrpoBatch(world_size=world, unit_size=unit_size, num_generations=num_generations,
                     pairing_budget=pairing_budget, prompts_per_step=units,
                     rows_per_step=units * unit_size, completions_per_step=completions,
                     updates_per_generation=updates, completions_per_update=per_update,
                     per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
                     steps_per_generation=accumulation * updates)
