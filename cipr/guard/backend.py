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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cipr.interface import Call, Interface, Message


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


@dataclass
class ScriptedBackend:
    """Returns fixed replies in order; raises when they run out (a test asked for more calls than planned).

    A reply is a string or `(string, Usage)`. Without a Usage, tokens are counted as whitespace
    words (prompt: message contents plus the tools' JSON; completion: the reply) so token
    accounting has deterministic, hand-checkable numbers.
    """

    replies: Sequence[str | tuple[str, Usage]]
    supports_forced_tool_choice: bool = True
    requests: list[Request] = field(default_factory=list)

    def generate(self, messages: ChatMessages, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
        i = len(self.requests)
        self.requests.append(Request(tuple(dict(m) for m in messages),
                                     tuple(dict(t) for t in tools) if tools is not None else None,
                                     tool_choice, max_tokens))
        if i >= len(self.replies):
            raise RuntimeError(f"ScriptedBackend has {len(self.replies)} replies; request {i + 1} has none")
        reply = self.replies[i]
        if isinstance(reply, tuple):
            return reply
        prompt = sum(_words(str(m.get("content", ""))) for m in messages)
        if tools:
            prompt += _words(json.dumps(list(tools)))
        return reply, Usage(prompt, _words(reply))


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


class HFBackend:
    """A transformers causal LM behind the Backend protocol (greedy by default, for reproducibility).

    - `call_format`: a `cipr.formats` CallFormat instance or its registered name (resolved with
      `cipr.formats.get_format`); it renders the tools into the prompt and gives the forced-choice
      prefix. None: the tokenizer's chat template renders `tools=` natively and the guard's JSON
      protocol is used for forced choices.
    - Special tokens are kept in the decoded text (call formats use tags such as `<tool_call>` that
      tokenizers mark special); generation stops at the tokenizer's EOS.
    """

    supports_forced_tool_choice = True

    def __init__(self, model: Any, tokenizer: Any, call_format: Any = None, *, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0) -> None:
        if isinstance(call_format, str):
            from cipr.formats import get_format

            call_format = get_format(call_format)
        self.model, self.tokenizer, self.call_format = model, tokenizer, call_format
        self.do_sample, self.temperature, self.top_p = do_sample, temperature, top_p

    def render(self, messages: ChatMessages, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The prompt text for `messages` and `tools`, ending with the assistant generation prompt."""
        if self.call_format is not None:
            msgs = [Message(str(m["role"]), str(m.get("content", ""))) for m in messages]
            interface = Interface.from_openai(tools or [], where="<backend tools>")
            return self.call_format.render_prompt(self.tokenizer, msgs, interface)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs)

    def generate(self, messages: ChatMessages, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
        import torch

        prefix = forced_prefix(self.call_format, tool_choice)
        prompt = self.render(messages, tools) + prefix
        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        device = next(self.model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": self.do_sample,
                                      "pad_token_id": self.tokenizer.pad_token_id,
                                      "eos_token_id": self.tokenizer.eos_token_id}
        if self.do_sample:
            gen_kwargs.update(temperature=self.temperature, top_p=self.top_p)
        with torch.no_grad():
            out = self.model.generate(**enc, **gen_kwargs)
        new = out[0, enc["input_ids"].shape[1]:].tolist()
        eos = self.tokenizer.eos_token_id
        if eos in new:
            new = new[: new.index(eos) + 1]
        text = self.tokenizer.decode([t for t in new if t not in (eos, self.tokenizer.pad_token_id)],
                                     skip_special_tokens=False)
        return prefix + text, Usage(int(enc["input_ids"].shape[1]), len(new))
