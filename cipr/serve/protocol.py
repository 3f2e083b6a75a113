"""The OpenAI chat-completions wire format as cipr-serve reads and writes it: request checks, errors, replies.

Every malformed request is refused with an OpenAI-style error object
`{"error": {"message", "type": "invalid_request_error", "param", "code"}}` whose `param` names the
offending field by its path (`messages[2].tool_calls[0].function.arguments`), so a client can see
what to fix without reading our logs. Checks cover what the adapter relies on (messages, roles,
earlier tool calls, tools, tool_choice) and what it does not offer (`stream=true`, `n > 1`); every
other field is forwarded to the backend as it is.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICE_WORDS = ("none", "auto", "required")


class ApiError(Exception):
    """An error the client receives as an HTTP status and an OpenAI-style error body.

    `extra` adds fields to the error object (e.g. the undeclared names and the model's message).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.extra = dict(extra or {})

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          **self.extra}}


def bad_request(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _check_content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string, null or a list of content parts", where, "invalid_type")
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise bad_request(f"{where}[{j}] must be an object with a 'type'", f"{where}[{j}]",
                              "invalid_type")


def _check_tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list", where, "invalid_type")
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, Mapping):
            raise bad_request(f"{at} must be an object", at, "invalid_type")
        if call.get("type", "function") != "function":
            raise bad_request(f"{at}.type must be 'function'", f"{at}.type")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise bad_request(f"{at}.function must be an object with name and arguments", f"{at}.function",
                              "invalid_type")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{at}.function.name must be a non-empty string", f"{at}.function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise bad_request(f"{at}.function.arguments must be a JSON string", f"{at}.function.arguments",
                              "invalid_type")
        try:
            json.loads(args or "{}")
        except json.JSONDecodeError as e:
            raise bad_request(f"{at}.function.arguments is not valid JSON: {e}",
                              f"{at}.function.arguments") from e


def check_messages(messages: Any) -> None:
    """Raise ApiError naming the field if `messages` is not a valid chat conversation."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages",
                          "missing_required_parameter" if messages is None else "invalid_value")
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise bad_request(f"{at} must be an object", at, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{at}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{at}.role")
        _check_content(m.get("content"), f"{at}.content")
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad_request(f"{at}.tool_calls is only allowed on assistant messages",
                                  f"{at}.tool_calls")
            _check_tool_calls(m["tool_calls"], f"{at}.tool_calls")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise bad_request(f"{at}.name must be a string", f"{at}.name", "invalid_type")


def check_tools(tools: Any) -> None:
    """Raise ApiError naming the field if `tools` is not a list of function tools."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools", "invalid_type")
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(t, Mapping) or t.get("type", "function") != "function":
            raise bad_request(f"{at} must be an object of type 'function'", at)
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise bad_request(f"{at}.function must be an object", f"{at}.function", "invalid_type")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{at}.function.name must be a non-empty string", f"{at}.function.name")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, Mapping)
                                   or params.get("type", "object") != "object"):
            raise bad_request(f"{at}.function.parameters must be a JSON Schema of type object",
                              f"{at}.function.parameters")
        props = (params or {}).get("properties")
        if props is not None and not isinstance(props, Mapping):
            raise bad_request(f"{at}.function.parameters.properties must be an object",
                              f"{at}.function.parameters.properties", "invalid_type")


def tool_choice_name(choice: Any) -> str | None:
    """The tool a `tool_choice` object forces, or None for the words none/auto/required."""
    if isinstance(choice, Mapping):
        return (choice.get("function") or {}).get("name")
    return None


def check_tool_choice(choice: Any, tools: Sequence[Mapping[str, Any]] | None) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICE_WORDS:
            raise bad_request(f"tool_choice must be one of {', '.join(TOOL_CHOICE_WORDS)} or a function "
                              "object", "tool_choice")
        if choice == "required" and not tools:
            raise bad_request("tool_choice 'required' needs tools", "tool_choice")
        return
    name = tool_choice_name(choice)
    if (not isinstance(choice, Mapping) or choice.get("type", "function") != "function"
            or not isinstance(name, str)):
        raise bad_request("tool_choice must be a word or {'type': 'function', 'function': {'name': ...}}",
                          "tool_choice")
    if name not in {t["function"]["name"] for t in tools or ()}:
        raise bad_request(f"tool_choice names {name!r}, which tools does not declare",
                          "tool_choice.function.name")


def check_request(body: Any) -> None:
    """Raise ApiError (400, naming the field) unless `body` is a chat-completions request we can serve."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object", None, "invalid_type")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad_request("model must be a non-empty string", "model",
                          "missing_required_parameter" if "model" not in body else "invalid_value")
    if body.get("stream"):
        raise bad_request("streaming is not supported by cipr-serve: send stream=false (or omit it); "
                          "the reply comes as one chat.completion object", "stream", "unsupported_value")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise bad_request("cipr-serve returns one choice per request: n must be 1", "n", "unsupported_value")
    check_messages(body.get("messages"))
    check_tools(body.get("tools"))
    check_tool_choice(body.get("tool_choice"), body.get("tools"))


def completion(model: str, message: Mapping[str, Any], *, finish_reason: str,
               usage: Mapping[str, Any] | None = None,
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `chat.completion` object with one choice."""
    out: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": dict(message), "finish_reason": finish_reason, "logprobs": None}],
        "usage": dict(usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
    }
    if extra:
        out.update(extra)
    return out


def models_list(names: Sequence[str]) -> dict[str, Any]:
    """A `/v1/models` reply."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "cipr"}
                                       for n in names]}
