"""One chat-completions request through the adapter and the guard, independent of HTTP.

    service = ChatService(backend, ServeConfig(names="canonical", guard="repair", audit="audit.jsonl"))
    reply = service.chat(request_body, stop=client_gone)   # raises ApiError with the client's status

Steps: check the request (400 naming the field) → under `names=canonical`, rename tools and
conversation (`cipr.serve.conversation`); under `names=original` forward the body unchanged →
backend → guard (unless `guard=off`) → translate the calls back → a `chat.completion` whose extra
field `cipr` says which names the model saw and what the guard did.

A call naming a tool the request does not declare (an unknown canonical id, or under original names
an unknown name) is an error the client sees: HTTP 502 with an OpenAI-style error of type
`upstream_error`, code `undeclared_tool`, the undeclared names in `undeclared` and the model's
message in `model_message`. Why an error status and not a 200 with a text-only message: the request
was valid, the model behind the service produced a turn the adapter refuses to guess a meaning for,
which is what a gateway's 502 says; a 200 would let a multi-turn client carry on as if the agent had
chosen to answer in text, and a benchmark would count a silent non-call instead of the failure.
Every OpenAI client raises on it. Both names settings apply the same rule, so the two arms of a
comparison fail alike. With the guard on, invalid calls are repaired or blocked first; a turn whose
every call the guard blocks is the same kind of error (code `guard_blocked`), and a turn where only
some are blocked returns the others with the blocked ones listed in `cipr.guard`.

`stop` (a callable, true once nobody waits for the reply) is the current stop test of every backend
call the request makes, the guard's included (`cipr.serve.backends.stopping`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.guard import AuditLog
from cipr.serve.backends import ChatBackend, stopping
from cipr.serve.conversation import canonical_request, request_interface, translate_reply, undeclared_names
from cipr.serve.guarding import GUARD_CHOICES, BoundedAuditLog, guard_info, guard_turn
from cipr.serve.protocol import ApiError, check_request, completion, models_list
from cipr.tools.canonical import RewriteText

NAMES = ("original", "canonical")


@dataclass(frozen=True)
class ServeConfig:
    """How requests are served.

    - `names`: the default tool names the model sees (`canonical` ids or the client's `original`
      names); a request to `/original/v1/...` or `/canonical/v1/...` chooses per request.
    - `guard`: off | none | naive_retry | tool_list | repair (see `cipr.serve.guarding`);
      `guard_budget` caps the new tokens of each guard model call; `audit` is the audit log file.
    - `rewrite_text`: how tool names in message text are rewritten (`cipr.tools.canonical.rewrite_text`).
    """

    names: str = "canonical"
    guard: str = "off"
    guard_budget: int = 512
    audit: str | None = None
    rewrite_text: RewriteText = "identifiers"

    def __post_init__(self) -> None:
        if self.names not in NAMES:
            raise ConfigError(f"names={self.names!r}: expected original or canonical")
        if self.guard not in GUARD_CHOICES:
            raise ConfigError(f"guard={self.guard!r}: expected one of {', '.join(GUARD_CHOICES)}")
        if self.rewrite_text not in ("identifiers", "all", "none"):
            raise ConfigError(f"rewrite_text={self.rewrite_text!r}: expected identifiers, all or none")
        if self.guard_budget < 1:
            raise ConfigError(f"guard_budget={self.guard_budget}: must be a positive number of tokens")


class ChatService:
    """The adapter and the guard in front of a chat backend (see the module docstring)."""

    def __init__(self, backend: ChatBackend, config: ServeConfig | None = None,
                 audit: AuditLog | None = None) -> None:
        self.backend, self.config = backend, config or ServeConfig()
        self.audit = audit if audit is not None else BoundedAuditLog(self.config.audit)

    def models(self) -> dict[str, Any]:
        return models_list(self.backend.models())

    def chat(self, body: Any, names: str | None = None,
             stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """The reply to one request under `names` (default: the configured names); raises ApiError."""
        check_request(body)
        with stopping(stop):
            return self._chat(body, names)

    def _chat(self, body: Any, names: str | None) -> dict[str, Any]:
        names = names or self.config.names
        rewrite = self.config.rewrite_text
        try:
            if names == "canonical":
                shown, nmap = canonical_request(body, rewrite)
                declared = set(nmap.backward)
            else:
                shown, nmap = dict(body), None
                declared = set(request_interface(body).names)
        except DataError as e:
            raise ApiError(400, str(e), param=e.field and "tools", code="invalid_value") from e
        data = self.backend.complete(shown)
        message = dict(data["choices"][0]["message"])
        message["role"] = "assistant"
        info: dict[str, Any] = {"names": names, "backend": self.backend.name}
        if self.config.guard != "off" and message.get("tool_calls"):
            attempted = len(message["tool_calls"])
            try:
                message, outcome = guard_turn(self.config.guard, shown, message, self.backend,
                                              audit=self.audit, budget=self.config.guard_budget,
                                              item_id=data.get("id"))
            except DataError as e:
                raise ApiError(400, f"the guard cannot read the request's tools: {e}", param="tools") from e
            info["guard"] = guard_info(outcome, self.config.guard)
            if attempted and not outcome.calls:
                raise ApiError(502, f"the guard ({self.config.guard}) blocked every call of the model's turn "
                               f"(status {outcome.status}; refused tools: "
                               f"{', '.join(outcome.refused) or 'none'})",
                               type="upstream_error", code="guard_blocked", extra={"guard": info["guard"]})
        undeclared = undeclared_names(message, declared)
        if undeclared:
            raise ApiError(502, f"the model called {', '.join(map(repr, undeclared))}, which the request's "
                           f"tools do not declare{' (canonical ids)' if nmap else ''}; the call is not "
                           "executed", type="upstream_error", code="undeclared_tool",
                           extra={"undeclared": undeclared, "model_message": message, "names": names})
        if nmap is not None:
            message = translate_reply(message, nmap, rewrite)
        finish = ("tool_calls" if message.get("tool_calls")
                  else data["choices"][0].get("finish_reason") or "stop")
        if finish == "tool_calls" and not message.get("tool_calls"):
            finish = "stop"
        return completion(body["model"], message, finish_reason=finish, usage=_usage(data.get("usage")),
                          extra={"cipr": info})


def _usage(usage: Mapping[str, Any] | None) -> dict[str, int]:
    u = dict(usage or {})
    p, c = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": int(u.get("total_tokens") or p + c)}
