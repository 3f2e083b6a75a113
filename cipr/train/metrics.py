"""Per-step metrics: one JSON line per optimizer step in `metrics.jsonl`, and wandb when configured.

Every line carries `stage`, the stage's optimizer `step`, and the Trainer's logs for that step. The GRPO stage
adds (`grpo.py`): `reward`, `reward/format`, `reward/correctness`; `consistency/rescore/kl`,
`consistency/rollout/kl` (every term: `cipr.method.objective`); `actions/entropy` (of the action distributions
at decisions), `actions/p_no_call` (mean π(∅)); `rollout/no_call_rate` (the paper's failure mode: consistency
can be met by not calling), `rollout/twin_call_rate` (calls to a degraded twin among perturbed-side calls),
`rollout/decisions_per_response`. Every step line has `speed/tokens_per_second` (prompt + completion tokens
over wall time) and `memory/peak_gb` (`peak_memory_gb`). GRPO lines split the step's wall time (seconds, mean
per micro-batch): `time/generate`, `time/generate_and_score` (+ rewards and TRL's bookkeeping),
`time/loss_forward` and within it `time/action_read` (folded read), `time/task_loss` (TRL's loss) and
`time/rescore_read`, and `time/backward` (the rest of the micro-step); the rest of `speed/step_seconds` is the
optimizer step and logging. Evaluation lines (`kind: "eval"`) record the reward of greedy responses on
held-out prompts before and after the warm start.

On resume, lines past the checkpoint's step (and of later stages) are dropped first, so the file reads
as one uninterrupted run; the wandb run id comes from the run folder, so wandb continues the same run.
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import TrainerCallback

from cipr.core.io import read_jsonl

STAGES = ("warm_start", "sft", "grpo", "supervised", "distill")  # the order stages run in (distill alone)


@dataclass
class WandbOptions:
    """wandb logging: `disabled` (default), `offline` (files under the run dir), or `online`."""

    mode: Literal["disabled", "offline", "online"] = "disabled"
    project: str = "cipr"
    entity: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()


@dataclass
class LoggingConfig:
    """What the run reports: progress bars, per-step metrics, wandb, sample completions."""

    progress_bar: bool = True
    wandb: WandbOptions = field(default_factory=WandbOptions)
    log_completions: bool = False
    print_metrics: bool = False
    rollout_samples: int = 16  # completions per GRPO step written to rollouts.jsonl (rank 0's; 0: none)
    trace: bool = False  # supervised regime: each term on the step's own pairs before/after its update


def peak_memory_gb() -> float:
    """Peak memory of this process so far: CUDA peak allocation on a GPU, else peak resident set size."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


def _clean(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends metric records to `metrics.jsonl` (rank 0 only) and mirrors them to wandb."""

    def __init__(self, run_dir: str | Path, wandb: WandbOptions | None = None,
                 config: dict[str, Any] | None = None, enabled: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.samples_path = Path(run_dir) / "rollouts.jsonl"
        self.enabled = enabled
        self._wandb = None
        if enabled and wandb is not None and wandb.mode != "disabled":
            import wandb as wandb_lib

            run_id = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
            self._wandb = wandb_lib.init(project=wandb.project, entity=wandb.entity, name=wandb.name,
                                         tags=list(wandb.tags), mode=wandb.mode, dir=str(run_dir),
                                         config=config, id=run_id, resume="allow")

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in record.items()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            prefix = record.get("stage", "run")
            numeric = {f"{prefix}/{k}": v for k, v in record.items() if isinstance(v, (int, float))
                       and not isinstance(v, bool) and k not in ("step",)}
            self._wandb.log(numeric)

    def write_samples(self, stage: str, step: int, samples: list[dict[str, Any]]) -> None:
        """Append sampled completions of `stage` at `step` to `rollouts.jsonl` (one line each)."""
        if not self.enabled or not samples:
            return
        with self.samples_path.open("a") as f:
            for sample in samples:
                f.write(json.dumps({"stage": stage, "step": step, **sample}) + "\n")

    def truncate_after(self, stage: str, step: int) -> int:
        """Drop lines of `stage` after `step`, its end line (it is being resumed), every line of later
        stages, and a line torn by a kill (metrics and samples); how many."""
        if not self.enabled:
            return 0
        from cipr.core.run_folder import truncate_metrics

        return truncate_metrics([self.path, self.samples_path], stage, step, STAGES)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return read_jsonl(self.path)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


class MetricsCallback(TrainerCallback):
    """Turns the Trainer's per-step logs into `metrics.jsonl` records for one stage."""

    def __init__(self, writer: MetricsWriter, stage: str, print_metrics: bool = False) -> None:
        self.writer = writer
        self.stage = stage
        self.print_metrics = print_metrics
        self._t0: float | None = None
        self._tokens0 = 0
        self._last_step = -1

    def on_step_begin(self, args, state, control, **kwargs):
        if self._t0 is None:
            self._t0 = time.perf_counter()
            self._tokens0 = int(state.num_input_tokens_seen or 0)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "train_loss" in logs and "total_flos" in logs:  # the Trainer's end-of-training summary
            self.writer.write({"stage": self.stage, "kind": "stage_end", "step": state.global_step, **logs})
            return control
        if state.global_step == self._last_step:
            return control
        self._last_step = state.global_step
        now = time.perf_counter()
        tokens = int(state.num_input_tokens_seen or 0)
        record: dict[str, Any] = {"stage": self.stage, "kind": "step", "step": state.global_step,
                                  "time": time.time()}
        record.update(logs)
        if self._t0 is not None:
            elapsed = max(now - self._t0, 1e-9)
            record["speed/step_seconds"] = elapsed
            if tokens > self._tokens0:
                record["speed/tokens_per_second"] = (tokens - self._tokens0) / elapsed
        record["memory/peak_gb"] = peak_memory_gb()
        self.writer.write(record)
        if self.print_metrics:
            short = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()
                     if k != "time"}
            print(json.dumps(short), flush=True)
        self._t0 = None
        return control
