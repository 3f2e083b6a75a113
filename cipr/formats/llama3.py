"""Llama 3.1 / 3.2 call format: a bare `{"name": ..., "parameters": {...}}` object per call, tools through the
template.

Meta's chat templates (TRL's `llama3_1.jinja`, `llama3_2.jinja`) take `tools=` and write them as indented JSON
after an instruction into the first user message (`tools_in_user_message`, true by default). An assistant turn
with one call renders as `{"name": "<name>", "parameters": <arguments|tojson>}` alone (its text dropped),
closed by `<|eot_id|>`; a `tool` message renders as an `ipython` turn. So the prompt always goes through the
template: `chat` refuses `native_tools=False` (the format has no prompt text of its own for the tools). A
target is what the template writes between the generation prompt
(`<|start_header_id|>assistant<|end_header_id|>\\n\\n`) and `<|eot_id|>` (tested on both templates).

Choices the template leaves open, made here:
- Parallel calls (the template raises on them) are call objects joined by `; `, the separator vLLM's
  `llama3_json` tool parser splits on; an earlier turn's parallel calls reach the template as that text
  (assistant content, written verbatim, trimmed).
- A call turn's text and any reasoning are dropped, as the template drops them. A text answer is the response
  as given; one starting with `{` (after whitespace) would read back as a call and is refused.
- Names are JSON-escaped (the template pastes them raw: identical unless a name holds `"` or `\\`); JSON keeps
  non-ASCII characters, as `tojson` does.
- `parse`: a response whose first non-space character, after an optional `<|python_tag|>` (Llama 3.1's ipython
  mode), is `{` holds calls: JSON objects read with the JSON decoder, separated by `;` (whitespace allowed).
  It reports invalid JSON (with its position), a missing or non-string name, missing or non-object
  `parameters`, a `;` with no call after it, and text after the last object; extra keys are ignored. `calls`
  holds the objects valid on their own. Any other response is a text answer: `response` its stripped text
  (None when empty), no calls.

Decisions (the name closed by `"`): the first call opens at its `{` with opener `{"name": "`; a call after
`; ` opens at the `;` with opener `; {"name": "` (after any other separator: at its `{`, first opener). With
`end_decision` (default), ending the turn (`<|eot_id|>`) after the last call is a ∅ decision at the end of the
last object, opener `; {"name": "`. A text answer has one ∅ decision where it starts (after leading
whitespace), opener `{"name": "`. A call with broken JSON counts when its name can be read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.formats.base import Decision, ParseResult, TemplateFormat, native_message
from cipr.formats.json_calls import (
    CALL_NAME_OPENER,
    ReadCall,
    call_object,
    decode_at,
    lexical_name,
    read_value,
)
from cipr.formats.json_calls import name_text as json_name_text
from cipr.formats.scan import skip_space
from cipr.tools.interface import Call, Message

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = "; "
FIRST_OPENER = CALL_NAME_OPENER
NEXT_OPENER = SEPARATOR + CALL_NAME_OPENER
_SPECIALS = (PYTHON_TAG, "<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>")


@dataclass
class _Object:
    start: int
    end: int | None
    separator: int | None
    read: ReadCall


@dataclass
class _Scan:
    answer: int = 0
    calls: bool = False
    objects: list[_Object] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _scan(text: str) -> _Scan:
    s = _Scan(answer=skip_space(text, 0))
    i = s.answer
    if text.startswith(PYTHON_TAG, i):
        i = skip_space(text, i + len(PYTHON_TAG))
    if not text.startswith("{", i):
        return s
    s.calls, separator, n = True, None, len(text)
    while True:
        value, end, error = decode_at(text, i)
        if error is not None:
            s.objects.append(_Object(i, None, separator, ReadCall(lexical_name(text[i:]), None, error)))
            s.errors.append(error)
            return s
        read = read_value(value, "parameters", i)
        s.objects.append(_Object(i, end, separator, read))
        if read.error:
            s.errors.append(read.error)
        j = skip_space(text, end)
        if j >= n:
            return s
        if text[j] == ";":
            k = skip_space(text, j + 1)
            if text.startswith("{", k):
                separator, i = j, k
                continue
            if k >= n:
                s.errors.append(f"';' at char {j} is not followed by a call")
                return s
        s.errors.append(f"unexpected text after the calls at char {j}: {text[j:j + 60]!r}")
        return s


@dataclass(frozen=True)
class Llama3JsonFormat(TemplateFormat):
    """Llama 3.1 / 3.2 tool calls (`end_decision`: see `TemplateFormat`)."""

    name = "llama3_json"
    templates = "llama3_1 or llama3_2"

    def template_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """Parallel calls of an earlier turn go in as their target text (the template takes one a turn)."""
        return [{"role": "assistant", "content": self.render_target(m.calls)} if len(m.calls) > 1
                else native_message(m) for m in messages]

    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """The call objects joined by `; `; without calls, the response text (`think` is always dropped)."""
        if calls:
            return SEPARATOR.join(call_object(c, "parameters") for c in calls)
        text = response or ""
        head = text.lstrip()
        if head.startswith(("{", PYTHON_TAG)) or any(tag in text for tag in _SPECIALS):
            raise ValueError(f"Llama 3 format: the response text {text[:40]!r} would not parse back as a "
                             f"text answer (it starts with '{{' or holds a control token)")
        return text

    def parse(self, text: str) -> ParseResult:
        s = _scan(text)
        calls = tuple(o.read.call for o in s.objects if o.read.call is not None)
        response = None if s.calls else (text.strip() or None)
        return ParseResult(calls=calls, ok=not s.errors, error="; ".join(s.errors) or None, response=response)

    def decisions(self, text: str) -> list[Decision]:
        s = _scan(text)
        if not s.calls:
            return [Decision(s.answer, FIRST_OPENER, '"', None)]
        out: list[Decision] = []
        for o in s.objects:
            if o.read.name is None:
                continue
            if o.separator is not None and text.startswith(NEXT_OPENER, o.separator):
                out.append(Decision(o.separator, NEXT_OPENER, '"', o.read.name))
            else:
                out.append(Decision(o.start, FIRST_OPENER, '"', o.read.name))
        last = s.objects[-1].end
        if self.end_decision and last is not None:
            out.append(Decision(last, NEXT_OPENER, '"', None))
        return out

    def name_text(self, name: str) -> str:
        return json_name_text(name)
