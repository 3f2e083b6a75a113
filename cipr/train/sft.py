"""Supervised fine-tuning with TRL's SFTTrainer: the warm start before GRPO, or `algo=sft` alone.

Each row is a prompt rendered by the call format and its target (reference calls and/or response,
rendered by the same format); the loss is on the target tokens only (TRL's `completion_only_loss`
for prompt/completion rows), and TRL appends the end-of-turn token the model config made `eos`, so
the model learns to stop. The trainer shares the checkpoint behaviour of the GRPO stage
(`CheckpointMixin`: tracked saves, data-order state, non-finite loss guard).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl import SFTConfig, SFTTrainer

from cipr.train.checkpoint import CheckpointMixin, check_finite
from cipr.train.data import PromptRecord


class WarmStartTrainer(CheckpointMixin, SFTTrainer):
    """TRL's SFTTrainer with tracked checkpoints and a stop on a NaN or infinite loss."""

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                   num_items_in_batch=num_items_in_batch)
        check_finite(out[0] if return_outputs else out, self.state.global_step)
        return out


def sft_dataset(records: Sequence[PromptRecord]) -> Any:
    """A `datasets.Dataset` with the prompt/completion columns SFTTrainer reads."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": r.prompt, "completion": r.target} for r in records])


def build_sft_trainer(model: Any, tokenizer: Any, records: Sequence[PromptRecord], args: dict[str, Any],
                      max_length: int | None, callbacks: Sequence[Any] = ()) -> WarmStartTrainer:
    """An SFT trainer over `records` with TrainingArguments fields `args` (see `schedule.common_args`)."""
    config = SFTConfig(**args, max_length=max_length, completion_only_loss=True, packing=False,
                       remove_unused_columns=True)
    return WarmStartTrainer(model=model, args=config, train_dataset=sft_dataset(records),
                            processing_class=tokenizer, callbacks=list(callbacks))
