"""Agent trajectories for self-distillation (paper §4.3), by path.

Two on-disk shapes, one JSON list or JSON Lines file each:
- AgentInstruct style (AgentLM's training data): `{"id", "conversations": [{"from": "human"|"gpt"|
  "system", "value": str}, ...]}`; human turns carry instructions and observations, gpt turns
  `Thought: ... Action: search[...]` text. The action interface is given by the caller (for WebShop:
  `cipr.envs.toyshop.ACTIONS`, the two actions search and click), since the data does not declare it.
- JSON tool-call conversations: `{"id", "tools": [OpenAI tools], "messages": [OpenAI chat messages,
  assistant ones with "tool_calls"]}`.

Both become `Example`s whose `messages` hold the whole conversation (assistant turns included) and
`meta["kind"] == "trajectory"`; nothing is dropped: a malformed record raises a DataError naming the
file, the record and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cipr.envs.toyshop import ACTIONS, ToyShop
from cipr.errors import DataError
from cipr.interface import Call, Example, Interface, Message

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def _records(path: Path) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"invalid JSON: {e.msg} at column {e.colno}", file=str(path),
                                    item=f"line {i}") from e
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}", file=str(path)) from e
    if not isinstance(data, list):
        raise DataError("expected a JSON list of trajectories", file=str(path))
    return data


def _agentinstruct(rec: Mapping[str, Any], path: Path, idx: int, interface: Interface) -> Example:
    rid = str(rec.get("id", idx))
    turns = rec.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError("'conversations' must be a non-empty list", file=str(path), item=rid, field="conversations")
    msgs = []
    for j, t in enumerate(turns):
        role = _ROLES.get(t.get("from")) if isinstance(t, Mapping) else None
        if role is None or not isinstance(t.get("value"), str):
            raise DataError(f"turn {j} needs 'from' in {sorted(_ROLES)} and a string 'value'", file=str(path),
                            item=rid, field=f"conversations[{j}]")
        msgs.append(Message(role, t["value"]))
    return Example(rid, tuple(msgs), interface, source="trajectories", partition=path.stem,
                   meta={"kind": "trajectory", "style": "agentinstruct"})


def _toolcalls(rec: Mapping[str, Any], path: Path, idx: int) -> Example:
    rid = str(rec.get("id", idx))
    interface = Interface.from_openai(rec.get("tools") or [], where=str(path), item=rid)
    msgs = []
    for j, m in enumerate(rec["messages"]):
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise DataError("each message needs a role of system/user/assistant/tool", file=str(path), item=rid,
                            field=f"messages[{j}]")
        calls = []
        for k, tc in enumerate(m.get("tool_calls") or []):
            fn = tc.get("function", tc)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError as e:
                    raise DataError(f"arguments are not valid JSON: {e.msg}", file=str(path), item=rid,
                                    field=f"messages[{j}].tool_calls[{k}].arguments") from e
            if fn.get("name") not in interface:
                raise DataError(f"call to undeclared tool {fn.get('name')!r}", file=str(path), item=rid,
                                field=f"messages[{j}].tool_calls[{k}].name")
            calls.append(Call(fn["name"], args))
        msgs.append(Message(m["role"], m.get("content") or "", tuple(calls), m.get("name")))
    return Example(rid, tuple(msgs), interface, source="trajectories", partition=path.stem,
                   meta={"kind": "trajectory", "style": "toolcalls"})


def load_trajectories(path: str | Path, *, interface: Interface = ACTIONS) -> list[Example]:
    """Trajectories from a JSON/JSONL file, in either shape (told apart per record)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file {path} not found (data.path=...); generate a toy set with "
                                f"`cipr-data trajectories --out FILE`")
    out = []
    for i, rec in enumerate(_records(path)):
        if not isinstance(rec, Mapping):
            raise DataError("a trajectory must be a JSON object", file=str(path), item=str(i))
        if "conversations" in rec:
            out.append(_agentinstruct(rec, path, i, interface))
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


def to_agentinstruct(examples: Iterable[Example]) -> list[dict[str, Any]]:
    """Examples back to AgentInstruct records (for writing a trajectory file)."""
    back = {"user": "human", "assistant": "gpt", "system": "system"}
    return [{"id": e.id, "conversations": [{"from": back[m.role], "value": m.content} for m in e.messages]}
            for e in examples]
