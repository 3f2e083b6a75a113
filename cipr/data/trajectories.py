"""Agent trajectories for self-distillation (paper §4.3), by path.

Two on-disk shapes, one JSON list or JSON Lines file each:
- AgentInstruct style (AgentLM's training data): `{"id", "conversations": [{"from": "human"|"gpt"|
  "system", "value": str}, ...]}`; human turns carry instructions and observations, gpt turns
  `Thought: ... Action: search[...]` text. The action interface is given by the caller (for WebShop:
  `cipr.envs.toyshop.ACTIONS`, the two actions search and click), since the data does not declare it.
  A gpt turn with an `Action:` line is parsed with the call format (`webshop` by default, which also
  reads AgentLM's `Thought:\n...\n\nAction:\nclick[...]` layout) into its thought (`content`) and
  its one call (`calls`), so the turn can be rendered again under other action names; a malformed
  action or an undeclared action name raises. A gpt turn without an `Action:` line (AgentInstruct's
  opening "OK") stays a text turn. Writing back (`to_agentinstruct`) renders calls with the format.
- JSON tool-call conversations: `{"id", "tools": [OpenAI tools], "messages": [OpenAI chat messages,
  assistant ones with "tool_calls"]}`, read row by row by `cipr.data.messages.row_conversation` (the
  reader of `data.source=messages`, so the same rules and errors), every message through the last
  assistant turn.

Both become `Example`s whose `messages` hold the whole conversation (assistant turns included) and
`meta["kind"] == "trajectory"`; nothing is dropped: a malformed record raises a DataError naming the
file, the record and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError, MissingInputError
from cipr.core.io import read_json, read_jsonl
from cipr.data.messages import RawRow, row_conversation
from cipr.envs.toyshop import ACTIONS, ToyShop
from cipr.formats import get_format
from cipr.formats.base import CallFormat
from cipr.tools.interface import Example, Interface, Message

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
_ACTION_LINE = re.compile(r"(?m)^Action:")


def _records(path: Path) -> list[Any]:
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError("expected a JSON list of trajectories", file=str(path))
    return data


def _assistant_turn(text: str, fmt: CallFormat, interface: Interface, path: Path, rid: str,
                    j: int) -> Message:
    """A gpt turn as a Message: its thought and its one action when it has an `Action:` line, else text."""
    if not _ACTION_LINE.search(text):
        return Message("assistant", text)
    parsed = fmt.parse(text)
    where = {"file": str(path), "item": rid, "field": f"conversations[{j}]"}
    if not parsed.ok or len(parsed.calls) != 1:
        raise DataError(f"the action of this turn cannot be read with the {fmt.name} format: "
                        f"{parsed.error or f'{len(parsed.calls)} actions'}", **where)
    call = parsed.calls[0]
    if call.name not in interface:
        raise DataError(f"action {call.name!r} is not declared (declared: {', '.join(interface.names)})",
                        **where)
    return Message("assistant", parsed.think or "", (call,))


def _agentinstruct(rec: Mapping[str, Any], path: Path, idx: int, interface: Interface,
                   fmt: CallFormat) -> Example:
    rid = str(rec.get("id", idx))
    turns = rec.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError("'conversations' must be a non-empty list", file=str(path), item=rid,
                        field="conversations")
    msgs = []
    for j, t in enumerate(turns):
        role = _ROLES.get(t.get("from")) if isinstance(t, Mapping) else None
        if role is None or not isinstance(t.get("value"), str):
            raise DataError(f"turn {j} needs 'from' in {sorted(_ROLES)} and a string 'value'", file=str(path),
                            item=rid, field=f"conversations[{j}]")
        msgs.append(_assistant_turn(t["value"], fmt, interface, path, rid, j) if role == "assistant"
                    else Message(role, t["value"]))
    return Example(rid, tuple(msgs), interface, source="trajectories", partition=path.stem,
                   meta={"kind": "trajectory", "style": "agentinstruct"})


def _toolcalls(rec: Mapping[str, Any], path: Path, idx: int) -> Example:
    """A JSON tool-call conversation, read by `cipr.data.messages` (its rules and its one-line errors)."""
    rid = str(rec.get("id", idx))
    example = row_conversation(RawRow(str(path), rid, rid, path.stem, rec))
    return example.with_(source="trajectories", meta={"kind": "trajectory", "style": "toolcalls"})


def load_trajectories(path: str | Path, *, interface: Interface = ACTIONS, call_format: str = "webshop"
                      ) -> list[Example]:
    """Trajectories from a JSON/JSONL file, either shape told apart per record; `interface` and `call_format`
    are the actions and action syntax of AgentInstruct records."""
    path = Path(path)
    fmt = get_format(call_format)
    if not path.is_file():
        raise MissingInputError(f"trajectory file {path} not found (data.path=...); generate a toy set with "
                                f"`cipr-data trajectories out=FILE`")
    out = []
    for i, rec in enumerate(_records(path)):
        if not isinstance(rec, Mapping):
            raise DataError("a trajectory must be a JSON object", file=str(path), item=str(i))
        if "conversations" in rec:
            out.append(_agentinstruct(rec, path, i, interface, fmt))
        elif "messages" in rec:
            out.append(_toolcalls(rec, path, i))
        else:
            raise DataError("a trajectory needs 'conversations' (AgentInstruct) or 'messages' (tool calls)",
                            file=str(path), item=str(rec.get("id", i)))
    return out


def toyshop_trajectories(n: int, *, seed: int = 0) -> list[Example]:
    """`n` expert ToyShop trajectories (AgentInstruct style, WebShop actions)."""
    shop = ToyShop(seed=seed)
    out = []
    for i in range(n):
        msgs, reward = shop.expert(i, seed=seed)
        out.append(Example(f"toyshop_{seed}_{i}", tuple(msgs), ACTIONS, source="toyshop", partition="train",
                           meta={"kind": "trajectory", "style": "agentinstruct", "reward": reward}))
    return out


def to_agentinstruct(examples: Iterable[Example], *, call_format: str = "webshop") -> list[dict[str, Any]]:
    """Examples back to AgentInstruct records (for a trajectory file), calls rendered by the format."""
    back = {"user": "human", "assistant": "gpt", "system": "system"}
    fmt = get_format(call_format)

    def text(m: Message) -> str:
        return fmt.render_target(m.calls, think=m.content or None) if m.calls else m.content

    return [{"id": e.id, "conversations": [{"from": back[m.role], "value": text(m)} for m in e.messages]}
            for e in examples]
