"""The per-turn state the guard's policies share: ask the model once, parse, validate, record.

Every model call a policy makes goes through `GuardSession.ask`, which times it, parses the reply,
validates the first call and appends a `Step` to the audit record; every proposed name goes
through `GuardSession.authorize`, which refuses (and records) names outside the allowed set.
Policies therefore cannot forget the audit trail or the authorization check.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cipr.guard.audit import AuditRecord, SecurityEvent, Step
from cipr.guard.backend import ask
from cipr.guard.contract import ContractSnapshot
from cipr.guard.parse import ParsedReply, parse_reply
from cipr.guard.validator import CallValidator, ValidationReport, call_to_json
from cipr.runtime.backends import Backend, Usage
from cipr.tools.interface import Call, Message, Tool


@dataclass
class GuardSession:
    """What one `Guard.process` call works with.

    - `candidates`: the visible authorized tools (snapshot declarations of the tools shown).
    - `listed`: every name the model was shown or a refresh left pending (to flag tools that
      appeared after the snapshot).
    - `messages`: the original prompt (chat dicts) and `tools` what it showed, for the baselines.
    """

    snapshot: ContractSnapshot
    validator: CallValidator
    backend: Backend | None
    call_format: Any
    budget: int
    record: AuditRecord
    candidates: tuple[Tool, ...]
    listed: frozenset[str]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]

    def ask(self, kind: str, messages: Sequence[Mapping[str, Any]], *,
            tools: Sequence[Mapping[str, Any]] | None, tool_choice: str | None,
            call_index: int | None) -> tuple[ParsedReply, ValidationReport | None]:
        """One model call: generate, parse, validate the first parsed call, record the step. A backend
        that raises does not end the turn: the step records the error and the call stays unresolved."""
        if self.backend is None:
            raise ValueError(f"policy {self.record.policy!r} needs a backend to call the model")
        if tool_choice is not None and not self.backend.supports_forced_tool_choice:
            tool_choice = None
        start = time.perf_counter()
        error = None
        try:
            text, usage = ask(self.backend, messages, tools=tools, tool_choice=tool_choice,
                              max_tokens=self.budget)
        except Exception as e:  # noqa: BLE001 - a failed model call is recorded and leaves the call unresolved
            text, usage, error = "", Usage(), f"{type(e).__name__}: {e}"
        latency = time.perf_counter() - start
        parsed = parse_reply(text, self.call_format) if error is None else ParsedReply((), False, error)
        self.note_unauthorized(parsed.calls, stage=kind, call_index=call_index)
        report = self.validator.validate(parsed.calls[0]) if parsed.calls else None
        prompt = [m.to_dict() if isinstance(m, Message) else dict(m) for m in messages]
        self.record.steps.append(Step(kind, call_index, tool_choice, prompt, text,
                                      [call_to_json(c) for c in parsed.calls],
                                      report.to_json() if report else None, usage, latency, error))
        return parsed, report

    def note_unauthorized(self, calls: Sequence[Call], *, stage: str, call_index: int | None) -> None:
        """Record every call naming a tool outside the snapshot (each attempt once, wherever it came from)."""
        for call in calls:
            if call.name and call.name not in self.snapshot:
                after = call.name in self.listed or call.name in self.snapshot.pending
                self.record.security.append(SecurityEvent(stage, call_index, call.name, "not_in_contract",
                                                          after))

    def authorize(self, call: Call, allowed: Sequence[str], *, stage: str, call_index: int | None,
                  reason: str = "not_a_candidate") -> bool:
        """Whether `call` names one of `allowed`; a refusal of an authorized tool is recorded with `reason`
        (names outside the snapshot were recorded by `ask`; a nameless call is the validator's)."""
        if not call.name or call.name in allowed:
            return True
        if call.name in self.snapshot:
            self.record.security.append(SecurityEvent(stage, call_index, call.name, reason, False))
        return False
