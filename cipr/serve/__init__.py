"""cipr-serve: the canonicalization adapter and the guard as an OpenAI-compatible chat-completions service.

Modules: `protocol` (request checks, OpenAI-style errors and replies), `conversation` (the adapter
on chat requests: canonical names in, executable names out), `backends` (an OpenAI-compatible URL
or an in-process transformers model), `guarding` (the guard over each request's tools), `service`
(one request end to end, without HTTP), `http` (the threading HTTP server). The command is
`cipr-serve` (`cipr.cli.serve`).
"""

from cipr.serve.backends import ChatBackend, HFChatBackend, OpenAIChatBackend
from cipr.serve.http import CiprHTTPServer, start, stop
from cipr.serve.protocol import ApiError
from cipr.serve.service import ChatService, ServeConfig

__all__ = ["ApiError", "ChatBackend", "ChatService", "CiprHTTPServer", "HFChatBackend", "OpenAIChatBackend",
           "ServeConfig", "start", "stop"]
