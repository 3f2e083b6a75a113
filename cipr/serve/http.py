"""The HTTP layer of cipr-serve: the standard library's threading server, one thread per request.

Routes (`PREFIX` is `/v1` for the configured names, `/original/v1` or `/canonical/v1` to choose):
`GET PREFIX/models`, `POST PREFIX/chat/completions`. Anything else is a 404, a body that is not
JSON a 400, a body over `MAX_BODY_BYTES` a 413, a bug a 500; each with an OpenAI-style error object.
No streaming (a `stream=true` request is refused with 400, see `cipr.serve.protocol`).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cipr.serve.protocol import ApiError
from cipr.serve.service import NAMES, ChatService

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024


def route(path: str) -> tuple[str | None, str]:
    """(names chosen by the path or None, endpoint after the prefix) for a request path."""
    path = path.split("?", 1)[0].rstrip("/")
    for names in NAMES:
        if path.startswith(f"/{names}/v1/"):
            return names, path[len(f"/{names}/v1"):]
    if path.startswith("/v1/"):
        return None, path[len("/v1"):]
    return None, path


class _Handler(BaseHTTPRequestHandler):
    server: CiprHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "cipr-serve"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: ApiError) -> None:
        self._send(err.status, err.to_json())

    def do_GET(self) -> None:
        _, endpoint = route(self.path)
        if endpoint == "/models":
            try:
                self._send(200, self.server.service.models())
            except ApiError as e:
                self._error(e)
            return
        self._error(ApiError(404, f"no such endpoint: GET {self.path}", code="not_found"))

    def do_POST(self) -> None:
        names, endpoint = route(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(ApiError(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}",
                                 code="too_large"))
            self.close_connection = True
            return
        raw = self.rfile.read(length) if length else b""
        if endpoint != "/chat/completions":
            self._error(ApiError(404, f"no such endpoint: POST {self.path}", code="not_found"))
            return
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            self._error(ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json"))
            return
        try:
            self._send(200, self.server.service.chat(body, names))
        except ApiError as e:
            self._error(e)
        except Exception as e:  # noqa: BLE001 - a bug must not kill the server; the client gets a 500
            log.exception("request failed")
            self._error(ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error",
                                 code="internal_error"))


class CiprHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server holding the ChatService; request threads are daemons."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, service: ChatService, host: str = "127.0.0.1", port: int = 0) -> None:
        self.service = service
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def start(service: ChatService, host: str = "127.0.0.1",
          port: int = 0) -> tuple[CiprHTTPServer, threading.Thread]:
    """A server on (host, port) (0: a free port) serving in a background thread; stop it with `stop`."""
    server = CiprHTTPServer(service, host, port)
    thread = threading.Thread(target=server.serve_forever, name="cipr-serve", daemon=True)
    thread.start()
    return server, thread


def stop(server: CiprHTTPServer, thread: threading.Thread, timeout_s: float = 10.0) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout_s)
