"""ToolRL (qiancheng0/ToolRL, `dataset/`): the verl RL parquet and the raw SFT JSON, as Examples.

Both hold three texts per item: an `instruction` (system prompt listing the tools as
`1. Name: ...\\nDescription: ...\\nParameters: {...}`), an `input` (`**Dialogue Records History**` then
`<user>`, `<think>`, `<tool_call>`, `<response>` and `<obs>` blocks), and a target
`<think>...</think>\\n<tool_call>\\n{"name": ..., "parameters": {...}}\\n...\\n</tool_call>` and/or
`<response>...</response>`. The verl parquet stores them as `prompt` ([system, user] messages),
`reward_model.ground_truth` and `extra_info` (index, split); the SFT JSON as a list of {"instruction",
"input", "output"}. The 3,920-row `train.parquet` loads by path with `load_toolrl_parquet`.

Choices (the data leaves them open):
- Parameters. ToolRL's dialect is `{arg: {"description", "type", "default"}}` with Python-ish type strings
  ("int", "str, optional", "List[float]", "Callable[[float], float]"). Each becomes a JSON Schema property:
  the type mapped (`_json_type`; unknown types such as Callable stay untyped), `default` kept unless ""
  (ToolRL's "no default"), the original type string kept under `x-toolrl-type` for `toolrl_parameters`. No
  argument is required: the dialect has no such flag, and neither ", optional" nor an empty default predicts
  it (115 reference calls in rlla_sft.json + test.parquet omit an argument that has neither), so any rule
  would make real reference calls invalid.
- The system prompt is not a Message (its tool list is the Interface); its text before and after the tool
  block is in `meta["system_prefix"]`/`meta["system_suffix"]`.
- History: `<user>` -> user message; each assistant turn (`<think>`, `<tool_call>`, `<response>`) -> one
  assistant message, calls the tool calls, content the response text (think text to `meta["history_think"]`,
  one entry per assistant message); `<obs>` -> a tool message with the raw text, named after the turn's tool
  when that turn made exactly one call.
- Target: `reference` = the calls, `response` = the response text (stripped), `meta["think"]` = the reasoning,
  `meta["target"]` = the raw target text.
- Bad structure (unreadable file, missing columns, a tool block or target off the format, call lines that are
  not `{"name": str, "parameters": object}` JSON) raises `DataError` naming the file, item and field. Content
  problems in the published data are kept and reported, so the counts stay those of the files: a reference
  call to an undeclared tool (test.parquet 1 item, a truncated tool name; rlla_sft.json 1), an undeclared
  argument (rlla_sft.json 8 items, the released target's JSON split at a comma inside a value), a tool
  declared twice (rlla_sft.json 1). They are listed in `meta["issues"]` and counted by `summarize`;
  `strict=True` raises instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError, MissingInputError
from cipr.core.io import read_json_list, read_parquet_rows
from cipr.data.paths import data_root
from cipr.tools.interface import Call, Example, Interface, Message, Tool

HISTORY_HEADER = "**Dialogue Records History**"
_ENTRY = re.compile(r"(\d+)\. Name: (.*)")
_BLOCK = re.compile(r"<(user|think|tool_call|response|obs)>(.*?)</\1>", re.S)
_TARGET = re.compile(r"<think>(?P<think>.*?)</think>\n(?:<tool_call>\n(?P<calls>.*?)\n</tool_call>)?\n?"
                     r"(?:<response>(?P<response>.*?)</response>)?\Z", re.S)

_SCALARS = {"str": "string", "string": "string", "text": "string", "int": "integer", "integer": "integer",
            "float": "number", "number": "number", "double": "number", "decimal": "number",
            "bool": "boolean", "boolean": "boolean", "dict": "object", "object": "object", "list": "array",
            "array": "array", "tuple": "array", "set": "array", "none": "null", "nonetype": "null",
            "null": "null"}


@dataclass(frozen=True)
class _Item:
    id: str
    instruction: str
    input: str
    output: str
    partition: str
    extra: Mapping[str, Any]


def _split_top(s: str) -> list[str]:
    """Split `a, b[c, d], e` at top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _json_type(t: str) -> dict[str, Any]:
    """JSON Schema for a ToolRL/Python type string ("int", "List[float]", "Union[int, float]", ...)."""
    t = t.strip()
    m = re.fullmatch(r"(?i)(optional)\[(.*)\]", t)
    if m:
        return _json_type(m.group(2))
    m = re.fullmatch(r"(?i)(list|tuple|set|sequence|array)\[(.*)\]", t)
    if m:
        inner = _split_top(m.group(2))
        items = _json_type(inner[0]) if len(inner) == 1 else {}
        return {"type": "array", "items": items} if items else {"type": "array"}
    m = re.fullmatch(r"(?i)(dict|mapping)\[(.*)\]", t)
    if m:
        return {"type": "object"}
    m = re.fullmatch(r"(?i)union\[(.*)\]", t)
    if m:
        parts = [_json_type(p) for p in _split_top(m.group(1))]
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            return {"type": sorted({p["type"] for p in parts})}
        return {"anyOf": parts} if all(parts) else {}
    name = _SCALARS.get(t.lower())
    return {"type": name} if name else {}


def toolrl_property(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One ToolRL parameter `{"description", "type", "default"}` as a JSON Schema property."""
    raw_type = spec.get("type", "")
    if isinstance(raw_type, list):  # a JSON Schema type list, e.g. ["string", "null"]
        mapped = [_json_type(str(t)).get("type") for t in raw_type]
        prop: dict[str, Any] = {"type": mapped} if all(isinstance(t, str) for t in mapped) else {}
    else:
        raw_type = str(raw_type)
        base = raw_type.split(",")[0] if re.search(r",\s*optional\s*$", raw_type) else raw_type
        prop = _json_type(base)
    if "description" in spec:
        prop["description"] = str(spec["description"])
    if "default" in spec and spec["default"] != "":
        prop["default"] = spec["default"]
    prop["x-toolrl-type"] = raw_type
    for k, v in spec.items():
        if k not in ("description", "type", "default"):
            prop[k] = v
    return prop


def toolrl_parameters(tool: Tool) -> dict[str, dict[str, Any]]:
    """A Tool's parameters in ToolRL's dialect `{arg: {"description", "type", "default"}}`, the inverse of the
    load-time conversion: the type string from `x-toolrl-type`, else the JSON Schema type; `default` "" when
    the schema has none."""
    out: dict[str, dict[str, Any]] = {}
    for name, prop in tool.properties.items():
        t = prop.get("x-toolrl-type")
        if t is None:
            jt = prop.get("type", "")
            t = "|".join(jt) if isinstance(jt, list) else str(jt)
        entry = {"description": prop.get("description", ""), "type": t, "default": prop.get("default", "")}
        out[name] = entry
    return out


def render_tool_block(interface: Interface) -> str:
    """The `1. Name: ...\nDescription: ...\nParameters: {...}` lines of a ToolRL system prompt; with
    `meta["system_prefix"]` and `meta["system_suffix"]` around them, the original instruction of every
    released item."""
    return "\n".join(f"{k}. Name: {t.name}\nDescription: {t.description}\nParameters: "
                     f"{json.dumps(toolrl_parameters(t))}" for k, t in enumerate(interface, start=1))


def parse_tool_block(instruction: str, *, file: str, item: str) -> tuple[Interface, str, str]:
    """The tools of a ToolRL system prompt, and the prompt text before and after the tool block."""
    lines = instruction.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("1. Name: ")), None)
    if start is None:
        raise DataError("system prompt has no tool list ('1. Name: ...')", file=file, item=item,
                        field="instruction")
    tools: list[Tool] = []
    i, k = start, 1
    while i < len(lines):
        m = _ENTRY.fullmatch(lines[i])
        if not m or int(m.group(1)) != k:
            break
        where = f"instruction.tools[{k}]"
        if not m.group(2).strip():
            raise DataError("tool has an empty name", file=file, item=item, field=where)
        if i + 2 >= len(lines) or not lines[i + 1].startswith("Description: ") \
                or not lines[i + 2].startswith("Parameters: "):
            raise DataError(f"tool {k} is not followed by 'Description: ...' and 'Parameters: ...' lines",
                            file=file, item=item, field=where)
        try:
            params = json.loads(lines[i + 2][len("Parameters: "):])
        except json.JSONDecodeError as e:
            raise DataError(f"parameters are not valid JSON: {e}", file=file, item=item,
                            field=f"{where}.parameters") from e
        if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
            raise DataError("parameters must map each argument to {description, type, default}",
                            file=file, item=item, field=f"{where}.parameters")
        schema = {"type": "object", "properties": {a: toolrl_property(v) for a, v in params.items()},
                  "required": []}
        tools.append(Tool(m.group(2), lines[i + 1][len("Description: "):], schema))
        i, k = i + 3, k + 1
    prefix = "\n".join(lines[:start]) + "\n"
    suffix = "\n".join(lines[i:])
    suffix = "\n" + suffix if i < len(lines) else ""
    return Interface(tuple(tools)), prefix, suffix


def parse_call_lines(text: str, *, file: str, item: str, field: str) -> tuple[Call, ...]:
    """The calls of a `<tool_call>` body: one `{"name": str, "parameters": object}` JSON per line."""
    calls: list[Call] = []
    for j, line in enumerate(text.strip().split("\n")):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"tool call line {j} is not valid JSON: {e}", file=file, item=item,
                            field=f"{field}[{j}]") from e
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) \
                or not isinstance(obj.get("parameters", {}), dict):
            raise DataError(f"tool call line {j} is not {{'name': str, 'parameters': object}}: {line[:200]}",
                            file=file, item=item, field=f"{field}[{j}]")
        calls.append(Call(obj["name"], dict(obj.get("parameters", {}))))
    return tuple(calls)


def parse_history(text: str, *, file: str, item: str) -> tuple[tuple[Message, ...], tuple[str, ...]]:
    """Messages of a ToolRL `input`, and the think text of each assistant message."""
    body = text.strip()
    if body.startswith(HISTORY_HEADER):
        body = body[len(HISTORY_HEADER):]
    messages: list[Message] = []
    thinks: list[str] = []
    turn: dict[str, Any] | None = None

    def close() -> None:
        nonlocal turn
        if turn is not None:
            messages.append(Message("assistant", turn["response"], turn["calls"]))
            thinks.append(turn["think"])
            turn = None

    pos = 0
    for b, m in enumerate(_BLOCK.finditer(body)):
        if body[pos:m.start()].strip():
            raise DataError(f"text outside the dialogue tags: {body[pos:m.start()].strip()[:120]!r}",
                            file=file, item=item, field="input")
        pos = m.end()
        tag, content = m.group(1), m.group(2)
        if tag == "user":
            close()
            messages.append(Message("user", content.strip()))
        elif tag == "obs":
            last = turn["calls"] if turn is not None else ()
            close()
            messages.append(Message("tool", content.strip(), name=last[0].name if len(last) == 1 else None))
        else:
            slot = {"think": "think", "tool_call": "calls", "response": "response"}[tag]
            if turn is None or turn[slot] or (tag == "think" and (turn["calls"] or turn["response"])):
                close()
                turn = {"think": "", "calls": (), "response": ""}
            if tag == "think":
                turn["think"] = content.strip()
            elif tag == "tool_call":
                turn["calls"] = parse_call_lines(content, file=file, item=item, field=f"input.tool_call#{b}")
            else:
                turn["response"] = content.strip()
    if body[pos:].strip():
        raise DataError(f"text outside the dialogue tags: {body[pos:].strip()[:120]!r}", file=file, item=item,
                        field="input")
    close()
    if not any(m.role == "user" for m in messages):
        raise DataError("the dialogue has no <user> turn", file=file, item=item, field="input")
    return tuple(messages), tuple(thinks)


def _issues(interface: Interface, calls: Sequence[Call]) -> list[str]:
    out: list[str] = []
    for c in calls:
        tool = interface.get(c.name)
        if tool is None:
            out.append(f"reference call names undeclared tool {c.name!r}")
            continue
        extra = [a for a in c.arguments if a not in tool.properties]
        if extra:
            out.append(f"reference call to {c.name!r} passes undeclared arguments {extra}")
    return out


def _example(it: _Item, file: str, strict: bool) -> Example:
    interface, prefix, suffix = parse_tool_block(it.instruction, file=file, item=it.id)
    messages, thinks = parse_history(it.input, file=file, item=it.id)
    m = _TARGET.match(it.output.strip())
    if not m:
        raise DataError("target is not '<think>...</think>' followed by <tool_call> and/or <response>",
                        file=file, item=it.id, field="output")
    calls = (parse_call_lines(m.group("calls"), file=file, item=it.id, field="output.tool_call")
             if m.group("calls") is not None else ())
    issues = _issues(interface, calls)
    dup = interface.duplicate_names()
    if dup:
        issues.insert(0, f"the prompt declares tool names more than once: {list(dup)}")
    if issues and strict:
        raise DataError("; ".join(issues), file=file, item=it.id,
                        field="instruction" if dup else "output.tool_call")
    response = m.group("response").strip() if m.group("response") is not None else None
    meta = {"think": m.group("think").strip(), "target": it.output, "input": it.input,
            "system_prefix": prefix, "system_suffix": suffix, "history_think": thinks,
            "issues": tuple(issues), **dict(it.extra)}
    return Example(id=it.id, messages=messages, interface=interface, reference=calls, response=response,
                   source="toolrl", partition=it.partition, meta=meta)


def _check_ids(items: Sequence[_Item], file: str) -> None:
    seen: set[str] = set()
    for it in items:
        if it.id in seen:
            raise DataError("duplicate item id", file=file, item=it.id, field="extra_info.index")
        seen.add(it.id)


def load_toolrl_parquet(path: str | Path, *, strict: bool = False) -> list[Example]:
    """Every row of a ToolRL verl parquet (`rlla_4k/test.parquet`, 80 rows; `train.parquet`, 3,920), ids
    `toolrl_<split>_<extra_info.index>` (the row number when extra_info lacks it)."""
    path = Path(path)
    file = str(path)
    if not path.is_file():
        raise MissingInputError(f"ToolRL parquet not found at {path}")
    rows = read_parquet_rows(path)
    items: list[_Item] = []
    for r, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        split = str(extra.get("split") or path.stem)
        item = f"toolrl_{split}_{extra.get('index', r)}"
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(p, dict) for p in prompt):
            raise DataError("'prompt' must be a list of {role, content} messages", file=file, item=item,
                            field="prompt")
        by_role: dict[str, list[str]] = {}
        for p in prompt:
            by_role.setdefault(str(p.get("role")), []).append(str(p.get("content", "")))
        if len(by_role.get("system", [])) != 1 or len(by_role.get("user", [])) != 1 or len(prompt) != 2:
            raise DataError(f"'prompt' must hold one system and one user message, got roles "
                            f"{[p.get('role') for p in prompt]}", file=file, item=item, field="prompt")
        gt = (row.get("reward_model") or {}).get("ground_truth")
        if not isinstance(gt, str):
            raise DataError("missing reward_model.ground_truth", file=file, item=item,
                            field="reward_model.ground_truth")
        meta_extra = {"row": r, "data_source": row.get("data_source")}
        items.append(_Item(item, by_role["system"][0], by_role["user"][0], gt, split, meta_extra))
    _check_ids(items, file)
    return [_example(it, file, strict) for it in items]


def load_toolrl_sft(path: str | Path, *, strict: bool = False) -> list[Example]:
    """Every item of ToolRL's raw SFT JSON (`rlla_4k_raw/rlla_sft.json`, 400 items with reasoning), ids
    `toolrl_sft_<position>`, the target's think text in `meta["think"]`."""
    file = str(path)
    data = read_json_list(path, "ToolRL SFT JSON", "a JSON list of {instruction, input, output}")
    items: list[_Item] = []
    for i, obj in enumerate(data):
        item = f"toolrl_sft_{i}"
        if not isinstance(obj, dict):
            raise DataError("item is not an object", file=file, item=item)
        for key in ("instruction", "input", "output"):
            if not isinstance(obj.get(key), str):
                raise DataError(f"missing or non-string {key!r}", file=file, item=item, field=key)
        items.append(_Item(item, obj["instruction"], obj["input"], obj["output"], "sft", {"row": i}))
    return [_example(it, file, strict) for it in items]


def load_toolrl(path: str | Path, *, strict: bool = False) -> list[Example]:
    """Either file by its suffix: `.json` -> SFT JSON, otherwise a verl parquet."""
    path = Path(path)
    return load_toolrl_sft(path, strict=strict) if path.suffix == ".json" else load_toolrl_parquet(path,
                                                                                                strict=strict)


def summarize(examples: Sequence[Example]) -> dict[str, int]:
    """Counts of one loaded file: totals, target shapes, calls, and kept data issues."""
    return {
        "total": len(examples),
        "with_calls": sum(1 for e in examples if e.reference),
        "response_only": sum(1 for e in examples if not e.reference and e.response is not None),
        "calls_and_response": sum(1 for e in examples if e.reference and e.response is not None),
        "parallel": sum(1 for e in examples if len(e.reference) > 1),
        "multi_turn": sum(1 for e in examples if sum(m.role == "user" for m in e.messages) > 1
                          or any(m.role != "user" for m in e.messages)),
        "items_with_issues": sum(1 for e in examples if e.meta.get("issues")),
    }


def toolrl_stats(root: str | Path | None = None) -> dict[str, dict[str, int]]:
    """`summarize` for each ToolRL file present under `<data root>/toolrl`."""
    base = data_root(root) / "toolrl"
    out: dict[str, dict[str, int]] = {}
    for rel in ("rlla_4k/test.parquet", "rlla_4k/train.parquet", "rlla_4k_raw/rlla_sft.json"):
        p = base / rel
        if p.exists():
            out[rel] = summarize(load_toolrl(p))
    return out
