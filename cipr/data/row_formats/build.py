"""What every reader of a public function-calling format shares: lenient decoding, and a `messages` row built
turn by turn that remembers which source field each of its parts came from.

A problem the `messages` reader (`cipr.data.messages`) finds in a converted row (an undeclared tool, a
malformed schema, an empty assistant turn, ...) is reported under the source's own field (`answers[1].name`,
`conversations[3].value.tool_call[0].arguments`, `chat[2]`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.data.messages import BadRow, RawRow, call_parts

_DECODER = json.JSONDecoder()


def json_data(value: Any) -> Any:
    """A Python literal as JSON data (tuples as lists); ValueError for sets, bytes, complex, other keys."""
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("an object with a non-string key")
        return {k: json_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_data(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise ValueError(f"a Python {type(value).__name__}, which JSON has no value for")


def loose_json(text: str) -> Any:
    """JSON, else a Python literal (single quotes, `True`, `None`) read with `ast.literal_eval` (never eval);
    ValueError saying why when it is neither."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        why = f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    except (ValueError, RecursionError) as e:
        why = f"not valid JSON ({str(e)[:100]})"
    try:
        return json_data(ast.literal_eval(text.strip()))
    except SyntaxError as e:  # its text names a made-up '<unknown>' file: keep the message alone
        raise ValueError(f"{why}, nor a Python literal ({e.msg})") from None
    except (ValueError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"{why}, nor a Python literal ({str(e)[:80]})") from None


def json_objects(text: str) -> list[Any]:
    """A list of objects written as one JSON list or object (or Python literal), or as objects one after the
    other (whitespace or commas between); ValueError when it is none of these."""
    try:
        value = loose_json(text)
    except ValueError as e:
        error = e
    else:
        return value if isinstance(value, list) else [value]
    out, i = [], 0
    while True:
        while i < len(text) and (text[i].isspace() or text[i] == ","):
            i += 1
        if i == len(text):
            return out
        try:
            value, i = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError):
            raise error from None
        out.append(value)


@dataclass
class Builder:
    """A `messages` row under construction, with the source field of each message, call and tool."""

    raw: RawRow
    tools_field: str
    messages_field: str
    tools: list[Any] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)

    def bad(self, kind: str, message: str, where: str | None = None) -> BadRow:
        return self.raw.bad(kind, message, where)

    def decoded(self, value: Any, where: str, kind: str) -> Any:
        """`value`, decoded when it is a string (`loose_json`); a BadRow of `kind` naming `where` if not."""
        if not isinstance(value, str):
            return value
        try:
            return loose_json(value)
        except ValueError as e:
            raise self.bad(kind, str(e), where) from None

    def tool(self, entry: Any, where: str) -> None:
        self.fields[f"tools[{len(self.tools)}]"] = where
        self.tools.append(entry)

    def call(self, value: Any, where: str) -> dict[str, Any]:
        """One call (`{name, arguments}`, or wrapped in `function`), its arguments decoded and checked."""
        if not isinstance(value, Mapping):
            raise self.bad("malformed call", f"a call must be an object, got {type(value).__name__}", where)
        name, args = call_parts(value.get("function", value), self.raw, where, self.decoded)
        return {"name": name, "arguments": args}

    def message(self, role: str, content: str | None, where: str, calls: Sequence[tuple[Any, str]] = (),
                name: str | None = None) -> None:
        """Append a message; `calls`: (call as the source gives it, its source field) pairs."""
        j = len(self.messages)
        self.fields[f"messages[{j}]"] = where
        m: dict[str, Any] = {"role": role, "content": content}
        if calls:
            m["tool_calls"] = []
            for k, (value, at) in enumerate(calls):
                m["tool_calls"].append(self.call(value, at))
                self.fields[f"messages[{j}].tool_calls[{k}]"] = at
        if name is not None:
            m["name"] = name
        self.messages.append(m)

    def row(self, source: Mapping[str, Any]) -> SourceRow:
        """The `messages` row built, as a row the `messages` reader reads (with the source's `id`)."""
        value: dict[str, Any] = {"tools": self.tools, "messages": self.messages}
        rid = source.get("id")
        if isinstance(rid, str | int) and not isinstance(rid, bool):
            value["id"] = rid
        fields = {"tools": self.tools_field, "messages": self.messages_field, **self.fields}
        r = self.raw
        return SourceRow(r.file, r.item, r.default_id, r.partition, value, fields=fields)


@dataclass(frozen=True)
class SourceRow(RawRow):
    """A converted row: the problems the `messages` reader finds are named by the source's fields."""

    fields: Mapping[str, str] = field(default_factory=dict)

    def bad(self, kind: str, message: str, field: str | None = None) -> BadRow:
        return super().bad(kind, message, source_field(field, self.fields))


def source_field(where: str | None, fields: Mapping[str, str]) -> str | None:
    """The source field of a `messages` row field: the longest known prefix, translated. A call's or a tool's
    inner field keeps its tail (`.name`, `.arguments`); a message is named by its source field alone."""
    if where is None:
        return None
    for end in sorted({i for i, c in enumerate(where) if c in ".["} | {len(where)}, reverse=True):
        key = where[:end]
        if key in fields:
            keep = key == where or "tool_calls[" in key or key.startswith("tools[")
            return fields[key] + (where[end:] if keep else "")
    return where
