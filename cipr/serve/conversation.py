"""The adapter on OpenAI chat requests: canonical names in, executable names out.

`canonical_request` renames, with `cipr.tools.canonical`'s positional rule, the request's `tools`, and
every reference to their names in the conversation: the name and argument names of each earlier
assistant `tool_calls` entry (arguments stay a JSON string, keys renamed), the `name` of each tool
result message, a forced `tool_choice`, and tool names in free text: message contents and the tools'
and their arguments' descriptions (`rewrite_text`, as `cipr.tools.canonical.apply_name_map` does for
examples). Tool result contents are values the tools returned, not interface names, and are left as
they are. A name in an earlier call that the request's tools do not declare is left unchanged (the
conversation is the client's, not ours).

`translate_reply` maps the backend's assistant message back: each tool call's name and argument
names, and canonical ids in its text. A call naming an id the canonical interface does not declare
raises `UndeclaredToolError` (never guessed into a declared tool). Both functions build new objects;
nothing is shared between requests.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from cipr.tools.canonical import (
    NameMap,
    RewriteText,
    canonicalize_interface,
    rewrite_interface_text,
    rewrite_text,
)
from cipr.tools.interface import Call, Interface


def request_interface(body: Mapping[str, Any]) -> Interface:
    """The request's tools as an Interface."""
    return Interface.from_openai(body.get("tools") or [], where="<request tools>")


def _rewrite_content(content: Any, mapping: Mapping[str, str], mode: RewriteText) -> Any:
    if isinstance(content, str):
        return rewrite_text(content, mapping, mode)
    if isinstance(content, list):
        return [{**p, "text": rewrite_text(p["text"], mapping, mode)} if p.get("type") == "text"
                and isinstance(p.get("text"), str) else p for p in content]
    return content


def _arguments(raw: Any) -> dict[str, Any] | None:
    """Arguments of a wire tool call as a dict, or None when they are not a JSON object."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _rename_call(tool_call: Mapping[str, Any], rename: Any) -> dict[str, Any]:
    """A wire tool call with `rename(Call) -> Call` applied to its name and argument keys."""
    out = copy.deepcopy(dict(tool_call))
    fn = out.setdefault("function", {})
    args = _arguments(fn.get("arguments"))
    new = rename(Call(fn.get("name", ""), args if args is not None else {}))
    fn["name"] = new.name
    if "name" in out:  # some clients (litellm from tau2) repeat the name beside `function`
        out["name"] = new.name
    if args is not None:
        fn["arguments"] = json.dumps(dict(new.arguments), ensure_ascii=False)
    return out


def canonical_request(body: Mapping[str, Any],
                      rewrite: RewriteText = "identifiers") -> tuple[dict[str, Any], NameMap]:
    """The request under canonical ids, and the map back (see the module docstring)."""
    interface, nmap = canonicalize_interface(request_interface(body))
    fwd = nmap.forward
    out = copy.deepcopy(dict(body))
    if body.get("tools") is not None:
        out["tools"] = rewrite_interface_text(interface, fwd, rewrite).to_openai()
    messages = []
    for m in body["messages"]:
        m = copy.deepcopy(dict(m))
        m["content"] = _rewrite_content(m.get("content"), fwd, rewrite)
        if m.get("tool_calls"):
            m["tool_calls"] = [_rename_call(tc, nmap.rename) for tc in m["tool_calls"]]
        if m.get("role") == "tool" and isinstance(m.get("name"), str):
            m["name"] = fwd.get(m["name"], m["name"])
        messages.append(m)
    out["messages"] = messages
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and isinstance((choice.get("function") or {}).get("name"), str):
        out["tool_choice"] = {**choice, "function": {**choice["function"],
                                                     "name": fwd.get(choice["function"]["name"],
                                                                     choice["function"]["name"])}}
    return out, nmap


def translate_reply(message: Mapping[str, Any], nmap: NameMap,
                    rewrite: RewriteText = "identifiers") -> dict[str, Any]:
    """The backend's assistant message in executable names; raises UndeclaredToolError for an unknown id."""
    out = copy.deepcopy(dict(message))
    if out.get("tool_calls"):
        out["tool_calls"] = [_rename_call(tc, nmap.translate_back) for tc in out["tool_calls"]]
    out["content"] = _rewrite_content(out.get("content"), nmap.backward, rewrite)
    return out


def undeclared_names(message: Mapping[str, Any], declared: set[str]) -> list[str]:
    """Names of the message's tool calls that `declared` lacks, in order."""
    return [tc.get("function", {}).get("name", "") for tc in message.get("tool_calls") or ()
            if tc.get("function", {}).get("name", "") not in declared]
