"""The HTTP layer of cipr-serve: a Starlette application on uvicorn, every error in OpenAI's shape.

Routes (`PREFIX` is `/v1` (or none) for the configured names, `/original/v1` or `/canonical/v1` to
choose): `POST PREFIX/chat/completions`, `GET PREFIX/models`, and `GET /health` (no key needed: for
orchestrators' probes). Everything else is a JSON error `{"error": {"message", "type", "param",
"code"}}`: 404 and 405 (with `Allow`; OPTIONS too, so a browser's cross-origin preflight fails), 415
for a body that is not `application/json` (a browser form or text/plain POST never reaches the
model), 413, 408, 400 naming the field, 401 without the key, 429 with `Retry-After` past the queue,
502 for the backend, 503 past the connection bound, and for malformed HTTP (uvicorn's own 400,
answered by `_protocol`). A bug is a 500 with a reference and no exception text, and one log line
with the exception's type (its traceback at DEBUG on `cipr.serve`).

Per request, cheapest first (`cipr.serve.limits`): key, method and path, content type, declared
length, body bytes within `body_timeout_s`, depth, JSON, sizes, the request model, then the queue:
at most `max_in_flight` requests run (each in a worker thread), `max_waiting` wait, the next one
gets 429. While a request waits or runs, its connection is watched: a client that goes away stops
its generation (`stop` reaches the backend, see `cipr.serve.backends`), and its slot is free once the
backend returns. `stream: true` gets the finished reply as server-sent `chat.completion.chunk`
events (`cipr.serve.protocol.chunks`): the adapter needs the whole turn to translate names back and
to check them against the declared tools, so the events follow the complete turn. Each request
logs one line on `cipr.serve.access`: method, path, status, milliseconds (never the body).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http import HTTPStatus
from typing import Any

from cipr.core.errors import ConfigError
from cipr.serve.backends import Cancelled
from cipr.serve.limits import ServeLimits, check_value, parse_body
from cipr.serve.protocol import ApiError, check_request, chunks, redact
from cipr.serve.service import ChatService

log = logging.getLogger("cipr.serve")
access = logging.getLogger("cipr.serve.access")

PREFIXES = {"": None, "/v1": None, "/original/v1": "original", "/canonical/v1": "canonical"}
OPEN_PATHS = ("/health",)


def render(payload: Any) -> bytes:
    """JSON bytes of a reply (an unpaired surrogate from a backend becomes '?', never an error)."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8", "replace")


def _shown_path(path: str) -> str:
    """A request path for a log line: printable, at most 200 characters."""
    return "".join(c if c.isprintable() and c != " " else "?" for c in path[:200])


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _raw_response(err: ApiError, close: bool = True) -> bytes:
    """A whole HTTP/1.1 response for a connection the ASGI app never saw (or must not see)."""
    body = render(err.to_json())
    head = [f"HTTP/1.1 {err.status} {_phrase(err.status)}", "content-type: application/json",
            f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in err.headers.items())]
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


# ----- the connection level: uvicorn's h11 protocol with JSON errors, a connection bound, header timeout ---


def _protocol(limits: ServeLimits) -> type:
    """uvicorn's h11 protocol with (1) malformed HTTP answered as a JSON 400 (uvicorn sends text),
    (2) at most `max_connections` open connections (a new one past it gets a JSON 503 and is closed),
    (3) a request's line and headers due within `header_timeout_s` of the connection or of the
    previous response (uvicorn has none: a half-sent request was held forever)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class CiprH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_cycle: Any = None
        _partial = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.access_log = False  # ours is `cipr.serve.access`, one line per request
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                err = ApiError(503, f"the server holds {limits.max_connections} connections, its limit; "
                               "retry shortly", type="server_error", code="too_many_connections",
                               headers={"Retry-After": "1"})
                access.info("- - 503 0.0 ms (connection limit)")
                transport.write(_raw_response(err))
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_cycle, self._partial = self.cycle, False
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_came(self) -> None:
            if self._header_timer is not None and self.cycle is not self._header_cycle:
                self._disarm()

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.cycle is not self._header_cycle:
                return
            if self._partial:
                err = ApiError(408, f"the request line and headers did not arrive within "
                               f"{limits.header_timeout_s:g} s", code="request_timeout")
                access.info("- - 408 %.1f ms (headers)", limits.header_timeout_s * 1000)
                self.transport.write(_raw_response(err))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            self._partial = True
            super().data_received(data)
            self._headers_came()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm()
            super().on_response_complete()
            self._headers_came()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            err = ApiError(400, "malformed HTTP request (request line, a header or Content-Length)",
                           code="invalid_http")
            access.info("- - 400 0.0 ms (malformed HTTP)")
            self.transport.write(_raw_response(err))
            self.transport.close()

    return CiprH11Protocol


class _QuietUvicorn(logging.Filter):
    """uvicorn's own log: warnings and errors only, one line each (the traceback only at DEBUG on
    `cipr.serve`); its malformed-request warning is our access line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.getMessage().startswith("Invalid HTTP request"):
            return False
        if record.exc_info and not log.isEnabledFor(logging.DEBUG):
            exc = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage().strip()} ({type(exc).__name__})", None
            record.exc_info, record.exc_text = None, None
        return True


class _Redacting(logging.Filter):
    """Credentials out of the URLs an HTTP client logs (e.g. a completions backend's `user:pass@`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        shown = redact(text)
        if shown != text:
            record.msg, record.args = shown, None
        return True


def _install_log_filters() -> None:
    for name, kind in (("uvicorn.error", _QuietUvicorn), ("httpx", _Redacting), ("httpcore", _Redacting)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


# ----- the application ------------------------------------------------------------------------------------


class _Gone(Exception):
    """The client closed the connection; nobody reads a reply."""


class _Gate:
    """The queue in front of the model: `in_flight` run, `waiting` wait, the next is refused."""

    def __init__(self, in_flight: int, waiting: int) -> None:
        self.in_flight, self.capacity = in_flight, in_flight + waiting
        self.admitted = 0
        self.running = 0
        self.seconds = 1.0  # moving average of a request's run time, for Retry-After
        self.semaphore = asyncio.Semaphore(in_flight)

    def retry_after(self) -> int:
        waves = (self.admitted - self.in_flight + 1) / self.in_flight
        return int(min(60, max(1, math.ceil(self.seconds * max(1.0, waves)))))

    def admit(self) -> None:
        if self.admitted >= self.capacity:
            seconds = self.retry_after()
            raise ApiError(429, f"the server is at capacity ({self.in_flight} requests running, "
                           f"{self.capacity - self.in_flight} waiting); retry in {seconds} s",
                           type="rate_limit_error", code="queue_full", headers={"Retry-After": str(seconds)})
        self.admitted += 1


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


async def _until_disconnect(receive: Callable[[], Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _ChatEndpoint:
    """`ChatApp.chat` for one names setting, as an ASGI app (Starlette hands it scope, receive, send)."""

    def __init__(self, app: ChatApp, names: str | None) -> None:
        self.app, self.names = app, names

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app.chat(self.names, scope, receive, send)


class ChatApp:
    """The ASGI application: auth, access log and the last-resort 500 around a Starlette router."""

    def __init__(self, service: ChatService, limits: ServeLimits, api_key: str | None = None) -> None:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        self.service, self.limits, self.api_key = service, limits, api_key
        self.executor = ThreadPoolExecutor(max_workers=limits.max_in_flight, thread_name_prefix="cipr-serve")
        self.closing = threading.Event()
        self.gate: _Gate | None = None
        routes = [Route("/health", self.health, methods=["GET"])]
        for prefix, names in PREFIXES.items():
            for slash in ("", "/"):
                routes += [Route(f"{prefix}/models{slash}", self.models, methods=["GET"]),
                           Route(f"{prefix}/chat/completions{slash}", _ChatEndpoint(self, names),
                                 methods=["POST"])]
        self.router = Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_error, Exception: self._bug_response})

    # -- the edge: every request passes here ----------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if self.gate is None:
            self.gate = _Gate(self.limits.max_in_flight, self.limits.max_waiting)
        start, state = time.perf_counter(), {"status": 499}

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            await send(message)

        try:
            denied = self._denied(scope)
            if denied is not None:
                await self._send_error(denied, sending)
            else:
                await self.router(scope, receive, sending)
        except Exception as e:  # noqa: BLE001 - a bug must not reach uvicorn (its log has the traceback)
            err = self._bug(scope, e) if not getattr(e, "_cipr_logged", False) else None
            if err is not None and state["status"] == 499:
                with contextlib.suppress(Exception):
                    await self._send_error(err, sending)
        finally:
            access.info("%s %s %d %.1f ms", scope["method"], _shown_path(scope["path"]), state["status"],
                        (time.perf_counter() - start) * 1000)

    def _denied(self, scope: dict[str, Any]) -> ApiError | None:
        if self.api_key is None or scope["path"] in OPEN_PATHS:
            return None
        scheme, _, token = (_header(scope, b"authorization") or "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                                                              self.api_key.encode("utf-8")):
            return None
        return ApiError(401, "a valid key is required: send 'Authorization: Bearer <key>'",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def _bug(self, scope: dict[str, Any], e: BaseException) -> ApiError:
        ref = uuid.uuid4().hex[:12]
        log.error("%s %s: internal error %s (%s)", scope.get("method"), _shown_path(scope.get("path", "")),
                  ref, type(e).__name__)
        log.debug("internal error %s", ref, exc_info=e)
        return ApiError(500, f"internal error (reference {ref}); the server log has its type",
                        type="server_error", code="internal_error")

    async def _send_error(self, err: ApiError, send: Any) -> None:
        body = render(err.to_json())
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in err.headers.items()]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _response(self, err: ApiError, close: bool = False) -> Any:
        from starlette.responses import Response

        headers = {**err.headers, **({"Connection": "close"} if close else {})}
        if err.status >= 500 and err.code != "internal_error":  # a bug was logged where it was caught
            log.warning("%d %s: %s", err.status, err.code, redact(err.message)[:300])
        return Response(render(err.to_json()), status_code=err.status, headers=headers,
                        media_type="application/json")

    async def _http_error(self, request: Any, exc: Any) -> Any:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        what = f"{request.method} {_shown_path(request.url.path)}"
        message = {404: f"no such endpoint: {what}",
                   405: f"{what}: method not allowed (allowed: {(exc.headers or {}).get('Allow', '')})"}
        return self._response(ApiError(exc.status_code, message.get(exc.status_code, exc.detail), code=code,
                                       headers=exc.headers))

    async def _bug_response(self, request: Any, exc: Exception) -> Any:
        """Starlette's last resort (it re-raises after sending this): logged once, here."""
        err = self._bug(request.scope, exc)
        with contextlib.suppress(AttributeError):
            exc._cipr_logged = True  # type: ignore[attr-defined]
        return self._response(err)

    # -- routes -----------------------------------------------------------------------------------------

    async def health(self, request: Any) -> Any:
        from starlette.responses import Response

        gate = self.gate
        payload = {"status": "stopping" if self.closing.is_set() else "ok",
                   "backend": self.service.backend.name,
                   "running": gate.running if gate else 0,
                   "waiting": max(0, gate.admitted - gate.running) if gate else 0,
                   "capacity": gate.capacity if gate else 0}
        return Response(render(payload), status_code=503 if self.closing.is_set() else 200,
                        media_type="application/json")

    async def models(self, request: Any) -> Any:
        from starlette.responses import Response

        try:
            payload = await asyncio.get_running_loop().run_in_executor(None, self.service.models)
        except ApiError as e:
            return self._response(e)
        except Exception as e:  # noqa: BLE001 - a bug in a backend's models()
            return self._response(self._bug(request.scope, e))
        return Response(render(payload), media_type="application/json")

    async def chat(self, names: str | None, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """POST chat/completions (an ASGI endpoint: it reads the body and watches the connection)."""
        from starlette.responses import Response

        try:
            if self.closing.is_set():
                raise ApiError(503, "the server is stopping", type="server_error", code="stopping",
                               headers={"Retry-After": "5"})
            body, request = await self._read(scope, receive)
            assert self.gate is not None
            self.gate.admit()
        except ApiError as e:
            await self._response(e, close=e.status in (408, 413, 415))(scope, receive, send)
            return
        except _Gone:
            return
        try:
            reply = await self._run(partial(self.service.chat, body, names), scope, receive)
        except _Gone:
            return
        except ApiError as e:
            await self._response(e)(scope, receive, send)
            return
        if request.stream:
            include = bool(request.stream_options and request.stream_options.include_usage)
            await self._stream(reply, include)(scope, receive, send)
        else:
            await Response(render(reply), media_type="application/json")(scope, receive, send)

    def _parse(self, raw: bytes) -> tuple[Any, Any]:
        body = parse_body(raw, self.limits)
        check_value(body, self.limits)
        return body, check_request(body)

    async def _read(self, scope: dict[str, Any], receive: Any) -> tuple[Any, Any]:
        """The body and its validated `ChatRequest`, within the limits (see the module docstring); a body
        over 64 KiB is parsed in a thread, so the event loop keeps serving other connections."""
        limits = self.limits
        ctype = (_header(scope, b"content-type") or "").lower()
        media, _, params = ctype.partition(";")
        charset = params.strip().removeprefix("charset=").strip('" ') if params.strip() else "utf-8"
        if media.strip() != "application/json" or charset not in ("utf-8", "utf8"):
            raise ApiError(415, f"the body must be application/json (UTF-8); got {ctype[:80] or 'no type'!r}",
                           param="Content-Type", code="unsupported_media_type")
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise ApiError(413, f"the body has {declared} bytes; at most {limits.max_body_bytes} are "
                           "accepted", code="request_too_large")

        async def read() -> bytes:
            raw = bytearray()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Gone
                raw += message.get("body", b"")
                if len(raw) > limits.max_body_bytes:
                    raise ApiError(413, f"the body exceeds {limits.max_body_bytes} bytes",
                                   code="request_too_large")
                if not message.get("more_body"):
                    return bytes(raw)

        try:
            raw = await asyncio.wait_for(read(), limits.body_timeout_s)
        except TimeoutError:
            raise ApiError(408, f"the body did not arrive within {limits.body_timeout_s:g} s",
                           code="request_timeout") from None
        if len(raw) <= 65536:
            return self._parse(raw)
        return await asyncio.get_running_loop().run_in_executor(None, self._parse, raw)

    async def _run(self, work: Callable[..., Any], scope: dict[str, Any], receive: Any) -> Any:
        """`work(stop=...)` in a worker thread once the queue lets it run; raises _Gone (after the work
        has stopped) when the client goes away first."""
        gate = self.gate
        assert gate is not None
        cancel = threading.Event()

        def stop() -> bool:
            return cancel.is_set() or self.closing.is_set()

        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            acquire = asyncio.ensure_future(gate.semaphore.acquire())
            await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not acquire.done() or acquire.cancelled():
                acquire.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acquire
                if not acquire.cancelled():
                    gate.semaphore.release()
                raise _Gone
            gate.running += 1
            start = time.perf_counter()
            try:
                fut = asyncio.get_running_loop().run_in_executor(self.executor, partial(work, stop=stop))
                await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not fut.done():
                    cancel.set()
                    with contextlib.suppress(Exception):
                        await fut  # the backend sees stop() at its next step; the slot is free after
                    raise _Gone
                try:
                    return fut.result()
                except Cancelled:
                    if gone.done():
                        raise _Gone from None
                    raise ApiError(503, "the server is stopping", type="server_error", code="stopping",
                                   headers={"Retry-After": "5"}) from None
                except ApiError:
                    raise
                except Exception as e:  # noqa: BLE001 - a bug in the service or a backend
                    raise self._bug(scope, e) from None
            finally:
                gate.running -= 1
                gate.seconds = 0.8 * gate.seconds + 0.2 * (time.perf_counter() - start)
                gate.semaphore.release()
        finally:
            gone.cancel()
            gate.admitted -= 1

    def _stream(self, reply: dict[str, Any], include_usage: bool) -> Any:
        from starlette.responses import StreamingResponse

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks(reply, include_usage):
                yield b"data: " + render(chunk) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ----- start and stop -------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to serve other machines without a key (ConfigError, one line)."""
    if not api_key and not is_loopback(host):
        raise ConfigError(f"host={host} serves other machines, and no key is set: set CIPR_SERVE_API_KEY "
                          "(or api_key=) so clients must send 'Authorization: Bearer <key>', or bind "
                          "host=127.0.0.1")


class CiprServer:
    """A running cipr-serve: `url` (http://host:port), `server_address`, the app and uvicorn's server."""

    def __init__(self, app: ChatApp, uvicorn_server: Any, sock: socket.socket) -> None:
        self.app, self.uvicorn, self.socket = app, uvicorn_server, sock
        self.server_address = sock.getsockname()[:2]
        self.service = app.service

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def start(service: ChatService, host: str = "127.0.0.1", port: int = 0, *, limits: ServeLimits | None = None,
          api_key: str | None = None) -> tuple[CiprServer, threading.Thread]:
    """A server on (host, port) (0: a free port) serving in a background thread; stop it with `stop`.
    `api_key`: clients must send it as a Bearer token (no key: loopback only, see `check_bind`)."""
    import uvicorn

    limits = limits or ServeLimits()
    limits.check()
    check_bind(host, api_key)
    _install_log_filters()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY on
    # accepted sockets only when the protocol is explicit: without it each reply waits ~40 ms (Nagle)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    app = ChatApp(service, limits, api_key)
    config = uvicorn.Config(app, http=_protocol(limits), lifespan="off", log_config=None, access_log=False,
                            server_header=False, proxy_headers=False, loop="asyncio",
                            timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="cipr-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        sock.close()
        raise RuntimeError("cipr-serve did not start within 30 s")
    return CiprServer(app, server, sock), thread


def stop(server: CiprServer, thread: threading.Thread, timeout_s: float = 15.0) -> None:
    """Stop accepting, stop running generations (their clients get no reply), wait for the thread."""
    server.app.closing.set()
    server.uvicorn.should_exit = True
    thread.join(timeout_s)
    server.app.executor.shutdown(wait=False, cancel_futures=True)
    server.socket.close()
    close = getattr(server.service.backend, "close", None)
    if callable(close):
        close()
