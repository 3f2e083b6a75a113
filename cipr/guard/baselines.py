"""The study's two baselines, run from the same guard code so the comparison is fair.

- Naive retry: the same prompt (messages and tools exactly as first shown) is sent again once.
- Tool-list re-prompt: the model's invalid turn is appended, then a user message that says the call
  was invalid and lists the tool names (the visible authorized ones), without the validator's
  report or any card.

Both act on the whole turn, fire under the repair's trigger (some call invalid, or none when one is
required) and are checked the same way: every call validated, calls outside the contract refused and
recorded, only valid calls returned. Under greedy decoding a naive retry reproduces the first reply;
that is the point of the baseline (the study ran it with a sampling API).
"""

from __future__ import annotations

from cipr.guard.session import GuardSession
from cipr.tools.interface import Call

TOOL_LIST_TEMPLATE = ("Your previous tool call was invalid. The available tools are: {names}. "
                      "Please try again.")


def naive_retry_messages(session: GuardSession) -> list[dict]:
    """The original prompt, unchanged."""
    return [dict(m) for m in session.messages]


def tool_list_messages(session: GuardSession, original_text: str) -> list[dict]:
    """The original prompt, the invalid reply, and a re-prompt naming the tools."""
    names = ", ".join(dict.fromkeys(t.name for t in session.candidates)) or "(none)"
    return [dict(m) for m in session.messages] + [
        {"role": "assistant", "content": original_text},
        {"role": "user", "content": TOOL_LIST_TEMPLATE.format(names=names)},
    ]


def retry_turn(session: GuardSession, kind: str, original_text: str) -> tuple[list[Call], bool]:
    """Run one baseline retry: (the valid calls of the new reply, whether all of them were valid).

    A reply with no call counts as not valid: the turn it replaces was an invalid call attempt.
    """
    if kind == "naive_retry":
        messages = naive_retry_messages(session)
    elif kind == "tool_list":
        messages = tool_list_messages(session, original_text)
    else:
        raise ValueError(f"unknown baseline {kind!r}; expected naive_retry or tool_list")
    parsed, _ = session.ask(kind, messages, tools=session.tools or None, tool_choice=None, call_index=None)
    valid: list[Call] = []
    for call in parsed.calls:  # calls outside the contract were recorded by `ask`; the validator rejects them
        if session.validator.validate(call).valid:
            valid.append(call)
    return valid, bool(parsed.calls) and len(valid) == len(parsed.calls)
