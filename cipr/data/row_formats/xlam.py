"""xLAM / APIGen rows (xlam-function-calling-60k, xlam-irrelevance-7.5k): `query`, `tools`, `answers`.

`tools` and `answers` are JSON strings (as on the Hub), decoded lists, or Python literals (single quotes). A
row is one user message (`query`) and one assistant turn making the `answers` calls in order (parallel when
several). Empty `answers` (xlam-irrelevance) is a turn that calls nothing; the data gives it no text, so its
text is `NO_CALL_ANSWER`.

xLAM writes `parameters` as `{name: {"type": "str", "description": ..., "default": ...}}`, not a JSON Schema;
they become `{"type": "object", "properties": ..., "required": ...}`: Python type names map to JSON Schema's
(`str` string, `int` integer, `float` number, `bool` boolean, `list`/`List[X]` array, with `items` for a known
X, `dict` object; other names kept as written), and a parameter is required unless its type says `optional`
(`str, optional`, `Optional[str]`) or it has a `default`. Parameters that already are a JSON Schema (a string
`type`) are kept, as are OpenAI-wrapped tools.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from cipr.data.row_formats.build import Builder

NO_CALL_ANSWER = "None of the available tools can do this."
"""The text of an answer without a call, which xLAM rows leave unwritten."""

_TYPES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
          "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "tuple": "array",
          "set": "array", "array": "array", "dict": "object", "object": "object"}
_OPTIONAL = re.compile(r"(?:optional\[(.*)\]|(.*?)\s*,\s*optional)", re.I | re.S)
_GENERIC = re.compile(r"(\w+)\s*\[\s*(\w+)\s*\]")


def _property(spec: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """A JSON Schema property from an xLAM parameter spec, and whether it is required."""
    out = dict(spec)
    required = "default" not in spec
    written = spec.get("type")
    if isinstance(written, str):
        text = written.strip()
        optional = _OPTIONAL.fullmatch(text)
        if optional:
            text, required = (optional.group(1) or optional.group(2)).strip(), False
        generic = _GENERIC.fullmatch(text)
        base = (generic.group(1) if generic else text).lower()
        out["type"] = _TYPES.get(base, text)
        if generic and out["type"] == "array" and generic.group(2).lower() in _TYPES:
            out["items"] = {"type": _TYPES[generic.group(2).lower()]}
    return out, required


def _tool(entry: Any, b: Builder, where: str) -> Any:
    if not isinstance(entry, Mapping):
        raise b.bad("malformed tool", f"a tool must be an object, got {type(entry).__name__}", where)
    fn = entry.get("function", entry)
    params = fn.get("parameters") if isinstance(fn, Mapping) else None
    if not isinstance(params, Mapping) or isinstance(params.get("type"), str):
        return entry  # a JSON Schema already (or malformed: the messages reader says why)
    properties, required = {}, []
    for name, spec in params.items():
        if not isinstance(spec, Mapping):
            raise b.bad("malformed tool", f"parameter {name!r} must be an object with its type and "
                        f"description", f"{where}.parameters.{name}")
        properties[name], needed = _property(spec)
        if needed:
            required.append(name)
    schema = {"type": "object", "properties": properties, "required": required}
    return {**fn, "parameters": schema}


def read_xlam(row: Mapping[str, Any], b: Builder) -> None:
    """Build the `messages` row of one xLAM row into `b`."""
    query = row.get("query")
    if not isinstance(query, str) or not query.strip():
        raise b.bad("missing query", f"'query' must be a non-empty string, got {query!r}"[:200], "query")
    for key in ("tools", "answers"):
        if row.get(key) is None:
            raise b.bad(f"missing {key}", f"missing {key!r} (give [] for none)", key)
    tools = b.decoded(row["tools"], "tools", "tools not valid JSON")
    if not isinstance(tools, list):
        raise b.bad("malformed tool", f"'tools' must be a list of tools, got {type(tools).__name__}", "tools")
    for k, entry in enumerate(tools):
        b.tool(_tool(entry, b, f"tools[{k}]"), f"tools[{k}]")
    answers = b.decoded(row["answers"], "answers", "answers not valid JSON")
    if not isinstance(answers, list):
        raise b.bad("malformed call", f"'answers' must be a list of calls, got {type(answers).__name__}",
                    "answers")
    b.message("user", query, "query")
    b.message("assistant", None if answers else NO_CALL_ANSWER, "answers",
              [(a, f"answers[{k}]") for k, a in enumerate(answers)])
