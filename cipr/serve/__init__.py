"""cipr-serve: the canonicalization adapter and the guard as an OpenAI-compatible chat-completions service.

Modules: `protocol` (request models and checks, OpenAI-style errors and replies, streamed chunks),
`limits` (`ServeLimits` and the checks on a raw body), `conversation` (the adapter on chat requests:
canonical names in, executable names out), `backends` (an OpenAI-compatible URL or an in-process
transformers model), `guarding` (the guard over each request's tools), `service` (one request end to
end, without HTTP), `http` (the Starlette application on uvicorn: limits, keys, queue, streaming).
The command is `cipr-serve` (`cipr.cli.serve`).
"""

from cipr.serve.backends import ChatBackend, HFChatBackend, OpenAIChatBackend
from cipr.serve.http import CiprServer, start, stop
from cipr.serve.limits import ServeLimits
from cipr.serve.protocol import ApiError
from cipr.serve.service import ChatService, ServeConfig

__all__ = ["ApiError", "ChatBackend", "ChatService", "CiprServer", "HFChatBackend", "OpenAIChatBackend",
           "ServeConfig", "ServeLimits", "start", "stop"]
