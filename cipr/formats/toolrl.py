"""ToolRL's call format (qiancheng0/ToolRL, `rlla_4k`): `<think>`, `<tool_call>` JSON lines, `<response>`.

A target is `<think> ... </think>` followed by a `<tool_call>` block holding one
`{"name": ..., "parameters": {...}}` JSON object per line, and/or a `<response> ... </response>`:

    <think> I should use the appropriate tool with proper parameters to respond to the user's need. </think>
    <tool_call>
    {"name": "GetNews", "parameters": {"page": "1"}}
    </tool_call>

The prompt reproduces ToolRL's data byte for byte (checked on the 80 rows of `rlla_4k/test.parquet` and the
400 items of `rlla_sft.json`, targets included): a system prompt with ToolRL's instruction and the tools
listed as `1. Name: ...\\nDescription: ...\\nParameters: {...}`, and one user message holding the whole
dialogue as `**Dialogue Records History**` followed by `<user> ... </user>`, earlier assistant turns in the
target format and tool results as `<obs> ... </obs>`. ToolRL's chat has no native tool support.

Choices ToolRL leaves open, made here:
- `Parameters:` is ToolRL's dialect `{arg: {"description", "type", "default"}}` for properties that
  carry their original ToolRL type (`x-toolrl-type`, set by the ToolRL loader), so ToolRL's prompts
  come back exactly; any other property is written as its JSON Schema (enums, items and nested
  properties stay visible). `json.dumps` defaults (ASCII escapes) as in ToolRL's data. A tool whose
  schema lists required arguments gets a further `Required: [...]` line (ToolRL's data has none).
- A system message of the conversation is not ToolRL's instruction (the format writes that itself,
  from the interface); its text is put before the instruction, separated by a blank line.
- An assistant turn without its own reasoning gets ToolRL's placeholder think text (the two sentences
  of its RL data); its `content` is the `<response>`. A tool message whose content already is ToolRL's
  observation list (`[{"name", "results"}, ...]`) is written verbatim; any other is wrapped as
  `{"name": <tool>, "results": <content, parsed if it is JSON>}`, consecutive ones in one list.
- Targets write JSON with `json.dumps` defaults, non-ASCII as `\\uXXXX` escapes, as ToolRL's data does
  (rlla_sft.json writes `"\\u3084\\u307e"`); parsing accepts either, and `name_text` escapes alike.
- `think` and `response` are stripped of surrounding whitespace by `parse` (rendering adds one space
  inside the tags, as ToolRL does).

Parsing is sequential, so tag names mentioned inside the reasoning (ToolRL's SFT thoughts do that) do not
count: a leading `<think>` block up to the first `</think>` (a missing one is reported, and the rest is still
read), then `<tool_call>` and `<response>` blocks. Each call object is read with the JSON decoder, so tags
inside argument strings stay text; a `</tool_call>` right after the object on the same line closes the block,
an object spread over several lines is read but reported. It reports (never raises) a missing or unclosed tag,
a second `<tool_call>` or `<response>` block, text outside the tags, blocks out of order, an empty block, and
per call line invalid JSON (with its position), a missing or non-string name, missing or non-object
`parameters`. `calls` holds every call line that is valid on its own. Extra keys in a call object are ignored,
as ToolRL's reward does.

Decisions (where ∅ sits): the first call line opens at `<tool_call>` with opener
`<tool_call>\\n{"name": "`; each further line opens at its `{` with opener `{"name": "`; the name is
closed by `"` (names are JSON-escaped: see `name_text`). After the last call line the policy writes
`</tool_call>` instead of opening another call: with `end_decision` (default) that is a decision with
`taken=None` at the offset of `</tool_call>` and opener `{"name": "`, so a response with k calls has
k + 1 decisions and the number of calls is part of what the consistency KL compares. A response with
no `<tool_call>` block has one decision, at `<response>`, whose opener is `<tool_call>\\n{"name": "`.
A call line whose JSON is broken still counts as a decision when its name can be read
(`{"name": "<name>"` at its start): the policy chose that tool. Text that reaches neither a
`<tool_call>` nor a `<response>` (e.g. cut off inside `<think>`) has no decision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.formats.base import CallFormat, Decision, ParseResult
from cipr.formats.json_calls import CALL_NAME_OPENER, ReadCall, call_object, read_call_at, to_plain
from cipr.formats.json_calls import name_text as json_name_text
from cipr.formats.scan import THINK, THINK_END, ThinkScan, refuse_tags, skip_space
from cipr.tools.interface import Call, Interface, Message, Tool

CALL_THINK = "I should use the appropriate tool with proper parameters to respond to the user's need."
RESPONSE_THINK = "I should directly respond to the user's need."
HISTORY_HEADER = "**Dialogue Records History**"
BLOCK_OPENER = "<tool_call>\n" + CALL_NAME_OPENER

INSTRUCTION_HEAD = ("You are a helpful multi-turn dialogue assistant capable of leveraging tool calls to "
                    "solve user tasks and provide structured chat responses.\n\n**Available Tools**\n"
                    "In your response, you can use the following tools:\n")
INSTRUCTION_TAIL = """

**Steps for Each Turn**
1. **Think:** Recall relevant context and analyze the current user goal.
2. **Decide on Tool Usage:** If a tool is needed, specify the tool and its parameters.
3. **Respond Appropriately:** If a response is needed, generate one while maintaining consistency across \
user queries.

**Output Format**
```plaintext
<think> Your thoughts and reasoning </think>
<tool_call>
{"name": "Tool name", "parameters": {"Parameter name": "Parameter content", "... ...": "... ..."}}
{"name": "... ...", "parameters": {"... ...": "... ...", "... ...": "... ..."}}
...
</tool_call>
<response> AI's final response </response>
```

**Important Notes**
1. You must always include the `<think>` field to outline your reasoning. Provide at least one of \
`<tool_call>` or `<response>`. Decide whether to use `<tool_call>` (possibly multiple times), `<response>`, \
or both.
2. You can invoke multiple tool calls simultaneously in the `<tool_call>` fields. Each tool call should be a \
JSON object with a "name" field and an "parameters" field containing a dictionary of parameters. If no \
parameters are needed, leave the "parameters" field an empty dictionary.
3. Refer to the previous dialogue records in the history, including the user's queries, previous \
`<tool_call>`, `<response>`, and any tool feedback noted as `<obs>` (if exists)."""

_CALLS, _CALLS_END = "<tool_call>", "</tool_call>"
_RESP, _RESP_END = "<response>", "</response>"


def tool_parameters(tool: Tool) -> dict[str, Any]:
    """The `Parameters:` object of one tool (ToolRL's dialect where the loader kept it, else JSON Schema)."""
    out: dict[str, Any] = {}
    for arg, prop in tool.properties.items():
        if isinstance(prop, Mapping) and "x-toolrl-type" in prop:
            out[arg] = {"description": prop.get("description", ""), "type": prop["x-toolrl-type"],
                        "default": prop.get("default", "")}
        else:
            out[arg] = prop
    return out


def tool_list(interface: Interface) -> str:
    """ToolRL's numbered tool list: `1. Name: ...\\nDescription: ...\\nParameters: {...}`."""
    entries = []
    for k, tool in enumerate(interface, start=1):
        entry = (f"{k}. Name: {tool.name}\nDescription: {tool.description}\n"
                 f"Parameters: {json.dumps(to_plain(tool_parameters(tool)))}")
        if tool.required:
            entry += f"\nRequired: {json.dumps(list(tool.required))}"
        entries.append(entry)
    return "\n".join(entries)


@dataclass
class _Line:
    start: int
    read: ReadCall


@dataclass
class _Block:
    open: int
    close: int | None
    lines: list[_Line] = field(default_factory=list)


@dataclass
class _Scan(ThinkScan):
    blocks: list[_Block] = field(default_factory=list)
    response: str | None = None
    response_open: int | None = None

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(line.read.call for b in self.blocks for line in b.lines if line.read.call is not None)


def _next_tag(text: str, i: int, tags: Sequence[str]) -> int:
    found = [k for k in (text.find(t, i) for t in tags) if k >= 0]
    return min(found) if found else len(text)


def _scan(text: str) -> _Scan:
    s = _Scan()
    n = len(text)
    think = s.read_think(text)
    if think.error is not None:
        return s
    i = skip_space(text, 0)
    if think.end is not None:
        i = think.end
    else:
        s.errors.append("missing <think> ... </think> at the start")
    while True:
        i = skip_space(text, i)
        if i >= n:
            break
        if text.startswith(_CALLS, i):
            if s.response_open is not None:
                s.errors.append(f"<tool_call> at char {i} comes after <response>")
            if s.blocks:
                s.errors.append(f"second <tool_call> block at char {i} (expected one)")
            block = _Block(i, None)
            end = _read_block(text, i + len(_CALLS), block, s.errors)
            if block.close is None:
                s.errors.append(f"<tool_call> at char {i} is never closed by </tool_call>")
            if not block.lines:
                s.errors.append(f"empty <tool_call> block at char {i}")
            s.blocks.append(block)
            i = end
        elif text.startswith(_RESP, i):
            j = text.find(_RESP_END, i + len(_RESP))
            if j < 0:
                s.errors.append(f"<response> at char {i} is never closed by </response>")
            content = text[i + len(_RESP):j if j >= 0 else n]
            if s.response_open is None:
                s.response_open, s.response = i, content.strip()
            else:
                s.errors.append(f"second <response> block at char {i} (expected one)")
            i = j + len(_RESP_END) if j >= 0 else n
        else:
            k = _next_tag(text, i + 1, (_CALLS, _RESP))
            s.errors.append(f"unexpected text at char {i}: {text[i:k].strip()[:60]!r}")
            i = k
    if not s.blocks and s.response_open is None:
        s.errors.append("neither <tool_call> nor <response>")
    return s


def _read_block(text: str, start: int, block: _Block, errors: list[str]) -> int:
    """Read the call lines of a `<tool_call>` block from `start`; returns where scanning resumes.

    Each call object is decoded with the JSON decoder, so tags inside its strings stay text. The
    block ends at `</tool_call>` (closed), or unclosed at a `<tool_call>` or `<response>` that
    starts a line, or at the end of the text.
    """
    n = len(text)
    j = start
    while True:
        j = skip_space(text, j)
        if j >= n:
            return n
        if text.startswith(_CALLS_END, j):
            block.close = j
            return j + len(_CALLS_END)
        if text.startswith(_CALLS, j) or text.startswith(_RESP, j):
            return j
        line_end = text.find("\n", j)
        line_end = n if line_end < 0 else line_end
        close = text.find(_CALLS_END, j, line_end)
        read, end = read_call_at(text, j, "parameters", stop=close if close >= 0 else line_end)
        if read.error:
            errors.append(read.error)
        elif end > line_end:
            errors.append(f"call at char {j} spans several lines (ToolRL writes one JSON object per line)")
        block.lines.append(_Line(j, read))
        rest = end
        while rest < n and text[rest] in " \t\r":
            rest += 1
        if rest < n and text[rest] != "\n" and not text.startswith(_CALLS_END, rest):
            eol = text.find("\n", rest)
            eol = n if eol < 0 else eol
            stop = text.find(_CALLS_END, rest, eol)
            stop = eol if stop < 0 else stop
            errors.append(f"unexpected text after the call at char {rest}: {text[rest:stop].strip()[:60]!r}")
            rest = stop
        j = rest


@dataclass(frozen=True)
class ToolRLFormat(CallFormat):
    """ToolRL's format. `end_decision`: whether the `</tool_call>` after the last call is a ∅ decision."""

    end_decision: bool = True

    name = "toolrl"
    uses_native_tools = False

    def chat(self, messages: Sequence[Message], interface: Interface, *,
             native_tools: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """[system, user]: ToolRL's instruction with the tools, and the whole dialogue in one user message."""
        extra = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
        system = INSTRUCTION_HEAD + tool_list(interface) + INSTRUCTION_TAIL
        if extra:
            system = extra + "\n\n" + system
        entries: list[str] = []
        observations: list[Message] = []
        previous = ""

        def flush() -> None:
            if observations:
                obs = f"<obs> {_observation(observations)} </obs>"
                if previous == "assistant" and entries:
                    entries[-1] += "\n" + obs
                else:
                    entries.append(obs)
                observations.clear()

        for m in messages:
            if m.role == "tool":
                observations.append(m)
                continue
            flush()
            if m.role == "user":
                entries.append(f"<user> {m.content} </user>")
            elif m.role == "assistant":
                entries.append(self.render_target(m.calls, response=m.content or None))
            elif m.role != "system":
                raise ValueError(f"ToolRL format: unsupported message role {m.role!r}")
            previous = m.role
        flush()
        user = HISTORY_HEADER + "\n" + "\n\n".join(entries)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], None

    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """`<think> .. </think>`, then the `<tool_call>` block and/or `<response>` (empty if neither)."""
        if think is None:
            think = CALL_THINK if calls else RESPONSE_THINK
        refuse_tags(think, (THINK_END,), "think", "ToolRL")
        parts = [f"{THINK} {think} {THINK_END}"]
        if calls:
            parts.append(_CALLS + "\n" + "\n".join(call_object(c, "parameters", ascii=True) for c in calls)
                         + "\n" + _CALLS_END)
        if response is not None or not calls:
            refuse_tags(response or "", (_RESP_END,), "response", "ToolRL")
            parts.append(f"{_RESP} {response or ''} {_RESP_END}")
        return "\n".join(parts)

    def parse(self, text: str) -> ParseResult:
        s = _scan(text)
        return ParseResult(calls=s.calls, ok=not s.errors, error="; ".join(s.errors) or None,
                           response=s.response, think=s.think)

    def decisions(self, text: str) -> list[Decision]:
        s = _scan(text)
        out: list[Decision] = []
        for block in s.blocks:
            for k, line in enumerate(block.lines):
                if line.read.name is None:
                    continue
                start, opener = (block.open, BLOCK_OPENER) if k == 0 else (line.start, CALL_NAME_OPENER)
                out.append(Decision(start, opener, '"', line.read.name))
        if s.blocks:
            if self.end_decision and s.blocks[-1].close is not None:
                out.append(Decision(s.blocks[-1].close, CALL_NAME_OPENER, '"', None))
        elif s.response_open is not None:
            out.append(Decision(s.response_open, BLOCK_OPENER, '"', None))
        return out

    def name_text(self, name: str) -> str:
        return json_name_text(name, ascii=True)


def _observation(messages: Sequence[Message]) -> str:
    """The body of one `<obs>` block for consecutive tool messages."""
    if len(messages) == 1 and _is_observation_list(messages[0].content):
        return messages[0].content
    items = []
    for m in messages:
        try:
            results: Any = json.loads(m.content)
        except json.JSONDecodeError:
            results = m.content
        items.append({"name": m.name, "results": results})
    return json.dumps(items)


def _is_observation_list(content: str) -> bool:
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return False
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, dict) and set(v) == {"name", "results"} for v in value))
