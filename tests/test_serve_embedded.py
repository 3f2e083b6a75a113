"""`cipr-serve backend=embedded` as a user starts it, with a key: SmolLM2-135M in the process, the `openai`
client plain and streaming, concurrent requests decoded together, the access log (integration: loads the
embedded model, ~1 minute on 2 cores)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def ask(client, content: str, **extra):
    try:
        return client.chat.completions.create(model="embedded", tools=TOOLS, max_tokens=16,
                                              messages=[{"role": "user", "content": content}], **extra)
    except openai.APIStatusError as e:  # the 135M model may call a tool it was not given: the documented 502
        assert e.status_code == 502 and e.body["code"] == "undeclared_tool", e.body
        return None


def test_embedded_model_behind_the_command_with_a_key(tmp_path):
    port_file, log_file = tmp_path / "port", tmp_path / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CIPR_SERVE_API_KEY": "k-embedded"}
    with log_file.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cipr.cli.serve", "backend=embedded", "port=0",
                                 f"port_file={port_file}", "max_new_tokens=16", "threads=1", "batch_size=4"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1800):
            if port_file.exists() and port_file.read_text().strip():
                break
            assert proc.poll() is None, log_file.read_text()[-3000:]
            time.sleep(0.1)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key="k-embedded", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["embedded"]

        out = ask(client, "What is the weather in Paris?")
        assert out is None or out.usage.completion_tokens <= 16
        stream = ask(client, "What is the weather in Rome?", stream=True)
        if stream is not None:
            chunks = list(stream)
            assert chunks[0].choices[0].delta.role == "assistant"
            assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda i: ask(client, f"Weather in city number {i}?"), range(4)))
        assert len(replies) == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    text = log_file.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "key=required" in text and "POST /v1/chat/completions" in text and "GET /v1/models 401" in text
    assert "Traceback" not in text and "k-embedded" not in text
