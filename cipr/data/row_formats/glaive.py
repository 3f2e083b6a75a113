"""Glaive function-calling v2 rows: a `system` text and a `chat` text.

`system` is `SYSTEM: <instructions> -` then the function definitions, bare JSON objects one after the other; a
system text without any is kept as the system message (`SYSTEM:` dropped), one with them is the format's own
tool instructions and is not kept.

`chat` is a sequence of turns opened by `USER:`, `ASSISTANT:` or `FUNCTION RESPONSE:` at the start of a line,
assistant turns closed by `<|endoftext|>` (dropped wherever it appears). An assistant turn's call is
`<functioncall> {"name": ..., "arguments": ...}`; several are parallel calls, and the text around them is the
turn's text. Glaive writes the arguments as a JSON string in single quotes (`"arguments": '{"a": 1}'`),
neither JSON nor (with an apostrophe inside) a Python literal: the call is read as JSON, else as a Python
literal, else as that exact shape. A `FUNCTION RESPONSE:` turn is a tool message (its tool: the single call
before it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from cipr.data.row_formats.build import Builder, json_objects, loose_json

_MARKER = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_QUOTED_ARGUMENTS = re.compile(
    r"""\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*'(.*)'\s*}""", re.S)
_CALL, _END = "<functioncall>", "<|endoftext|>"
ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}


def _call(text: str, b: Builder, where: str) -> tuple[Any, str]:
    """(the call written at the start of `text`, the text after it)."""
    start = len(text) - len(text.lstrip())
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
        return value, text[end:].strip()
    except (ValueError, RecursionError):
        pass
    try:
        return loose_json(text), ""
    except ValueError as e:
        quoted = _QUOTED_ARGUMENTS.fullmatch(text.strip())
        if quoted is None:
            raise b.bad("call not valid JSON", f"the <functioncall> object is {e}", where) from None
    return {"name": json.loads(quoted.group(1)), "arguments": quoted.group(2)}, ""


def _assistant(body: str, b: Builder, where: str) -> None:
    pieces = body.split(_CALL)
    outside, calls = [pieces[0].strip()], []
    for k, piece in enumerate(pieces[1:]):
        call, after = _call(piece, b, f"{where}.functioncall[{k}]")
        calls.append((call, f"{where}.functioncall[{k}]"))
        outside.append(after)
    b.message("assistant", "\n".join(p for p in outside if p), where, calls)


def _system(row: Mapping[str, Any], b: Builder) -> None:
    system = row.get("system")
    if system is None:
        return
    if not isinstance(system, str):
        raise b.bad("non-text content", f"'system' must be a string, got {type(system).__name__}", "system")
    text = system.strip().removeprefix("SYSTEM:").strip()
    brace = text.find("{")
    if brace < 0:
        if text:
            b.message("system", text, "system")
        return
    try:
        tools = json_objects(text[brace:])
    except ValueError as e:
        raise b.bad("tools not valid JSON", f"the function definitions are {e}", "system") from None
    for k, entry in enumerate(tools):
        b.tool(entry, f"system.function[{k}]")


def read_glaive(row: Mapping[str, Any], b: Builder) -> None:
    """Build the `messages` row of one Glaive row into `b`."""
    chat = row.get("chat")
    if not isinstance(chat, str) or not chat.strip():
        raise b.bad("missing chat", "'chat' must be the conversation's text (USER: ... ASSISTANT: ...)",
                    "chat")
    _system(row, b)
    marks = list(_MARKER.finditer(chat))
    if not marks or chat[:marks[0].start()].strip():
        raise b.bad("malformed message", "the chat must open with a USER:, ASSISTANT: or FUNCTION "
                    "RESPONSE: turn", "chat")
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(chat)
        body = chat[m.end():end].replace(_END, "").strip()
        role, where = ROLES[m.group(1)], f"chat[{k}]"
        if role == "assistant":
            _assistant(body, b, where)
        else:
            b.message(role, body, where)
