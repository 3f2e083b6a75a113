"""Replayed episodes: assistant turns drawn from a script instead of sampled from the policy.

A random tiny model never writes a tool call, so multi-turn tests give the GRPO trainer a `rollout_source`
that replays these turns (as `cipr.train.replay.replay_rollouts` does for single turns): everything else, the
episode loop, the environment, the ids between turns, rewards and losses, is the trainer's own code. Each
context the loop hands over is located (its row, by the prompt it starts with; its assistant message index
m, by the generation prompts after it) and `choose(row, m, generator)` gives the turn's text. The generator
is seeded by the context's ids and how many times this step has already drawn for that context, so one
process and two draw the same turns for the same episodes (the distributed tier compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from zlib import crc32

import torch

from cipr.tools.interface import Call
from cipr.train.episodes import EpisodeRunner

Choose = Callable[[int, int, torch.Generator], str]


class EpisodeReplay:
    """Replayed turns for multi-turn GRPO (`generate`, from a `rollout_source`); `sampled` records (row, m,
    ids) per turn."""

    def __init__(self, runner: EpisodeRunner, choose: Choose) -> None:
        self.runner, self.choose = runner, choose
        tok = runner.tokenizer
        self.rows: dict[tuple[int, ...], int] = {}
        for row in range(len(runner.episodes.records)):
            self.rows.setdefault(tuple(runner.prompt_ids(row)), row)
        self.lengths = sorted({len(k) for k in self.rows}, reverse=True)
        chat = [{"role": "user", "content": "x"}]
        with_prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        without = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        self.generation_ids = tok(with_prompt[len(without):], add_special_tokens=False)["input_ids"]
        self.drawn: dict[tuple[int, ...], int] = {}
        self.step: int | None = None
        self.sampled: list[tuple[int, int, list[int]]] = []

    def locate(self, context: Sequence[int]) -> tuple[int, int]:
        """(row, assistant message index) of a context."""
        for n in self.lengths:
            row = self.rows.get(tuple(context[:n]))
            if row is not None:
                rest, g = list(context[n:]), self.generation_ids
                m = sum(1 for i in range(len(rest) - len(g) + 1) if rest[i:i + len(g)] == g)
                return row, m
        raise KeyError("a context the replay was not built for reached generation")

    def generate(self, prompt_ids: Sequence[Sequence[int]], images: Any = None, multimodal_fields: Any = None,
                 num_generations: int = 1, has_tool_images: bool = False, *, step: int = 0
                 ) -> tuple[list[list[int]], None]:
        if step != self.step:
            self.step, self.drawn = step, {}
        tok = self.runner.tokenizer
        out = []
        for context in prompt_ids:
            key = tuple(context)
            n = self.drawn.get(key, 0)
            self.drawn[key] = n + 1
            row, m = self.locate(context)
            generator = torch.Generator().manual_seed(crc32(str(key).encode()) * 1_000_003 + n)
            text = self.choose(row, m, generator)
            ids = tok(text + tok.eos_token, add_special_tokens=False)["input_ids"]
            self.sampled.append((row, m, list(ids)))
            out.append(list(ids))
        return out, None


def expert_script(runner: EpisodeRunner, row: int) -> list[list[Call] | None]:
    """ToyShop's scripted expert for `row` under the row's names: one assistant message per call, and an
    answer (None) closing each user turn."""
    names = runner.episodes.names[row]
    back_args = {w: {o: a for a, o in t[1].items()} for w, t in names.back.items() if t is not None}
    shop = runner.factory()
    script: list[list[Call] | None] = []
    for turn in shop.expert_calls(runner.episodes.tasks[row]):
        for call in turn:
            written = names.forward.get(call.name, call.name)
            args = back_args.get(written, {})
            script.append([Call(written, {args.get(k, k): v for k, v in call.arguments.items()})])
        script.append(None)
    return script


def expert_choice(runner: EpisodeRunner, *, follow: float = 0.75, answer: str = "Done.") -> Choose:
    """Message m of a row's expert script with probability `follow`; otherwise a call to another declared tool
    of the row (a twin, on a perturbed row, when one is drawn) with the script's arguments."""
    fmt = runner.fmt
    scripts: dict[int, list[list[Call] | None]] = {}

    def choose(row: int, m: int, generator: torch.Generator) -> str:
        if row not in scripts:
            scripts[row] = expert_script(runner, row)
        script = scripts[row]
        step = script[m] if m < len(script) else None
        if float(torch.rand((), generator=generator)) < follow or step is None:
            return fmt.render_target(step or (), response=None if step else answer)
        tools = [t for t in runner.episodes.records[row].tools if t != step[0].name]
        other = tools[int(torch.randint(len(tools), (), generator=generator))]
        return fmt.render_target([Call(other, step[0].arguments)])

    return choose
