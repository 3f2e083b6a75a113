"""gpt-oss (harmony) call format: a call is a message addressed `to=functions.<name>`, tools through the
template.

OpenAI's gpt-oss chat template (TRL's `gptoss.jinja`) takes `tools=` and writes them as a TypeScript-like
`namespace functions` in the developer message. Its generation prompt is `<|start|>assistant`; an assistant
turn is a sequence of messages `<header><|message|><body><terminator>`, each next one opened by
`<|start|>assistant`:

    <|channel|>analysis<|message|>reasoning<|end|>                      (the `thinking` of the turn)
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{"arg": 1}<|call|>
    <|channel|>final<|message|>the answer<|return|>                    (a turn without calls)

so a response starts with its first message's header, and the tool name sits between ` to=functions.` and the
`<|channel|>` control token. A target is what the template writes after the generation prompt: a call turn up
to and including its `<|call|>`, a text answer up to `<|return|>` (the end-of-turn token, like Qwen's
`<|im_end|>` not part of the target; tested).

Choices the template leaves open, made here:
- Parallel calls: the template renders only `tool_calls[0]` of a turn. Each call is its own message instead
  (`...<|call|><|start|>assistant to=functions.B...<|call|>`, as the template renders consecutive single-call
  assistant messages); `chat` splits an earlier turn's parallel calls that way. (gpt-oss's own generation
  config stops at `<|call|>`, so the model makes one call per turn.)
- The text of a turn with calls goes into its analysis message, as the template writes `content` there; text
  and reasoning together are refused, as the template refuses them. An empty reasoning of a call turn writes
  nothing (the template skips it); a text answer writes its reasoning even when empty.
- Names are written raw, as the template does: an empty name, or one with whitespace or a control token, is
  refused. Arguments are `json.dumps`, non-ASCII kept (the template's `tojson`).
- `parse` reads the messages in order: a header `<|channel|>analysis`, `<|channel|>final` or
  ` to=functions.NAME<|channel|>commentary json` (`<|constrain|>json` also read), the body up to its
  terminator. `think` is the analysis bodies joined by newlines, `response` the final body (None when empty).
  A call's body is its arguments, read with the JSON decoder (control-token text inside a string stays text),
  and must be an object. It reports an unknown header, a message without `<|message|>`, a wrong terminator
  (`<|call|>` closes calls, `<|end|>` analysis, `<|return|>` or `<|end|>` the final message), an analysis
  never closed, text between messages, a message after the final one, a second final message, and a response
  with neither a call nor a final message. The last call's `<|call|>` and the final message's `<|return|>` may
  be missing at the end (runtimes stop on them). `calls` holds the calls with valid arguments.

Decisions, the name always closed by `<|channel|>`: a call or final message not following a call opens at its
header with opener ` to=functions.` (where the policy chooses between a call and the final channel). A message
right after a call opens where that `<|call|>` starts, opener `<|call|><|start|>assistant to=functions.`; so
does the end of the turn after the last call (∅, with `end_decision`), whether or not the text keeps the
`<|call|>`. A call with broken arguments still counts (its name is in the header); a text cut off inside its
analysis has no decision.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.formats.base import Decision, ParseResult, TemplateFormat, native_message
from cipr.formats.json_calls import decode_at, dumps
from cipr.formats.scan import refuse_tags, skip_space
from cipr.tools.interface import Call, Message

START, CHANNEL, MESSAGE = "<|start|>assistant", "<|channel|>", "<|message|>"
END, CALL, RETURN, CONSTRAIN = "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"
RECIPIENT = " to=functions."
FIRST_OPENER = RECIPIENT
NEXT_OPENER = CALL + START + RECIPIENT
CONTROL = ("<|start|>", CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)
_CALL_HEADER = re.compile(r"\s*to=functions\.(.*?)<\|channel\|>(.*)", re.S)
_CALL_CHANNEL = re.compile(r"commentary (?:<\|constrain\|>)?(\S+)\s*", re.S)
_TERMINATORS = (END, CALL, RETURN)


@dataclass
class _Message:
    start: int
    kind: str                # "analysis", "final" or "call"
    name: str | None = None
    body: str = ""
    args_end: int | None = None
    call: Call | None = None


@dataclass
class _Scan:
    messages: list[_Message] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cut_in_analysis: bool = False


def _header(header: str, at: int, s: _Scan) -> tuple[str | None, str | None]:
    """(kind, name) of a message header at char `at`; kind None (and an error) when it is not one."""
    if header.strip() in (CHANNEL + "analysis", CHANNEL + "final"):
        return header.strip()[len(CHANNEL):], None
    m = _CALL_HEADER.fullmatch(header)
    if m is None or not m.group(1):
        s.errors.append(f"unknown message header at char {at}: {header[:60]!r}")
        return None, None
    channel = _CALL_CHANNEL.fullmatch(m.group(2))
    if channel is None or channel.group(1) != "json":
        s.errors.append(f"call to {m.group(1)!r} at char {at}: expected 'commentary json' after <|channel|>, "
                        f"got {m.group(2)[:40]!r}")
    return "call", m.group(1)


def _arguments(text: str, msg: _Message, body: int, s: _Scan) -> int:
    """Read a call's arguments from `body`; returns where the message's terminator should be."""
    j = skip_space(text, body)
    value, end, error = decode_at(text, j)
    if error is not None:
        s.errors.append(f"call to {msg.name!r}: {error}")
        ends = [k for k in (text.find(t, body) for t in _TERMINATORS) if k >= 0]
        return min(ends, default=len(text))
    if not isinstance(value, dict):
        s.errors.append(f"call to {msg.name!r} at char {j}: the arguments must be a JSON object, "
                        f"got {type(value).__name__}")
    else:
        msg.call = Call(msg.name or "", value)
    msg.args_end = end
    return skip_space(text, end)


def _scan(text: str) -> _Scan:
    s = _Scan()
    n, pos = len(text), 0
    while True:
        h = text.find(MESSAGE, pos)
        if h < 0:
            s.errors.append(f"message at char {pos} has no <|message|>" if text[pos:].strip() else
                            "empty response" if not s.messages else
                            f"<|start|>assistant at char {pos} opens no message")
            break
        kind, name = _header(text[pos:h], pos, s)
        if kind is None:
            break
        msg = _Message(pos, kind, name)
        s.messages.append(msg)
        body = h + len(MESSAGE)
        if kind == "call":
            stop = _arguments(text, msg, body, s)
            if stop < n and not any(text.startswith(t, stop) for t in _TERMINATORS):
                s.errors.append(f"unexpected text after the arguments of {name!r} at char {stop}: "
                                f"{text[stop:stop + 40]!r}")
                break
        else:
            stops = [k for k in (text.find(t, body) for t in _TERMINATORS) if k >= 0]
            stop = min(stops, default=n)
            msg.body = text[body:stop]
            for tag in CONTROL:
                if tag in msg.body:
                    s.errors.append(f"stray {tag} in the {kind} message at char {pos}")
                    break
            if stop == n and kind == "analysis":
                s.errors.append(f"analysis message at char {pos} is never closed by <|end|>")
                s.cut_in_analysis = True
        if stop >= n:
            break
        terminator = next(t for t in _TERMINATORS if text.startswith(t, stop))
        expected = {"call": (CALL,), "analysis": (END,), "final": (RETURN, END)}[kind]
        if terminator not in expected:
            s.errors.append(f"the {kind} message at char {pos} is closed by {terminator}, not "
                            f"{' or '.join(expected)}")
        pos = stop + len(terminator)
        if pos >= n:
            break
        if not text.startswith(START, pos):
            s.errors.append(f"unexpected text after {terminator} at char {pos}: {text[pos:pos + 40]!r}")
            break
        pos += len(START)
    finals = [m for m in s.messages if m.kind == "final"]
    if len(finals) > 1:
        s.errors.append(f"second final message at char {finals[1].start}")
    if finals and finals[0] is not s.messages[-1]:
        s.errors.append(f"a message follows the final message at char {finals[0].start}")
    if s.messages and not finals and not any(m.kind == "call" for m in s.messages) and not s.cut_in_analysis:
        s.errors.append("the response has neither a call nor a final message")
    return s


@dataclass(frozen=True)
class GptOssFormat(TemplateFormat):
    """gpt-oss tool calls (`end_decision`: see `TemplateFormat`)."""

    name = "gptoss"
    templates = "gptoss"

    def template_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """An earlier turn's parallel calls become one assistant message each (the template renders one)."""
        out: list[dict[str, Any]] = []
        for m in messages:
            out.append(native_message(Message(m.role, m.content, m.calls[:1], m.name)))
            out.extend(native_message(Message("assistant", "", (c,))) for c in m.calls[1:])
        return out

    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """Analysis message (reasoning, or a call turn's text), then a message per call, or the final one."""
        for text, what in ((think, "think"), (response, "response")):
            refuse_tags(text or "", CONTROL, what, "gpt-oss")
        analysis = think
        if calls:
            if response and think:
                raise ValueError("gpt-oss format: a turn with calls takes text or reasoning, not both (the "
                                 "template writes either into its analysis message)")
            analysis = think or response or None
        out = f"{CHANNEL}analysis{MESSAGE}{analysis}{END}{START}" if analysis is not None else ""
        if not calls:
            return out + f"{CHANNEL}final{MESSAGE}{response or ''}"
        for c in calls:
            if not c.name or any(ch.isspace() for ch in c.name) or any(tag in c.name for tag in CONTROL):
                raise ValueError(f"gpt-oss format: the tool name {c.name!r} cannot sit in a message header")
        return out + START.join(f"{RECIPIENT}{c.name}{CHANNEL}commentary json{MESSAGE}"
                                f"{dumps(c.arguments)}{CALL}" for c in calls)

    def parse(self, text: str) -> ParseResult:
        s = _scan(text)
        calls = tuple(m.call for m in s.messages if m.call is not None)
        analysis = [m.body for m in s.messages if m.kind == "analysis"]
        final = next((m.body for m in s.messages if m.kind == "final"), None)
        return ParseResult(calls=calls, ok=not s.errors, error="; ".join(s.errors) or None,
                           response=final or None, think="\n".join(analysis) if analysis else None)

    def decisions(self, text: str) -> list[Decision]:
        s = _scan(text)
        out: list[Decision] = []
        before: _Message | None = None
        for m in s.messages:
            if m.kind != "analysis":
                taken = m.name if m.kind == "call" else None
                if before is not None and before.kind == "call" and before.args_end is not None and \
                        text[before.args_end:m.start] == CALL + START:
                    out.append(Decision(before.args_end, NEXT_OPENER, CHANNEL, taken))
                else:
                    out.append(Decision(m.start, FIRST_OPENER, CHANNEL, taken))
            before = m
        if self.end_decision and before is not None and before.kind == "call" and before.args_end is not None:
            out.append(Decision(before.args_end, NEXT_OPENER, CHANNEL, None))
        return out
