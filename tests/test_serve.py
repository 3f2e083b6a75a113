"""cipr-serve on loopback with the `openai` client: what the backend saw (canonical names) and what the
client got back (original names), errors, the guard, concurrency, the tiny HF model, the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

openai = pytest.importorskip("openai")

from cipr.guard import read_audit  # noqa: E402
from cipr.runtime.backends import GenRequest, chat_example  # noqa: E402
from cipr.serve import ChatService, HFChatBackend, OpenAIChatBackend, ServeConfig, start, stop  # noqa: E402
from cipr.serve.conversation import canonical_request, translate_reply  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_flight", "description": "Book a flight.",
        "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                        "destination": {"type": "string"},
                                                        "date": {"type": "string"}},
                       "required": ["origin", "destination"]}}},
]

CONVERSATION = [
    {"role": "system", "content": "Use get_weather before book_flight."},
    {"role": "user", "content": "Weather in Paris and Rome, then book Paris to Rome."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": json.dumps({"city": "Rome"})}}]},
    {"role": "tool", "tool_call_id": "call_a", "name": "get_weather",
     "content": "{\"city\": \"Paris\", \"t\": 21}"},
    {"role": "tool", "tool_call_id": "call_b", "name": "get_weather",
     "content": "{\"city\": \"Rome\", \"t\": 25}"},
    {"role": "assistant", "content": "Sunny in both. I will call book_flight now.", "tool_calls": [
        {"id": "call_c", "type": "function", "function": {
            "name": "book_flight", "arguments": json.dumps({"origin": "Paris", "destination": "Rome",
                                                            "date": "2025-05-01"})}}]},
    {"role": "tool", "tool_call_id": "call_c", "name": "book_flight", "content": "booked"},
    {"role": "user", "content": "Also the weather in Oslo in f, and a flight Oslo to Rome."},
]


def tool_call(name: str, args: dict[str, Any], call_id: str = "call_x") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def reply(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


class Stub:
    """An OpenAI-compatible stub: records each body it receives, answers with `script(body, i)`."""

    def __init__(self, script: Callable[[dict[str, Any], int], dict[str, Any]]) -> None:
        self.script, self.received = script, []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub._lock:
                    i = len(stub.received)
                    stub.received.append(body)
                self._send(stub.script(body, i))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def serve():
    """serve(script, **config) -> (openai client, stub, base url); everything is stopped afterwards."""
    opened: list[Any] = []

    def make(script, **config):
        stub = Stub(script)
        service = ChatService(OpenAIChatBackend(stub.url), ServeConfig(**config))
        server, thread = start(service)
        opened.append((stub, server, thread))
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        return client, stub, server.url

    yield make
    for stub, server, thread in opened:
        stop(server, thread)
        stub.close()


def test_multiturn_parallel_calls_canonical_to_backend_original_to_client(serve):
    canonical_calls = [tool_call("function_01", {"arg_01": "Oslo", "arg_02": "f"}, "call_1"),
                       tool_call("function_02", {"arg_01": "Oslo", "arg_02": "Rome"}, "call_2")]
    client, stub, _ = serve(lambda body, i: reply({"content": None, "tool_calls": canonical_calls}))
    out = client.chat.completions.create(model="m", messages=CONVERSATION, tools=TOOLS, temperature=0)
    seen = stub.received[0]
    assert [t["function"]["name"] for t in seen["tools"]] == ["function_01", "function_02"]
    assert list(seen["tools"][1]["function"]["parameters"]["properties"]) == ["arg_01", "arg_02", "arg_03"]
    assert seen["tools"][1]["function"]["parameters"]["required"] == ["arg_01", "arg_02"]
    assert seen["tools"][0]["function"]["description"] == "Current weather in a city."
    assert seen["messages"][0]["content"] == "Use function_01 before function_02."
    assert [json.loads(tc["function"]["arguments"]) for tc in seen["messages"][2]["tool_calls"]] == [
        {"arg_01": "Paris", "arg_02": "c"}, {"arg_01": "Rome"}]
    assert {tc["function"]["name"] for tc in seen["messages"][2]["tool_calls"]} == {"function_01"}
    assert [seen["messages"][i]["name"] for i in (3, 4, 6)] == ["function_01", "function_01", "function_02"]
    assert seen["messages"][3]["content"] == CONVERSATION[3]["content"]
    assert seen["messages"][5]["content"] == "Sunny in both. I will call function_02 now."
    assert seen["temperature"] == 0
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls"
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("call_1", "get_weather", {"city": "Oslo", "unit": "f"}),
        ("call_2", "book_flight", {"origin": "Oslo", "destination": "Rome"})]
    assert out.model_extra["cipr"]["names"] == "canonical"


def test_canonical_conversation_sent_back_equals_the_original(serve):
    """The backend answers each turn with the canonical form of an earlier assistant turn it received;
    the client must get that turn back exactly as the original conversation wrote it."""
    turns = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]

    def echo(body, i):
        m = body["messages"][turns[i]]
        return reply({"content": m["content"], "tool_calls": m["tool_calls"]})

    client, stub, _ = serve(echo)
    for i in turns:
        got = client.chat.completions.create(model="m", messages=CONVERSATION, tools=TOOLS).choices[0].message
        want = CONVERSATION[i]
        assert got.content == want["content"]
        assert [c.model_dump() for c in got.tool_calls] == want["tool_calls"]
    canonical, nmap = canonical_request({"model": "m", "messages": CONVERSATION, "tools": TOOLS})
    assert stub.received[0]["messages"] == canonical["messages"]
    for i in turns:
        back = translate_reply(canonical["messages"][i], nmap)
        assert back == CONVERSATION[i]


def test_original_names_pass_through_unchanged(serve):
    client, stub, url = serve(lambda body, i: reply({"content": None, "tool_calls": [
        tool_call("get_weather", {"city": "Oslo"})]}), names="original")
    body = {"model": "m", "messages": CONVERSATION, "tools": TOOLS, "temperature": 0}
    out = client.chat.completions.create(**body)
    assert stub.received[0] == body
    assert out.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert out.model_extra["cipr"]["names"] == "original"
    per_path = openai.OpenAI(base_url=url + "/canonical/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:  # the stub answers in original names: undeclared there
        per_path.chat.completions.create(**body)
    assert e.value.body["code"] == "undeclared_tool"
    assert stub.received[1]["tools"][0]["function"]["name"] == "function_01"
    assert [m.id for m in client.models.list().data] == ["stub-model"]


def _error(client, **body) -> tuple[int, dict[str, Any]]:
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(**body)
    return e.value.status_code, e.value.body


@pytest.mark.parametrize("change, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"stream": "yes"}, "stream"),
    ({"n": 2}, "n"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
])
def test_malformed_requests_get_openai_style_400_naming_the_field(serve, change, param):
    client, stub, _ = serve(lambda body, i: reply({"content": "never"}))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **change}
    status, err = _error(client, **body)
    assert status == 400
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert stub.received == []


def test_http_level_errors(serve):
    _, _, url = serve(lambda body, i: reply({"content": "x"}))
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json",
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert httpx.get(url + "/v1/nothing").status_code == 404


def test_undeclared_name_is_an_error_the_client_sees(serve):
    client, _, _ = serve(lambda body, i: reply({"content": None, "tool_calls": [
        tool_call("function_01", {"arg_01": "Oslo"}), tool_call("function_09", {"arg_01": 1})]}))
    status, err = _error(client, model="m", messages=CONVERSATION, tools=TOOLS)
    assert status == 502
    assert err["code"] == "undeclared_tool" and err["undeclared"] == ["function_09"]
    assert err["model_message"]["tool_calls"][1]["function"]["name"] == "function_09"


def test_guard_blocks_a_call_outside_the_authorized_tools(serve, tmp_path):
    audit = tmp_path / "audit.jsonl"
    client, stub, _ = serve(lambda body, i: reply({"content": None, "tool_calls": [
        tool_call("function_01", {"arg_01": "Oslo"}, "call_ok"),
        tool_call("delete_account", {"user": "x"})]}),
        guard="none", audit=str(audit))
    out = client.chat.completions.create(model="m", messages=CONVERSATION, tools=TOOLS)
    calls = out.choices[0].message.tool_calls
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_ok", "get_weather", {"city": "Oslo"})]
    guard = out.model_extra["cipr"]["guard"]
    assert guard["status"] == "unresolved" and guard["refused"] == ["delete_account"]
    (record,) = read_audit(audit)
    assert record["security"][0]["name"] == "delete_account" and \
        record["security"][0]["reason"] == "not_in_contract"
    assert len(stub.received) == 1


def test_guard_blocking_every_call_is_an_error(serve):
    client, _, _ = serve(lambda body, i: reply({"content": None, "tool_calls": [
        tool_call("transfer_money", {"to": "x"})]}), guard="none")
    status, err = _error(client, model="m", messages=CONVERSATION, tools=TOOLS)
    assert status == 502 and err["code"] == "guard_blocked" and err["guard"]["refused"] == ["transfer_money"]


def test_guard_repair_fixes_an_invalid_call_through_the_same_backend(serve, tmp_path):
    """The first reply calls an unauthorized tool; the guard's retry (second request, canonical tools)
    gets a valid call, which the client receives in original names."""
    def script(body, i):
        if i == 0:
            return reply({"content": None, "tool_calls": [tool_call("drop_tables", {"arg_01": "Oslo"})]})
        return reply({"content": None, "tool_calls": [tool_call("function_01", {"arg_01": "Oslo"})]})

    client, stub, _ = serve(script, guard="repair", audit=str(tmp_path / "audit.jsonl"))
    out = client.chat.completions.create(model="m", messages=CONVERSATION, tools=TOOLS)
    (call,) = out.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})
    assert out.model_extra["cipr"]["guard"]["status"] == "repaired"
    assert len(stub.received) >= 2
    assert all(t["function"]["name"].startswith("function_") for b in stub.received
               for t in b.get("tools", []))


def test_concurrent_requests_with_different_tools_do_not_share_mappings(serve):
    def script(body, i):
        time.sleep(0.01 * (i % 3))
        marker = body["messages"][-1]["content"]
        return reply({"content": None, "tool_calls": [tool_call("function_02", {"arg_01": marker})]})

    client, _, _ = serve(script)
    results: dict[int, Any] = {}

    def worker(k: int) -> None:
        tools = [{"type": "function", "function": {"name": f"tool_{k}_{j}", "parameters": {
            "type": "object", "properties": {f"field_{k}_{j}": {"type": "string"}}}}} for j in range(3)]
        out = client.chat.completions.create(model="m", tools=tools,
                                             messages=[{"role": "user", "content": f"marker-{k}"}])
        c = out.choices[0].message.tool_calls[0]
        results[k] = (c.function.name, json.loads(c.function.arguments))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {k: (f"tool_{k}_1", {f"field_{k}_1": f"marker-{k}"}) for k in range(8)}


def test_tiny_hf_model_in_process(tiny_model, tiny_tokenizer, one_thread):
    backend = HFChatBackend(tiny_model, tiny_tokenizer, call_format="hermes", model_name="tiny",
                            max_new_tokens=8)
    server, thread = start(ChatService(backend, ServeConfig(names="canonical")))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        try:
            out = client.chat.completions.create(model="tiny", messages=CONVERSATION[:2], tools=TOOLS,
                                                 max_tokens=8)
            assert out.choices[0].message.role == "assistant"
            assert out.usage.completion_tokens <= 8
        except openai.APIStatusError as e:
            # a random model may invent a name; that must be the documented error
            assert e.status_code == 502 and e.body["code"] == "undeclared_tool"
        shown, _ = canonical_request({"model": "x", "messages": CONVERSATION[:2], "tools": TOOLS})
        prompt, _ = backend.generator.prompt(GenRequest(chat_example(shown["messages"], shown["tools"])))
        assert "function_01" in prompt and "get_weather" not in prompt
    finally:
        stop(server, thread)


def test_cipr_serve_command_on_loopback(tmp_path):
    stub = Stub(lambda body, i: reply({"content": None,
                                       "tool_calls": [tool_call("function_02", {"arg_01": "A"})]}))
    port_file = tmp_path / "port"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cipr.cli.serve", f"backend={stub.url}", "names=canonical",
                             "port=0", f"port_file={port_file}"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        port = int(port_file.read_text())
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               max_retries=0, timeout=30)
        out = client.chat.completions.create(model="m", messages=CONVERSATION, tools=TOOLS)
        assert out.choices[0].message.tool_calls[0].function.name == "book_flight"
        assert stub.received[0]["tools"][0]["function"]["name"] == "function_01"
    finally:
        proc.terminate()
        proc.wait(20)
        stub.close()
    assert proc.returncode == 0


def test_bad_option_exits_2():
    r = subprocess.run([sys.executable, "-m", "cipr.cli.serve", "guard=sometimes"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "'guard' must be one of 'off'" in r.stderr and "got 'sometimes'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "cipr.cli.serve", "gaurd=repair"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "Did you mean 'guard'?" in r.stderr


def test_serving_other_machines_needs_a_key():
    env = {k: v for k, v in os.environ.items() if k != "CIPR_SERVE_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "cipr.cli.serve", "host=0.0.0.0", "backend=http://127.0.0.1:9/v1"],
                       capture_output=True, text=True, timeout=120, env={**env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "no key is set" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_backend_pointing_nowhere_is_a_502(tmp_path):
    server, thread = start(ChatService(OpenAIChatBackend("http://127.0.0.1:9/v1", timeout_s=5)))
    try:
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "x"}]}, timeout=30)
        assert r.status_code == 502 and r.json()["error"]["code"] == "backend_unavailable"
    finally:
        stop(server, thread)


def test_litellm_message_shape_is_renamed_everywhere():
    """litellm (τ²'s client) repeats the name beside `function`, sends `tool_calls: null` on text turns and
    tool results without a name: all renamed or kept consistently."""
    messages = [{"role": "assistant", "content": "Hi!", "tool_calls": None},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "name": "book_flight", "type": "function",
                     "function": {"name": "book_flight",
                                  "arguments": json.dumps({"origin": "A", "destination": "B"})}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    shown, nmap = canonical_request({"model": "m", "messages": messages, "tools": TOOLS})
    call = shown["messages"][1]["tool_calls"][0]
    assert call["name"] == call["function"]["name"] == "function_02"
    assert json.loads(call["function"]["arguments"]) == {"arg_01": "A", "arg_02": "B"}
    assert shown["messages"][0]["tool_calls"] is None and "name" not in shown["messages"][2]
    assert translate_reply(shown["messages"][1], nmap) == messages[1]
