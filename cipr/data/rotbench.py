"""RoTBench (Junjie-Ye/RoTBench, `Data/`): First_Turn and Third_Turn at five noise levels, as Examples.

Each file is a JSON list of `{"id", "conversations", "scenario"}`. The first turn is the system prompt,
embedding the tool list as one JSON array (`[{"name", "description", "parameters"}]`) between a fixed preamble
and `\\n\\nLet's Begin!`. The last turn (`from: assistant`) lists the accepted answers, each
`Thought:\\nAction: <name>\\nAction Input: {json}`. Third_Turn items carry two earlier assistant turns, each
followed by a `function` result (or a `user` reply to ask_to_user). Noisy levels perturb tool and argument
names in the prompt, and the gold answers use those names. Counts: First_Turn clean/slight/medium/heavy/union
105/210/210/210/105, Third_Turn 70/140/140/140/70, seven scenarios (TG, RS, DU, PL, AM, IR, FT) in equal
shares.

Choices:
- The system prompt is not a Message (its tool list is the Interface); its text before and after the array is
  in `meta["system_prefix"]`/`meta["system_suffix"]`, so `prefix + render_tool_list(interface) + suffix`
  reproduces it (tested on every item).
- The user turn keeps its text verbatim (RoTBench's trailing `\\nBegin!\\n` included).
- Earlier assistant turns become assistant messages with one call and the thought as content; `function` turns
  become tool messages named after the preceding call.
- `reference` is the first accepted answer's call, `alternatives` the others (file order). Gold values "None"
  (RoTBench's "any value") are kept; the scorer drops those keys.
- RoTBench's scorer treats the last two declared tools as `finish` and `ask_to_user` whatever their names at a
  noisy level, so their names are recorded in `meta["finish_tool"]`/`meta["ask_tool"]` (robust to later
  perturbation).
- Ids repeat inside noisy files (each query under two noise draws), so an Example's id is
  `rotbench/<split>/<level>/<position>`, the original in `meta["original_id"]`.
- The source's F1 toolkit declares `drivers` twice (38 items over all files): kept, noted in `meta["issues"]`
  and counted by `rotbench_stats`; `strict=True` raises.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import read_json_list
from cipr.data.paths import data_root, require_dir
from cipr.formats.react import extract_action
from cipr.tools.interface import Call, Example, Interface, Message, Tool

SPLITS = ("First_Turn", "Third_Turn")
LEVELS = ("clean", "slight", "medium", "heavy", "union")
SCENARIOS = {"TG": "Text Generation", "RS": "Real-Time Search", "DU": "Data Understanding",
             "PL": "Personal Life", "AM": "Application Manipulation", "IR": "Information Retrieval",
             "FT": "Financial Transactions"}


def parse_answer(text: str, *, file: str = "<answer>", item: str | None = None,
                 field: str = "answer") -> tuple[Call, str]:
    """A gold/earlier ReAct turn as (Call, thought). Raises DataError when it does not parse."""
    ext = extract_action(text)
    if ext is None:
        raise DataError(f"not 'Thought: ...\\nAction: ...\\nAction Input: ...': {text[:200]!r}", file=file,
                        item=item, field=field)
    name, raw = ext
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        raise DataError(f"Action Input is not valid JSON: {e}", file=file, item=item, field=field) from e
    if not isinstance(args, dict):
        raise DataError(f"Action Input is not a JSON object: {raw[:200]!r}", file=file, item=item,
                        field=field)
    thought = text[:text.find("Action:")]
    thought = thought.removeprefix("Thought:").strip()
    return Call(name, args), thought


def render_tool_list(interface: Interface) -> str:
    """The tool array of a RoTBench system prompt (`json.dumps` of name/description/parameters)."""
    return json.dumps([{"name": t.name, "description": t.description, "parameters": dict(t.parameters)}
                       for t in interface])


def parse_system(text: str, *, file: str, item: str) -> tuple[Interface, str, str]:
    """The tools embedded in a RoTBench system prompt, and the text before and after the array."""
    start = text.find("[")
    if start < 0:
        raise DataError("system prompt has no tool array", file=file, item=item, field="conversations[0]")
    try:
        tools, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise DataError(f"tool array is not valid JSON: {e}", file=file, item=item,
                        field="conversations[0]") from e
    if not isinstance(tools, list) or not tools:
        raise DataError("tool array is empty or not a list", file=file, item=item, field="conversations[0]")
    parsed = tuple(Tool.from_openai(t, where=file, item=item) for t in tools)
    return Interface(parsed), text[:start], text[end:]


def _example(obj: Any, i: int, file: str, split: str, level: str, strict: bool) -> Example:
    ex_id = f"rotbench/{split}/{level}/{i:03d}"
    if not isinstance(obj, Mapping) or not isinstance(obj.get("conversations"), list):
        raise DataError("item is not {id, conversations, scenario}", file=file, item=ex_id,
                        field="conversations")
    conv = obj["conversations"]
    for j, turn in enumerate(conv):
        if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
            raise DataError("turn is not {from, value}", file=file, item=ex_id, field=f"conversations[{j}]")
    if len(conv) < 3 or conv[0]["from"] != "system" or conv[1]["from"] != "user" \
            or conv[-1]["from"] != "assistant":
        raise DataError(f"expected system, user, ..., assistant turns, got {[t['from'] for t in conv]}",
                        file=file, item=ex_id, field="conversations")
    if not isinstance(conv[0]["value"], str):
        raise DataError("system prompt is not a string", file=file, item=ex_id, field="conversations[0]")
    interface, prefix, suffix = parse_system(conv[0]["value"], file=file, item=ex_id)
    messages: list[Message] = []
    last_call: Call | None = None
    for j, turn in enumerate(conv[1:-1], start=1):
        role, value, field = turn["from"], turn["value"], f"conversations[{j}]"
        if not isinstance(value, str):
            raise DataError("turn value is not a string", file=file, item=ex_id, field=field)
        if role == "user":
            messages.append(Message("user", value))
        elif role == "assistant":
            last_call, thought = parse_answer(value, file=file, item=ex_id, field=field)
            messages.append(Message("assistant", thought, (last_call,)))
        elif role == "function":
            messages.append(Message("tool", value, name=last_call.name if last_call else None))
        else:
            raise DataError(f"unknown turn role {role!r}", file=file, item=ex_id, field=field)
    answers = conv[-1]["value"]
    field = f"conversations[{len(conv) - 1}]"
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DataError("the last assistant turn must be a non-empty list of answers", file=file, item=ex_id,
                        field=field)
    calls = [parse_answer(a, file=file, item=ex_id, field=f"{field}[{k}]")[0] for k, a in enumerate(answers)]
    issues = [f"gold answer {k} names undeclared tool {c.name!r}" for k, c in enumerate(calls)
              if c.name not in interface]
    dup = interface.duplicate_names()
    if dup:
        issues.append(f"the prompt declares tool names more than once: {list(dup)}")
    if issues and strict:
        raise DataError("; ".join(issues), file=file, item=ex_id, field="conversations[0]" if dup else field)
    scenario = obj.get("scenario")
    if scenario not in SCENARIOS:
        raise DataError(f"unknown scenario {scenario!r}", file=file, item=ex_id, field="scenario")
    names = interface.names
    meta = {"original_id": obj.get("id"), "scenario": scenario, "split": split, "level": level, "index": i,
            "system_prefix": prefix, "system_suffix": suffix, "answers": tuple(answers),
            "finish_tool": names[-1], "ask_tool": names[-2] if len(names) > 1 else None,
            "issues": tuple(issues)}
    return Example(id=ex_id, messages=tuple(messages), interface=interface, reference=(calls[0],),
                   alternatives=tuple((c,) for c in calls[1:]), source="rotbench",
                   partition=f"{split}/{level}", meta=meta)


def rotbench_file(root: str | Path | None = None, split: str = "First_Turn", level: str = "clean") -> Path:
    """Path of one RoTBench file under the data root (`<root>/rotbench/<split>/<level>.json`)."""
    if split not in SPLITS:
        raise ConfigError(f"unknown RoTBench split {split!r}; choose one of {', '.join(SPLITS)}")
    if level not in LEVELS:
        raise ConfigError(f"unknown RoTBench level {level!r}; choose one of {', '.join(LEVELS)}")
    base = require_dir(data_root(root) / "rotbench", "RoTBench data")
    return base / split / f"{level}.json"


def load_rotbench_file(path: str | Path, split: str, level: str, *, strict: bool = False) -> list[Example]:
    """Every item of one RoTBench JSON file (split and level name the Examples and their partition)."""
    data = read_json_list(path, "RoTBench file")
    return [_example(obj, i, str(path), split, level, strict) for i, obj in enumerate(data)]


def load_rotbench(root: str | Path | None = None, split: str = "First_Turn", level: str = "clean", *,
                  strict: bool = False) -> list[Example]:
    """RoTBench items of one split (First_Turn, Third_Turn) and noise level (clean ... union)."""
    return load_rotbench_file(rotbench_file(root, split, level), split, level, strict=strict)


def rotbench_stats(root: str | Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Per split and level: items, accepted answers, items with alternatives, scenarios, data issues."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for split in SPLITS:
        out[split] = {}
        for level in LEVELS:
            exs = load_rotbench(root, split, level)
            out[split][level] = {
                "items": len(exs),
                "accepted_answers": sum(1 + len(e.alternatives) for e in exs),
                "with_alternatives": sum(1 for e in exs if e.alternatives),
                "scenarios": dict(sorted(Counter(e.meta["scenario"] for e in exs).items())),
                "items_with_issues": sum(1 for e in exs if e.meta["issues"]),
            }
    return out
