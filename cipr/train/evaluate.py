"""A quick held-out probe: greedy responses to held-out training prompts, scored by the GRPO reward.

Run before and after the warm start and GRPO on the same `trainer.warm_start.eval_examples` held-out
prompts, it shows what SFT and GRPO did to the reward's format and correctness parts and the no-call
rate. Greedy decoding with the evaluation's stop tokens (`cipr.runtime.generation.greedy_texts`); the
model's train/eval mode is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cipr.formats.base import CallFormat
from cipr.runtime.generation import end_token_ids, greedy_texts
from cipr.train.data import PromptRecord
from cipr.train.reward import RolloutScorer


@torch.no_grad()
def evaluate_prompts(model: Any, tokenizer: Any, records: Sequence[PromptRecord], fmt: CallFormat, *,
                     max_new_tokens: int, batch_size: int = 8) -> dict[str, float]:
    """Mean reward, format, correctness, no-call rate and response length over `records` (greedy)."""
    if not records:
        return {}
    rows = greedy_texts(model, tokenizer, [r.prompt for r in records], max_new_tokens=max_new_tokens,
                        batch_size=batch_size)
    scorer = RolloutScorer(records, fmt, tokenizer, sorted(end_token_ids(tokenizer, model)))
    ids = [row for row, _ in rows]
    totals = {"reward": 0.0, "format": 0.0, "correctness": 0.0, "no_call_rate": 0.0, "completion_tokens": 0.0}
    for row, rollout in zip(ids, scorer.score(ids, [r.row for r in records]), strict=True):
        totals["reward"] += rollout.reward
        totals["format"] += rollout.format
        totals["correctness"] += rollout.correctness
        totals["no_call_rate"] += float(rollout.no_call)
        totals["completion_tokens"] += len(row)
    return {k: v / len(records) for k, v in totals.items()}
