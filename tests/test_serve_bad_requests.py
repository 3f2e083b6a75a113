"""cipr-serve against bad and odd requests: malformed HTTP, methods, content types, bodies, every field of
the request model, keys, slow clients, and an upstream that misbehaves. Each answer must be a 4xx (a
502 for the upstream's faults) with OpenAI's error object, no traceback in the body or the log, and the
server must answer the next request."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from cipr.serve import ChatService, OpenAIChatBackend, ServeConfig, ServeLimits, start, stop

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
GOOD = {"model": "m", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS}
LIMITS = ServeLimits(max_body_bytes=1024 * 1024, max_string_chars=100_000, max_list_items=1000,
                     max_prompt_chars=300_000, header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=2.0)
SECRET = "hunter2-upstream-password"


def ok_reply(message: dict[str, Any] | None = None) -> dict[str, Any]:
    message = message or {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "function_01", "arguments": json.dumps({"arg_01": "Oslo"})}}]}
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


class Upstream:
    """An OpenAI-compatible stub whose next answers are set by the test: `plan` maps a path suffix to a
    callable giving (status, headers, body bytes), or None to drop the connection."""

    def __init__(self) -> None:
        self.plan: dict[str, Callable[[], tuple[int, dict[str, str], bytes] | None]] = {}
        self.calls = 0
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, default: dict[str, Any]) -> None:
                up.calls += 1
                make = next((f for k, f in up.plan.items() if self.path.endswith(k)), None)
                out = make() if make else (200, {}, json.dumps(default).encode())
                if out is None:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, headers, body = out
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                if status not in (204, 304):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if status not in (204, 304):
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer({"object": "list", "data": [{"id": "stub-model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(ok_reply())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://user:{SECRET}@127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Upstream]]:
    up = Upstream()
    backend = OpenAIChatBackend(up.url, timeout_s=1.5, connect_timeout_s=1.0)
    server, thread = start(ChatService(backend, ServeConfig()), limits=LIMITS)
    yield server.url, up
    stop(server, thread)
    up.close()


@pytest.fixture
def logs(caplog) -> Iterator[Any]:
    caplog.set_level(logging.INFO)
    yield caplog
    for r in caplog.get_records("setup") + caplog.get_records("call"):
        text = r.getMessage()
        assert r.exc_info is None and not r.exc_text, f"a log record carries a traceback: {text}"
        assert "Traceback" not in text and SECRET not in text, text


def assert_error(status: int, body: bytes, want: int | tuple[int, ...], code: str | None = None) -> dict:
    wanted = want if isinstance(want, tuple) else (want,)
    assert status in wanted, (status, body[:300])
    text = body.decode("utf-8")
    assert "Traceback" not in text and 'File "' not in text and SECRET not in text, text
    err = json.loads(text)["error"]
    assert {"message", "type", "param", "code"} <= set(err) and isinstance(err["message"], str), err
    if code is not None:
        assert err["code"] == code, err
    return err


def still_answers(url: str) -> None:
    r = httpx.get(url + "/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def post(url: str, body: Any = None, *, content: bytes | None = None, path: str = "/v1/chat/completions",
         headers: dict[str, str] | None = None) -> httpx.Response:
    if content is None:
        content = json.dumps(body).encode()
    return httpx.post(url + path, content=content, timeout=20,
                      headers={"Content-Type": "application/json", **(headers or {})})


def raw(url: str, data: bytes, *, then: bytes = b"", pause_s: float = 0.0,
        timeout_s: float = 10.0) -> tuple[int | None, dict[str, str], bytes]:
    """Send `data` on a fresh connection (then, after `pause_s`, `then`), read until the server closes or
    one whole response arrived: (status or None when closed without one, headers, body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(data)
        if pause_s:
            time.sleep(pause_s)
        if then:
            try:
                s.sendall(then)
            except OSError:
                pass
        buf = b""
        while b"\r\n\r\n" not in buf or len(buf) < buf.index(b"\r\n\r\n") + 4 + _length(buf):
            try:
                part = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not part:
                break
            buf += part
    if not buf:
        return None, {}, b""
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _length(buf: bytes) -> int:
    head = buf.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


# ----- malformed HTTP (below the application) --------------------------------------------------------------

REQ = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

MALFORMED_HTTP = {
    "content_length_minus_one": REQ + b"Content-Length: -1\r\n\r\n{}",
    "content_length_abc": REQ + b"Content-Length: abc\r\n\r\n{}",
    "two_content_lengths": REQ + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "garbage_request_line": b"GARBAGE\r\n\r\n",
    "header_without_colon": REQ + b"NoColonHere\r\nContent-Length: 2\r\n\r\n{}",
    "http11_without_host": b"GET /health HTTP/1.1\r\n\r\n",
    "bad_chunk_size": REQ + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "headers_over_256k": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300_000 + b"\r\n\r\n",
    "nul_in_path": b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", list(MALFORMED_HTTP))
def test_malformed_http_is_a_json_400(served, logs, name):
    url, _ = served
    status, headers, body = raw(url, MALFORMED_HTTP[name])
    assert_error(status, body, 400, "invalid_http")
    assert headers["content-type"] == "application/json"
    still_answers(url)


def test_declared_20_mb_body_is_refused_before_reading(served, logs):
    url, _ = served
    head = REQ + b"Content-Length: 20000000\r\n\r\n"
    start = time.perf_counter()
    status, headers, body = raw(url, head + b'{"model": "m", "messages": [{"role": "user", "content": "')
    assert_error(status, body, 413, "request_too_large")
    assert headers.get("connection") == "close" and time.perf_counter() - start < 5
    still_answers(url)


def test_chunked_body_over_the_limit_is_cut_while_reading(served, logs):
    url, _ = served
    chunk = b"a" * 65536
    data = REQ + b"Transfer-Encoding: chunked\r\n\r\n" + (b"10000\r\n" + chunk + b"\r\n") * 20
    status, _, body = raw(url, data)
    assert_error(status, body, 413, "request_too_large")
    still_answers(url)


def test_half_sent_headers_time_out(served, logs):
    url, _ = served
    start = time.perf_counter()
    status, _, body = raw(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")
    assert_error(status, body, 408, "request_timeout")
    assert time.perf_counter() - start < 5
    still_answers(url)


def test_half_sent_body_times_out(served, logs):
    url, _ = served
    status, _, body = raw(url, REQ + b"Content-Length: 100\r\n\r\n{\"model\":")
    assert_error(status, body, 408, "request_timeout")
    still_answers(url)


def test_idle_connection_is_closed(served, logs):
    url, _ = served
    start = time.perf_counter()
    status, _, _ = raw(url, b"")
    assert status is None and time.perf_counter() - start < 5
    still_answers(url)


def test_slow_but_steady_body_within_the_timeout_is_served(served, logs):
    url, _ = served
    body = json.dumps(GOOD).encode()
    status, _, reply = raw(url, REQ + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10],
                           then=body[10:], pause_s=0.3)
    assert status == 200 and json.loads(reply)["choices"][0]["message"]["tool_calls"]


# ----- methods, paths, content types ---------------------------------------------------------------------

@pytest.mark.parametrize("method, path, status", [
    ("PUT", "/v1/chat/completions", 405), ("DELETE", "/v1/chat/completions", 405),
    ("OPTIONS", "/v1/chat/completions", 405), ("PATCH", "/v1/chat/completions", 405),
    ("GET", "/v1/chat/completions", 405), ("POST", "/v1/models", 405), ("BREW", "/v1/chat/completions", 405),
    ("GET", "/nothing", 404), ("POST", "/v1/completions", 404), ("GET", "/v1/../../etc/passwd", 404),
    ("GET", "/v1/models%0a%0dInjected: 1", 404), ("POST", "/v2/chat/completions", 404),
])
def test_methods_and_paths(served, logs, method, path, status):
    url, _ = served
    r = httpx.request(method, url + path, content=json.dumps(GOOD).encode(),
                      headers={"Content-Type": "application/json"}, timeout=10)
    err = assert_error(r.status_code, r.content, status)
    if status == 405:
        assert r.headers["allow"] and err["code"] == "method_not_allowed"
    assert all("\n" not in rec.getMessage() for rec in logs.records)
    still_answers(url)


def test_head_is_refused_without_a_body(served, logs):
    url, _ = served
    r = httpx.head(url + "/v1/chat/completions", timeout=10)
    assert r.status_code == 405 and r.headers["content-type"] == "application/json" and r.content == b""
    assert httpx.head(url + "/health", timeout=10).status_code == 200
    still_answers(url)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   "", "application/json; charset=latin-1", "application/jsonp"])
def test_content_types_other_than_json_are_415(served, logs, ctype):
    url, up = served
    before = up.calls
    r = httpx.post(url + "/v1/chat/completions", content=json.dumps(GOOD).encode(),
                   headers={"Content-Type": ctype} if ctype else {}, timeout=10)
    assert_error(r.status_code, r.content, 415, "unsupported_media_type")
    assert up.calls == before  # a browser's form POST never reaches the model
    still_answers(url)


# ----- bodies -----------------------------------------------------------------------------------------------

BODIES = {
    "empty": b"",
    "not_json": b"{not json",
    "array": b"[]",
    "null": b"null",
    "string": b'"hello"',
    "deep_100k": b"[" * 100_000 + b"]" * 100_000,
    "deep_600": b'{"model": "m", "x": ' + b"[" * 600 + b"]" * 600 + b"}",
    "deep_objects_65": b'{"a":' * 65 + b"1" + b"}" * 65,
    "invalid_utf8": b'{"model": "\xff\xfe", "messages": []}',
    "nan": b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}',
    "infinity": b'{"model": "m", "temperature": Infinity, "messages": [{"role": "user", "content": "x"}]}',
    "huge_float": b'{"model": "m", "temperature": 1e999, "messages": [{"role": "user", "content": "x"}]}',
    "huge_int": b'{"model": "m", "seed": ' + b"9" * 5000
                + b', "messages": [{"role": "user", "content": "x"}]}',
    "lone_surrogate_content": b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    "lone_surrogate_key": b'{"model": "m", "\\udc00": 1, "messages": [{"role": "user", "content": "x"}]}',
    "lone_surrogate_model": b'{"model": "\\udfff", "messages": [{"role": "user", "content": "x"}]}',
    "trailing_garbage": json.dumps(GOOD).encode() + b" tail",
}


@pytest.mark.parametrize("name", list(BODIES))
def test_bad_bodies_are_400(served, logs, name):
    url, up = served
    before = up.calls
    r = post(url, content=BODIES[name])
    assert_error(r.status_code, r.content, 400)
    assert up.calls == before
    still_answers(url)


@pytest.mark.parametrize("change, code", [
    ({"messages": [{"role": "user", "content": "x" * 100_001}]}, "string_too_long"),
    ({"messages": [{"role": "user", "content": "x"}] * 1001}, "array_too_long"),
    ({"metadata": {f"k{i}": i for i in range(1001)}}, "object_too_large"),
    ({"messages": [{"role": "user", "content": "x" * 90_000}] * 4}, "context_length_exceeded"),
])
def test_size_limits(served, logs, change, code):
    url, _ = served
    r = post(url, {**GOOD, **change})
    assert_error(r.status_code, r.content, 400, code)
    still_answers(url)


# ----- the request model, field by field -------------------------------------------------------------------

def msg(**fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": "hi", **fields}


CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
FIELDS = [
    ({"model": None}, "model"), ({"model": 5}, "model"), ({"model": ""}, "model"),
    ({"model": "m" * 300}, "model"),
    ({"messages": None}, "messages"), ({"messages": {}}, "messages"), ({"messages": []}, "messages"),
    ({"messages": [5]}, "messages[0]"), ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [msg(role=5)]}, "messages[0].role"),
    ({"messages": [msg(role="robot")]}, "messages[0].role"),
    ({"messages": [msg(content=5)]}, "messages[0].content"),
    ({"messages": [msg(content={"text": "x"})]}, "messages[0].content"),
    ({"messages": [msg(content=[{"type": "text", "text": 5}])]}, "messages[0].content[0].text"),
    ({"messages": [msg(content=[{"type": "text"}])]}, "messages[0].content[0]"),
    ({"messages": [msg(content=[{"text": "x"}])]}, "messages[0].content[0].type"),
    ({"messages": [msg(content=["x"])]}, "messages[0].content[0]"),
    ({"messages": [msg(name=5)]}, "messages[0].name"),
    ({"messages": [msg(), {"role": "tool", "tool_call_id": ["c1"], "content": "r"}]},
     "messages[1].tool_call_id"),
    ({"messages": [msg(role="assistant", tool_calls="get_weather()")]}, "messages[0].tool_calls"),
    ({"messages": [msg(role="assistant", tool_calls=[{**CALL, "function": "get_weather"}])]},
     "messages[0].tool_calls[0].function"),
    ({"messages": [msg(role="assistant", tool_calls=[{**CALL, "function": {"arguments": "{}"}}])]},
     "messages[0].tool_calls[0].function.name"),
    ({"messages": [msg(role="assistant", tool_calls=[{**CALL, "function": {"name": "f", "arguments": {}}}])]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [msg(role="assistant",
                       tool_calls=[{**CALL, "function": {"name": "f", "arguments": "{x"}}])]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [msg(role="assistant", tool_calls=[{**CALL, "type": "retrieval"}])]},
     "messages[0].tool_calls[0].type"),
    ({"messages": [msg(tool_calls=[CALL])]}, "messages[0].tool_calls"),
    ({"tools": {"get_weather": {}}}, "tools"), ({"tools": [5]}, "tools[0]"),
    ({"tools": [{"type": "retrieval", "function": TOOLS[0]["function"]}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": 5}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "properties": []}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "properties": {"city": 5}}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 300}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]},
     "tools[0].function.description"),
    ({"tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice.function"),
    ({"tool_choice": 5}, "tool_choice"), ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required", "tools": None}, "tool_choice"),
    ({"max_tokens": -5}, "max_tokens"), ({"max_tokens": "abc"}, "max_tokens"),
    ({"max_tokens": {}}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 10**7}, "max_tokens"), ({"max_tokens": "5"}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"n": 2}, "n"), ({"n": "1"}, "n"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"temperature": "hot"}, "temperature"), ({"temperature": 5}, "temperature"), ({"top_p": -1}, "top_p"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"), ({"seed": 1.5}, "seed"), ({"user": 5}, "user"),
]


@pytest.mark.parametrize("change, param", FIELDS)
def test_each_field_is_checked_and_named(served, logs, change, param):
    url, up = served
    before = up.calls
    r = post(url, {**GOOD, **change})
    err = assert_error(r.status_code, r.content, 400)
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert param.split("[")[0].split(".")[0] in err["message"] or "n must be 1" in err["message"], err
    assert up.calls == before
    still_answers(url)


def test_duplicate_tool_names_are_a_400(served, logs):
    url, _ = served
    r = post(url, {**GOOD, "tools": TOOLS * 2})
    assert assert_error(r.status_code, r.content, 400)["param"] == "tools[1].function.name"
    still_answers(url)


def test_unknown_fields_are_forwarded_and_a_good_request_still_works(served, logs):
    url, _ = served
    r = post(url, {**GOOD, "metadata": {"a": 1}, "logit_bias": {}})
    assert r.status_code == 200
    call = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call == {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}

    def logged() -> bool:
        return any(rec.name == "cipr.serve.access" and " 200 " in rec.getMessage() for rec in logs.records)

    deadline = time.monotonic() + 30  # the server's thread logs the line after the response is on its way
    while not logged() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logged()


# ----- the upstream misbehaves: 502, clearly, without its credentials ---------------------------------------

def _json(status: int, payload: Any) -> Callable[[], tuple[int, dict[str, str], bytes]]:
    return lambda: (status, {}, json.dumps(payload).encode())


def _message(message: Any) -> Any:
    return _json(200, {**ok_reply(), "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


UPSTREAM = {
    "string_message": _message("hello"),
    "string_tool_calls": _message({"role": "assistant", "content": None, "tool_calls": "function_01()"}),
    "tool_call_name_5": _message({"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}),
    "content_object": _message({"role": "assistant", "content": {"text": "x"}}),
    "no_choices": _json(200, {"id": "x"}),
    "empty_choices": _json(200, {"choices": []}),
    "choices_object": _json(200, {"choices": {"0": {}}}),
    "usage_strings": _json(200, {**ok_reply(), "usage": {"prompt_tokens": "3"}}),
    "not_json": lambda: (200, {}, b"<html>gateway</html>"),
    "nan": lambda: (200, {}, json.dumps(ok_reply()).replace('"created": 0', '"created": NaN').encode()),
    "status_204": lambda: (204, {}, b""),
    "status_302": lambda: (302, {"Location": "http://elsewhere/"}, b""),
    "status_500": _json(500, {"error": {"message": f"boom at http://admin:{SECRET}@db/"}}),
    "status_401": _json(401, {"error": {"message": "bad key"}}),
    "status_400": _json(400, {"error": {"message": "context too long"}}),
    "dropped": lambda: None,
    "slow": lambda: (time.sleep(2.5), (200, {}, json.dumps(ok_reply()).encode()))[1],
}


@pytest.mark.parametrize("name", list(UPSTREAM))
def test_upstream_faults_are_502(served, logs, name):
    url, up = served
    up.plan = {"/chat/completions": UPSTREAM[name]}
    try:
        r = post(url, GOOD)
    finally:
        up.plan = {}
    err = assert_error(r.status_code, r.content, 502)
    assert err["type"] == "upstream_error" and "backend http://***@127.0.0.1" in err["message"], err
    if name == "slow":
        assert err["code"] == "backend_timeout"
    if name.startswith("status_"):
        assert err["upstream_status"] == int(name.split("_")[1])
    still_answers(url)


@pytest.mark.parametrize("payload", [{"data": 5}, {"data": [{"name": "x"}]}, {"models": []}, [1, 2]])
def test_upstream_models_garbage_is_502(served, logs, payload):
    url, up = served
    up.plan = {"/models": _json(200, payload)}
    try:
        r = httpx.get(url + "/v1/models", timeout=10)
    finally:
        up.plan = {}
    assert_error(r.status_code, r.content, 502)
    still_answers(url)


def test_upstream_arguments_as_an_object_are_accepted(served, logs):
    url, up = served
    up.plan = {"/chat/completions": _message({"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "function_01", "arguments": {"arg_01": "A"}}}]})}
    try:
        r = post(url, GOOD)
    finally:
        up.plan = {}
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "A"}'


def test_unreachable_upstream_is_a_502_without_credentials(logs):
    backend = OpenAIChatBackend(f"http://user:{SECRET}@127.0.0.1:9/v1", connect_timeout_s=1)
    server, thread = start(ChatService(backend), limits=LIMITS)
    try:
        r = post(server.url, GOOD)
        err = assert_error(r.status_code, r.content, 502, "backend_unavailable")
        assert "unreachable" in err["message"]
    finally:
        stop(server, thread)


# ----- keys -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed() -> Iterator[str]:
    up = Upstream()
    server, thread = start(ChatService(OpenAIChatBackend(up.url)), limits=LIMITS, api_key="sesame-123")
    yield server.url
    stop(server, thread)
    up.close()


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic c2VzYW1lLTEyMw==", "Bearer", "sesame-123",
                                  "Bearer sesame-1234", "Bearer \u00e9"])
def test_requests_without_the_key_are_401(keyed, logs, auth):
    headers = {"Authorization": auth.encode("utf-8")} if auth else {}
    r = post(keyed, GOOD, headers=headers)
    assert_error(r.status_code, r.content, 401, "invalid_api_key")
    assert r.headers["www-authenticate"] == "Bearer"
    for path in ("/v1/models", "/nothing"):
        assert httpx.get(keyed + path, headers=headers, timeout=10).status_code == 401
    assert all("sesame" not in rec.getMessage() for rec in logs.records)


def test_the_key_lets_requests_through_and_health_needs_none(keyed, logs):
    r = post(keyed, GOOD, headers={"Authorization": "Bearer sesame-123"})
    assert r.status_code == 200
    assert httpx.get(keyed + "/health", timeout=10).status_code == 200


def test_binding_beyond_loopback_without_a_key_is_refused():
    from cipr.core.errors import ConfigError

    with pytest.raises(ConfigError, match="host=0.0.0.0 serves other machines"):
        start(ChatService(OpenAIChatBackend("http://127.0.0.1:9/v1")), "0.0.0.0")


@pytest.mark.integration
def test_a_20_mb_prompt_is_refused_before_it_is_tokenized(tiny_model, tiny_tokenizer, logs):
    """With limits raised past 20 MB, the in-process model's backend still refuses the prompt by its
    characters (more than the context could hold at 16 characters a token) before any tokenizing."""
    from cipr.serve import HFChatBackend

    backend = HFChatBackend(tiny_model, tiny_tokenizer, model_name="tiny", max_new_tokens=8)
    submitted: list[Any] = []
    submit = backend.batcher.submit
    backend.batcher.submit = lambda *a: submitted.append(a) or submit(*a)
    big = ServeLimits(max_body_bytes=32 * 2**20, max_string_chars=32 * 2**20, max_prompt_chars=32 * 2**20)
    server, thread = start(ChatService(backend), limits=big)
    try:
        start_s = time.perf_counter()
        r = post(server.url, {**GOOD, "messages": [{"role": "user", "content": "word " * 4_000_000}]})
        seconds = time.perf_counter() - start_s
        err = assert_error(r.status_code, r.content, 400, "context_length_exceeded")
        assert "characters" in err["message"] and not submitted and seconds < 20, (err, seconds)
        still_answers(server.url)
        r = post(server.url, {**GOOD, "messages": [{"role": "user", "content": "word " * 3000}]})
        assert_error(r.status_code, r.content, 400, "context_length_exceeded")  # counted in tokens
        assert "tokens" in r.json()["error"]["message"] and len(submitted) == 1
    finally:
        stop(server, thread)


class Buggy:
    """A backend with a bug: its exception text must reach neither the client nor the log (but DEBUG)."""

    name = "buggy"

    def models(self) -> list[str]:
        raise KeyError("secret-detail in models")

    def complete(self, body: Any) -> dict[str, Any]:
        raise RuntimeError("secret-detail at /srv/model.py line 3")


def test_a_server_bug_is_a_generic_500_and_one_log_line(caplog):
    caplog.set_level(logging.INFO)
    server, thread = start(ChatService(Buggy()), limits=LIMITS)
    try:
        for do in (lambda: post(server.url, GOOD),
                   lambda: httpx.get(server.url + "/v1/models", timeout=10)):
            caplog.clear()
            r = do()
            err = assert_error(r.status_code, r.content, 500, "internal_error")
            assert err["type"] == "server_error" and "secret" not in r.text and "reference" in err["message"]
            errors = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
            assert len(errors) == 1 and errors[0].exc_info is None, [e.getMessage() for e in errors]
            assert "Error" in errors[0].getMessage() and "secret" not in errors[0].getMessage()
            assert err["message"].split("reference ")[1][:12] in errors[0].getMessage()
        caplog.clear()
        caplog.set_level(logging.DEBUG, logger="cipr.serve")
        post(server.url, GOOD)
        assert any(rec.exc_info and rec.levelno == logging.DEBUG for rec in caplog.records)
        still_answers(server.url)
    finally:
        stop(server, thread)
