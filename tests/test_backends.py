"""The one generation module and the one backend protocol (cipr/runtime/generation.py, backends.py): greedy
batching equals one-by-one decoding, rows stop at their own limits, a forced tool choice is a prefill; the
OpenAI-compatible client retries with backoff against a local server and records what it cannot get; vLLM
stays unimported unless chosen."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from support.tiny_models import attention_as as attention

from cipr.formats.base import CallFormat, Decision, ParseResult
from cipr.formats.toolrl import ToolRLFormat
from cipr.runtime.backends import (
    GenRequest,
    HFBackend,
    OpenAIBackend,
    OpenAIBackendConfig,
    forced_prefix,
)
from cipr.runtime.generation import GreedyConfig, common_prefix, cut_at_end, greedy_texts
from cipr.tools.interface import Call, Example, Interface, Message, Tool

FMT = ToolRLFormat()
TOOL = Tool("get_weather", "Weather for a city.",
            {"type": "object", "properties": {"city": {"type": "string"}}})


def ex(q: str) -> Example:
    return Example(id=q, messages=(Message("user", q),), interface=Interface((TOOL,)),
                   reference=(Call("get_weather", {"city": "Rome"}),))


@pytest.fixture(scope="module")
def sharp_model(tiny_tokenizer):
    """The tiny model with its matrices scaled up, so that greedy outputs vary with the prompt and the
    step (at its initial scale it repeats one token everywhere)."""
    import torch
    from support.tiny_models import tiny_model

    model = tiny_model(tiny_tokenizer, seed=1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(10)
    return model


REQS = [GenRequest(ex(q)) for q in ["Rome?", "What is the weather like in Paris tomorrow morning, please?",
                                     "Oslo", "Tell me about Lima and its weather today"]]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_hf_batched_matches_one_by_one(sharp_model, tiny_tokenizer, attn):
    """Batch size 1 and 4, prefilled per item or as a padded batch, and `model.generate`: the same greedy
    texts."""

    def run(bs, drop, prefill="auto"):
        cfg = GreedyConfig(batch_size=bs, max_new_tokens=12, drop_finished=drop, prefill=prefill)
        return [g.text for g in HFBackend(sharp_model, tiny_tokenizer, FMT, cfg).generate(REQS)]

    with attention(sharp_model, attn):
        assert sharp_model.config._attn_implementation == attn
        one = run(1, True)
        assert tiny_tokenizer.padding_side == "left"
        assert run(4, True, "per_item") == run(4, True, "batched") == one == run(4, False)
    assert all(one) and len(set(one)) == len(one)
    assert all("<|im_end|>" not in t and "<|endoftext|>" not in t for t in one)


def test_hf_rows_leave_the_batch_when_they_end(sharp_model, tiny_tokenizer):
    """Make a token the model emits mid-way an end token, so rows finish at different steps."""
    probe = HFBackend(sharp_model, tiny_tokenizer, FMT, GreedyConfig(batch_size=4, max_new_tokens=10))
    prompts = [probe.prompt(r)[0] for r in REQS]
    enc = tiny_tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        rows = probe.greedy._generate(enc["input_ids"], enc["attention_mask"], 10)
    counts = {}
    for row in rows:
        for t in set(row[1:6]):
            counts[t] = counts.get(t, 0) + 1
    stop = min(counts, key=lambda t: (counts[t], t))  # emitted by few rows: they stop early, others go on
    outs = {}
    for drop, bs in ((True, 4), (False, 4), (True, 1)):
        b = HFBackend(sharp_model, tiny_tokenizer, FMT, GreedyConfig(batch_size=bs, max_new_tokens=10,
                                                                      drop_finished=drop))
        b.greedy.end_ids = b.greedy.end_ids | {stop}
        outs[(drop, bs)] = [g.text for g in b.generate(REQS)]
    assert len(set(map(tuple, outs.values()))) == 1
    lengths = {len(t) for t in outs[(True, 4)]}
    assert len(lengths) > 1  # the rows did end at different steps


@pytest.mark.parametrize("bs", [1, 3])
def test_hf_prefix_reuse_computes_only_what_prompts_do_not_share_and_gives_the_same_texts(
        sharp_model, tiny_tokenizer, bs):
    """Each prompt reuses the states of the shared start of the one prefilled before it (longest first),
    within one `generate` call: the tokens reused are the sum of those common prefixes, every call
    starts afresh, and the texts equal those of prompts prefilled in full."""
    def backend(reuse):
        return HFBackend(sharp_model, tiny_tokenizer, FMT,
                         GreedyConfig(batch_size=bs, max_new_tokens=8, prefill="per_item",
                                      prefix_reuse=reuse))

    with attention(sharp_model, "sdpa"):
        on, off = backend(True), backend(False)
        ids = sorted((tiny_tokenizer(on.prompt(r)[0], add_special_tokens=False)["input_ids"] for r in REQS),
                     key=lambda x: -len(x))
        shared = sum(common_prefix(a, b) for a, b in zip(ids, ids[1:], strict=False))
        assert shared >= 3 * 20  # the format's system prompt
        first = [g.text for g in on.generate(REQS)]
        assert on.greedy.timing["prefix_reused_tokens"] == shared
        assert on.greedy.timing["prefill_tokens"] == sum(map(len, ids)) - shared
        assert [g.text for g in on.generate(REQS)] == first and \
            on.greedy.timing["prefix_reused_tokens"] == 2 * shared
        assert [g.text for g in off.generate(REQS)] == first and \
            off.greedy.timing["prefix_reused_tokens"] == 0


def test_hf_prefix_reuse_survives_a_batch_that_fails_mid_prefill(sharp_model, tiny_tokenizer):
    """The second prefill forward of the first batch raises: the batch is retried item by item (reusing its
    buffers) and every text equals a clean run's; the states of the failed batch are not reused."""
    cfg = GreedyConfig(batch_size=4, max_new_tokens=8, prefill="per_item")
    clean = [g.text for g in HFBackend(sharp_model, tiny_tokenizer, FMT, cfg).generate(REQS)]
    backend = HFBackend(sharp_model, tiny_tokenizer, FMT, cfg)
    calls = {"n": 0}
    real = sharp_model.forward

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of memory")
        return real(*args, **kwargs)

    sharp_model.forward = flaky
    try:
        out = backend.generate(REQS)
    finally:
        del sharp_model.forward
    assert calls["n"] > 2 and all(g.error is None for g in out) and [g.text for g in out] == clean


def test_hf_batch_failure_is_retried_per_item(tiny_model, tiny_tokenizer):
    backend = HFBackend(tiny_model, tiny_tokenizer, FMT, GreedyConfig(batch_size=2, max_new_tokens=4))
    real = backend.greedy.run

    def flaky(prompts, limits=None, stops=None):
        if len(prompts) > 1 or "Oslo" in tiny_tokenizer.decode(prompts[0]):
            raise RuntimeError("out of memory")
        return real(prompts, limits, stops)

    backend.greedy.run = flaky
    out = backend.generate([GenRequest(ex("Rome?")), GenRequest(ex("Oslo"))])
    assert out[0].error is None and out[1].error == "RuntimeError: out of memory"


class _Server:
    """A local chat-completions endpoint that fails the first `fail` requests with a status code."""

    def __init__(self, fail: int, status: int = 503, tool_calls: bool = False):
        self.fail, self.status, self.tool_calls, self.seen = fail, status, tool_calls, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "served-model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append(body)
                if len(outer.seen) <= outer.fail:
                    return self._send(outer.status, {"error": "busy"})
                msg = {"role": "assistant",
                       "content": FMT.render_target([Call("get_weather", {"city": "Rome"})])}
                if outer.tool_calls:
                    msg = {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
                        {"id": "2", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{oops"}}]}
                self._send(200, {"choices": [{"message": msg}]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server(request):
    s = _Server(*request.param)
    yield s
    s.close()


@pytest.mark.parametrize("server", [(2, 503)], indirect=True)
def test_openai_retries_with_exponential_backoff(server):
    sleeps = []
    cfg = OpenAIBackendConfig(base_url=server.url, max_retries=3, backoff_s=0.5, jitter=0.0, concurrency=1)
    out = OpenAIBackend(FMT, cfg, sleep=sleeps.append).generate([GenRequest(ex("Rome?"))])
    assert out[0].error is None and out[0].attempts == 3
    assert FMT.parse(out[0].text).calls == (Call("get_weather", {"city": "Rome"}),)
    assert sleeps == [0.5, 1.0]
    body = server.seen[-1]
    assert body["model"] == "served-model" and body["temperature"] == 0 and \
        body["messages"][0]["role"] == "system"


@pytest.mark.parametrize("server", [(100, 500)], indirect=True)
def test_openai_gives_up_and_records_failure(server):
    sleeps = []
    cfg = OpenAIBackendConfig(base_url=server.url, model_name="m", max_retries=2, backoff_s=1,
                              backoff_max_s=1.5, jitter=0.0, concurrency=2)
    out = OpenAIBackend(FMT, cfg, sleep=sleeps.append).generate([GenRequest(ex("a")), GenRequest(ex("b"))])
    assert [g.attempts for g in out] == [3, 3] and all("gave up after 3 attempts" in g.error for g in out)
    assert all("HTTP 500" in g.error for g in out) and sorted(sleeps) == [1, 1, 1.5, 1.5]


@pytest.mark.parametrize("server", [(1, 400)], indirect=True)
def test_openai_client_error_is_not_retried(server):
    cfg = OpenAIBackendConfig(base_url=server.url, model_name="m", concurrency=1)
    out = OpenAIBackend(FMT, cfg, sleep=lambda s: None).generate([GenRequest(ex("a"))])
    assert out[0].error.startswith("HTTP 400") and out[0].attempts == 1


@pytest.mark.parametrize("server", [(0, 200, True)], indirect=True)
def test_openai_native_tool_calls(server):
    cfg = OpenAIBackendConfig(base_url=server.url, model_name="m", native_tools=True, concurrency=1)
    g = OpenAIBackend(FMT, cfg).generate([GenRequest(ex("a"))])[0]
    assert g.parsed is not None and g.parsed.calls == (Call("get_weather", {"city": "Rome"}),)
    assert g.parsed.ok is False and "oops" not in (g.parsed.error or "") and "get_weather" in g.parsed.error


def test_vllm_is_not_imported_by_the_harness():
    code = ("import sys, cipr.runtime.backends, cipr.eval.runner, cipr.eval.report, cipr.guard, cipr.serve; "
            "assert 'vllm' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_per_item_prefill_is_automatic_only_for_full_attention_on_cpu(tiny_model, tiny_tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    sliding = MistralForCausalLM(MistralConfig(num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=1, hidden_size=8, intermediate_size=8,
                                               vocab_size=50, sliding_window=4))
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert HFBackend(tiny_model, tiny_tokenizer, FMT).greedy.per_item_prefill(cpu)
    assert not HFBackend(tiny_model, tiny_tokenizer, FMT).greedy.per_item_prefill(gpu)
    assert not HFBackend(sliding, tiny_tokenizer, FMT).greedy.per_item_prefill(cpu)
    forced = HFBackend(tiny_model, tiny_tokenizer, FMT, GreedyConfig(prefill="per_item"))
    assert forced.greedy.per_item_prefill(gpu)


def test_each_request_stops_at_its_own_limit(sharp_model, tiny_tokenizer):
    """Rows of one batch with limits 1, 3, 5 and the default 12: each is the default run's first tokens."""
    backend = HFBackend(sharp_model, tiny_tokenizer, FMT, GreedyConfig(batch_size=4, max_new_tokens=12))
    full = backend.greedy.run([tiny_tokenizer(backend.prompt(r)[0])["input_ids"] for r in REQS])
    limits = [1, 3, 5, None]
    out = backend.generate([GenRequest(r.example, max_new_tokens=n)
                            for r, n in zip(REQS, limits, strict=True)])
    for g, row, n in zip(out, full, limits, strict=True):
        kept = row[:n or 12]
        assert g.usage.completion_tokens == len(kept)
        assert g.text == \
            tiny_tokenizer.decode(cut_at_end(kept, backend.greedy.end_ids), skip_special_tokens=False)


def test_forced_tool_choice_is_a_prefill_the_text_includes(sharp_model, tiny_tokenizer):
    prefix = forced_prefix(FMT, "get_weather")
    backend = HFBackend(sharp_model, tiny_tokenizer, FMT, GreedyConfig(max_new_tokens=4))
    (g,) = backend.generate([GenRequest(REQS[0].example, tool_choice="get_weather")])
    assert g.text.startswith(prefix) and \
        backend.prompt(GenRequest(REQS[0].example, "get_weather"))[0].endswith(prefix)


def test_greedy_texts_equals_the_backend_and_restores_training_mode(sharp_model, tiny_tokenizer):
    backend = HFBackend(sharp_model, tiny_tokenizer, FMT, GreedyConfig(max_new_tokens=6))
    prompts = [backend.prompt(r)[0] for r in REQS]
    sharp_model.train()
    out = greedy_texts(sharp_model, tiny_tokenizer, prompts, max_new_tokens=6, batch_size=3)
    assert sharp_model.training
    sharp_model.eval()
    assert [text for _, text in out] == [g.text for g in backend.generate(REQS)]


class ReactFormat(CallFormat):
    """A minimal ReAct-style format (`Action: name\\nAction Input: {json}`) to test format-agnostic
    prefixes."""

    name = "react_test"

    def chat(self, messages, interface, *, native_tools=False):
        tools = "\n".join(t.name for t in interface)
        return [{"role": "system", "content": f"Tools:\n{tools}"}] + [m.to_dict() for m in messages], None

    def render_target(self, calls: Sequence[Call], *, response=None, think=None) -> str:
        c = calls[0]
        return f"Thought: go\nAction: {c.name}\nAction Input: {json.dumps(dict(c.arguments))}"

    def parse(self, text: str) -> ParseResult:
        try:
            head, args = text.split("\nAction Input: ", 1)
            return ParseResult((Call(head.split("Action: ", 1)[1].strip(), json.loads(args)),))
        except (ValueError, IndexError) as e:
            return ParseResult((), ok=False, error=str(e))

    def decisions(self, text: str) -> list[Decision]:
        i = text.find("Action: ")
        if i < 0:
            return []
        return [Decision(i, "Action: ", "\n", text[i + 8:].split("\n", 1)[0])]


def test_forced_prefix_follows_the_call_format():
    assert forced_prefix(None, "get_weather") == '{"name": "get_weather", "arguments": '
    assert forced_prefix(None, "required") == '{"name": "'
    assert forced_prefix(None, None) == "" and forced_prefix(ReactFormat(), "auto") == ""
    assert forced_prefix(ReactFormat(), "get_weather") == "Thought: go\nAction: get_weather\n"
    assert forced_prefix(ReactFormat(), "required") == "Thought: go\nAction: "
    toolrl = forced_prefix(ToolRLFormat(), 'we"ird')
    assert toolrl.endswith('<tool_call>\n{"name": "we\\"ird"') and toolrl.startswith("<think>")


def test_cpu_kv_cache_is_sized_from_the_run_not_the_machine():
    """SmolLM2-135M's shape: 30 layers, 3 key/value heads of 64: 46,080 float32 bytes of keys and values a
    token; 16 sequences of 4,096 tokens need 3.02e9 bytes; a tiny run gets the floor."""
    from types import SimpleNamespace

    from cipr.runtime.vllm_engine import FLOOR_BYTES, cpu_kv_cache_bytes, kv_bytes_per_token

    smol = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
                           num_hidden_layers=30, max_position_embeddings=8192)
    assert kv_bytes_per_token(smol) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert cpu_kv_cache_bytes(smol, 4096, 16) == (46_080 * 4096 * 16, 4096)
    assert cpu_kv_cache_bytes(smol, None, 1) == (46_080 * 8192, 8192)
    assert cpu_kv_cache_bytes(smol, 64, 1) == (FLOOR_BYTES, 64)


def test_a_stopped_request_leaves_the_batch_and_the_others_go_on(sharp_model, tiny_tokenizer):
    """`GenRequest.stop` (a client that went away) ends its row at the next step; the rest are unchanged."""
    backend = HFBackend(sharp_model, tiny_tokenizer, FMT, GreedyConfig(batch_size=4, max_new_tokens=12))
    clean = backend.generate(REQS)
    asked = {"n": 0}

    def after_three() -> bool:
        asked["n"] += 1
        return asked["n"] > 3

    out = backend.generate([GenRequest(REQS[0].example, stop=after_three), *REQS[1:]])
    assert [g.text for g in out[1:]] == [g.text for g in clean[1:]]
    assert out[0].usage.completion_tokens <= 4 < clean[0].usage.completion_tokens
