"""The guard's audit trail: one JSON line per processed turn.

Each record keeps what the guide (docs/references.md) says to preserve: the contract version, the
original call, the validator report, every retry and repair (prompt kind, reply, parsed call, new
report, tokens, latency), refused calls outside the contract, the final decision and the guard's
tokens and added latency. Plain JSON; `AuditLog` appends them to a file and keeps them in memory.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cipr.core.io import read_jsonl
from cipr.runtime.backends import Usage


@dataclass
class Step:
    """One model call the guard made: `kind` is candidate_retry, repair, naive_retry or tool_list;
    `prompt` the messages sent (the tools offered are in the report's contract version); `error` the
    backend's failure, if it raised (the step then has no reply and the call stays unresolved)."""

    kind: str
    call_index: int | None
    tool_choice: str | None
    prompt: list[dict[str, Any]]
    reply: str
    parsed: list[dict[str, Any]]
    report: dict[str, Any] | None
    usage: Usage
    latency_s: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "call_index": self.call_index, "tool_choice": self.tool_choice,
                "prompt": self.prompt, "reply": self.reply, "parsed": self.parsed, "report": self.report,
                "usage": self.usage.to_json(), "latency_s": round(self.latency_s, 6), "error": self.error}


@dataclass
class SecurityEvent:
    """A proposed call to a tool outside the authorized candidates, refused.

    `reason`: `not_in_contract` (the name is not in the snapshot), `not_a_candidate` (authorized
    but not offered at this step), `other_tool_in_repair` (a repair for one tool named another).
    `listed_after_snapshot`: the name is on the tool list the model was shown (or pending after a
    refresh) but not in the snapshot, i.e. a tool that appeared after it, possibly malicious.
    """

    stage: str
    call_index: int | None
    name: str
    reason: str
    listed_after_snapshot: bool

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "call_index": self.call_index, "name": self.name, "reason": self.reason,
                "listed_after_snapshot": self.listed_after_snapshot}


@dataclass
class AuditRecord:
    """Everything the guard did for one turn."""

    contract_version: str
    policy: str
    budget: int
    item_id: str | None = None
    original_text: str | None = None
    original_calls: list[dict[str, Any]] = field(default_factory=list)
    original_usage: Usage | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    security: list[SecurityEvent] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    status: str = ""
    final_calls: list[dict[str, Any]] = field(default_factory=list)
    latency_s: float = 0.0
    time: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="milliseconds"))

    @property
    def usage(self) -> Usage:
        """Tokens the guard spent (all its model calls together)."""
        total = Usage()
        for s in self.steps:
            total = total + s.usage
        return total

    @property
    def triggered(self) -> bool:
        """Whether the guard called the model (the repair trigger)."""
        return bool(self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time, "item_id": self.item_id, "contract_version": self.contract_version,
            "policy": self.policy, "budget": self.budget,
            "original": {"text": self.original_text, "calls": self.original_calls,
                         "usage": self.original_usage.to_json() if self.original_usage else None},
            "reports": self.reports, "steps": [s.to_json() for s in self.steps],
            "security": [e.to_json() for e in self.security], "decisions": self.decisions,
            "final": {"status": self.status, "calls": self.final_calls, "executed": bool(self.final_calls)},
            "tokens": self.usage.to_json(), "latency_s": round(self.latency_s, 6),
        }


class AuditLog:
    """Appends records as JSON lines to `path` (if given) and keeps them in `records`."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.records: list[AuditRecord] = []
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: AuditRecord) -> None:
        line = json.dumps(record.to_json(), ensure_ascii=False, default=str)
        with self._lock:
            self.records.append(record)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")


def read_audit(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of an audit file, in order."""
    return read_jsonl(path)
