"""JSON pieces shared by the JSON call formats (ToolRL, Hermes): rendering and tolerant reading of calls.

Rendering uses `json.dumps` with the default separators `", "` and `": "`, as Qwen's chat template
(`tojson`, non-ASCII kept) and ToolRL's data (ASCII escapes, `ascii=True`) both do.
Reading never raises: every failure comes back as a message that says what was wrong and where.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cipr.tools.interface import Call

CALL_NAME_OPENER = '{"name": "'
"""The text of a call object up to its name; a tool name is closed by a double quote."""

_DECODER = json.JSONDecoder()
_LEXICAL_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\\n]|\\.)*)"')


def to_plain(value: Any) -> Any:
    """Mappings to dicts and tuples to lists, recursively, so `json.dumps` accepts any argument value."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def dumps(value: Any, *, ascii: bool = False) -> str:
    """JSON with the default separators; non-ASCII kept as Qwen's template writes it unless `ascii`."""
    return json.dumps(to_plain(value), ensure_ascii=ascii)


def name_text(name: str, *, ascii: bool = False) -> str:
    """A tool name as it appears between `"name": "` and the closing quote (JSON-escaped)."""
    return dumps(name, ascii=ascii)[1:-1]


def call_object(call: Call, args_key: str, *, ascii: bool = False) -> str:
    """One call as a single-line JSON object: `{"name": ..., "<args_key>": {...}}`."""
    return ("{" + f'"name": {dumps(call.name, ascii=ascii)}, '
            f'"{args_key}": {dumps(call.arguments, ascii=ascii)}' + "}")


@dataclass(frozen=True)
class ReadCall:
    """What could be read from one call object's text: `name` when it can be read (even in a broken object:
    the policy chose that tool), `call` only when the whole object is valid, `error` what was wrong."""

    name: str | None
    call: Call | None
    error: str | None


def read_call(text: str, args_key: str, *, offset: int = 0) -> ReadCall:
    """Read one JSON call object (`{"name": str, args_key: object}`) that is all of `text`; `offset`, its
    position in the response, makes error positions response offsets."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return ReadCall(lexical_name(text), None, f"invalid JSON at char {offset + e.pos}: {e.msg}")
    except RecursionError:
        return ReadCall(lexical_name(text), None, f"invalid JSON at char {offset}: nested too deeply")
    return read_value(value, args_key, offset)


def decode_at(text: str, start: int) -> tuple[Any, int, str | None]:
    """The JSON value that starts at `text[start]` and its end, or (None, start, why it does not decode)."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as e:
        return None, start, f"invalid JSON at char {e.pos}: {e.msg}"
    except RecursionError:
        return None, start, f"invalid JSON at char {start}: nested too deeply"
    return value, end, None


def read_call_at(text: str, start: int, args_key: str, *, stop: int) -> tuple[ReadCall, int]:
    """Read the JSON call object that starts at `text[start]`, and where it ends: the JSON decoder finds the
    end, so tags inside strings (`"</tool_call>"`) do not end a block; an object that does not decode runs to
    `stop`, and the read says why."""
    value, end, error = decode_at(text, start)
    if error is not None:
        return ReadCall(lexical_name(text[start:stop]), None, error), stop
    return read_value(value, args_key, start), end


def read_value(value: Any, args_key: str, offset: int) -> ReadCall:
    """Check a decoded JSON value as a call object; extra keys are ignored."""
    if not isinstance(value, dict):
        return ReadCall(None, None, f"call at char {offset} is a JSON {type(value).__name__}, not an object")
    if "name" not in value:
        return ReadCall(None, None, f"call at char {offset} has no 'name'")
    name = value["name"]
    if not isinstance(name, str) or not name:
        return ReadCall(None, None, f"call at char {offset}: 'name' must be a non-empty string, got {name!r}")
    if args_key not in value:
        return ReadCall(name, None, f"call to {name!r} at char {offset} has no '{args_key}'")
    args = value[args_key]
    if not isinstance(args, dict):
        return ReadCall(name, None, f"call to {name!r} at char {offset}: '{args_key}' must be an object, "
                                    f"got {type(args).__name__}")
    return ReadCall(name, Call(name, args), None)


def lexical_name(text: str) -> str | None:
    """The name of a call object that does not parse as JSON, if it starts `{"name": "<name>"`."""
    m = _LEXICAL_NAME.match(text)
    if not m:
        return None
    try:
        name = json.loads(f'"{m.group(1)}"')
    except json.JSONDecodeError:
        return None
    return name or None
