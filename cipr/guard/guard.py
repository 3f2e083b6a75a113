"""The guard: validate a proposed tool-call turn against the authorized contract, fix what it may, log it.

    guard = Guard(snapshot, backend, policy="repair", budget=512, audit=AuditLog("audit.jsonl"))
    outcome = guard.process(messages, model_reply_text, visible=interface_shown)
    if outcome.calls: execute(outcome.calls)       # every one valid against the snapshot

Policies (one code path, chosen by config, so baselines and repair are comparable):
- `none`: validate only; invalid calls are blocked (`unresolved`), no model call.
- `naive_retry`, `tool_list`: the study's baselines (`cipr.guard.baselines`).
- `repair`: the non-oracle protocol (`cipr.guard.repair`).

Guarantees, whatever the model replies: a returned call names a tool of the snapshot and passes
the validator; a call to a tool outside it (including one listed after the snapshot was taken) is
refused and recorded in the audit record's `security` list; each turn costs at most one model call
per baseline, or per invalid call one candidate retry and one repair, each capped at `budget` new
tokens.

Statuses: `valid` (nothing to do), `repaired` (every call valid after the guard's model calls),
`unresolved` (some call stayed invalid; only the valid calls are returned, the rest never run),
`no_call` (the reply made no call attempt and the config does not require one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from cipr.core.errors import ConfigError
from cipr.guard.audit import AuditLog, AuditRecord
from cipr.guard.baselines import retry_turn
from cipr.guard.contract import ContractSnapshot
from cipr.guard.parse import parse_reply
from cipr.guard.repair import REPAIRED, RESOLVED, UNRESOLVED, VALID, repair_protocol
from cipr.guard.session import GuardSession
from cipr.guard.validator import CallValidator, ValidatorConfig, call_to_json
from cipr.runtime.backends import Backend, Usage
from cipr.tools.interface import Call, Interface, Message, Tool

Policy = Literal["none", "naive_retry", "tool_list", "repair"]
POLICIES: tuple[str, ...] = ("none", "naive_retry", "tool_list", "repair")


@dataclass(frozen=True)
class GuardConfig:
    """Options of the guard.

    - `budget`: max new tokens per guard model call (the study's 512 stops truncated repairs).
    - `candidate_retry`: the missing-name path; off is the study's ablation (unresolved names stay so).
    - `cards`: show the tool card in the repair prompt (the study's card ablation turns it off).
    - `require_call`: treat a reply with no call attempt as a call with a missing name (for tasks
      known to need a call, e.g. BFCL); off lets text answers through untouched.
    """

    policy: Policy = "repair"
    budget: int = 512
    candidate_retry: bool = True
    cards: bool = True
    require_call: bool = False
    validator: ValidatorConfig = field(default_factory=ValidatorConfig)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown guard policy {self.policy!r}; expected one of {', '.join(POLICIES)}")
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"guard budget must be a positive number of tokens, got {self.budget}")


@dataclass(frozen=True)
class GuardOutcome:
    """What the guard decided for one turn: `calls` may be executed, nothing else may."""

    calls: tuple[Call, ...]
    status: str
    record: AuditRecord

    @property
    def final_call(self) -> Call | None:
        return self.calls[0] if self.calls else None

    @property
    def executed(self) -> bool:
        return bool(self.calls)

    @property
    def usage(self) -> Usage:
        return self.record.usage

    @property
    def triggered(self) -> bool:
        return self.record.triggered

    @property
    def refused(self) -> tuple[str, ...]:
        """Names of tools outside the allowed set that the model tried to call, in order."""
        return tuple(e.name for e in self.record.security)


def _chat(messages: Sequence[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [m.to_dict() if isinstance(m, Message) else dict(m) for m in messages]


class Guard:
    """Validate-and-repair for tool calls against a contract snapshot (see the module docstring)."""

    def __init__(self, snapshot: ContractSnapshot, backend: Backend | None = None, *,
                 policy: Policy | None = None, budget: int | None = None, config: GuardConfig | None = None,
                 call_format: Any = None, audit: AuditLog | None = None) -> None:
        config = config or GuardConfig()
        changes = {k: v for k, v in (("policy", policy), ("budget", budget)) if v is not None}
        self.config = replace(config, **changes)
        if self.config.policy != "none" and backend is None:
            raise ValueError(f"guard policy {self.config.policy!r} needs a backend")
        self.snapshot, self.backend, self.call_format = snapshot, backend, call_format
        self.validator = CallValidator(snapshot, self.config.validator)
        self.audit = audit if audit is not None else AuditLog()

    def refreshed(self, listed: Iterable[Tool] | Interface, *, authorize: Iterable[str] = ()) -> Guard:
        """A guard on the refreshed contract (new tools stay unauthorized unless named in `authorize`)."""
        return Guard(self.snapshot.refresh(listed, authorize=authorize), self.backend, config=self.config,
                     call_format=self.call_format, audit=self.audit)

    def _proposal(self, proposed: Any) -> tuple[list[Call], str | None]:
        """(calls, reply text or None). A malformed call attempt becomes a nameless call (`parse`)."""
        if isinstance(proposed, str):
            return list(parse_reply(proposed, self.call_format).calls), proposed
        if isinstance(proposed, Call):
            return [proposed], None
        if hasattr(proposed, "calls") and hasattr(proposed, "ok"):  # a cipr.formats ParseResult
            calls = list(proposed.calls)
            return (calls or ([] if proposed.ok else [Call("", {})])), None
        calls = list(proposed)
        if not all(isinstance(c, Call) for c in calls):
            raise TypeError("proposed must be reply text, a Call, a ParseResult or a sequence of Calls")
        return calls, None

    def process(self, messages: Sequence[Message | Mapping[str, Any]], proposed: Any, *,
                visible: Interface | Iterable[Tool] | None = None, item_id: str | None = None,
                proposal_usage: Usage | None = None) -> GuardOutcome:
        """Guard one turn.

        - `messages`: the prompt the model answered (used as task context and by the baselines).
        - `proposed`: the model's reply text (parsed with the call format, else as JSON), a Call, a
          `ParseResult`, or a sequence of Calls.
        - `visible`: the tools the model was shown (default: the snapshot). Retry candidates are
          the authorized ones among them; the others are recorded as listed-after-snapshot.
        - `proposal_usage`: tokens of the call being guarded, kept in the audit record (overhead base).
        """
        start = time.perf_counter()
        cfg = self.config
        shown = tuple(visible) if visible is not None else self.snapshot.tools
        record = AuditRecord(contract_version=self.snapshot.version, policy=cfg.policy, budget=cfg.budget,
                             item_id=item_id, original_usage=proposal_usage)
        session = GuardSession(self.snapshot, self.validator, self.backend, self.call_format, cfg.budget,
                               record, self.snapshot.visible(shown), frozenset(t.name for t in shown),
                               _chat(messages), [t.to_openai() for t in shown])
        calls, text = self._proposal(proposed)
        record.original_text = text
        record.original_calls = [call_to_json(c) for c in calls]
        if not calls and cfg.require_call:
            calls = [Call("", {})]
            record.decisions.append({"call_index": 0, "note": "no call attempted; a call is required"})
        if not calls:
            return self._finish(record, [], "no_call", start)

        reports = [self.validator.validate(c) for c in calls]
        record.reports = [r.to_json() for r in reports]
        for i, call in enumerate(calls):
            session.note_unauthorized([call], stage="proposal", call_index=i)
        if all(r.valid for r in reports):
            record.decisions += [{"call_index": i, "decision": VALID} for i in range(len(calls))]
            return self._finish(record, calls, "valid", start)

        if cfg.policy in ("naive_retry", "tool_list"):
            shown_text = text if text is not None else json.dumps(record.original_calls, ensure_ascii=False,
                                                                  default=str)
            new_calls, ok = retry_turn(session, cfg.policy, shown_text)
            record.decisions.append({"call_index": None, "decision": REPAIRED if ok else UNRESOLVED,
                                     "via": cfg.policy})
            return self._finish(record, new_calls, "repaired" if ok else "unresolved", start)

        final: list[Call] = []
        unresolved = repaired = False
        for i, (call, report) in enumerate(zip(calls, reports, strict=True)):
            if report.valid:
                final.append(call)
                record.decisions.append({"call_index": i, "decision": VALID})
                continue
            if cfg.policy == "none":
                fixed, decision = None, UNRESOLVED
            else:
                fixed, decision = repair_protocol(session, call, report, i,
                                                  use_candidate_retry=cfg.candidate_retry, cards=cfg.cards)
            record.decisions.append({"call_index": i, "decision": decision,
                                     "final": call_to_json(fixed) if fixed is not None else None})
            if fixed is None:
                unresolved = True
            else:
                repaired = repaired or decision in (REPAIRED, RESOLVED)
                final.append(fixed)
        status = "unresolved" if unresolved else ("repaired" if repaired else "valid")
        return self._finish(record, final, status, start)

    def _finish(self, record: AuditRecord, calls: list[Call], status: str, start: float) -> GuardOutcome:
        for call in calls:  # the one invariant that must hold whatever happened above
            if not self.validator.validate(call).valid:
                raise AssertionError(f"guard would emit an invalid call {call_to_json(call)}")
        record.status = status
        record.final_calls = [call_to_json(c) for c in calls]
        record.latency_s = time.perf_counter() - start
        self.audit.write(record)
        return GuardOutcome(tuple(calls), status, record)
