"""Replayed rollouts: completions drawn from fixed candidate texts instead of sampled from the policy.

Tests and scripts need rollouts that make tool calls from the first step (a tiny random model never does),
identical across algorithms. `replay_rollouts()` is a `rollout_source` for the GRPO trainer
(`cipr.train.grpo`; `cipr.train.run.run(cfg, rollout_source=replay_rollouts())`): it stands in where TRL
turns prompt ids into completion ids, so everything after it (rewards, advantages, losses, checkpoints) is
the trainer's own code.

For each prompt row the candidates are: the reference target (correct); the target with its first
call sent to another declared tool (on the perturbed side the called tool's degraded twin when it
has one: a twin call); a text answer without a call; and text outside the format. Each completion
is drawn with the global torch RNG, so a run resumed from a checkpoint (whose RNG state the Trainer
restores) draws what the uninterrupted run drew. With `draw="per_prompt"` the n-th completion of a prompt
comes instead from a generator seeded by the prompt's tokens and n, so a run split over several processes
draws for each prompt what one process drew (the distributed tier compares the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal
from zlib import crc32

import torch

from cipr.formats.base import CallFormat
from cipr.train.data import PromptRecord

NO_CALL_TEXT = "I cannot help with that request."
OFF_FORMAT_TEXT = "Let me think about which tool to use"


def candidates(record: PromptRecord, fmt: CallFormat) -> list[str]:
    """Candidate completions of one prompt row (see module docstring); the first is the reference."""
    out = [record.target]
    reference = record.example.reference
    if reference:
        called = reference[0].name
        tools = list(record.tools)
        index = tools.index(called) if called in tools else -1
        other = None
        if index >= 0 and record.side == "perturbed":
            other = next((t for t, of in zip(tools, record.twin_of, strict=True) if of == called), None)
        if other is None:
            other = next((t for t in tools if t != called), None)
        if other is not None:
            calls = (replace(reference[0], name=other), *reference[1:])
            out.append(fmt.render_target(calls, response=record.example.response))
    out.append(fmt.render_target((), response=NO_CALL_TEXT))
    out.append(OFF_FORMAT_TEXT)
    return out


class ReplayRollouts:
    """Completions drawn from `candidates` for the prompts it is called with."""

    def __init__(self, records: Sequence[PromptRecord], fmt: CallFormat, tokenizer: Any, *,
                 max_completion_length: int, draw: Literal["global", "per_prompt"] = "global") -> None:
        self.tokenizer = tokenizer
        self.draw = draw
        self.drawn: dict[tuple[int, ...], int] = {}
        self.max_completion_length = max_completion_length
        prompt_ids = tokenizer(text=[r.prompt for r in records])["input_ids"]
        self.by_prompt: dict[tuple[int, ...], list[list[int]]] = {}
        for record, ids in zip(records, prompt_ids, strict=True):
            texts = [t + tokenizer.eos_token for t in candidates(record, fmt)]
            encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
            self.by_prompt[tuple(ids)] = [list(e)[:max_completion_length] for e in encoded]

    def __call__(self, prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], None]:
        """One completion per prompt (no sampler log-probabilities)."""
        out = []
        for ids in prompt_ids:
            options = self.by_prompt.get(tuple(ids))
            if options is None:
                raise KeyError("a prompt the replay was not built for reached generation")
            generator = None
            if self.draw == "per_prompt":
                key = tuple(ids)
                n = self.drawn.get(key, 0)
                self.drawn[key] = n + 1
                generator = torch.Generator().manual_seed(crc32(str(key).encode()) * 1_000_003 + n)
            k = int(torch.randint(len(options), (), generator=generator).item())
            out.append(list(options[k]))
        return out, None



def replay_rollouts(draw: Literal["global", "per_prompt"] = "global") -> Callable[[Any], ReplayRollouts]:
    """A `rollout_source` (`cipr.train.grpo.RolloutSource`): each trainer replays its own prompt set."""

    def source(trainer: Any) -> ReplayRollouts:
        return ReplayRollouts(trainer.prompt_set.records, trainer.fmt, trainer.processing_class,
                              max_completion_length=trainer.max_completion_length, draw=draw)

    return source
