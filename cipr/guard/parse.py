"""Reading calls out of model replies, including the malformed ones the guard exists to catch.

The guard's prompts ask for JSON (`{"name": ..., "arguments": {...}}`), but a model may answer in
its own call format, in OpenAI's shape, inside `<tool_call>` tags, or with no name at all. Parsing
here is lenient about *where* the call is and strict about *what* it says: a call without a name
becomes `Call("", arguments)` (the validator reports `missing_name`), arguments that are not an
object are kept as they are (reported `arguments_not_object`), and nothing is ever guessed.

Order: the call format's own parser when given (a model answers best in its trained format); when it
finds no call, the JSON scan: every `<tool_call>` block's JSON values, else every JSON value in the
text; objects with `name` (or OpenAI's `function: {name, arguments}`) are calls, objects with only
`arguments`/`parameters` nameless calls, lists several calls, and a reply that is one bare JSON object
with neither key the arguments of a nameless call.

`attempted`: the reply tried to make a call (a call parsed, the format reported a malformed call, or the
text has `<tool_call>` or `{"`). A plain text answer passes unless the guard requires a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cipr.tools.interface import Call

_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_OPENS_OBJECT = re.compile(r'\{\s*"')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedReply:
    """Calls found in a reply; `error` says what was malformed, if anything."""

    calls: tuple[Call, ...]
    attempted: bool
    error: str | None = None


def _json_values(text: str) -> list[Any]:
    values: list[Any] = []
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            except RecursionError:  # nested too deeply to read: skip the whole run of openers
                while i < len(text) and (text[i] in "{[" or text[i].isspace()):
                    i += 1
                continue
            values.append(value)
            i = end
        else:
            i += 1
    return values


def _to_call(obj: Mapping[str, Any], *, whole: bool) -> Call | None:
    if isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    if "name" in obj or "arguments" in obj or "parameters" in obj:
        name = obj.get("name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                pass
        return Call(name if isinstance(name, str) else "", args)
    if whole:
        return Call("", dict(obj))
    return None


def _calls_from(values: list[Any], *, whole: bool) -> list[Call]:
    calls: list[Call] = []
    for value in values:
        if isinstance(value, Mapping) and isinstance(value.get("tool_calls"), list):
            value = value["tool_calls"]
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, Mapping):
                call = _to_call(item, whole=whole and len(values) == 1 and len(items) == 1)
                if call is not None:
                    calls.append(call)
    return calls


def parse_json_calls(text: str) -> ParsedReply:
    """Calls from JSON in `text` (see the module docstring for what counts as a call)."""
    blocks = _TAG.findall(text)
    if blocks:
        calls: list[Call] = []
        for block in blocks:
            values = _json_values(block)
            found = _calls_from(values, whole=True)
            calls.extend(found or [Call("", {})])
        bad = sum(1 for b in blocks if not _calls_from(_json_values(b), whole=True))
        return ParsedReply(tuple(calls), True,
                           f"{bad} <tool_call> block(s) hold no parseable call" if bad else None)
    stripped = text.strip()
    values = _json_values(stripped)
    whole = len(values) == 1 and stripped[:1] in "{[" and stripped[-1:] in "}]"
    calls = _calls_from(values, whole=whole)
    attempted = bool(calls) or _OPENS_OBJECT.search(text) is not None
    if not calls and attempted:
        return ParsedReply((Call("", {}),), True, "the reply opens a JSON object but holds no parseable call")
    return ParsedReply(tuple(calls), attempted, None)


def parse_reply(text: str, call_format: Any = None) -> ParsedReply:
    """Calls in a model reply: the call format's parser first (if given), then the JSON scan."""
    if call_format is not None:
        try:
            result = call_format.parse(text)
        except RecursionError:
            return ParsedReply((Call("", {}),), True, "the reply nests too deeply to read")
        if result.calls:
            return ParsedReply(tuple(result.calls), True, result.error)
        fallback = parse_json_calls(text)
        if fallback.calls and fallback.attempted:
            return fallback
        if not result.ok:
            return ParsedReply((Call("", {}),), True, result.error or "malformed call")
        return ParsedReply((), False, None)
    return parse_json_calls(text)
