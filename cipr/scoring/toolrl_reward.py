"""ToolRL's reward: format (0/1) plus tool-call correctness in [-3, 3].

A port of `verl/utils/reward_score/rlla.py` in ToolRL (github.com/qiancheng0/ToolRL:
`customize_format_reward_func`, `match_score`, `compute_tool_call_reward`,
`customize_correctness_reward_tool`, `compute_score`) with its default settings: every environment switch off
(REFINEDREWARD, COARSEREWARD, INTERMEDIATEREWARD, SCHEDULEREWARD, MAX1STEP30MAX3, CORRECTMAX1, WITHLENGTH), so
no length term.

The ground truth's shape comes from the Example, not its text: a `<tool_call>` block iff it has reference
calls, a `<response>` block iff `expects_response`.

- Format, on the completion stripped of surrounding whitespace (rlla.py strips the assistant turn): 1 if it
  matches, with `re.DOTALL`, the pattern for that shape and each of the shape's call/response tags occurs
  exactly once, else 0. Patterns: calls only `^<think>.*?</think>\\n<tool_call>\\n.*?\\n</tool_call>$`;
  response only `^<think>.*?</think>\\n<response>.*?</response>$`; both
  `^<think>.*?</think>\\n<tool_call>\\n.*?\\n</tool_call>\\n<response>.*?</response>$`; neither
  `^<think>.*?</think>$`. (The `<think>` tags are not counted, as in rlla.py.)
- Correctness: 0 when the ground truth has no calls (rlla.py does not score those). Otherwise the text between
  the first `<tool_call>` and the next `</tool_call>`, stripped and split on newlines, must give one JSON
  object per line with a "name"; missing tags, a line that is not JSON (blank lines included) or a malformed
  call -> -3. Equal call lists (same order, Python `==`) -> 3. Else `6 * S / S_max - 3` with `S = J(gt names,
  predicted names) + sum over gt calls of [J(gt keys, matched keys) + #gt arguments whose value equals (==)
  the matched call's]`, each gt call matched in order to the unused predicted call of the same name with the
  highest positive score (first on ties), and `S_max = 1 + sum over gt calls of (1 + #gt arguments)`. `J` is
  rlla.py's `match_score`: 1 for equal lists, 0 if either is empty, else the multiset Jaccard
  `|A ∩ B| / (|A| + |B| - |A ∩ B|)`.
- "A malformed call" is exactly what makes rlla.py's `compute_tool_call_reward` raise: a line whose JSON is
  not an object with "name", a name that is not hashable, or a call whose name matches a gt call but whose
  "parameters" is missing or not an object. A predicted call with another name needs no "parameters" (rlla.py
  never reads it).

Kept from rlla.py: the calls are read after the *first* `<tool_call>` and tags are counted over the whole
text, so reasoning that mentions a tag costs both terms: 17 of the 346 call targets in ToolRL's rlla_sft.json
score format 0, correctness -3 against their own reference (ToolRL uses that file for SFT, never as RL ground
truth).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from cipr.tools.interface import Call

FORMAT_MAX, FORMAT_MIN = 1.0, 0.0
CORRECT_MAX, CORRECT_MIN = 3.0, -3.0

_PATTERNS = {
    (True, False): r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$",
    (False, True): r"^<think>.*?</think>\n<response>.*?</response>$",
    (True, True): r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$",
    (False, False): r"^<think>.*?</think>$",
}
_ONCE = {
    (True, False): ("<tool_call>", "</tool_call>"),
    (False, True): ("<response>", "</response>"),
    (True, True): ("<tool_call>", "</tool_call>", "<response>", "</response>"),
    (False, False): (),
}


class _Malformed(Exception):
    """A predicted call list that rlla.py's scorer would raise on."""


def match_score(list1: Sequence[Any], list2: Sequence[Any]) -> float:
    """rlla.py's `match_score`: 1 for equal lists, 0 if one is empty, else multiset Jaccard."""
    if list(list1) == list(list2):
        return 1.0
    if not list1 or not list2:
        return 0.0
    c1, c2 = Counter(list1), Counter(list2)
    inter = sum(min(c1[k], c2[k]) for k in c1.keys() & c2.keys())
    union = len(list1) + len(list2) - inter
    return inter / union if union > 0 else 0.0


def format_reward(completion: str, *, expects_calls: bool, expects_response: bool) -> float:
    """1.0 if the stripped completion has the ground truth's shape (each of its tags once), else 0.0."""
    text = completion.strip()
    shape = (expects_calls, expects_response)
    ok = (re.search(_PATTERNS[shape], text, re.DOTALL) is not None
          and all(text.count(t) == 1 for t in _ONCE[shape]))
    return FORMAT_MAX if ok else FORMAT_MIN


def call_list_score(gt: Sequence[Mapping[str, Any]],
                    pd: Sequence[Mapping[str, Any]]) -> tuple[float, dict[str, float]]:
    """`compute_tool_call_reward` on {"name", "parameters"} dicts: (reward in [-3, 3], {"S", "S_max"}); raises
    `_Malformed` where rlla.py raises (the caller gives -3)."""
    if list(gt) == list(pd):
        n_max = 1.0 + sum(1.0 + len(g["parameters"]) for g in gt)
        return CORRECT_MAX, {"S": n_max, "S_max": n_max}
    for p in pd:
        if not isinstance(p, Mapping) or "name" not in p or not isinstance(p["name"], Hashable):
            raise _Malformed("a predicted call is not an object with a hashable 'name'")
    score = match_score([g["name"] for g in gt], [p["name"] for p in pd])
    s_max = 1.0
    used: set[int] = set()
    for g in gt:
        g_params = g["parameters"]
        s_max += 1.0 + len(g_params)
        best, best_score = -1, 0.0
        for i, p in enumerate(pd):
            if i in used or p["name"] != g["name"]:
                continue
            p_params = p.get("parameters")
            if not isinstance(p_params, Mapping):
                raise _Malformed(f"predicted call {i} to {p['name']!r} has no 'parameters' object")
            total = match_score(list(g_params.keys()), list(p_params.keys()))
            total += sum(1.0 for k, v in g_params.items() if k in p_params and p_params[k] == v)
            if total > best_score:
                best, best_score = i, total
        if best >= 0:
            used.add(best)
            score += best_score
    value = (CORRECT_MAX - CORRECT_MIN) * score / s_max + CORRECT_MIN
    return value, {"S": score, "S_max": s_max}


def correctness_reward(completion: str, reference_calls: Sequence[Call]) -> tuple[float, dict[str, Any]]:
    """Tool-call correctness in [-3, 3] (0 when no call is expected) and metrics: `status` ("no_reference",
    "missing_tags", "parse_error", "exact", "partial"), `S` and `S_max` when scored."""
    if not reference_calls:
        return 0.0, {"status": "no_reference"}
    text = completion.strip()
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return CORRECT_MIN, {"status": "missing_tags"}
    body = text.split("<tool_call>")[1].split("</tool_call>")[0].strip()
    gt = [{"name": c.name, "parameters": dict(c.arguments)} for c in reference_calls]
    try:
        pd = [json.loads(line) for line in body.split("\n")]
        value, m = call_list_score(gt, pd)
    except (json.JSONDecodeError, _Malformed) as e:
        return CORRECT_MIN, {"status": "parse_error", "error": str(e)}
    return value, {"status": "exact" if gt == pd else "partial", **m}


def toolrl_reward(completion_text: str, reference_calls: Sequence[Call],
                  expects_response: bool) -> tuple[float, dict[str, Any]]:
    """ToolRL's total reward = format (0/1) + correctness ([-3, 3]): (total, {"format", "correctness",
    "status", ...}). `reference_calls`: the ground truth's calls (empty without a `<tool_call>` block);
    `expects_response`: whether it has a `<response>` block."""
    fmt = format_reward(completion_text, expects_calls=bool(reference_calls),
                        expects_response=expects_response)
    corr, m = correctness_reward(completion_text, reference_calls)
    return fmt + corr, {"format": fmt, "correctness": corr, **m}
