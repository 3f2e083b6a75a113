"""The self-distillation stage (`algo=distill`, paper §4.3) on train's engine, evaluation included.

    cipr-train algo=distill                                         # one CPU: embedded SmolLM2-135M, ToyShop
    cipr-train algo=distill data=messages data.path=tests/data/messages_example.jsonl data.eval_examples=2 \\
        algo.eval.namings=[original,canonical]                     # your own messages + tools rows
    cipr-train experiment=smollm2_distill_toyshop                   # the short CPU run
    cipr-train algo=distill model=qwen25_3b data.path=/data/webshop_agentinstruct.json \\
        algo.eval.live_env=webshop algo.eval.live_tasks=200        # one GPU, real WebShop trajectories
    ... launcher.num_processes=8 distributed=zero2                  # several GPUs, as every algorithm

The model section names the released model: the frozen teacher (original names) and the student's
initialization; the student trains under canonical names on agent trajectories (data=trajectories or
data=messages) in `data.call_format` (WebShop ReAct for AgentInstruct-style data), else
`model.call_format`. The math and data are `cipr.distill`; run config, folder, checkpoints, resume,
strategy and metrics are the other algorithms' (`rollout` options are refused: no rollouts).

    run_dir/
      config.json, config.yaml   the resolved configuration
      metrics.jsonl              one line per optimizer step (stage "distill"), plus eval lines
      distill/                   checkpoint-<step>/ (HF format), latest.json, final/, stage.json
      eval/teacher.json          the teacher's action distributions on held-out decisions (computed once)
      eval/student.json          the trained student's, per naming (both: probs [D, A+1], ∅ last,
                                 and segments)
      eval/eval.json, table.md   agreement and KL per model and naming (+ live rewards when played)
      summary.json

Rerunning resumes (`trainer.resume=auto`), skips a finished stage and reuses the teacher's evaluation;
a run folder started with another model, data or algo config is refused.

The loop is a `transformers.Trainer` with loss `cipr.distill.batch.batch_loss`, `CheckpointMixin`'s
checkpoints, LoRA via PEFT, and accelerate or DeepSpeed where configured. Choices:
- Teacher: with LoRA the teacher is the student's own base weights with the adapter disabled (no
  second copy in memory); without LoRA, a frozen deep copy taken before training, so a resumed run
  still distills from the released weights.
- A batch is `per_device_train_batch_size` trajectories; the loss is averaged as `cipr.distill.loss`
  says and the Trainer scales it by gradient accumulation.
- Each step's relabeling is `cipr.method.pairing.relabeled` of the batch's `student_view` (seeded by the
  run's relabeling, the step and the trajectory id), so a resumed run redraws the same names.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer

from cipr.core.errors import ConfigError
from cipr.core.io import read_json, read_text
from cipr.distill.batch import DistillItem, batch_loss, student_view
from cipr.distill.data import build_items, load_split
from cipr.distill.evaluate import (
    Readings,
    check_namings,
    greedy_policy,
    live_evaluate,
    offline_rows,
    read_rendered,
    render_named,
    write_report,
)
from cipr.formats.base import CallFormat
from cipr.method.pairing import relabeled
from cipr.method.relabel import Relabeling
from cipr.train.algo import DistillConfig
from cipr.train.checkpoint import CheckpointMixin, check_finite, load_trained, stage_done, write_json_atomic
from cipr.train.config import TrainConfig
from cipr.train.metrics import MetricsWriter
from cipr.train.schedule import common_args
from cipr.train.stage import run_stage
from cipr.train.strategy import sharded

log = logging.getLogger("cipr.train")

STAGE = "distill"


def collate_indices(rows: Sequence[int]) -> dict[str, torch.Tensor]:
    return {"index": torch.tensor(list(rows), dtype=torch.long)}


def teacher_for(student: Any, dtype: str = "model") -> tuple[Any, Callable[[], Any]]:
    """(teacher model, context to enter around its forwards): see the module docstring. With LoRA,
    `dtype` must be "model" (`cipr.train.algo.validate_distill`)."""
    if hasattr(student, "disable_adapter") and hasattr(student, "peft_config"):
        return student, student.disable_adapter
    teacher = copy.deepcopy(student)
    if dtype == "bfloat16":
        teacher.to(torch.bfloat16)
    teacher.requires_grad_(False)
    teacher.eval()
    return teacher, contextlib.nullcontext


class DistillTrainer(CheckpointMixin, Trainer):
    """HF Trainer over trajectory indices (dataset 0..n-1) with the batch's self-distillation loss."""

    def __init__(self, *, items: Sequence[DistillItem], fmt: CallFormat, algo: DistillConfig, teacher: Any,
                 teacher_context: Callable[[], Any], relabeling: Relabeling | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("data_collator", collate_indices)
        super().__init__(train_dataset=list(range(len(items))), **kwargs)
        if teacher is not self.model:
            teacher.to(self.args.device)
        self.items = list(items)
        self.fmt = fmt
        self.algo = algo
        self.consistency = algo.objective()
        self.relabeling = relabeling or Relabeling.of(None, self.args.seed)
        self.teacher = teacher
        self.teacher_context = teacher_context
        self._sums: dict[str, float] = defaultdict(float)
        self._count = 0

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        batch = [self.items[i] for i in inputs["index"].tolist()]
        tokenizer = self.processing_class
        step = self.state.global_step
        copies = relabeled(student_view(batch, tokenizer), self.fmt, self.relabeling, step) \
            if self.consistency.uses("rescore") else None
        autocast = self.algo.autocast_bf16 and self.args.device.type == "cpu"
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, metrics = batch_loss(model, self.teacher, tokenizer, batch, copies, self.fmt,
                                       self.algo.weights, objective=self.consistency,
                                       teacher_context=self.teacher_context,
                                       token_positions=self._positions, step=self.state.global_step,
                                       max_steps=self.state.max_steps)
        check_finite(loss, self.state.global_step, metrics)
        for k, v in metrics.items():
            self._sums[k] += v
        self._sums["distill/tokens_seen"] += float(sum(len(it.student_tokens.ids) for it in batch))
        self._count += 1
        return (loss, {}) if return_outputs else loss

    def _positions(self, local: int) -> float | None:
        """The token KL's divisor on several processes: every process's aligned positions over their number,
        so that the gradients DDP, FSDP and ZeRO average are those of the mean over all positions (None: one
        process)."""
        processes = self.accelerator.num_processes
        if processes == 1:
            return None
        total = self.accelerator.reduce(torch.tensor(float(local), device=self.args.device), reduction="sum")
        return max(float(total), 1.0) / processes

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.accelerator.num_processes > 1 and "loss" in logs:  # every process's micro-batches
            from accelerate.utils import gather_object

            parts = gather_object([(dict(self._sums), self._count)])
            self._sums = defaultdict(float)
            for sums, _ in parts:
                for k, v in sums.items():
                    self._sums[k] += v
            self._count = sum(count for _, count in parts)
        if self._count and "loss" in logs:
            for k, v in self._sums.items():
                logs[k] = v if k == "distill/tokens_seen" else v / self._count
            self._sums.clear()
            self._count = 0
        super().log(logs, start_time)


def run_distill(cfg: TrainConfig, run_dir: Path, writer: MetricsWriter, fmt: Callable[[Any], CallFormat]
                ) -> dict[str, Any] | None:
    """Train the stage (resuming) and evaluate teacher and student in `run_dir`; `fmt(tokenizer)` is the
    run's call format. Returns the summary's entries of this algorithm (None: the run was complete)."""
    stage_dir, eval_dir = run_dir / STAGE, run_dir / "eval"
    done = stage_done(stage_dir)
    if done and (eval_dir / "eval.json").is_file():
        log.info("%s is complete (trained and evaluated); nothing to do", run_dir)
        return None
    student, tokenizer = load_trained(cfg.model, stage_dir / "final" if done else None)
    call_format = fmt(tokenizer)
    train_examples, eval_examples, counts = load_split(cfg.data)
    check_namings(eval_examples, cfg.algo.eval)
    rewrite = cfg.perturb.rewrite_text
    train = build_items(train_examples, call_format, tokenizer, rewrite=rewrite)
    held = build_items(eval_examples, call_format, tokenizer, rewrite=rewrite)
    skipped = dict(train.skipped + held.skipped)
    if skipped:
        log.warning("skipped %d trajectories: %s", sum(skipped.values()), skipped)
    if not train.items:
        raise ConfigError(f"no usable training trajectory ({counts}; skipped {skipped})")
    usable_eval = [it.example for it in held.items]
    log.info("%d training trajectories, %d held out (%s)", len(train.items), len(usable_eval), counts)

    main, teacher_file = writer.enabled, eval_dir / "teacher.json"
    if main and usable_eval and not done:
        if not teacher_file.is_file():
            t0 = time.time()
            namings = ["original", *[n for n in cfg.algo.eval.namings if n != "original"]]
            readings = _readings(student, tokenizer, usable_eval, call_format, cfg, namings)
            write_json_atomic(teacher_file, {k: v.to_json() for k, v in readings.items()})
            log.info("teacher evaluated on %d held-out trajectories in %.0fs", len(usable_eval),
                     time.time() - t0)
        if cfg.algo.eval.live_tasks:
            write_json_atomic(eval_dir / "teacher_live.json", _live(student, tokenizer, call_format, cfg))
    steps = 0
    if not done:
        steps = _train(cfg, student, tokenizer, train.items, call_format, stage_dir, writer)
        if sharded(cfg.distributed.strategy) and main:  # split across the processes in place: evaluate final/
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()  # rank 0 loads alone: not under ZeRO-3's collective zero.Init
            student, tokenizer = load_trained(cfg.model, stage_dir / "final")
    if not main:
        return None
    if usable_eval:
        _evaluate(cfg, student, tokenizer, usable_eval, call_format, eval_dir, writer, steps)
    return {"eval": read_json(eval_dir / "eval.json") if (eval_dir / "eval.json").is_file() else None,
            "data": counts, "train_trajectories": len(train.items), "held_out_trajectories": len(usable_eval),
            "skipped_trajectories": skipped}


def _evaluate(cfg: TrainConfig, student: Any, tokenizer: Any, examples: list, fmt: CallFormat, eval_dir: Path,
              writer: MetricsWriter, steps: int) -> None:
    """The student's readings against the teacher's (eval/teacher.json): eval.json, table.md, an eval line."""
    teacher_file = eval_dir / "teacher.json"
    if not teacher_file.is_file():
        raise RuntimeError(f"{teacher_file} is missing: delete {eval_dir.parent / STAGE}/stage.json to redo "
                           f"the run's teacher evaluation, or start a new run_dir")
    teacher = {k: Readings.from_json(v) for k, v in read_json(teacher_file).items()}
    t0 = time.time()
    namings = cfg.algo.eval.namings
    student_readings = _readings(student, tokenizer, examples, fmt, cfg, namings)
    write_json_atomic(eval_dir / "student.json", {k: v.to_json() for k, v in student_readings.items()})
    rows = offline_rows({"teacher": {n: teacher[n] for n in namings}, "student": student_readings},
                        reference=teacher["original"])
    live = {}
    if cfg.algo.eval.live_tasks:
        teacher_live = eval_dir / "teacher_live.json"
        live = {"teacher": read_json(teacher_live) if teacher_live.is_file() else {},
                "student": _live(student, tokenizer, fmt, cfg)}
    write_report(eval_dir, rows, live, {"held_out_trajectories": len(examples)})
    writer.write({"stage": STAGE, "kind": "eval", "tag": "after", "step": steps,
                  **{f"eval/{m}/{n}/{k}": v for m, per in rows.items() for n, r in per.items()
                     for k, v in r.items() if k != "decisions"}})
    log.info("evaluation (%.0fs):\n%s", time.time() - t0, read_text(eval_dir / "table.md"))


def _train(cfg: TrainConfig, student: Any, tokenizer: Any, items: list, fmt: CallFormat, stage_dir: Path,
           writer: MetricsWriter) -> int:
    from transformers import TrainingArguments

    algo = cfg.algo

    def build(callbacks: list[Any]) -> DistillTrainer:
        args = common_args(cfg.trainer, cfg.distributed, output_dir=str(stage_dir),
                           progress_bar=cfg.logging.progress_bar)
        args.update(include_num_input_tokens_seen="no", remove_unused_columns=False)
        teacher, context = teacher_for(student, algo.teacher_dtype)
        return DistillTrainer(model=student, args=TrainingArguments(**args), processing_class=tokenizer,
                              items=items, fmt=fmt, algo=algo, teacher=teacher, teacher_context=context,
                              relabeling=cfg.relabeling, callbacks=callbacks)

    return run_stage(cfg, STAGE, stage_dir, writer, build)[0]


def _eval_model(model: Any, cfg: TrainConfig) -> Any:
    """The model the evaluation runs: itself, or a bfloat16 copy (`algo.eval.dtype`)."""
    if cfg.algo.eval.dtype == "bfloat16" and next(model.parameters()).dtype != torch.bfloat16:
        return copy.deepcopy(model).to(torch.bfloat16).eval()
    return model


def _readings(model: Any, tokenizer: Any, examples: list, fmt: CallFormat, cfg: TrainConfig,
              namings: Sequence[str]) -> dict[str, Readings]:
    model, ev = _eval_model(model, cfg), cfg.algo.eval
    out = {}
    for naming in namings:
        rendered = render_named(examples, fmt, tokenizer, naming, rewrite=cfg.perturb.rewrite_text,
                                renames=ev.renames)
        out[naming] = read_rendered(model, tokenizer, rendered, fmt, batch_size=ev.batch_size)
    return out


def _live(model: Any, tokenizer: Any, fmt: CallFormat, cfg: TrainConfig) -> dict[str, dict[str, float]]:
    ev = cfg.algo.eval
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
    return {naming: live_evaluate(greedy_policy(model, tokenizer), tokenizer, factory, tasks, fmt, naming,
                                  rewrite=cfg.perturb.rewrite_text, renames=ev.renames,
                                  max_steps=ev.live_max_steps,
                                  max_new_tokens=ev.live_max_new_tokens,
                                  max_observation_chars=cfg.data.max_observation_chars)
            for naming in ev.namings}
