"""What cipr-serve forwards to: an OpenAI-compatible URL, or a transformers model in the same process.

A backend takes a chat-completions request body (already under the names the model should see)
and returns a `chat.completion` object whose first choice holds the assistant message with native
`tool_calls`. Backends hold no per-request state, so one instance serves concurrent requests. The
request's stop test (the client went away, the server is stopping) is `current_stop()`, set by the
service around its backend calls, so `complete(body)` keeps its one argument.

- `OpenAIChatBackend`: POSTs the body to `<base_url>/chat/completions` (a vLLM server, a hosted
  API; key from the environment variable `api_key_env`). Requests run concurrently on an async client
  in a thread of their own; a stopped request is cancelled, which closes its connection (vLLM then
  aborts the generation). Any failure is a 502 naming the backend without its credentials: no
  connection within `connect_timeout_s`, no reply within `timeout_s` (the read timeout, which bounds a
  whole non-streamed reply: long enough for `max_tokens` on a slow CPU server), any status but 200,
  or a reply that is not a chat completion (validated field by field).
- `HFChatBackend`: renders the conversation with a `cipr.formats` call format (Hermes by default),
  generates greedily through `cipr.runtime.backends.HFBackend` (which also forces `tool_choice` by
  prefilling), and parses the calls back into `tool_calls`. One thread owns the model and decodes up
  to `batch_size` waiting requests together (`_Batcher`): a request that arrives during a batch waits
  for the next one. Each request's stop test ends its row at the next decoding step. With
  `completions_url` the same prompt goes to a served model's text-completions endpoint instead
  (`cipr.runtime.backends.CompletionsBackend`), concurrently.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from cipr.core.errors import DataError
from cipr.serve.protocol import ApiError, completion, plain, redact, strict_json, tool_choice_name
from cipr.tools.interface import Call

log = logging.getLogger(__name__)

MAX_CHARS_PER_TOKEN = 16
"""No tokenizer we serve averages more characters a token: a prompt longer than context x this is
refused before it is tokenized."""

_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("cipr_serve_stop", default=None)


def current_stop() -> Callable[[], bool] | None:
    """The stop test of the request this thread works on (None outside a request)."""
    return _STOP.get()


@contextmanager
def stopping(stop: Callable[[], bool] | None) -> Iterator[None]:
    """Make `stop` the current request's stop test within the block."""
    token = _STOP.set(stop)
    try:
        yield
    finally:
        _STOP.reset(token)


class Cancelled(ApiError):
    """The request was stopped (its client went away, or the server is stopping); nobody reads the reply."""

    def __init__(self) -> None:
        super().__init__(499, "the request was cancelled", type="server_error", code="cancelled")


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


def _wait(fut: Future[Any], stop: Callable[[], bool] | None, on_stop: Callable[[], bool]) -> Any:
    """`fut`'s result, asking `stop` every 50 ms; once it is true and `on_stop()` withdrew the work,
    raise Cancelled (work already running finishes early by itself and is waited for)."""
    while True:
        try:
            return fut.result(timeout=0.05)
        except TimeoutError:
            if stop is not None and stop() and on_stop():
                raise Cancelled() from None


# ----- an OpenAI-compatible upstream ------------------------------------------------------------------


class _Up(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _UpFunction(_Up):
    name: Annotated[StrictStr, Field(min_length=1)]
    arguments: StrictStr | dict[str, Any] = "{}"


class _UpCall(_Up):
    id: StrictStr | None = None
    type: StrictStr | None = None
    function: _UpFunction


class _UpMessage(_Up):
    content: StrictStr | None = None
    tool_calls: list[_UpCall] | None = None


class _UpChoice(_Up):
    message: _UpMessage
    finish_reason: StrictStr | None = None


class _UpUsage(_Up):
    prompt_tokens: Annotated[StrictInt, Field(ge=0)] | None = 0
    completion_tokens: Annotated[StrictInt, Field(ge=0)] | None = 0


class _UpCompletion(_Up):
    choices: Annotated[list[_UpChoice], Field(min_length=1)]
    usage: _UpUsage | None = None


class _UpModel(_Up):
    id: Annotated[StrictStr, Field(min_length=1)]


class _UpModels(_Up):
    data: list[_UpModel]


class _TooLarge(Exception):
    pass


def _where(e: ValidationError) -> str:
    err = e.errors(include_url=False, include_input=False, include_context=False)[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    return f"{loc or 'the reply'} {plain(err['msg'])}"


@dataclass
class OpenAIChatBackend:
    """Forwards to an OpenAI-compatible endpoint (see the module docstring)."""

    base_url: str
    model_name: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    max_connections: int = 64
    max_reply_bytes: int = 16 * 1024 * 1024
    name: str = "openai"
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _client: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.shown_url = redact(self.base_url.rstrip("/"))
        self._key = os.environ.get(self.api_key_env, "")

    def _scrub(self, text: str) -> str:
        text = redact(text)
        if self._key:
            text = text.replace(self._key, "***")
        return "".join(c if c.isprintable() else " " for c in text)

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                import httpx

                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="cipr-serve-upstream", daemon=True).start()
                headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
                url = httpx.URL(self.base_url.rstrip("/") + "/")
                auth = None
                if url.userinfo:  # sent as Basic auth, so the URL httpx logs carries no credentials
                    auth = None if self._key else httpx.BasicAuth(url.username, url.password)
                    url = url.copy_with(username=None, password=None)

                async def client() -> Any:
                    return httpx.AsyncClient(
                        base_url=url, headers=headers, auth=auth,
                        timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                        limits=httpx.Limits(max_connections=self.max_connections), follow_redirects=False)

                self._client = asyncio.run_coroutine_threadsafe(client(), loop).result()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Close the connections and the client's thread (a later request starts them again)."""
        with self._lock:
            loop, client, self._loop, self._client = self._loop, self._client, None, None
        if loop is not None:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)

    async def _send(self, method: str, path: str, payload: Any = None) -> tuple[int, bytes]:
        kwargs = {"json": payload} if payload is not None else {}
        async with self._client.stream(method, path, **kwargs) as r:
            body = bytearray()
            async for part in r.aiter_bytes():
                body += part
                if len(body) > self.max_reply_bytes:
                    raise _TooLarge
            return r.status_code, bytes(body)

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        """The JSON of a 200 reply, or ApiError 502 saying what went wrong (never the credentials)."""
        import httpx

        loop = self._start()
        fut = asyncio.run_coroutine_threadsafe(self._send(method, path, payload), loop)
        where = f"backend {self.shown_url}"
        try:
            status, raw = _wait(fut, current_stop(), fut.cancel)
        except Cancelled:
            raise
        except httpx.ConnectTimeout:
            raise self._error(f"{where} did not accept a connection within {self.connect_timeout_s:g} s",
                              "backend_unavailable") from None
        except (httpx.ConnectError, OSError):
            raise self._error(f"{where} is unreachable (connection refused or no route)",
                              "backend_unavailable") from None
        except httpx.ReadTimeout:
            raise self._error(f"{where} sent no reply within {self.timeout_s:g} s (the read timeout: the "
                              "longest a whole reply may take)", "backend_timeout") from None
        except _TooLarge:
            raise self._error(f"{where} sent a reply over {self.max_reply_bytes} bytes") from None
        except httpx.HTTPError as e:
            raise self._error(f"{where} failed: {type(e).__name__} (connection closed or malformed "
                              "HTTP)", "backend_unavailable") from None
        if status != 200:
            raise self._error(f"{where} answered HTTP {status}{self._detail(raw)}", extra={
                "upstream_status": status})
        try:
            return strict_json(raw)
        except (ValueError, RecursionError):
            raise self._error(f"{where} sent a reply that is not JSON") from None

    def _detail(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
            message = data["error"]["message"] if isinstance(data.get("error"), dict) else data.get("message")
        except (ValueError, RecursionError, AttributeError, KeyError, TypeError):
            message = raw.decode("utf-8", "replace")
        message = self._scrub(str(message or "").strip())[:300]
        return f": {message}" if message else ""

    def _error(self, message: str, code: str = "backend_error",
               extra: Mapping[str, Any] | None = None) -> ApiError:
        return ApiError(502, self._scrub(message), type="upstream_error", code=code, extra=extra)

    def models(self) -> list[str]:
        if self.model_name:
            return [self.model_name]
        data = self._request("GET", "models")
        try:
            return [m.id for m in _UpModels.model_validate(data).data]
        except ValidationError as e:
            raise self._error(f"backend {self.shown_url} listed its models malformed ({_where(e)})") from None

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        payload = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if self.model_name:
            payload["model"] = self.model_name
        data = self._request("POST", "chat/completions", payload)
        try:
            reply = _UpCompletion.model_validate(data)
        except ValidationError as e:
            raise self._error(f"backend {self.shown_url} sent a malformed completion ({_where(e)})") from None
        message = data["choices"][0]["message"]
        for i, call in enumerate(reply.choices[0].message.tool_calls or ()):
            if isinstance(call.function.arguments, dict):
                message["tool_calls"][i]["function"]["arguments"] = json.dumps(call.function.arguments)
        return data


# ----- a model in this process ------------------------------------------------------------------------


class _Batcher:
    """The one thread that runs the in-process model: takes up to `batch_size` waiting requests, checks
    each prompt's tokens against the context (`check(n_prompt) -> limit`, raising ApiError), and decodes
    them together with `HFBackend.generate`. A request stopped while it waits is dropped."""

    def __init__(self, generator: Any, tokenizer: Any, batch_size: int) -> None:
        self.generator, self.tokenizer, self.batch_size = generator, tokenizer, max(1, batch_size)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, request: Any, prompt: str, check: Callable[[int], int]) -> Any:
        fut: Future[Any] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="cipr-serve-model", daemon=True)
                self._thread.start()
        self._queue.put((request, prompt, check, fut))
        return _wait(fut, request.stop, fut.cancel)

    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < self.batch_size:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            live = []
            for request, prompt, check, fut in items:
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    if request.stop is not None and request.stop():
                        raise Cancelled()
                    n_prompt = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
                    live.append((replace(request, max_new_tokens=check(n_prompt)), fut))
                except BaseException as e:  # noqa: BLE001 - the request's thread raises it
                    fut.set_exception(e)
            if not live:
                continue
            try:
                gens = self.generator.generate([r for r, _ in live])
            except BaseException as e:  # noqa: BLE001 - every request of the batch raises it
                for _, fut in live:
                    fut.set_exception(e)
                continue
            for (_, fut), gen in zip(live, gens, strict=True):
                fut.set_result(gen)


class HFChatBackend:
    """A model behind the chat API through a `cipr.runtime.backends` backend (see the module docstring)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, call_format: str = "hermes",
                 model_name: str = "embedded", max_new_tokens: int = 512,
                 completions_url: str | None = None, batch_size: int = 8) -> None:
        from cipr.formats import resolve_format
        from cipr.runtime.backends import CompletionsBackend, HFBackend
        from cipr.runtime.generation import GreedyConfig

        self.format = resolve_format(call_format, tokenizer)
        self.batcher: _Batcher | None = None
        if completions_url is None:
            self.generator: Any = HFBackend(model, tokenizer, self.format,
                                            GreedyConfig(batch_size=max(1, batch_size),
                                                         max_new_tokens=max_new_tokens))
            self.batcher = _Batcher(self.generator, tokenizer, batch_size)
        else:
            self.generator = CompletionsBackend(completions_url, tokenizer, self.format,
                                                model_name=model_name, max_new_tokens=max_new_tokens)
        self.tokenizer = tokenizer
        self.model_name = model_name if completions_url is None else self.generator.model_name
        self.max_new_tokens = max_new_tokens
        self.max_length = getattr(getattr(model, "config", None), "max_position_embeddings", None)

    def models(self) -> list[str]:
        return [self.model_name]

    def _limit(self, wanted: int) -> Callable[[int], int]:
        def check(n_prompt: int) -> int:
            if self.max_length and n_prompt >= self.max_length:
                raise ApiError(400, f"the prompt has {n_prompt} tokens; the model's context is "
                               f"{self.max_length}", param="messages", code="context_length_exceeded")
            return max(1, min(wanted, self.max_new_tokens, (self.max_length or 1 << 30) - n_prompt))
        return check

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from cipr.runtime.backends import GenRequest, chat_example

        choice = body.get("tool_choice")
        tools = None if choice == "none" else body.get("tools")
        forced = tool_choice_name(choice) or ("required" if choice == "required" else None)
        wanted = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None),
                      self.max_new_tokens)
        try:
            request = GenRequest(chat_example(body["messages"], tools), forced, stop=current_stop())
            prompt, _ = self.generator.prompt(request)
        except DataError as e:
            raise ApiError(400, str(e), param="tools", code="invalid_value") from None
        except ValueError as e:  # a forced tool the call format cannot prefill
            raise ApiError(400, f"cannot force this tool_choice with the {self.format.name} call format: "
                           f"{e}", param="tool_choice", code="invalid_value") from None
        if self.max_length and len(prompt) > self.max_length * MAX_CHARS_PER_TOKEN:
            raise ApiError(400, f"the prompt has {len(prompt)} characters, more than the model's context of "
                           f"{self.max_length} tokens can hold", param="messages",
                           code="context_length_exceeded")
        check = self._limit(int(wanted))
        if self.batcher is not None:
            gen = self.batcher.submit(request, prompt, check)
        else:
            (gen,) = self.generator.generate([replace(request, max_new_tokens=check(0))])
        if request.stop is not None and request.stop():
            raise Cancelled()  # the reply was cut short: nobody may read it as the model's turn
        if gen.error is not None:
            log.warning("the model failed: %s", redact(gen.error)[:500])
            kind = gen.error.split(":", 1)[0][:80]
            raise ApiError(502, f"the model failed ({redact(kind)})", type="upstream_error",
                           code="backend_error")
        text, usage = gen.text, gen.usage
        limit = check(usage.prompt_tokens) if self.max_length else check(0)
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
