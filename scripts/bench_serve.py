"""Requests per second through cipr-serve at 1 and 16 concurrent clients, and the latency the service adds.

    .venv/bin/python scripts/bench_serve.py [--backend embedded|stub|vllm] [--requests 48]
        [--clients 1,16] [--max-new-tokens 32] [--batch-size 8] [--threads N] [--stub-ms 50]

The same kind of request (a short conversation, two tools, canonical names, `max_tokens` =
--max-new-tokens; each request's question differs) is sent --requests times at each client count,
(a) straight to the backend's `complete` from that many threads (no HTTP, no adapter), then (b) through
cipr-serve on loopback with a plain HTTP client (httpx) from that many threads. Printed per client count:
requests per second and median latency of both, and the statuses served; then the served throughput
ratio (most clients / one client) and the service's added latency (served minus direct median latency at
one client: HTTP, validation, the adapter's renaming both ways).

Backends:
- `embedded`: SmolLM2-135M in this process; concurrent requests are decoded together up to
  --batch-size (`cipr.serve.backends.HFChatBackend`), on --threads torch threads.
- `stub`: an in-process backend that sleeps --stub-ms and answers with two tool calls: what an
  upstream that runs requests concurrently looks like, without a model (measures the service alone).
- `vllm`: vLLM's OpenAI server (its CPU build works) on the embedded model's folder, fronted through its
  text-completions endpoint as `cipr-serve backend=URL tokenizer=DIR` does; needs vLLM importable.
A reply the service refuses (a 502 when the model calls an undeclared tool) still went through the
model and counts as served; its status is listed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_flight", "description": "Book a flight between two cities.",
        "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                        "destination": {"type": "string"}},
                       "required": ["origin", "destination"]}}}]
CITIES = ["Oslo", "Rome", "Paris", "Lima", "Kyiv", "Quito", "Hanoi", "Accra"]


def body(i: int, max_tokens: int) -> dict[str, Any]:
    city = CITIES[i % len(CITIES)]
    return {"model": "bench", "tools": TOOLS, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": "You are a travel assistant. Use the tools."},
                         {"role": "user", "content": f"Request {i}: what is the weather in {city}?"}]}


class StubBackend:
    """Sleeps `seconds`, then calls function_01 (the first tool under canonical names)."""

    name = "stub"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def models(self) -> list[str]:
        return ["stub"]

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        from cipr.serve.protocol import completion

        time.sleep(self.seconds)
        call = {"id": "call_1", "type": "function",
                "function": {"name": "function_01", "arguments": json.dumps({"arg_01": "Oslo"})}}
        return completion("stub", {"role": "assistant", "content": None, "tool_calls": [call]},
                          finish_reason="tool_calls",
                          usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(max_seqs: int):
    """vLLM's OpenAI server on the embedded model's folder: (base URL with /v1, the folder)."""
    import httpx

    from cipr.runtime.embedded import embedded_hf_dir

    folder = embedded_hf_dir()
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
           "HF_HUB_OFFLINE": "1"}
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host",
           "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
           "--max-num-seqs", str(max_seqs), "--enforce-eager"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    start = time.time()
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the vLLM server exited ({proc.returncode}); its log: {log.name}")
            if time.time() - start > 900:
                raise SystemExit(f"the vLLM server did not come up in 900 s; its log: {log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(2)
        print(f"vLLM server up in {time.time() - start:.0f} s (log {log.name})", flush=True)
        yield f"http://127.0.0.1:{port}/v1", folder
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run(n: int, clients: int, one: Callable[[int], int]) -> dict[str, Any]:
    """`one(i)` for i < n from `clients` threads: requests per second, median seconds, statuses."""
    latencies: list[float] = []

    def timed(i: int) -> int:
        t = time.perf_counter()
        status = one(i)
        latencies.append(time.perf_counter() - t)
        return status

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        statuses = Counter(pool.map(timed, range(n)))
    seconds = time.perf_counter() - start
    return {"rps": n / seconds, "median_s": statistics.median(latencies), "statuses": dict(statuses)}


def measure(backend: Any, n: int, client_counts: list[int], max_tokens: int,
            max_in_flight: int) -> dict[str, Any]:
    import httpx

    from cipr.serve import ApiError, ChatService, ServeConfig, ServeLimits, start, stop
    from cipr.serve.conversation import canonical_request

    def direct(i: int) -> int:
        shown, _ = canonical_request(body(i, max_tokens))
        try:
            backend.complete(shown)
        except ApiError as e:
            return e.status
        return 200

    limits = ServeLimits(max_in_flight=max_in_flight, max_waiting=4 * max(client_counts))
    server, thread = start(ChatService(backend, ServeConfig(names="canonical")), limits=limits)
    client = httpx.Client(base_url=server.url + "/v1", timeout=3600, limits=httpx.Limits(max_connections=64))

    def served(i: int) -> int:
        r = client.post("chat/completions", json=body(i, max_tokens))
        r.json()
        return r.status_code

    out: dict[str, Any] = {}
    try:
        direct(0), served(0)  # warm-up: first forward, imports, connections
        for c in client_counts:
            out[c] = {"direct": run(n, c, direct), "served": run(n, c, served)}
            d, s = out[c]["direct"], out[c]["served"]
            print(f"  {c:>3} clients: direct {d['rps']:8.2f} req/s, median {d['median_s'] * 1000:9.1f} ms | "
                  f"served {s['rps']:8.2f} req/s, median {s['median_s'] * 1000:9.1f} ms, statuses "
                  f"{s['statuses']}", flush=True)
    finally:
        stop(server, thread)
    lo, hi = min(client_counts), max(client_counts)
    out["ratio"] = out[hi]["served"]["rps"] / out[lo]["served"]["rps"]
    out["added_ms"] = (out[lo]["served"]["median_s"] - out[lo]["direct"]["median_s"]) * 1000
    print(f"  served throughput {hi} vs {lo} clients: x{out['ratio']:.2f}; the service adds "
          f"{out['added_ms']:.1f} ms a request (median, {lo} client)", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["embedded", "stub", "vllm"], action="append",
                   help="repeatable; default: embedded and stub, plus vllm when vLLM is importable")
    p.add_argument("--requests", type=int, default=48, help="requests per client count and path")
    p.add_argument("--clients", default="1,16", help="client counts, comma-separated")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8, help="embedded: requests decoded together")
    p.add_argument("--threads", type=int, default=None, help="embedded: torch CPU threads")
    p.add_argument("--stub-ms", type=float, default=50.0, help="stub: milliseconds a reply takes")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.util

    backends = args.backend or ["embedded", "stub"] + (["vllm"] if importlib.util.find_spec("vllm") else [])
    clients = [int(c) for c in args.clients.split(",")]
    results: dict[str, Any] = {}
    for name in backends:
        print(f"{name}: {args.requests} requests per client count, max_tokens={args.max_new_tokens}",
              flush=True)
        if name == "stub":
            results[name] = measure(StubBackend(args.stub_ms / 1000), args.requests, clients,
                                    args.max_new_tokens, max(clients))
        elif name == "embedded":
            from cipr.serve.command import ServeCommand, build_backend

            backend = build_backend(ServeCommand(backend="embedded", max_new_tokens=args.max_new_tokens,
                                                 batch_size=args.batch_size, threads=args.threads))
            results[name] = measure(backend, args.requests, clients, args.max_new_tokens, max(clients))
            results[name]["batch_size"] = args.batch_size
        else:
            if importlib.util.find_spec("vllm") is None:
                raise SystemExit("--backend vllm needs vLLM importable (the gpu extra or vLLM's CPU build)")
            from cipr.serve.command import ServeCommand, build_backend

            with vllm_server(max(clients)) as (url, folder):
                backend = build_backend(ServeCommand(backend=url, tokenizer=str(folder),
                                                     max_new_tokens=args.max_new_tokens))
                results[name] = measure(backend, args.requests, clients, args.max_new_tokens, max(clients))
    summary = {k: {"ratio": round(v["ratio"], 2), "added_ms": round(v["added_ms"], 1),
                   **{f"rps_{c}": round(v[c]["served"]["rps"], 2) for c in clients}}
               for k, v in results.items()}
    print("summary " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
