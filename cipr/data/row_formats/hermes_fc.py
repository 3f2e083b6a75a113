"""ShareGPT function-calling rows, `conversations` of `{"from", "value"}` turns: NousResearch's Hermes
function calling, and ToolACE-style rows.

Turns come `from` `system`, `human`, `gpt` or `tool` (also `user`, `assistant`, `function`, `observation`); a
row-level `system` text (ToolACE) is a first system turn. The tools are the JSON (or Python-literal) objects
inside `<tools>...</tools>` of a system turn, as a list or one after the other, bare or wrapped
(`{"type": "function", "function": ...}`); a system turn without `<tools>` holding a JSON list of named
objects (ToolACE's "Here is a list of functions in JSON format") declares that list. A row-level `tools` (a
list or a JSON string) is read instead when present. A system turn that declares tools is the format's own
tool instructions and is not kept (the call format writes its own); any other is the system message.

A `gpt` turn's calls are its `<tool_call>...</tool_call>` blocks in order (parallel calls when several), each
`{"name", "arguments"}` as JSON or a Python literal (Hermes writes `{'arguments': {...}, 'name': ...}`),
arguments an object or a JSON string; the text outside the blocks, stripped, is the turn's text. A turn that
is entirely a Python list of calls with keyword arguments, `[f(a=1), g(b='x')]` (ToolACE), makes those calls
(values read with `ast.literal_eval`, never evaluated). Each `<tool_response>...</tool_response>` block of a
`tool` turn is one tool message: `{"name", "content"}` gives the name and the content (non-string content as
JSON), any other block is the content itself. A turn without blocks that is a JSON list of
`{"name", "results"}` (ToolACE) is one tool message per entry (results as JSON); any other is one tool message
of its whole text.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from cipr.data.row_formats.build import Builder, json_data, json_objects, loose_json

ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "tool": "tool", "function": "tool", "observation": "tool"}
_DECODER = json.JSONDecoder()


def tagged(text: str, tag: str, b: Builder, where: str) -> tuple[list[str], list[str]]:
    """(the bodies of the `<tag>...</tag>` blocks of `text`, the pieces of text outside them, stripped)."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    bodies, outside, i = [], [], 0
    while True:
        k = text.find(opening, i)
        outside.append(text[i:k if k >= 0 else len(text)].strip())
        if k < 0:
            return bodies, [piece for piece in outside if piece]
        end = text.find(closing, k)
        if end < 0:
            raise b.bad("malformed call" if tag == "tool_call" else "malformed message",
                        f"{opening} at char {k} is never closed by {closing}", where)
        bodies.append(text[k + len(opening):end].strip())
        i = end + len(closing)


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, Mapping) and isinstance(v.get("name"), str) for v in value)


def _listed(text: str) -> list[Any] | None:
    """The first JSON list of named objects in `text` (ToolACE's prompt lists its functions so), else None."""
    i = text.find("[")
    while i >= 0:
        try:
            value, _ = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError):
            value = None
        if _named_list(value):
            return value
        i = text.find("[", i + 1)
    return None


def _declared(value: str, b: Builder, where: str) -> list[Any] | None:
    """The tools a system turn declares (None when it declares none)."""
    bodies, _ = tagged(value, "tools", b, where)
    if not bodies:
        return _listed(value)
    try:
        return [entry for body in bodies for entry in json_objects(body)]
    except ValueError as e:
        raise b.bad("tools not valid JSON", f"the <tools> block is {e}", where) from None


def _pythonic(text: str, b: Builder, where: str) -> list[tuple[Any, str]] | None:
    """The calls of a turn written as a Python list of calls (`[f(a=1)]`), else None."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.List) or not node.elts or not all(isinstance(e, ast.Call) for e in node.elts):
        return None
    calls = []
    for k, call in enumerate(node.elts):
        at = f"{where}.call[{k}]"
        if call.args or not isinstance(call.func, ast.Name | ast.Attribute):
            raise b.bad("malformed call", f"call {k} must be NAME(key=value, ...): {ast.unparse(call)[:80]}",
                        at)
        try:
            args = json_data({kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg})
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
            raise b.bad("arguments not valid JSON", f"an argument is not a JSON-like Python literal ({e})",
                        f"{at}.arguments") from None
        calls.append(({"name": ast.unparse(call.func), "arguments": args}, at))
    return calls


def _results(value: str, b: Builder, where: str) -> None:
    bodies, _ = tagged(value, "tool_response", b, where)
    try:
        listed = None if bodies else json.loads(value)
    except ValueError:
        listed = None
    if _named_list(listed) and all("results" in r for r in listed):
        for k, r in enumerate(listed):
            b.message("tool", json.dumps(r["results"], ensure_ascii=False), f"{where}[{k}]", name=r["name"])
        return
    for k, body in enumerate(bodies or [value.strip()]):
        at = f"{where}.tool_response[{k}]" if bodies else where
        try:
            result = loose_json(body)
        except ValueError:
            result = None
        name = result.get("name") if isinstance(result, Mapping) else None
        content = result["content"] if isinstance(result, Mapping) and "content" in result else body
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        b.message("tool", text, at, name=name if isinstance(name, str) else None)


def _turns(row: Mapping[str, Any], b: Builder) -> list[tuple[Any, Any, str]]:
    """(from, value, field) of every turn, a row-level `system` text first."""
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise b.bad("missing conversations", "'conversations' must be a non-empty list of {from, value} "
                    "turns", "conversations")
    out = [("system", row["system"], "system")] if isinstance(row.get("system"), str) else []
    for i, turn in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(turn, Mapping):
            raise b.bad("malformed message", "a turn must be an object", where)
        out.append((turn.get("from"), turn.get("value"), where))
    return out


def read_hermes_fc(row: Mapping[str, Any], b: Builder) -> None:
    """Build the `messages` row of one ShareGPT function-calling row into `b`."""
    turns = _turns(row, b)
    given = row.get("tools")
    if given is not None:
        given = b.decoded(given, "tools", "tools not valid JSON")
        for k, entry in enumerate(given if isinstance(given, list) else [given]):
            b.tool(entry, f"tools[{k}]")
    for sender, value, where in turns:
        role = ROLES.get(sender) if isinstance(sender, str) else None
        if role is None:
            raise b.bad("unknown role", f"from {sender!r} is not one of {', '.join(ROLES)}", f"{where}.from")
        if not isinstance(value, str):
            raise b.bad("non-text content", f"'value' must be a string, got {type(value).__name__}",
                        f"{where}.value" if where != "system" else where)
        where += ".value" if where != "system" else ""
        if role == "system":
            tools = _declared(value, b, where)
            for k, entry in enumerate(tools if given is None and tools else []):
                b.tool(entry, f"{where}.tools[{k}]")
            if tools is None:
                b.message("system", value, where)
        elif role == "assistant":
            calls = _pythonic(value, b, where)
            if calls is not None:
                b.message("assistant", "", where, calls)
                continue
            bodies, outside = tagged(value, "tool_call", b, where)
            at = [f"{where}.tool_call[{k}]" for k in range(len(bodies))]
            calls = [(b.decoded(t, f, "call not valid JSON"), f) for t, f in zip(bodies, at, strict=True)]
            b.message("assistant", "\n".join(outside), where, calls)
        elif role == "tool":
            _results(value, b, where)
        else:
            b.message("user", value, where)
