"""The OpenAI chat-completions wire format as cipr-serve reads and writes it: request models, errors, replies.

Every refused request gets an OpenAI-style error object `{"error": {"message", "type", "param",
"code"}}` whose `param` names the offending field by its path
(`messages[2].tool_calls[0].function.arguments`), so a client can see what to fix without our logs.
A request is validated twice, and forwarded as the client sent it: `ChatRequest` (pydantic, strict:
no "5" for 5, no 5 for "5") checks the shape and types of every field the adapter reads and of the
usual sampling fields; `check_request` then checks what spans fields (tool calls only on assistant
messages, arguments that are JSON, a forced tool the request declares). Fields we do not know are
forwarded unchanged. `chunks` writes a finished reply as `chat.completion.chunk` server-sent events.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICE_WORDS = ("none", "auto", "required")
MAX_NEW_TOKENS = 1_000_000
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str | bytes) -> Any:
    """`json.loads` that refuses what JSON does not allow (NaN, Infinity, numbers beyond a float)."""
    return json.loads(text, parse_float=_finite, parse_constant=_constant)


def redact(text: str) -> str:
    """`text` with the credentials of any URL in it (`user:pass@`) replaced by `***@`."""
    return _USERINFO.sub(r"\1***@", text)


class ApiError(Exception):
    """An error the client receives as an HTTP status and an OpenAI-style error body.

    `extra` adds fields to the error object (e.g. the undeclared names and the model's message);
    `headers` adds response headers (e.g. Retry-After).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 extra: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": redact(self.message), "type": self.type, "param": self.param,
                          "code": self.code, **self.extra}}


def bad_request(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


# ----- request models ---------------------------------------------------------------------------------


class _Open(BaseModel):
    """Strict types, unknown fields kept (and forwarded)."""

    model_config = ConfigDict(extra="allow", strict=True)


Name = Annotated[StrictStr, Field(min_length=1, max_length=256)]
Tokens = Annotated[StrictInt, Field(ge=1, le=MAX_NEW_TOKENS)]


class ContentPart(_Open):
    type: Name
    text: StrictStr | None = None

    @model_validator(mode="after")
    def _text_part(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise PydanticCustomError("missing", "must have a string 'text' (a text part)")
        return self


def _content_kind(v: Any) -> str | None:
    return "<text>" if isinstance(v, str) else "<parts>" if isinstance(v, list) else None


Content = Annotated[
    Annotated[StrictStr, Tag("<text>")] | Annotated[list[ContentPart], Tag("<parts>")],
    Discriminator(_content_kind, custom_error_type="invalid_type",
                  custom_error_message="must be a string, null or a list of content parts")]


class FunctionCall(_Open):
    name: Name
    arguments: StrictStr = "{}"


class ToolCall(_Open):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None


class FunctionDef(_Open):
    name: Name
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _schema(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, dict) or v.get("type", "object") != "object":
            raise PydanticCustomError("invalid_value", "must be a JSON Schema of type object")
        props = v.get("properties")
        if props is not None and (not isinstance(props, dict)
                                  or not all(isinstance(p, dict) for p in props.values())):
            raise PydanticCustomError("invalid_type", "must have 'properties' as an object of JSON Schemas")
        req = v.get("required")
        if req is not None and (not isinstance(req, list) or not all(isinstance(r, str) for r in req)):
            raise PydanticCustomError("invalid_type", "must have 'required' as a list of property names")
        return v


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class ToolChoiceFunction(_Open):
    name: Name


class ToolChoiceObject(_Open):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


def _choice_kind(v: Any) -> str | None:
    return "<word>" if isinstance(v, str) else "<object>" if isinstance(v, dict) else None


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("<word>")]
    | Annotated[ToolChoiceObject, Tag("<object>")],
    Discriminator(_choice_kind, custom_error_type="invalid_type",
                  custom_error_message="must be none, auto, required or "
                                       "{'type': 'function', 'function': {'name': ...}}")]


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


class ChatRequest(_Open):
    """A chat-completions request body as cipr-serve accepts it (see the module docstring)."""

    model: Name
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] | None = None
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    parallel_tool_calls: StrictBool | None = None
    seed: StrictInt | None = None
    user: StrictStr | None = None


_CODES = {"missing": "missing_required_parameter", "too_short": "invalid_value"}


def _param(loc: Sequence[str | int]) -> str | None:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif not p.startswith("<"):  # union tags are ours, not fields
            out += f".{p}" if out else p
    return out or None


def plain(msg: str) -> str:
    """A pydantic error message in our words ("must be ...", no class names)."""
    msg = re.sub(r" or instance of \w+", "", msg).replace("Input should be", "must be")
    msg = msg.replace("valid dictionary", "JSON object").replace("Field required", "is required")
    msg = re.sub(r" after validation|, not \d+$", "", msg)
    return re.sub(r"^(String|List|Dictionary) should have", "must have", msg)


def validation_error(e: ValidationError) -> ApiError:
    """The first error of a ChatRequest validation as a 400 naming the field (never the input value)."""
    err = e.errors(include_url=False, include_input=False, include_context=False)[0]
    param = _param(err["loc"])
    msg = f"{param or 'the request body'} {plain(err['msg'])}"
    if param == "n":
        msg = "cipr-serve returns one choice per request: n must be 1"
    code = _CODES.get(err["type"], "invalid_type" if err["type"].endswith("_type") else "invalid_value")
    return ApiError(400, msg, param=param, code=code)


# ----- checks across fields ---------------------------------------------------------------------------


def tool_choice_name(choice: Any) -> str | None:
    """The tool a `tool_choice` object forces, or None for the words none/auto/required."""
    if isinstance(choice, Mapping):
        return (choice.get("function") or {}).get("name")
    return None


def _check_cross(body: Mapping[str, Any]) -> None:
    for i, m in enumerate(body["messages"]):
        at = f"messages[{i}]"
        if m.get("tool_calls") is not None and m["role"] != "assistant":
            raise bad_request(f"{at}.tool_calls is only allowed on assistant messages", f"{at}.tool_calls")
        for j, call in enumerate(m.get("tool_calls") or ()):
            where = f"{at}.tool_calls[{j}].function.arguments"
            try:
                json.loads(call["function"].get("arguments") or "{}")
            except json.JSONDecodeError as e:
                raise bad_request(f"{where} is not valid JSON ({e.msg} at column {e.colno})", where) from None
    choice, tools = body.get("tool_choice"), body.get("tools")
    seen: set[str] = set()
    for i, t in enumerate(tools or ()):
        if t["function"]["name"] in seen:
            raise bad_request(f"tools[{i}].function.name repeats {t['function']['name']!r}: each tool needs "
                              "its own name", f"tools[{i}].function.name")
        seen.add(t["function"]["name"])
    if choice == "required" and not tools:
        raise bad_request("tool_choice 'required' needs tools", "tool_choice")
    name = tool_choice_name(choice)
    if name is not None and name not in {t["function"]["name"] for t in tools or ()}:
        raise bad_request(f"tool_choice names {name!r}, which tools does not declare",
                          "tool_choice.function.name")


def check_request(body: Any) -> ChatRequest:
    """The validated request; raises ApiError (400, naming the field) unless `body` can be served."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object", None, "invalid_type")
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from None
    _check_cross(body)
    return request


# ----- replies ----------------------------------------------------------------------------------------


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


def chunks(reply: Mapping[str, Any], include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """A finished `chat.completion` as the `chat.completion.chunk` objects of OpenAI's stream: the role,
    the content, each tool call (id and name, then its arguments), then the finish reason (with the
    reply's extra fields, e.g. `cipr`) and, when asked, a last chunk with the usage."""
    choice = reply["choices"][0]
    message = choice["message"]
    head = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"],
            "model": reply["model"]}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
                **extra}

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        yield chunk({"tool_calls": [{"index": i, "id": call.get("id"), "type": "function",
                                     "function": {"name": fn.get("name"), "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": fn.get("arguments") or ""}}]})
    known = {"id", "object", "created", "model", "choices", "usage"}
    extra = {k: v for k, v in reply.items() if k not in known}
    yield chunk({}, choice.get("finish_reason") or "stop", **extra)
    if include_usage:
        yield {**head, "choices": [], "usage": reply.get("usage")}


def models_list(names: Sequence[str]) -> dict[str, Any]:
    """A `/v1/models` reply."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "cipr"}
                                       for n in names]}
