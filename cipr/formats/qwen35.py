"""Qwen3.5 / 3.6 call format: XML calls in `<tool_call>` blocks, tools through the model's chat template.

Qwen3.5's chat templates (TRL's `qwen3_5_think.jinja`, `qwen3_5_nothink.jinja`) take `tools=`, list them as
JSON in the system prompt and ask for, and render, one block per call:

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

An assistant turn is `<think>\\nreasoning\\n</think>\\n\\n` (in the turns after the last user message), its
text, `\\n\\n` before the first block when there is text, and `\\n` between blocks. A target is exactly what
the template writes after `<|im_start|>assistant\\n` (tested); as for Qwen3 (`hermes`), the last turn gets an
empty think block, which the target has when `think=""`. Text and reasoning are trimmed, as the template trims
them. Values are written as the template writes them: strings raw, objects and lists as JSON (non-ASCII kept),
others with Python's `str` (`True`, `None`, `1.5`). `qwen36_xml` is the format as Qwen3.6's and Qwen3.8's
templates write it (`qwen3_6.jinja`, `qwen3_8.jinja`): every value but a string as JSON (`true`, `null`);
parsing reads both.

The think template's generation prompt ends with an open `<think>\\n`; `render_prompt` leaves it out, so a
response (and a target) starts with its think block as for Qwen3, and prompt + target is the text the template
renders. The nothink template's prompt ends with a closed empty block and is kept whole (a response is the
answer itself).

Choices the template leaves open, made here:
- Names and keys are written raw, as the template does: one that is empty or holds `>` or a newline, and a
  string value holding `</parameter>`, are refused (they could not be read back).
- `parse` reads an optional leading `<think>` block (unclosed: reported, no calls) and every block; text
  outside the blocks, stripped and joined by newlines, is the `response`. A value is the text between
  `<parameter=KEY>` and `</parameter>` less one newline at each end, read back as `True`/`False`/`None` for
  those words, as JSON when it is valid JSON without surrounding whitespace (`NaN` and `Infinity` excluded),
  else as the string. So a string argument that reads as JSON (`"42"`, `"true"`) comes back typed: the text
  cannot tell them apart (a server's parser, vLLM's included, retypes by the tool's schema instead). Reported:
  a block without `<function=NAME>`, a name or key not closed by `>` on its line, an unclosed parameter, a
  repeated key, other text inside a block, a block never closed by `</tool_call>`, and a stray closing or call
  tag (or a `<think>` tag) outside the blocks. `calls` holds the valid blocks.

Decisions (the name closed by `>`): the call that opens the answer (only the think block before it) opens at
`<tool_call>` with opener `<tool_call>\\n<function=`; the first call after text opens at the `\\n\\n` before
it (opener `\\n\\n<tool_call>\\n<function=`), a call after another call at the newline before it (opener
`\\n<tool_call>\\n<function=`); any other layout opens at `<tool_call>`. With `end_decision` (default) the end
of the turn after the last closed block is a ∅ decision, opener `\\n<tool_call>\\n<function=`. A response
without blocks has one ∅ decision where its answer starts, opener `<tool_call>\\n<function=`. A broken block
counts when its name can be read; a text cut off inside `<think>` has no decision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.formats.base import Decision, ParseResult, TemplateFormat, native_message
from cipr.formats.json_calls import dumps
from cipr.formats.scan import THINK, THINK_END, ThinkScan, refuse_tags, skip_space
from cipr.tools.interface import Call, Message

CALL, CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
FIRST_OPENER = f"{CALL}\n{FUNCTION}"
NEXT_OPENER = "\n" + FIRST_OPENER
TEXT_OPENER = "\n\n" + FIRST_OPENER
NAME_SUFFIX = ">"
OPEN_THINK = THINK + "\n"
_WORDS = {"True": True, "False": False, "None": None}
_STRAY = (CALL_END, FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END, THINK, THINK_END)


def render_value(value: Any, *, json_scalars: bool = False) -> str:
    """A parameter value as the template writes it: strings raw, objects and lists as JSON, else `str`
    (with `json_scalars`, as Qwen3.6 writes them: JSON)."""
    if isinstance(value, str):
        return value
    if json_scalars or isinstance(value, Mapping | list | tuple):
        return dumps(value)
    return str(value)


def _reject(constant: str) -> Any:
    raise ValueError(constant)


def read_value(text: str) -> Any:
    """A parameter value read back (module docstring): Python's words, then strict JSON, else the text."""
    if text in _WORDS:
        return _WORDS[text]
    if text and text == text.strip():
        try:
            return json.loads(text, parse_constant=_reject)
        except (ValueError, RecursionError):
            pass
    return text


def _tag_value(text: str, i: int) -> tuple[str | None, int]:
    """The text from `i` up to the `>` that closes it on the same line, and the index after `>`."""
    close, line = text.find(">", i), text.find("\n", i)
    if close < 0 or 0 <= line < close or close == i:
        return None, i
    return text[i:close], close + 1


@dataclass
class _Block:
    open: int
    close: int | None = None
    name: str | None = None
    call: Call | None = None


@dataclass
class _Scan(ThinkScan):
    answer: int | None = None
    blocks: list[_Block] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)


def _read_block(text: str, b: _Block, s: _Scan) -> int:
    """Read the block opened at `b.open` into `b`; returns where the scan goes on."""
    i = skip_space(text, b.open + len(CALL))
    error = None
    if not text.startswith(FUNCTION, i):
        error = f"<tool_call> at char {b.open} does not open with <function=NAME>"
    else:
        b.name, i = _tag_value(text, i + len(FUNCTION))
        if b.name is None:
            error = f"the function name at char {i} is empty or not closed by '>' on its line"
    args: dict[str, Any] = {}
    while error is None:
        i = skip_space(text, i)
        if text.startswith(PARAMETER, i):
            key, j = _tag_value(text, i + len(PARAMETER))
            end = text.find(PARAMETER_END, j)
            if key is None:
                error = f"the parameter name at char {i} is empty or not closed by '>' on its line"
            elif end < 0:
                error = f"parameter {key!r} at char {i} is never closed by {PARAMETER_END}"
            elif key in args:
                error = f"parameter {key!r} is given twice in the call to {b.name!r}"
            else:
                value = text[j + (text.startswith("\n", j)):end]
                args[key] = read_value(value[:-1] if value.endswith("\n") else value)
                i = end + len(PARAMETER_END)
        elif text.startswith(FUNCTION_END, i):
            i = skip_space(text, i + len(FUNCTION_END))
            if text.startswith(CALL_END, i):
                b.close, b.call = i + len(CALL_END), Call(b.name or "", args)
                return b.close
            if i < len(text) and not text.startswith(CALL, i):
                error = f"unexpected text after {FUNCTION_END} at char {i}: {text[i:i + 40]!r}"
            break
        else:
            error = f"unexpected text in the call to {b.name!r} at char {i}: {text[i:i + 40]!r}"
    if error is not None:
        s.errors.append(error)
    close, again = text.find(CALL_END, i), text.find(CALL, i)
    if close >= 0 and (again < 0 or close < again):
        b.close = close + len(CALL_END)
        return b.close
    s.errors.append(f"<tool_call> at char {b.open} is never closed by {CALL_END}")
    return again if again >= 0 else len(text)


def _scan(text: str) -> _Scan:
    s = _Scan()
    start = s.answer_start(text)
    if start is None:
        return s
    i = s.answer = start
    while True:
        k = text.find(CALL, i)
        piece = text[i:k if k >= 0 else len(text)]
        for tag in _STRAY:
            if tag in piece:
                s.errors.append(f"stray {tag} at char {i + piece.find(tag)}")
        if piece.strip():
            s.outside.append(piece.strip())
        if k < 0:
            return s
        s.blocks.append(_Block(k))
        i = _read_block(text, s.blocks[-1], s)


def _check_name(name: str, what: str) -> None:
    if not name or ">" in name or "\n" in name:
        raise ValueError(f"Qwen3.5 format: the {what} {name!r} is empty or holds '>' or a newline, so it "
                         f"could not be read back")


def render_call(call: Call, *, json_scalars: bool = False) -> str:
    """One `<tool_call>` block, as the template writes it (`json_scalars`: see `render_value`)."""
    _check_name(call.name, "tool name")
    params = ""
    for key, value in call.arguments.items():
        _check_name(key, "parameter name")
        if isinstance(value, str):
            refuse_tags(value, (PARAMETER_END,), "value", "Qwen3.5")
        params += f"{PARAMETER}{key}>\n{render_value(value, json_scalars=json_scalars)}\n{PARAMETER_END}\n"
    return f"{FIRST_OPENER}{call.name}>\n{params}{FUNCTION_END}\n{CALL_END}"


@dataclass(frozen=True)
class Qwen35XmlFormat(TemplateFormat):
    """Qwen3.5 XML tool calls (`end_decision`: see `TemplateFormat`)."""

    name = "qwen35_xml"
    templates = "qwen3_5_think or qwen3_5_nothink"
    json_scalars = False

    def template_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        return [native_message(m) for m in messages]

    def render_prompt(self, tokenizer: Any, messages: Sequence[Message], interface: Any) -> str:
        """The template's prompt, less the open `<think>\\n` the think template ends it with."""
        prompt = super().render_prompt(tokenizer, messages, interface)
        return prompt[:-len(OPEN_THINK)] if prompt.endswith(OPEN_THINK) else prompt

    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """The think block (if any), the text, then the blocks (`\\n\\n` after text, `\\n` between)."""
        head = ""
        if think is not None:
            refuse_tags(think, (THINK_END,), "reasoning", "Qwen3.5")
            head = f"{THINK}\n{think.strip()}\n{THINK_END}\n\n"
        body = (response or "").strip()
        refuse_tags(body, (CALL, *_STRAY), "response", "Qwen3.5")
        for k, call in enumerate(calls):
            sep = "\n" if k else "\n\n" if body else ""
            body += sep + render_call(call, json_scalars=self.json_scalars)
        return head + body

    def parse(self, text: str) -> ParseResult:
        s = _scan(text)
        return ParseResult(calls=tuple(b.call for b in s.blocks if b.call is not None), ok=not s.errors,
                           error="; ".join(s.errors) or None, response="\n".join(s.outside) or None,
                           think=s.think)

    def decisions(self, text: str) -> list[Decision]:
        s = _scan(text)
        if s.answer is None:
            return []
        out: list[Decision] = []
        after = s.answer
        for k, b in enumerate(s.blocks):
            if b.name is not None:
                before = text[after:b.open]
                if k == 0 and not before.strip():
                    out.append(Decision(b.open, FIRST_OPENER, NAME_SUFFIX, b.name))
                elif before.strip() and before.endswith("\n\n"):
                    out.append(Decision(b.open - 2, TEXT_OPENER, NAME_SUFFIX, b.name))
                elif before.endswith("\n"):
                    out.append(Decision(b.open - 1, NEXT_OPENER, NAME_SUFFIX, b.name))
                else:
                    out.append(Decision(b.open, FIRST_OPENER, NAME_SUFFIX, b.name))
            after = b.close if b.close is not None else b.open
        if not s.blocks:
            out.append(Decision(s.answer, FIRST_OPENER, NAME_SUFFIX, None))
        elif self.end_decision and s.blocks[-1].close is not None:
            out.append(Decision(s.blocks[-1].close, NEXT_OPENER, NAME_SUFFIX, None))
        return out


@dataclass(frozen=True)
class Qwen36XmlFormat(Qwen35XmlFormat):
    """Qwen3.6 / 3.8 XML tool calls: Qwen3.5's, with every value but a string written as JSON."""

    name = "qwen36_xml"
    templates = "qwen3_6 or qwen3_8"
    json_scalars = True
