"""The self-distillation training loop: a `transformers.Trainer` whose loss is `cipr.distill.batch.batch_loss`.

The frozen teacher is the released model under the original names; the student starts from the
same weights and trains under canonical names (plus the rescoring consistency KL under fresh
relabels, redrawn every step); no rollouts are sampled. Using the HF Trainer gives the project's
checkpoint behaviour unchanged (`cipr.train.checkpoint.CheckpointMixin`: `checkpoint-<step>/`
folders with optimizer, scheduler and RNG state, a `latest.json` tracker written after a save
completes, resume from it, a stop before applying a NaN/inf loss), LoRA via PEFT, and accelerate or
DeepSpeed where configured.

Choices:
- Teacher: with LoRA the teacher is the student's own base weights with the adapter disabled (no
  second copy in memory); without LoRA, a frozen deep copy taken before training, so a resumed run
  still distills from the released weights.
- A batch is `per_device_train_batch_size` trajectories; the loss is averaged as `loss.py` says and
  the Trainer scales it by gradient accumulation.
- Each step's relabeling seed is (relabel seed, trajectory id, optimizer step), so a resumed run
  redraws the same names.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import Trainer

from cipr.distill.batch import DistillItem, LossWeights, batch_loss, relabeled_view
from cipr.distill.evaluate import EvalConfig
from cipr.formats.base import CallFormat
from cipr.method.relabel import RelabelConfig
from cipr.train.checkpoint import CheckpointMixin, check_finite


@dataclass
class DistillConfig:
    """`algo=distill`: the weights of the loss terms, the relabeling, and the evaluation.

    - `token_weight`, `action_weight`: the task loss, KL(teacher original || student canonical) on
      aligned tokens and on action distributions at decisions (`cipr.distill.loss`).
    - `rescore_weight`: λ of the rescoring consistency KL (student canonical vs relabeled); 0 turns it off.
    - `detach_reference`: the canonical side of the rescoring KL is a fixed target (see `cipr.method.consistency`).
    - `relabel`: the fresh-name scheme (`cipr.method.relabel.RelabelConfig`).
    - `teacher_dtype`: "bfloat16" runs the frozen teacher in bfloat16 (its forward is inference only;
      faster on CPUs with AVX512-BF16); "model" keeps the loaded dtype. Without LoRA only.
    - `autocast_bf16`: on CPU, run the student's forward and backward under bfloat16 autocast (weights
      and optimizer stay float32); on a GPU use `trainer.precision=bf16` instead.
    """

    name: Literal["distill"] = "distill"
    names: Literal["canonical"] = "canonical"
    token_weight: float = 1.0
    action_weight: float = 1.0
    rescore_weight: float = 1.0
    detach_reference: bool = True
    eps: float = 1e-6
    teacher_dtype: Literal["model", "bfloat16"] = "model"
    autocast_bf16: bool = False
    relabel: RelabelConfig = field(default_factory=RelabelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def weights(self) -> LossWeights:
        return LossWeights(self.token_weight, self.action_weight, self.rescore_weight, self.detach_reference,
                           self.eps)


def check_distill(cfg: DistillConfig) -> None:
    """Reject weights that cannot mean what they say (ValueError naming the option)."""
    if min(cfg.token_weight, cfg.action_weight, cfg.rescore_weight) < 0:
        raise ValueError("algo.token_weight, algo.action_weight and algo.rescore_weight must be >= 0")
    if not (cfg.token_weight or cfg.action_weight):
        raise ValueError("algo.token_weight and algo.action_weight are both 0: the student would not learn from the "
                         "teacher (the rescoring term alone only makes it consistent with itself)")
    if cfg.eps < 0:
        raise ValueError("algo.eps must be >= 0")


class _Indices(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, int]:
        return {"index": i}


def collate_indices(rows: Sequence[dict[str, int]]) -> dict[str, torch.Tensor]:
    return {"index": torch.tensor([r["index"] for r in rows], dtype=torch.long)}


def teacher_for(student: Any, dtype: str = "model") -> tuple[Any, Callable[[], Any]]:
    """(teacher model, context to enter around its forwards): see the module docstring."""
    if hasattr(student, "disable_adapter") and hasattr(student, "peft_config"):
        if dtype != "model":
            raise ValueError("algo.teacher_dtype must be 'model' with LoRA: the teacher is the student's own base")
        return student, student.disable_adapter
    import copy

    teacher = copy.deepcopy(student)
    if dtype == "bfloat16":
        teacher.to(torch.bfloat16)
    teacher.requires_grad_(False)
    teacher.eval()
    return teacher, contextlib.nullcontext


class DistillTrainer(CheckpointMixin, Trainer):
    """HF Trainer over trajectory indices whose loss is the self-distillation loss of the batch."""

    def __init__(self, *, items: Sequence[DistillItem], fmt: CallFormat, algo: DistillConfig, teacher: Any,
                 teacher_context: Callable[[], Any], **kwargs: Any) -> None:
        kwargs.setdefault("data_collator", collate_indices)
        super().__init__(train_dataset=_Indices(len(items)), **kwargs)
        if teacher is not self.model:
            teacher.to(self.args.device)
        self.items = list(items)
        self.fmt = fmt
        self.algo = algo
        self.teacher = teacher
        self.teacher_context = teacher_context
        self._sums: dict[str, float] = defaultdict(float)
        self._count = 0

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        batch = [self.items[i] for i in inputs["index"].tolist()]
        tokenizer = self.processing_class
        relabeled = None
        if self.algo.rescore_weight > 0:
            step = self.state.global_step
            relabeled = [relabeled_view(it, self.fmt, tokenizer, self.algo.relabel,
                                        f"{self.algo.relabel.seed}\x1f{it.example.id}\x1f{step}") for it in batch]
        autocast = self.algo.autocast_bf16 and self.args.device.type == "cpu"
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, metrics = batch_loss(model, self.teacher, tokenizer, batch, relabeled, self.fmt, self.algo.weights,
                                       teacher_context=self.teacher_context, token_positions=self._positions)
        check_finite(loss, self.state.global_step, metrics)
        for k, v in metrics.items():
            self._sums[k] += v
        self._sums["distill/tokens_seen"] += float(sum(len(it.student_tokens.ids) for it in batch))
        self._count += 1
        return (loss, {}) if return_outputs else loss

    def _positions(self, local: int) -> float | None:
        """The token KL's divisor on several processes: every process's aligned positions over their number, so
        that the gradients DDP, FSDP and ZeRO average are those of the mean over all positions (None: one process)."""
        processes = self.accelerator.num_processes
        if processes == 1:
            return None
        total = self.accelerator.reduce(torch.tensor(float(local), device=self.args.device), reduction="sum")
        return max(float(total), 1.0) / processes

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.accelerator.num_processes > 1 and "loss" in logs:  # every process's micro-batches, not rank 0's
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
