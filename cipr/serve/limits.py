"""What cipr-serve accepts before it does any work: `ServeLimits` and the checks on a raw request body.

Order, cheapest first: the declared length (413 before reading), the bytes read (413 while reading),
the nesting depth counted on the raw bytes (400 before `json.loads`, so a 100k-deep array costs one
scan, not a RecursionError), strict JSON (no NaN, Infinity or non-UTF-8), then one walk over the
parsed value: every string and key within `max_string_chars` and free of unpaired surrogates (they
cannot be encoded for the model or an upstream), every list and object within `max_list_items`, and
the characters of `messages` and `tools` within `max_prompt_chars` (an upper bound on what a
tokenizer would be given; the backend then compares tokens with the model's context).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from cipr.core.errors import ConfigError
from cipr.serve.protocol import ApiError, bad_request, strict_json

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on requests, connections and the queue, each with its default (docs/serve_and_tau2.md)."""

    max_body_bytes: int = 4 * 1024 * 1024  # a larger request body is refused with 413
    max_json_depth: int = 64  # deeper nesting of arrays and objects is refused before parsing
    max_string_chars: int = 1_000_000  # the longest string or key accepted anywhere in a body
    max_list_items: int = 10_000  # the most items of any one list, or keys of any one object
    max_prompt_chars: int = 2_000_000  # the most characters under messages and tools together
    max_in_flight: int = 16  # requests the model works on at once
    max_waiting: int = 64  # requests queued behind them; past both: 429 with Retry-After
    max_connections: int = 256  # open connections; past it a new one gets 503
    header_timeout_s: float = 10.0  # a request's line and headers must arrive within this (408)
    body_timeout_s: float = 30.0  # a request's whole body must arrive within this (408)
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this

    def check(self) -> None:
        """Raise ConfigError naming the first option out of range."""
        for name in ("max_body_bytes", "max_json_depth", "max_string_chars", "max_list_items",
                     "max_prompt_chars", "max_in_flight", "max_connections"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be at least 1")
        if self.max_waiting < 0:
            raise ConfigError(f"max_waiting={self.max_waiting}: must be 0 or more")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)}: must be a positive number of seconds")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw` JSON text (brackets inside strings ignored)."""
    brackets = _STRING.sub(b"", raw).translate(None, _BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def parse_body(raw: bytes, limits: ServeLimits) -> Any:
    """The JSON value of a request body, or ApiError 400 saying what is wrong (never an exception text
    of the parser beyond its position)."""
    if not raw.strip():
        raise bad_request("the request body is empty: send a JSON object", None, "invalid_json")
    depth = json_depth(raw)
    if depth > limits.max_json_depth:
        raise bad_request(f"the request body is nested {depth} levels deep; at most {limits.max_json_depth} "
                          "are accepted", None, "json_too_deep")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not UTF-8 (byte {e.start})", None, "invalid_json") from None
    try:
        return strict_json(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                          None, "invalid_json") from None
    except (ValueError, RecursionError) as e:  # out-of-range numbers, NaN, over-long integers
        reason = str(e) if "JSON" in str(e) or "out of range" in str(e) else "a number is out of range"
        raise bad_request(f"the request body is not valid JSON: {reason}", None, "invalid_json") from None


def _path(parts: tuple[str | int, ...]) -> str | None:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def check_value(body: Any, limits: ServeLimits) -> None:
    """Walk the parsed body once: string, key and container sizes, unpaired surrogates, prompt characters.
    Raises ApiError 400 naming the field."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(body, ())]
    prompt_chars = 0
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if len(value) > limits.max_string_chars:
                raise bad_request(f"{_path(path) or 'a string'} has {len(value)} characters; at most "
                                  f"{limits.max_string_chars} are accepted", _path(path), "string_too_long")
            if _SURROGATE.search(value):
                raise bad_request(f"{_path(path) or 'a string'} contains an unpaired UTF-16 surrogate "
                                  "(\\ud800-\\udfff), which is not text", _path(path), "invalid_value")
            if path and path[0] in ("messages", "tools"):
                prompt_chars += len(value)
        elif isinstance(value, list):
            if len(value) > limits.max_list_items:
                raise bad_request(f"{_path(path) or 'the body'} has {len(value)} items; at most "
                                  f"{limits.max_list_items} are accepted", _path(path), "array_too_long")
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
        elif isinstance(value, dict):
            if len(value) > limits.max_list_items:
                raise bad_request(f"{_path(path) or 'the body'} has {len(value)} keys; at most "
                                  f"{limits.max_list_items} are accepted", _path(path), "object_too_large")
            for k, v in value.items():
                if len(k) > limits.max_string_chars or _SURROGATE.search(k):
                    raise bad_request(f"a key of {_path(path) or 'the body'} is too long or not text",
                                      _path(path), "invalid_value")
                stack.append((v, (*path, k)))
        if prompt_chars > limits.max_prompt_chars:
            raise ApiError(400, f"messages and tools hold more than {limits.max_prompt_chars} characters",
                           param="messages", code="context_length_exceeded")
