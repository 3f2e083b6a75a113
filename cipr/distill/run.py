"""`cipr-train algo=distill` (its data group is data=trajectories, or data=messages): one self-distillation run,
evaluation included.

    cipr-train algo=distill                                         # one CPU: embedded SmolLM2-135M, ToyShop
    cipr-train algo=distill data=messages data.path=tests/data/messages_example.jsonl data.eval_examples=2 \
        algo.eval.namings=[original,canonical]                     # your own messages + tools rows
    cipr-train experiment=smollm2_distill_toyshop                   # the short CPU run
    cipr-train algo=distill model=qwen25_3b data.path=/data/webshop_agentinstruct.json \\
        algo.eval.live_env=webshop algo.eval.live_tasks=200        # one GPU, real WebShop trajectories
    cipr-train algo=distill ... launcher.num_processes=8 distributed=zero2   # several GPUs on one node
    sbatch --gres=gpu:8 slurm/train.sbatch algo=distill launcher.num_processes=8 ...  # Slurm

The model section names the released model (teacher and the student's initialization); the
trajectories' call format is `data.call_format` (WebShop ReAct for AgentInstruct-style data), or
`model.call_format` when that is null. `rollout` options are accepted and unused: no rollouts.

    run_dir/
      config.json, config.yaml   the resolved configuration
      metrics.jsonl              one line per optimizer step (stage "distill"), plus eval lines
      distill/                   checkpoint-<step>/ (HF format), latest.json, final/, stage.json
      eval/teacher.json          the teacher's action distributions on held-out decisions (computed once)
      eval/student.json          the trained student's, per naming (both: probs [D, A+1], ∅ last, and segments)
      eval/eval.json, table.md   agreement and KL per model and naming (+ live rewards when played)
      summary.json

Rerunning continues from the latest complete checkpoint (`trainer.resume=auto`), skips a finished
stage, and reuses the teacher's evaluation; a run folder started with another model, data or algo
config is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cipr.core.config import ConfigError, from_dict, to_dict
from cipr.core.io import read_json, read_text
from cipr.core.run_folder import prepare
from cipr.distill.data import TrajectoryDataConfig, build_items, check_data, distill_data_section, load_split
from cipr.distill.evaluate import (
    Readings,
    check_eval,
    check_namings,
    live_evaluate,
    offline_rows,
    read_rendered,
    render_named,
    write_report,
)
from cipr.distill.trainer import DistillConfig, DistillTrainer, check_distill, teacher_for
from cipr.runtime.model import ModelConfig, resolve_source
from cipr.train.checkpoint import (
    latest_complete,
    load_trained,
    resolve_resume,
    stage_done,
    write_json_atomic,
)
from cipr.train.metrics import LoggingConfig, MetricsCallback, MetricsWriter, peak_memory_gb
from cipr.train.schedule import (
    LauncherConfig,
    TrainerConfig,
    check_numbers,
    common_args,
    precision_flags,
)
from cipr.train.stage import finish_stage, preemption_callback, train_stage
from cipr.train.strategy import DistributedConfig, reset_accelerator_state, sharded, validate_distributed

log = logging.getLogger("cipr.distill")

STAGE = "distill"
COMPARED = ("model", "data", "algo")


@dataclass
class DistillRunConfig:
    """The whole self-distillation run; sections as in `cipr.train.run.TrainConfig` (rollout unused)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: TrajectoryDataConfig = field(default_factory=TrajectoryDataConfig)
    algo: DistillConfig = field(default_factory=DistillConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    rollout: dict[str, Any] = field(default_factory=dict)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


def config_from_dict(data: dict[str, Any]) -> DistillRunConfig:
    """A DistillRunConfig from a composed (Hydra) config; unknown keys and bad values raise ConfigError."""
    sections = {k: v for k, v in data.items() if k != "hydra"}
    sections["data"] = distill_data_section(sections.get("data") or {})
    return from_dict(DistillRunConfig, sections)


def call_format_name(cfg: DistillRunConfig) -> str:
    return cfg.data.call_format or cfg.model.call_format


def validate(cfg: DistillRunConfig) -> None:
    """Every check that needs neither model nor data in memory; raises ConfigError with the fix."""
    from cipr.formats import get_format

    try:
        if cfg.algo.teacher_dtype != "model" and cfg.model.lora.enabled:
            raise ValueError("algo.teacher_dtype must be 'model' with model.lora.enabled (the teacher is the base)")
        check_distill(cfg.algo)
        check_eval(cfg.algo.eval)
        check_data(cfg.data)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if cfg.trainer.max_steps < 1 or cfg.trainer.save_steps < 1 or cfg.trainer.per_device_train_batch_size < 1:
        raise ConfigError("trainer.max_steps, trainer.save_steps and trainer.per_device_train_batch_size must be >= 1")
    check_numbers(cfg.trainer)
    validate_distributed(cfg.distributed)
    precision_flags(cfg.trainer.precision)
    resolve_source(cfg.model)
    try:
        get_format(call_format_name(cfg))
    except ValueError as e:
        raise ConfigError(f"data.call_format / model.call_format: {e}") from e
    if cfg.model.attn_implementation not in ("sdpa", "eager"):
        raise ConfigError(f"algo=distill reads action distributions with a tree-shaped attention mask, which needs "
                          f"model.attn_implementation=sdpa or eager (got {cfg.model.attn_implementation})")
    if cfg.trainer.resume != "auto":
        resolve_resume(cfg.trainer.resume, Path(cfg.trainer.run_dir) / STAGE)


def _started(out: Path) -> bool:
    """Whether the run folder holds training progress (a complete checkpoint or the finished stage)."""
    return bool(latest_complete(out / STAGE) or stage_done(out / STAGE))


def _eval_model(model: Any, cfg: DistillRunConfig) -> Any:
    """The model the evaluation runs: itself, or a bfloat16 copy (`algo.eval.dtype`)."""
    if cfg.algo.eval.dtype == "bfloat16" and next(model.parameters()).dtype != torch.bfloat16:
        import copy

        return copy.deepcopy(model).to(torch.bfloat16).eval()
    return model


def _readings(model: Any, tokenizer: Any, examples: list, fmt: Any, cfg: DistillRunConfig, namings: Sequence[str]
              ) -> dict[str, Readings]:
    model = _eval_model(model, cfg)
    out = {}
    for naming in namings:
        rendered = render_named(examples, fmt, tokenizer, naming, rewrite=cfg.data.rewrite_text,  # type: ignore[arg-type]
                                renames=cfg.algo.eval.renames)
        out[naming] = read_rendered(model, tokenizer, rendered, fmt, batch_size=cfg.algo.eval.batch_size)
    return out


def _plain_float(model: Any) -> Any:
    """A GGUF model whose quantizer was dropped after de-quantization still says `is_quantized`; the
    HF Trainer then refuses to train it. Its weights are plain floats, so the flag is cleared."""
    base = getattr(model, "get_base_model", lambda: model)()
    for m in {id(model): model, id(base): base}.values():
        if getattr(m, "hf_quantizer", None) is None and getattr(m, "is_quantized", False):
            m.is_quantized = False
    return model


def _live(model: Any, tokenizer: Any, fmt: Any, cfg: DistillRunConfig) -> dict[str, dict[str, float]]:
    ev = cfg.algo.eval
    if not ev.live_tasks:
        return {}
    model = _eval_model(model, cfg)
    if ev.live_env == "webshop":
        from cipr.envs.webshop import WebShopEnv

        def factory() -> Any:
            return WebShopEnv()
    else:
        from cipr.envs.toyshop import ToyShop

        def factory() -> Any:
            return ToyShop(seed=cfg.data.seed)
    tasks = list(range(ev.live_first_task, ev.live_first_task + ev.live_tasks))
    return {naming: live_evaluate(model, tokenizer, factory, tasks, fmt, naming, rewrite=cfg.data.rewrite_text,
                                  renames=ev.renames, max_steps=ev.live_max_steps,
                                  max_new_tokens=ev.live_max_new_tokens,
                                  max_observation_chars=cfg.data.max_observation_chars)
            for naming in ev.namings}


def run_distill(cfg: DistillRunConfig | dict[str, Any], run_dir: str | Path | None = None) -> Path:
    """Train (resuming where a previous run stopped) and evaluate; returns the run folder.

    `cfg` is a DistillRunConfig or a plain dict of its sections; `run_dir` overrides `trainer.run_dir`.
    """
    if not isinstance(cfg, DistillRunConfig):
        cfg = config_from_dict(dict(cfg))
    if run_dir is not None:
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, run_dir=str(run_dir)))
    validate(cfg)
    started = time.time()
    if cfg.trainer.torch_threads:
        torch.set_num_threads(cfg.trainer.torch_threads)
    out = Path(cfg.trainer.run_dir).expanduser()
    main = prepare(out, to_dict(cfg), COMPARED, lambda: _started(out))
    writer = MetricsWriter(out, cfg.logging.wandb, to_dict(cfg), enabled=main)
    try:
        _run(cfg, out, writer, started, main)
    finally:
        writer.close()
    return out


def _run(cfg: DistillRunConfig, out: Path, writer: MetricsWriter, started: float, main: bool) -> None:
    from cipr.formats import get_format

    stage_dir = out / STAGE
    done = stage_done(stage_dir)
    eval_dir = out / "eval"
    if done and (eval_dir / "eval.json").is_file():
        log.info("%s is complete (trained and evaluated); nothing to do", out)
        return
    fmt = get_format(call_format_name(cfg))
    weights = stage_dir / "final" if done else None
    student, tokenizer = load_trained(cfg.model, weights)
    _plain_float(student)
    train_examples, eval_examples, counts = load_split(cfg.data)
    try:
        check_namings(eval_examples, cfg.algo.eval)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    train = build_items(train_examples, fmt, tokenizer, rewrite=cfg.data.rewrite_text)
    held = build_items(eval_examples, fmt, tokenizer, rewrite=cfg.data.rewrite_text)
    skipped = dict(train.skipped + held.skipped)
    if skipped:
        log.warning("skipped %d trajectories: %s", sum(skipped.values()), skipped)
    if not train.items:
        raise ConfigError(f"no usable training trajectory ({counts}; skipped {skipped})")
    usable_eval = [it.example for it in held.items]
    log.info("%d training trajectories, %d held out (%s)", len(train.items), len(usable_eval), counts)

    teacher_file = eval_dir / "teacher.json"
    teacher_readings: dict[str, Readings] | None = None
    if main and usable_eval and not done:
        if teacher_file.is_file():
            teacher_readings = {k: Readings.from_json(v) for k, v in read_json(teacher_file).items()}
        else:
            t0 = time.time()
            namings = ["original", *[n for n in cfg.algo.eval.namings if n != "original"]]
            teacher_readings = _readings(student, tokenizer, usable_eval, fmt, cfg, namings)
            write_json_atomic(teacher_file, {k: v.to_json() for k, v in teacher_readings.items()})
            log.info("teacher evaluated on %d held-out trajectories in %.0fs", len(usable_eval), time.time() - t0)
        teacher_live = _live(student, tokenizer, fmt, cfg) if cfg.algo.eval.live_tasks else {}
        if teacher_live:
            write_json_atomic(eval_dir / "teacher_live.json", teacher_live)

    steps = 0
    if not done:
        steps = _train(cfg, student, tokenizer, train.items, fmt, stage_dir, writer)
        if sharded(cfg.distributed.strategy) and main:  # split across the processes in place: evaluate final/
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()  # rank 0 loads alone: not under ZeRO-3's collective zero.Init
            student, tokenizer = load_trained(cfg.model, stage_dir / "final")
            _plain_float(student)
    if main and usable_eval:
        if teacher_readings is None:
            if not teacher_file.is_file():
                raise RuntimeError(f"{teacher_file} is missing: delete {stage_dir}/stage.json to redo the run's "
                                   f"teacher evaluation, or start a new run_dir")
            teacher_readings = {k: Readings.from_json(v) for k, v in read_json(teacher_file).items()}
        t0 = time.time()
        student_readings = _readings(student, tokenizer, usable_eval, fmt, cfg, cfg.algo.eval.namings)
        write_json_atomic(eval_dir / "student.json", {k: v.to_json() for k, v in student_readings.items()})
        shown = {n: teacher_readings[n] for n in cfg.algo.eval.namings}
        rows = offline_rows({"teacher": shown, "student": student_readings}, reference=teacher_readings["original"])
        live = {}
        if cfg.algo.eval.live_tasks:
            teacher_live_file = eval_dir / "teacher_live.json"
            live = {"teacher": read_json(teacher_live_file) if teacher_live_file.is_file() else {},
                    "student": _live(student, tokenizer, fmt, cfg)}
        write_report(eval_dir, rows, live, {"held_out_trajectories": len(usable_eval)})
        writer.write({"stage": STAGE, "kind": "eval", "tag": "after", "step": steps,
                      **{f"eval/{m}/{n}/{k}": v for m, per in rows.items() for n, r in per.items()
                         for k, v in r.items() if k != "decisions"}})
        log.info("evaluation (%.0fs):\n%s", time.time() - t0, read_text(eval_dir / "table.md"))
    if main:
        summary = {"run_dir": str(out), "algo": "distill", "stage_done": bool(stage_done(stage_dir)),
                   "final": next((r for r in reversed(writer.read()) if r.get("kind") == "step"), None),
                   "eval": read_json(eval_dir / "eval.json") if (eval_dir / "eval.json").is_file()
                   else None,
                   "data": counts, "train_trajectories": len(train.items), "held_out_trajectories": len(usable_eval),
                   "skipped_trajectories": skipped, "peak_memory_gb": peak_memory_gb(),
                   "wall_seconds_this_invocation": time.time() - started}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))


def _train(cfg: DistillRunConfig, student: Any, tokenizer: Any, items: list, fmt: Any, stage_dir: Path,
           writer: MetricsWriter) -> int:
    from transformers import TrainingArguments

    t = cfg.trainer
    reset_accelerator_state()
    args = common_args(t, cfg.distributed, output_dir=str(stage_dir), max_steps=t.max_steps,
                       learning_rate=t.learning_rate, batch=t.per_device_train_batch_size,
                       accumulation=t.gradient_accumulation_steps, scheduler=t.lr_scheduler_type,
                       warmup=t.warmup_steps, progress_bar=cfg.logging.progress_bar)
    args["include_num_input_tokens_seen"] = "no"
    args["remove_unused_columns"] = False
    teacher, context = teacher_for(student, cfg.algo.teacher_dtype)
    preemption = preemption_callback()
    trainer = DistillTrainer(model=student, args=TrainingArguments(**args), processing_class=tokenizer, items=items,
                             fmt=fmt, algo=cfg.algo, teacher=teacher, teacher_context=context,
                             callbacks=[MetricsCallback(writer, STAGE, cfg.logging.print_metrics), preemption])
    steps = train_stage(trainer, stage_dir, t.resume, writer, STAGE, preemption, cfg.distributed.strategy)
    finish_stage(trainer, stage_dir, steps)
    del trainer
    return steps


def distill_main(container: dict[str, Any]) -> int:
    """The `cipr-train` entry for `algo=distill` (a resolved Hydra config as a dict); returns the exit status.

    Exit statuses and the re-launch under `accelerate launch` are those of `cipr.ops.launch.run_entry`.
    """
    from cipr.ops.launch import run_entry

    return run_entry(container, config_from_dict, run_distill,
                     "metrics.jsonl, eval/table.md, summary.json, checkpoints")
