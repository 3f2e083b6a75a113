"""RoTBench's three criteria (Tool Selection, Parameter Identification, Content Filling) for one prediction.

A port of `ts_eval`, `pi_eval` and `cf_eval` in RoTBench's `Code/Evaluation/evaluate.py`
(github.com/Junjie-Ye/RoTBench, commit 3f04317, non-Raven path `version=0`). For accepted answers a_1..a_k
(gold calls) and a predicted call p, each criterion scans the answers in order and passes at the first one
that satisfies it:

- Tool Selection: same action name.
- Parameter Identification: same name and key set.
- Content Filling: same name, same key set, and equal values after deleting, from both sides, the keys whose
  gold value is the string "None". Values are not compared when the gold action is `finish` or `ask_to_user`,
  which RoTBench identifies by position (the last and second-to-last declared tools, whatever their names at a
  noisy level) or by those literal names.

Reproduced exactly, quirks included (published numbers depend on them):
- A prediction named `finish` matches a gold answer calling the last declared tool, and from then on the
  prediction's name is that tool's for the remaining answers of the item.
- A prediction whose Action Input is empty (`{}`) or not a JSON object fails all three criteria, even when the
  gold input is empty too: 84 of the 1,912 accepted answers over all files have an empty input (e.g.
  `get_today_date`), and 77 items accept nothing else, so no prediction passes them.
- Content Filling deletes the "None" keys from the prediction in place, so a later answer of the same item is
  compared against the reduced prediction: 24 accepted answers, predicted verbatim, fail Content Filling
  because an earlier answer removed a key they need.
`replicate_quirks=False` lifts these two (empty inputs become ordinary, each answer is compared against the
unreduced prediction); the default reproduces the benchmark.
- Values compare with Python `==` after `json.loads` (so 1 == 1.0, and "1" != 1).

Parsing generated text is the ReAct call format's job; `parse_prediction` is RoTBench's own extraction, for
exact replication of its numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cipr.formats.react import extract_action
from cipr.tools.interface import Call, Example

CRITERIA = ("tool_selection", "parameter_identification", "content_filling")


def parse_prediction(text: str) -> Call | None:
    """A model's ReAct output as RoTBench reads it (`get_test_value`); None where RoTBench fails it: a missing
    marker, an input that is not JSON or not a JSON object (RoTBench skips a string and would crash on other
    non-objects)."""
    ext = extract_action(text)
    if ext is None:
        return None
    name, raw = ext
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return Call(name, args) if isinstance(args, dict) else None


def _passes(stage: int, pred: Call, answers: Sequence[Call], finish_name: str | None,
            ask_name: str | None, in_place: bool) -> bool:
    """One of RoTBench's loops: stage 1 tool selection, 2 parameter identification, 3 content filling."""
    test_action = pred.name
    test_input: dict[str, Any] = dict(pred.arguments)
    for ans in answers:
        if not in_place:
            test_input = dict(pred.arguments)
        answer_action = ans.name
        answer_input: dict[str, Any] = dict(ans.arguments)
        if answer_action == finish_name and test_action == "finish":
            test_action = answer_action
        if answer_action != test_action:
            continue
        if stage == 1:
            return True
        if answer_input.keys() != test_input.keys():
            continue
        if stage == 2:
            return True
        if answer_action == finish_name:
            answer_action = "finish"
        if answer_action == ask_name:
            answer_action = "ask_to_user"
        for key in [k for k, v in answer_input.items() if v == "None"]:
            del answer_input[key]
            del test_input[key]
        if answer_input != test_input and answer_action not in ("finish", "ask_to_user"):
            continue
        return True
    return False


def rotbench_criteria(pred: Call | None, answers: Sequence[Call], *, finish_name: str | None,
                      ask_name: str | None, replicate_quirks: bool = True) -> dict[str, float]:
    """The three criteria (1.0 pass / 0.0 fail) of a prediction (None: a parse failure) against the gold calls
    `answers` in file order (reference, then alternatives); `finish_name` and `ask_name` name the last and
    second-to-last declared tools of the item's original interface."""
    if pred is None or not isinstance(pred.arguments, Mapping) or (replicate_quirks and not pred.arguments):
        return {c: 0.0 for c in CRITERIA}
    return {c: float(_passes(stage, pred, answers, finish_name, ask_name, replicate_quirks))
            for stage, c in enumerate(CRITERIA, start=1)}


def accepted_answers(example: Example) -> tuple[Call, ...]:
    """An Example's accepted answers in RoTBench's order: the reference call, then each alternative."""
    out = list(example.reference)
    for alt in example.alternatives:
        out.extend(alt)
    return tuple(out)


def content_filling(pred: Call | None, example: Example, *,
                    replicate_quirks: bool = True) -> tuple[float, dict[str, float]]:
    """RoTBench's Content-Filling verdict (1.0 / 0.0) on a loaded RoTBench Example, and metrics with all three
    criteria and `parse_failed`. The `finish`/`ask_to_user` names come from `meta` (set by the loader), else
    from the interface."""
    names = example.interface.names
    finish_name = example.meta.get("finish_tool", names[-1] if names else None)
    ask_name = example.meta.get("ask_tool", names[-2] if len(names) > 1 else None)
    metrics = rotbench_criteria(pred, accepted_answers(example), finish_name=finish_name, ask_name=ask_name,
                                replicate_quirks=replicate_quirks)
    metrics["parse_failed"] = float(pred is None)
    return metrics["content_filling"], metrics
