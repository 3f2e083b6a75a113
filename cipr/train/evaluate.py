"""A quick held-out probe: greedy responses to held-out training prompts, scored by the GRPO reward.

Run before and after the warm start and before and after GRPO (`trainer.warm_start.eval_examples`
of the held-out prompts, the same ones each time), it shows what SFT and then GRPO did to the format
and correctness parts of ToolRL's reward and to the no-call rate (the untrained SmolLM2 does not
produce the format at all). Greedy decoding, left padding, batched HF `generate`; the model's
train/eval mode is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cipr.formats.base import CallFormat
from cipr.train.data import PromptRecord
from cipr.train.reward import RolloutScorer


@torch.no_grad()
def evaluate_prompts(model: Any, tokenizer: Any, records: Sequence[PromptRecord], fmt: CallFormat, *,
                     max_new_tokens: int, batch_size: int = 8) -> dict[str, float]:
    """Mean reward, format, correctness, no-call rate and response length over `records` (greedy)."""

    if not records:
        return {}
    stop = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    scorer = RolloutScorer(records, fmt, tokenizer, [i for i in stop if i is not None])
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    totals = {"reward": 0.0, "format": 0.0, "correctness": 0.0, "no_call_rate": 0.0, "completion_tokens": 0.0}
    try:
        for start in range(0, len(records), batch_size):
            chunk = list(records[start:start + batch_size])
            enc = tokenizer([r.prompt for r in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items()}
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            completions = out[:, enc["input_ids"].shape[1]:].tolist()
            trimmed = []
            for ids in completions:
                if tokenizer.eos_token_id in ids:
                    ids = ids[:ids.index(tokenizer.eos_token_id) + 1]
                trimmed.append(ids)
            for ids, rollout in zip(trimmed, scorer.score(trimmed, [r.row for r in chunk]), strict=True):
                totals["reward"] += rollout.reward
                totals["format"] += rollout.format
                totals["correctness"] += rollout.correctness
                totals["no_call_rate"] += float(rollout.no_call)
                totals["completion_tokens"] += len(ids)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return {k: v / len(records) for k, v in totals.items()}
