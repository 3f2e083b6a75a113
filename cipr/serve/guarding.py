"""The guard on served tool calls: `cipr.guard.Guard` over the tools of each request, with its audit log.

The guard checks the calls in the namespace the model sees (canonical ids under the adapter, the
client's names otherwise), against a contract snapshot of the request's tools: its repair and retry
prompts then go to the same model with the same tools, and a call it lets through always translates
back. Policies are the guard's own (`none` validates and blocks only; `naive_retry`, `tool_list`,
`repair`); `off` skips the guard. One Guard is built per request (no state shared between requests
except the audit log, which is thread-safe). A server runs for days: its audit log
(`BoundedAuditLog`) appends each record to its file and keeps only the last `window` in memory.

`ChatGuardBackend` lets the guard call the served backend: its chat-completions reply is written
as text the guard's parser reads (`<tool_call>` blocks of `{"name", "arguments"}` JSON after the
message content); a forced `tool_choice` goes through as OpenAI's function object.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cipr.guard import AuditLog, ContractSnapshot, Guard, GuardOutcome
from cipr.runtime.backends import Generation, GenRequest, Usage
from cipr.serve.backends import ChatBackend, wire_call
from cipr.serve.conversation import _arguments
from cipr.tools.interface import Call

GUARD_CHOICES = ("off", "none", "naive_retry", "tool_list", "repair")


class BoundedAuditLog(AuditLog):
    """An AuditLog that streams records to its file and keeps the last `window` of them in `records`."""

    def __init__(self, path: str | os.PathLike[str] | None = None, window: int = 64) -> None:
        super().__init__(path)
        self.records = deque(maxlen=window)  # type: ignore[assignment]


def reply_text(message: Mapping[str, Any]) -> str:
    """An assistant message as text: its content, then one `<tool_call>` JSON block per call."""
    parts = [message.get("content") or ""]
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function", {})
        args = _arguments(fn.get("arguments"))
        call = {"name": fn.get("name", ""), "arguments": args if args is not None else fn.get("arguments")}
        parts.append("<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(p for p in parts if p)


@dataclass
class ChatGuardBackend:
    """A `cipr.runtime.backends.Backend` over a chat backend; `base` holds the request's other fields
    (model, ...)."""

    backend: ChatBackend
    base: Mapping[str, Any]
    supports_forced_tool_choice: bool = True
    name: str = "chat"

    def _one(self, request: GenRequest) -> Generation:
        ex = request.example
        chat = ex.meta.get("chat") or [m.to_dict() for m in ex.messages]
        body: dict[str, Any] = {**self.base, "messages": [dict(m) for m in chat],
                                "max_tokens": request.max_new_tokens or 512}
        body.pop("max_completion_tokens", None)
        if len(ex.interface):
            body["tools"] = ex.interface.to_openai()
        choice = request.tool_choice
        if choice in ("auto", "none", "required"):
            body["tool_choice"] = choice
        elif choice:
            body["tool_choice"] = {"type": "function", "function": {"name": choice}}
        data = self.backend.complete(body)
        usage = data.get("usage") or {}
        return Generation(reply_text(data["choices"][0]["message"]),
                          usage=Usage(int(usage.get("prompt_tokens") or 0),
                                      int(usage.get("completion_tokens") or 0)))

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        return [self._one(r) for r in requests]


def proposed_calls(message: Mapping[str, Any]) -> list[Call]:
    """The message's tool calls as Calls (arguments that are not a JSON object are kept as they are)."""
    calls = []
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function", {})
        args = _arguments(fn.get("arguments"))
        calls.append(Call(fn.get("name", ""), args if args is not None else fn.get("arguments")))
    return calls


def guard_turn(policy: str, body: Mapping[str, Any], message: Mapping[str, Any], backend: ChatBackend, *,
               audit: AuditLog, budget: int,
               item_id: str | None = None) -> tuple[dict[str, Any], GuardOutcome]:
    """Guard one assistant turn of a request `body` (in the model's namespace): the message with only
    the calls the guard lets through, and the guard's outcome."""
    snapshot = ContractSnapshot.from_openai(body.get("tools") or [], where="<request tools>")
    base = {k: v for k, v in body.items() if k not in ("messages", "tools", "tool_choice")}
    guard = Guard(snapshot, ChatGuardBackend(backend, base) if policy != "none" else None, policy=policy,
                  budget=budget, audit=audit)
    calls = proposed_calls(message)
    outcome = guard.process(list(body["messages"]), calls, item_id=item_id)
    ids = {c.key(): tc.get("id") for c, tc in zip(calls, message.get("tool_calls") or (), strict=True)}
    out = dict(message)
    out["tool_calls"] = [wire_call(c, ids.get(c.key())) for c in outcome.calls] or None
    if out["tool_calls"] is None:
        out.pop("tool_calls")
    return out, outcome


def guard_info(outcome: GuardOutcome, policy: str) -> dict[str, Any]:
    """What the client is told about the guard's decision (the full record is in the audit log)."""
    rec = outcome.record
    return {"policy": policy, "status": outcome.status, "contract_version": rec.contract_version,
            "refused": list(outcome.refused), "decisions": rec.decisions,
            "original_calls": rec.original_calls, "final_calls": rec.final_calls,
            "tokens": rec.usage.to_json()}
