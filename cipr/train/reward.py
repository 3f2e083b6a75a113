"""The GRPO reward: ToolRL's format + correctness, and per-rollout facts the metrics need.

`RolloutScorer`, the reward function handed to TRL, decodes each completion itself keeping special
tokens (TRL's decode drops them, and `<tool_call>` is one in Qwen vocabularies), strips the trailing
end-of-turn/pad tokens, and scores it against the row's reference under its names. Calling a degraded
twin earns what any wrong call earns (paper, Appendix A).

With the `toolrl` call format the reward is `cipr.scoring.toolrl_reward` exactly. Other formats
(Hermes/Qwen native calls, ReAct) have no ToolRL tags, so the format part is the call format's own
parse check (1 when the text parses and makes calls exactly when the reference does) and the
correctness part is rlla.py's call-list score on the parsed calls (-3 when nothing parses), so the
two parts keep ToolRL's ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cipr.formats.base import CallFormat, Decision
from cipr.scoring.toolrl_reward import CORRECT_MAX, CORRECT_MIN, _Malformed, call_list_score, toolrl_reward
from cipr.tools.interface import Call, Example
from cipr.train.data import PromptRecord


@dataclass(frozen=True)
class Rollout:
    """One scored completion: its text (no end-of-turn token), what it did, and its reward parts."""

    row: int
    text: str
    ended: bool
    decisions: tuple[Decision, ...]
    calls: tuple[Call, ...]
    twin_calls: int
    format: float
    correctness: float

    @property
    def reward(self) -> float:
        return self.format + self.correctness

    @property
    def no_call(self) -> bool:
        return not self.calls


def generic_reward(fmt: CallFormat, text: str, example: Example) -> tuple[float, float]:
    """(format, correctness) for a call format without ToolRL's tags (see module docstring)."""
    parsed = fmt.parse(text)
    shape_ok = parsed.ok and bool(parsed.calls) == bool(example.reference)
    if not example.reference:
        return float(shape_ok), 0.0
    if not parsed.calls:
        return float(shape_ok), CORRECT_MIN
    gt = [{"name": c.name, "parameters": dict(c.arguments)} for c in example.reference]
    pd = [{"name": c.name, "parameters": dict(c.arguments)} for c in parsed.calls]
    try:
        value, _ = call_list_score(gt, pd)
    except _Malformed:
        value = CORRECT_MIN
    return float(shape_ok), max(CORRECT_MIN, min(CORRECT_MAX, value))


def score_text(fmt: CallFormat, text: str, record: PromptRecord) -> Rollout:
    """Reward parts and decisions of one completion text for one prompt row."""
    example = record.example
    if fmt.name == "toolrl":
        _, parts = toolrl_reward(text, example.reference, record.expects_response)
        form, corr = float(parts["format"]), float(parts["correctness"])
    else:
        form, corr = generic_reward(fmt, text, example)
    calls = fmt.parse(text).calls
    twin_names = {name for name, twin in zip(record.tools, record.twins, strict=True) if twin}
    twin_calls = sum(1 for c in calls if c.name in twin_names)
    return Rollout(record.row, text, True, tuple(fmt.decisions(text)), tuple(calls), twin_calls, form, corr)


@dataclass(frozen=True)
class BatchRow:
    """One row of a GRPO batch as the loss receives it: the prompt's record (its side, pair, tools and their
    equivalence classes) and what was sampled for it (a `Rollout`, or an `cipr.train.episodes.Episode`).
    Built where the generation batch is scored, so the loss never looks a record up by row id."""

    record: PromptRecord
    rollout: Any


class RolloutScorer:
    """TRL reward function over the prompt rows; keeps the last batch's `Rollout`s for the trainer."""

    __name__ = "toolrl"

    def __init__(self, records: Sequence[PromptRecord], fmt: CallFormat, tokenizer: Any,
                 stop_ids: Sequence[int]) -> None:
        self.records = list(records)
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.stop_ids = set(int(i) for i in stop_ids)
        self.last: list[Rollout] = []

    def decode(self, ids: Sequence[int]) -> tuple[str, bool]:
        """(text without the trailing end-of-turn/pad tokens, whether the completion ended on one)."""
        ids = list(ids)
        ended = False
        while ids and ids[-1] in self.stop_ids:
            ids.pop()
            ended = True
        return self.tokenizer.decode(ids, skip_special_tokens=False), ended

    def score(self, completion_ids: Sequence[Sequence[int]], rows: Sequence[int]) -> list[Rollout]:
        out = []
        for ids, row in zip(completion_ids, rows, strict=True):
            text, ended = self.decode(ids)
            rollout = score_text(self.fmt, text, self.records[int(row)])
            out.append(Rollout(rollout.row, text, ended, rollout.decisions, rollout.calls, rollout.twin_calls,
                               rollout.format, rollout.correctness))
        return out

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]], row_id: Sequence[int], log_metric: Any = None,
                 **_: Any) -> list[float]:
        self.last = self.score(completion_ids, row_id)
        if log_metric is not None and self.last:
            n = len(self.last)
            log_metric("reward/format", sum(r.format for r in self.last) / n)
            log_metric("reward/correctness", sum(r.correctness for r in self.last) / n)
        return [r.reward for r in self.last]
