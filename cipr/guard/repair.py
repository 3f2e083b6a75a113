"""The non-oracle repair protocol of the drift study (SchemaShield-Lite), for one invalid call.

- The call names an authorized tool with invalid arguments: ONE constrained repair for that tool
  (task context, its card, the invalid call, the report), the tool choice forced where the backend
  can and a JSON call asked for either way. The reply may not name another tool.
- The call has no name, or names a tool outside the contract: ONE candidate-set retry over the
  visible authorized tools only (their cards, the invalid call, the report), then, if the chosen
  tool's arguments are still invalid, the constrained repair for it. A reply naming a tool outside
  the candidates is refused and recorded; it is never retried into some other tool.
- Every reply is validated again; what is still invalid ends `unresolved` and is never executed.

The expected tool is never an input (non-oracle): only the validator's report and the visible
contract guide the repair. Choices the guide and study (docs/references.md) leave open:
- Task context is the conversation without system messages: the system prompt is where the
  (drifted) tool list was rendered, and the card replaces it.
- A repair reply without a name is read as a call to the tool under repair (the prompt and the
  forced choice both fixed that tool); one naming any other tool is refused.
- A candidate retry whose reply is already valid is final: no repair call is spent on it.
- Several calls in one reply: the first is used (each prompt asks for exactly one call).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cipr.guard.cards import render_cards, tool_card
from cipr.guard.session import GuardSession
from cipr.guard.validator import ValidationReport, call_to_json
from cipr.tools.interface import Call, Tool

REPAIR_INSTRUCTIONS = (
    "You repair one tool call that failed validation against its tool's schema. Reply with exactly one "
    'JSON object {"name": "<tool>", "arguments": {...}} calling the tool on the card, and nothing else. '
    "Use only the argument names on the card, with the types and allowed values it gives. If the call "
    "is empty or a required argument is missing, infer it from the conversation.")

CANDIDATE_INSTRUCTIONS = (
    "A tool call did not name an available tool. Choose the one tool below that fits the conversation "
    'and reply with exactly one JSON object {"name": "<tool>", "arguments": {...}}, and nothing else. '
    "Use only a tool name listed below and only the argument names on its card.")

# Per-call decisions recorded in the audit log.
VALID, REPAIRED, RESOLVED, UNRESOLVED = "valid", "repaired", "resolved", "unresolved"


def task_context(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as `role: content` lines, system messages left out (see the module docstring)."""
    lines = []
    for m in messages:
        role = str(m.get("role", ""))
        if role == "system":
            continue
        content = str(m.get("content", "") or "")
        calls = m.get("tool_calls")
        if calls:
            content = (content + " " if content else "") + json.dumps(calls, ensure_ascii=False, default=str)
        lines.append(f"{role}: {content}")
    return "\n".join(lines)


def _call_text(call: Call) -> str:
    return json.dumps(call_to_json(call), ensure_ascii=False, default=str)


def repair_messages(context: str, tools: Sequence[Tool], call: Call, report: ValidationReport, *,
                    cards: bool = True) -> list[dict[str, str]]:
    """The constrained repair prompt for the tool (its declarations) named in `tools`."""
    name = tools[0].name
    card = "\n\n".join(tool_card(t).render() for t in tools) if cards else f"tool: {name}"
    user = (f"Conversation:\n{context}\n\nTool card:\n{card}\n\nInvalid call:\n{_call_text(call)}\n\n"
            f"Validation errors:\n{report.render()}\n\nReply with the corrected call to {name}.")
    return [{"role": "system", "content": REPAIR_INSTRUCTIONS}, {"role": "user", "content": user}]


def candidate_messages(context: str, candidates: Sequence[Tool], call: Call,
                       report: ValidationReport) -> list[dict[str, str]]:
    """The candidate-set retry prompt over the visible authorized tools."""
    names = ", ".join(t.name for t in candidates)
    user = (f"Conversation:\n{context}\n\nAvailable tools ({names}):\n\n{render_cards(candidates)}\n\n"
            f"Invalid call:\n{_call_text(call)}\n\nValidation errors:\n{report.render()}\n\n"
            f"Reply with one call to one of: {names}.")
    return [{"role": "system", "content": CANDIDATE_INSTRUCTIONS}, {"role": "user", "content": user}]


def constrained_repair(session: GuardSession, call: Call, report: ValidationReport, index: int, *,
                       cards: bool = True) -> Call | None:
    """One repair of `call` (which names an authorized tool); the valid result or None."""
    name = call.name
    decls = session.snapshot.declarations(name)
    context = task_context(session.messages)
    parsed, _ = session.ask("repair", repair_messages(context, decls, call, report, cards=cards),
                            tools=[decls[0].to_openai()], tool_choice=name, call_index=index)
    if not parsed.calls:
        return None
    fixed = parsed.calls[0]
    if not fixed.name:
        fixed = Call(name, fixed.arguments)
    if not session.authorize(fixed, [name], stage="repair", call_index=index, reason="other_tool_in_repair"):
        return None
    return fixed if session.validator.validate(fixed).valid else None


def candidate_retry(session: GuardSession, call: Call, report: ValidationReport, index: int) -> Call | None:
    """One retry over the visible authorized tools; the reply's call if it names one of them, else None."""
    if not session.candidates:
        return None
    names = [t.name for t in session.candidates]
    context = task_context(session.messages)
    parsed, _ = session.ask("candidate_retry", candidate_messages(context, session.candidates, call, report),
                            tools=[t.to_openai() for t in _unique(session.candidates)],
                            tool_choice="required", call_index=index)
    if not parsed.calls or not parsed.calls[0].name:
        return None
    chosen = parsed.calls[0]
    if not session.authorize(chosen, names, stage="candidate_retry", call_index=index):
        return None
    return chosen


def _unique(tools: Sequence[Tool]) -> list[Tool]:
    seen: set[str] = set()
    out = []
    for t in tools:
        if t.name not in seen:
            seen.add(t.name)
            out.append(t)
    return out


def repair_protocol(session: GuardSession, call: Call, report: ValidationReport, index: int, *,
                    use_candidate_retry: bool = True, cards: bool = True) -> tuple[Call | None, str]:
    """The whole non-oracle protocol for one invalid call: (valid call or None, decision)."""
    resolved_name = False
    if not report.name_resolved:
        if not use_candidate_retry:
            return None, UNRESOLVED
        chosen = candidate_retry(session, call, report, index)
        if chosen is None:
            return None, UNRESOLVED
        chosen_report = session.validator.validate(chosen)
        if chosen_report.valid:
            return chosen, RESOLVED
        call, report, resolved_name = chosen, chosen_report, True
    fixed = constrained_repair(session, call, report, index, cards=cards)
    if fixed is None:
        return None, UNRESOLVED
    return fixed, (RESOLVED if resolved_name else REPAIRED)
