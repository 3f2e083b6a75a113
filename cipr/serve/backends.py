"""What cipr-serve forwards to: an OpenAI-compatible URL, or a transformers model in the same process.

A backend takes a chat-completions request body (already under the names the model should see)
and returns a `chat.completion` object whose first choice holds the assistant message with native
`tool_calls`. Backends hold no per-request state, so one instance serves concurrent requests:

- `OpenAIChatBackend`: POSTs the body to `<base_url>/chat/completions` (a vLLM server, a hosted
  API; key from the environment variable `api_key_env`). `model_name` replaces the client's model
  name when set. A transport failure or an upstream 5xx becomes a 502 for the client, an upstream
  4xx keeps its status; the upstream message is quoted.
- `HFChatBackend`: renders the conversation with a `cipr.formats` call format (Hermes by default:
  tools in the prompt, so models without a tool-aware template such as the embedded SmolLM2 work),
  generates greedily through `cipr.runtime.backends.HFBackend` (which also forces `tool_choice` by
  prefilling), and parses the calls back into `tool_calls`. With `completions_url` the same prompt
  goes to a served model's text-completions endpoint instead (`cipr.runtime.backends.CompletionsBackend`,
  e.g. a vLLM server: `backend=URL tokenizer=DIR` on cipr-serve), for checkpoints whose tool calls the
  server's own parsers do not read. Generation is serialized by a lock:
  one model, one forward at a time; requests still run their own translation concurrently.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cipr.serve.protocol import ApiError, completion, tool_choice_name
from cipr.tools.interface import Call


class ChatBackend(Protocol):
    """A chat-completions backend (see the module docstring)."""

    name: str

    def models(self) -> list[str]: ...

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]: ...


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def wire_call(call: Call, call_id: str | None = None) -> dict[str, Any]:
    """A Call as an OpenAI `tool_calls` entry (arguments as a JSON string)."""
    args = call.arguments
    text = json.dumps(dict(args) if isinstance(args, Mapping) else args, ensure_ascii=False)
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": text}}


@dataclass
class OpenAIChatBackend:
    """Forwards to an OpenAI-compatible endpoint (see the module docstring)."""

    base_url: str
    model_name: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 600.0
    name: str = "openai"

    def __post_init__(self) -> None:
        import httpx

        key = os.environ.get(self.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.base_url.rstrip("/") + "/", headers=headers,
                                    timeout=self.timeout_s)

    def models(self) -> list[str]:
        if self.model_name:
            return [self.model_name]
        try:
            r = self._client.get("models")
            r.raise_for_status()
            return [m["id"] for m in r.json().get("data", [])]
        except (self._httpx.HTTPError, ValueError, KeyError) as e:
            raise ApiError(502, f"backend {self.base_url} did not list its models: {e}",
                           type="upstream_error", code="backend_unavailable") from e

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        payload = dict(body)
        if self.model_name:
            payload["model"] = self.model_name
        try:
            r = self._client.post("chat/completions", json=payload)
        except self._httpx.HTTPError as e:
            raise ApiError(502, f"backend {self.base_url} unreachable: {type(e).__name__}: {e}",
                           type="upstream_error", code="backend_unavailable") from e
        if r.status_code != 200:
            try:
                detail = r.json().get("error", {}).get("message") or r.text
            except ValueError:
                detail = r.text
            status = 502 if r.status_code >= 500 else r.status_code
            raise ApiError(status, f"backend {self.base_url} answered HTTP {r.status_code}: "
                           f"{str(detail)[:500]}", type="upstream_error", code="backend_error")
        try:
            data = r.json()
            data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ApiError(502, f"backend {self.base_url} sent a malformed completion: {e}",
                           type="upstream_error", code="backend_error") from e
        return data


class HFChatBackend:
    """A model behind the chat API through a `cipr.runtime.backends` backend (see the module docstring)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, call_format: str = "hermes",
                 model_name: str = "embedded", max_new_tokens: int = 512,
                 completions_url: str | None = None) -> None:
        from cipr.formats import resolve_format
        from cipr.runtime.backends import CompletionsBackend, HFBackend
        from cipr.runtime.generation import GreedyConfig

        self.format = resolve_format(call_format, tokenizer)
        if completions_url is None:
            self.generator: Any = HFBackend(model, tokenizer, self.format,
                                            GreedyConfig(batch_size=1, max_new_tokens=max_new_tokens))
        else:
            self.generator = CompletionsBackend(completions_url, tokenizer, self.format,
                                                model_name=model_name, max_new_tokens=max_new_tokens)
        self.tokenizer = tokenizer
        self.model_name = model_name if completions_url is None else self.generator.model_name
        self.max_new_tokens = max_new_tokens
        self.max_length = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self._lock = threading.Lock()

    def models(self) -> list[str]:
        return [self.model_name]

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from cipr.runtime.backends import GenRequest, chat_example

        choice = body.get("tool_choice")
        tools = None if choice == "none" else body.get("tools")
        forced = tool_choice_name(choice) or ("required" if choice == "required" else None)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_new_tokens
        request = GenRequest(chat_example(body["messages"], tools), forced)
        prompt, _ = self.generator.prompt(request)
        n_prompt = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if self.max_length and n_prompt >= self.max_length:
            raise ApiError(400, f"the prompt has {n_prompt} tokens; the model's context is {self.max_length}",
                           param="messages", code="context_length_exceeded")
        limit = min(int(limit), self.max_new_tokens, (self.max_length or 1 << 30) - n_prompt)
        with self._lock:
            (gen,) = self.generator.generate([replace(request, max_new_tokens=limit)])
        if gen.error is not None:
            raise ApiError(502, f"the model failed: {gen.error}", type="upstream_error", code="backend_error")
        text, usage = gen.text, gen.usage
        parsed = self.format.parse(text)
        if parsed.calls:
            message = {"role": "assistant", "content": parsed.response,
                       "tool_calls": [wire_call(c) for c in parsed.calls]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": parsed.response if parsed.ok else text}
            finish = "length" if usage.completion_tokens >= limit else "stop"
        return completion(self.model_name, message, finish_reason=finish, usage=usage.to_json(),
                          extra={"cipr_raw": text} if not parsed.ok else None)
