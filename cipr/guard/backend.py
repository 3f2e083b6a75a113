"""How the guard calls a model: any `cipr.runtime.backends.Backend`, plus two scripted ones for tests.

The guard asks with chat messages (`{"role", "content"}` dicts or `Message`s), tools in OpenAI format and
`tool_choice` one of None (the model decides), `"required"` (some tool must be called) or a tool name
(that tool must be called) (`ask`). A backend that cannot force a choice says so with
`supports_forced_tool_choice = False`; the guard then relies on the prompt (JSON repair). Whatever the
backend returns is text; the guard parses and validates it, so a backend that ignores `tool_choice`
cannot smuggle a call past the validator. The in-process model (`cipr.runtime.backends.HFBackend`) forces
a choice by prefilling the assistant turn with the call's opening text up to the tool name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.runtime.backends import Backend, Generation, GenRequest, Usage, chat_example

ChatMessages = Sequence[Mapping[str, Any]]


def ask(backend: Backend, messages: Sequence[Any], *, tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | None = None, max_tokens: int = 512) -> tuple[str, Usage]:
    """One reply (text, tokens) to `messages`; raises RuntimeError when the backend reports a failure."""
    (gen,) = backend.generate([GenRequest(chat_example(messages, tools), tool_choice, max_tokens)])
    if gen.error is not None:
        raise RuntimeError(gen.error)
    return gen.text, gen.usage


@dataclass(frozen=True)
class Request:
    """What a scripted backend was asked (kept so tests can inspect prompts)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    tool_choice: str | None
    max_tokens: int | None

    @classmethod
    def of(cls, request: GenRequest) -> Request:
        ex = request.example
        tools = tuple(ex.interface.to_openai()) if len(ex.interface) else None
        return cls(tuple(m.to_dict() for m in ex.messages), tools, request.tool_choice,
                   request.max_new_tokens)


def word_usage(request: Request, reply: str) -> Usage:
    """Whitespace-word token counts (prompt: message contents plus the tools' JSON; completion: the
    reply): deterministic, hand-checkable numbers for scripted backends."""
    prompt = sum(len(str(m.get("content", "")).split()) for m in request.messages)
    if request.tools:
        prompt += len(json.dumps(list(request.tools)).split())
    return Usage(prompt, len(reply.split()))


@dataclass
class FunctionBackend:
    """Replies computed by `reply(request)` (a string, or `(string, Usage)`; words counted otherwise):
    replies that depend on the prompt, or any client callable as a Backend."""

    reply: Callable[[Request], str | tuple[str, Usage]]
    supports_forced_tool_choice: bool = True
    requests: list[Request] = field(default_factory=list)
    name: str = "function"

    def _answer(self, request: Request, out: str | tuple[str, Usage]) -> Generation:
        text, usage = out if isinstance(out, tuple) else (out, word_usage(request, out))
        return Generation(text, usage=usage)

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for r in requests:
            request = Request.of(r)
            self.requests.append(request)
            out.append(self._answer(request, self.reply(request)))
        return out


class ScriptedBackend(FunctionBackend):
    """Returns fixed replies (strings or `(string, Usage)`) in order; raises when they run out."""

    def __init__(self, replies: Sequence[str | tuple[str, Usage]], supports_forced_tool_choice: bool = True):
        super().__init__(self._next, supports_forced_tool_choice, [], "scripted")
        self.replies = replies

    def _next(self, request: Request) -> str | tuple[str, Usage]:
        i = len(self.requests) - 1
        if i >= len(self.replies):
            raise RuntimeError(f"ScriptedBackend has {len(self.replies)} replies; request {i + 1} has none")
        return self.replies[i]
