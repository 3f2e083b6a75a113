"""Model backends for the guard: a minimal protocol, a scripted backend for tests, a transformers one.

The guard talks to a model only through `Backend.generate(messages, *, tools, tool_choice,
max_tokens) -> (text, usage)`: chat messages as `{"role", "content"}` dicts, tools in OpenAI
format, and `tool_choice` one of None (the model decides), `"required"` (some tool must be
called) or a tool name (that tool must be called). A backend that cannot force a choice says so
with `supports_forced_tool_choice = False`; the guard then relies on the prompt (JSON repair).
Whatever the backend returns is text; the guard parses and validates it, so a backend that ignores
`tool_choice` cannot smuggle a call past the validator.

`HFBackend` forces a choice by prefilling the assistant turn with the call's opening text up to
and including the tool name (`forced_prefix`), which is how a local model gets "forced tool
choice" without a provider API. The returned text includes the prefill, so it parses like any
other reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cipr.tools.interface import Call, Interface, Message


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call: what it read (`prompt_tokens`) and what it wrote."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total}


ChatMessages = Sequence[Mapping[str, Any]]


@runtime_checkable
class Backend(Protocol):
    """What the guard needs from a model."""

    supports_forced_tool_choice: bool

    def generate(self, messages: ChatMessages, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
        """One assistant reply to `messages` (text) and the tokens it cost."""
        ...


@dataclass(frozen=True)
class Request:
    """What a backend was asked (kept by ScriptedBackend so tests can inspect prompts)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    tool_choice: str | None
    max_tokens: int


def _words(text: str) -> int:
    return len(text.split())


def word_usage(messages: ChatMessages, tools: Sequence[Mapping[str, Any]] | None, reply: str) -> Usage:
    """Whitespace-word token counts (prompt: message contents plus the tools' JSON; completion: the
    reply): deterministic, hand-checkable numbers for scripted backends."""
    prompt = sum(_words(str(_chat_dict(m).get("content", ""))) for m in messages)
    if tools:
        prompt += _words(json.dumps(list(tools)))
    return Usage(prompt, _words(reply))


@dataclass
class FunctionBackend:
    """Replies computed by `reply(request)` (a string, or `(string, Usage)`; words counted otherwise).

    For tests that need a reply to depend on the prompt (e.g. a fake model that answers repair
    prompts differently from task prompts), and to wrap any client callable as a Backend.
    """

    reply: Callable[[Request], str | tuple[str, Usage]]
    supports_forced_tool_choice: bool = True
    requests: list[Request] = field(default_factory=list)

    def generate(self, messages: ChatMessages, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
        request = Request(tuple(_chat_dict(m) for m in messages),
                          tuple(dict(t) for t in tools) if tools is not None else None, tool_choice, max_tokens)
        self.requests.append(request)
        out = self.reply(request)
        return out if isinstance(out, tuple) else (out, word_usage(messages, tools, out))


@dataclass
class ScriptedBackend:
    """Returns fixed replies in order; raises when they run out (a test asked for more calls than planned).

    A reply is a string or `(string, Usage)`; without a Usage, tokens are `word_usage` counts.
    """

    replies: Sequence[str | tuple[str, Usage]]
    supports_forced_tool_choice: bool = True
    requests: list[Request] = field(default_factory=list)

    def generate(self, messages: ChatMessages, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
        i = len(self.requests)
        self.requests.append(Request(tuple(_chat_dict(m) for m in messages),
                                     tuple(dict(t) for t in tools) if tools is not None else None,
                                     tool_choice, max_tokens))
        if i >= len(self.replies):
            raise RuntimeError(f"ScriptedBackend has {len(self.replies)} replies; request {i + 1} has none")
        reply = self.replies[i]
        return reply if isinstance(reply, tuple) else (reply, word_usage(messages, tools, reply))


def forced_prefix(call_format: Any, tool_choice: str | None) -> str:
    """The assistant-turn text that commits to a call (and, for a tool name, to that tool).

    With a call format (the `cipr.formats` contract), the prefix is read off the format's own
    rendering of a call: the text up to the decision's opener, the name as the format writes it
    (`name_text`, e.g. JSON-escaped) and the name's closing suffix. Without one, the guard's JSON protocol `{"name": "<tool>", "arguments": ` is used.
    None or "auto" gives no prefix.
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


END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


def _message(m: Message | Mapping[str, Any]) -> Message:
    if isinstance(m, Message):
        return m
    calls = tuple(Call.from_dict(c.get("function", c)) for c in m.get("tool_calls") or ())
    return Message(str(m["role"]), str(m.get("content", "") or ""), calls, m.get("name"))


def _chat_dict(m: Message | Mapping[str, Any]) -> dict[str, Any]:
    return m.to_dict() if isinstance(m, Message) else dict(m)


class HFBackend:
    """A transformers causal LM behind the Backend protocol (greedy by default, for reproducibility).

    - `call_format`: a `cipr.formats` CallFormat instance or its registered name (resolved with
      `cipr.formats.get_format`); it renders the tools into the prompt exactly as the evaluation
      harness does (`render_prompt`) and gives the forced-choice prefix. None: the tokenizer's chat
      template renders `tools=` natively and the guard's JSON protocol is used for forced choices.
    - Messages may be `Message` objects (kept as they are, earlier calls included) or chat dicts.
    - Special tokens are kept in the decoded text (call formats use tags such as `<tool_call>` that
      tokenizers mark special); generation stops at the first end-of-turn token (EOS, `<|im_end|>`,
      `<|endoftext|>`, ... when the vocabulary has them), which is not part of the text.
    - `generate_batch` runs several prompts per forward (left padding), for the evaluation's
      undrifted and drifted turns; the guard's own calls go one by one through `generate`.
    """

    supports_forced_tool_choice = True

    def __init__(self, model: Any, tokenizer: Any, call_format: Any = None, *, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 8) -> None:
        if isinstance(call_format, str):
            from cipr.formats import get_format

            call_format = get_format(call_format)
        self.model, self.tokenizer, self.call_format = model, tokenizer, call_format
        self.do_sample, self.temperature, self.top_p = do_sample, temperature, top_p
        self.batch_size = batch_size
        vocab = tokenizer.get_vocab()
        self.end_ids = {tokenizer.eos_token_id} | {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
        self.end_ids.discard(None)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def render(self, messages: Sequence[Message | Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The prompt text for `messages` and `tools`, ending with the assistant generation prompt."""
        if self.call_format is not None:
            interface = Interface.from_openai(tools or [], where="<backend tools>")
            return self.call_format.render_prompt(self.tokenizer, [_message(m) for m in messages], interface)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        return self.tokenizer.apply_chat_template([_chat_dict(m) for m in messages], **kwargs)

    def _run(self, prompts: list[str], max_tokens: int) -> list[tuple[str, Usage]]:
        import torch

        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"
        try:
            enc = self.tokenizer(prompts, return_tensors="pt", add_special_tokens=False, padding=True)
        finally:
            self.tokenizer.padding_side = side
        device = next(self.model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": self.do_sample,
                                      "pad_token_id": self.pad_id, "eos_token_id": sorted(self.end_ids)}
        if self.do_sample:
            gen_kwargs.update(temperature=self.temperature, top_p=self.top_p)
        with torch.inference_mode():
            out = self.model.generate(**enc, **gen_kwargs)
        width = enc["input_ids"].shape[1]
        results = []
        for row, mask in zip(out[:, width:].tolist(), enc["attention_mask"].sum(dim=1).tolist(), strict=True):
            cut = next((i for i, t in enumerate(row) if t in self.end_ids), None)
            used = row if cut is None else row[:cut + 1]
            text = self.tokenizer.decode(row if cut is None else row[:cut], skip_special_tokens=False)
            results.append((text, Usage(int(mask), len(used))))
        return results

    def generate(self, messages: ChatMessages, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
        prefix = forced_prefix(self.call_format, tool_choice)
        ((text, usage),) = self._run([self.render(messages, tools) + prefix], max_tokens)
        return prefix + text, usage

    def generate_batch(self, requests: Sequence[tuple[ChatMessages, Sequence[Mapping[str, Any]] | None]], *,
                       max_tokens: int = 512) -> list[tuple[str, Usage]]:
        """Replies to several (messages, tools) prompts without forced choice, `batch_size` per forward,
        longest first (less padding); results in request order."""
        prompts = [self.render(m, t) for m, t in requests]
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        out: list[tuple[str, Usage] | None] = [None] * len(prompts)
        for s in range(0, len(order), max(1, self.batch_size)):
            idx = order[s:s + self.batch_size]
            for i, result in zip(idx, self._run([prompts[i] for i in idx], max_tokens), strict=True):
                out[i] = result
        return [r for r in out if r is not None]


class CompletionsBackend(HFBackend):
    """A model served behind an OpenAI-compatible text-completions endpoint (a vLLM server), prompted as
    `HFBackend` prompts a local model: the tokenizer's chat template with the call format's tool text, the
    same forced-choice prefill, and the reply cut at the first end-of-turn token.

    This is how cipr-serve fronts a served checkpoint whose chat template or vocabulary has no native tool
    support that the server's own tool parsers recognize (e.g. the embedded SmolLM2: no `<tool_call>` token,
    which vLLM's Hermes parser requires). Greedy (`temperature` 0) unless `do_sample`; special tokens are
    kept in the text (`skip_special_tokens: false`, a vLLM extension other servers ignore).
    """

    def __init__(self, base_url: str, tokenizer: Any, call_format: Any = None, *, model_name: str | None = None,
                 timeout_s: float = 600.0, do_sample: bool = False, temperature: float = 1.0,
                 top_p: float = 1.0) -> None:
        import httpx

        super().__init__(None, tokenizer, call_format, do_sample=do_sample, temperature=temperature, top_p=top_p,
                         batch_size=1)
        self._client = httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=timeout_s)
        self.model_name = model_name or self._client.get("models").json()["data"][0]["id"]
        self.stop = sorted({tokenizer.convert_ids_to_tokens(i) for i in self.end_ids})

    def _run(self, prompts: list[str], max_tokens: int) -> list[tuple[str, Usage]]:
        results = []
        for prompt in prompts:
            body = {"model": self.model_name, "prompt": prompt, "max_tokens": max_tokens, "stop": self.stop,
                    "temperature": self.temperature if self.do_sample else 0.0, "top_p": self.top_p,
                    "skip_special_tokens": False}
            r = self._client.post("completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"completions endpoint {self._client.base_url} answered HTTP {r.status_code}: "
                                   f"{r.text[:500]}")
            data = r.json()
            usage = data.get("usage") or {}
            results.append((data["choices"][0]["text"], Usage(int(usage.get("prompt_tokens", 0)),
                                                              int(usage.get("completion_tokens", 0)))))
        return results
