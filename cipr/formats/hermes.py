"""Hermes/Qwen call format: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks.

A target is an optional `<think>\\n...\\n</think>\\n\\n` block (Qwen3 style), optional text, then one
`<tool_call>` block per call, separated by newlines, exactly as Qwen's chat template renders an assistant turn
with `tool_calls`.

Prompt: with a chat template that renders `tools=`, the interface goes through it (`Interface.to_openai()`)
and earlier turns as `tool_calls` / `tool` messages. Otherwise (e.g. SmolLM2's ChatML) the format renders what
Qwen's template would: the tools appended to the system prompt in Qwen's wording, earlier calls as
`<tool_call>` blocks in the assistant text, tool results as a user message of `<tool_response>` blocks; on a
Qwen template both paths give the same text (tested). Without a system message the non-native path uses
`default_system` (Qwen's template would use its own "You are Qwen..." sentence).

This is the Qwen2.5 / Qwen3 family of `format=auto` (`cipr.formats.templates`): on TRL's qwen2_5 and qwen3
templates a target is exactly what the template writes for the assistant turn, except that Qwen3's writes an
empty `<think>\n\n</think>\n\n` block into the turn after the last user message, which the target has when
`think=""` (tests/test_formats_templates.py).

Choices left open, made here:
- Names are JSON-escaped (Qwen's template pastes the name raw, which breaks JSON for a name with a quote;
  identical otherwise). JSON keeps non-ASCII characters, as the template's `tojson` does.
- `parse` reads an optional leading `<think>` block (unclosed: reported, no calls), every `<tool_call>` block
  (unclosed at the end or before the next `<tool_call>`: reported), and takes the text outside the blocks,
  stripped, as the `response` (None when empty). It reports a stray `</tool_call>`, a `<think>` tag after the
  start, invalid JSON (with its position), a missing or non-string name, missing or non-object `arguments`,
  and text between the object and `</tool_call>`; extra keys are ignored. The JSON decoder reads the object,
  so a `</tool_call>` inside a string stays text. `calls` holds the blocks valid on their own.

Decisions (where ∅ sits): the call that opens the answer (only the think block before it) opens at
`<tool_call>` with opener `<tool_call>\\n{"name": "`; a call after text or another call opens at the newline
before `<tool_call>` with opener `\\n<tool_call>\\n{"name": "` (the newline Qwen's template writes). With
`end_decision` (default), ending the turn after the last closed block is a ∅ decision at the end of that
`</tool_call>`, same opener. A response without `<tool_call>` has one ∅ decision where its answer starts
(after the think block and its whitespace), opener `<tool_call>\\n{"name": "`. A block with broken JSON counts
when its name can be read; a text cut off inside `<think>` has no decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.formats.base import CallFormat, Decision, ParseResult, native_message
from cipr.formats.json_calls import (
    CALL_NAME_OPENER,
    ReadCall,
    call_object,
    decode_at,
    dumps,
    read_call,
    read_value,
)
from cipr.formats.json_calls import name_text as json_name_text
from cipr.formats.scan import THINK, THINK_END, ThinkScan, refuse_tags, skip_space
from cipr.tools.interface import Call, Interface, Message

_CALL, _CALL_END = "<tool_call>", "</tool_call>"
FIRST_OPENER = _CALL + "\n" + CALL_NAME_OPENER
NEXT_OPENER = "\n" + FIRST_OPENER

TOOLS_HEAD = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
              "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
              "\"arguments\": <args-json-object>}\n</tool_call>")


def tools_section(interface: Interface) -> str:
    """The text Qwen's template appends to the system prompt for `tools=` (empty for no tools)."""
    if not len(interface):
        return ""
    return TOOLS_HEAD + "".join("\n" + dumps(t) for t in interface.to_openai()) + TOOLS_TAIL


@dataclass
class _Block:
    open: int
    close: int | None
    read: ReadCall


@dataclass
class _Scan(ThinkScan):
    answer: int | None = None
    blocks: list[_Block] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)


def _scan(text: str) -> _Scan:
    s = _Scan()
    n = len(text)
    start = s.answer_start(text)
    if start is None:
        return s
    i = s.answer = start
    while i <= n:
        k = text.find(_CALL, i)
        end = k if k >= 0 else n
        _outside(text, i, end, s)
        if k < 0:
            break
        body = k + len(_CALL)
        j = skip_space(text, body)
        value, end, error = decode_at(text, j)
        if error is None:
            read = read_value(value, "arguments", j)
            after = skip_space(text, end)
            close, again = text.find(_CALL_END, after), text.find(_CALL, after)
            if close > after and (again < 0 or close < again):
                s.errors.append(f"unexpected text after the call at char {after}: "
                                f"{text[after:close].strip()[:60]!r}")
        else:
            close, again = text.find(_CALL_END, body), text.find(_CALL, body)
            content = text[body:close if close >= 0 and (again < 0 or close < again) else
                           (again if again >= 0 else n)]
            read = read_call(content.strip(), "arguments", offset=j)
        closed = close >= 0 and (again < 0 or close < again)
        stop = close if closed else (again if again >= 0 else n)
        if not closed:
            s.errors.append(f"<tool_call> at char {k} is never closed by </tool_call>")
        if read.error:
            s.errors.append(read.error)
        s.blocks.append(_Block(k, stop if closed else None, read))
        i = stop + len(_CALL_END) if closed else stop
        if i >= n:
            break
    return s


def _outside(text: str, start: int, end: int, s: _Scan) -> None:
    piece = text[start:end]
    for tag in (_CALL_END, THINK, THINK_END):
        k = piece.find(tag)
        if k >= 0:
            s.errors.append(f"stray {tag} at char {start + k}")
    if piece.strip():
        s.outside.append(piece.strip())


@dataclass(frozen=True)
class HermesFormat(CallFormat):
    """Hermes/Qwen tool calls.

    - `end_decision`: whether the end of the turn after the last call is a ∅ decision.
    - `default_system`: the system prompt that carries the tools when the conversation has none and
      the template has no tool support.
    """

    end_decision: bool = True
    default_system: str = "You are a helpful assistant."

    name = "hermes"
    uses_native_tools = True

    def chat(self, messages: Sequence[Message], interface: Interface, *,
             native_tools: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """Messages for the chat template, and `tools=` (OpenAI format) when `native_tools`."""
        if native_tools:
            out = [native_message(m) for m in messages]
            return out, (interface.to_openai() if len(interface) else None)
        out: list[dict[str, Any]] = []
        section = self.tools_text(interface)
        if section and not (messages and messages[0].role == "system"):
            out.append({"role": "system", "content": self.default_system + section})
        for k, m in enumerate(messages):
            if m.role == "system":
                out.append({"role": "system", "content": m.content + (section if k == 0 else "")})
            elif m.role == "assistant":
                out.append({"role": "assistant",
                            "content": self.render_target(m.calls, response=m.content or None)})
            elif m.role == "tool":
                block = f"<tool_response>\n{m.content}\n</tool_response>"
                if k > 0 and messages[k - 1].role == "tool":
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block})
            else:
                out.append({"role": m.role, "content": m.content})
        return out, None

    def tools_text(self, interface: Interface) -> str:
        """What the system prompt gets for `interface` when the template renders no `tools=`."""
        return tools_section(interface)

    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """`<think>\\n..\\n</think>\\n\\n` (if any), the response text, then a `<tool_call>` block a call."""
        text = ""
        if think is not None:
            refuse_tags(think, (THINK_END,), "think", "Hermes")
            text = f"{THINK}\n{think}\n{THINK_END}\n\n"
        body = response or ""
        refuse_tags(body, (_CALL, _CALL_END, THINK, THINK_END), "response", "Hermes")
        for call in calls:
            body += ("\n" if body else "") + f"{_CALL}\n{call_object(call, 'arguments')}\n{_CALL_END}"
        return text + body

    def parse(self, text: str) -> ParseResult:
        s = _scan(text)
        calls = tuple(b.read.call for b in s.blocks if b.read.call is not None)
        response = "\n".join(s.outside) or None
        return ParseResult(calls=calls, ok=not s.errors, error="; ".join(s.errors) or None,
                           response=response, think=s.think)

    def decisions(self, text: str) -> list[Decision]:
        s = _scan(text)
        if s.answer is None:
            return []
        out: list[Decision] = []
        for k, b in enumerate(s.blocks):
            if b.read.name is None:
                continue
            first = k == 0 and not text[s.answer:b.open].strip()
            if not first and b.open > 0 and text[b.open - 1] == "\n":
                out.append(Decision(b.open - 1, NEXT_OPENER, '"', b.read.name))
            else:
                out.append(Decision(b.open, FIRST_OPENER, '"', b.read.name))
        if not s.blocks:
            out.append(Decision(s.answer, FIRST_OPENER, '"', None))
        elif self.end_decision and s.blocks[-1].close is not None:
            out.append(Decision(s.blocks[-1].close + len(_CALL_END), NEXT_OPENER, '"', None))
        return out

    def name_text(self, name: str) -> str:
        return json_name_text(name)
