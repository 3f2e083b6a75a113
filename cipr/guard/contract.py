"""The authorized tool contract: a snapshot of tool names, descriptions and schemas with a version hash.

The guard checks every call against a snapshot, never against whatever tool list is on display at
the moment. A changed tool list (an MCP `notifications/tools/list_changed`, a new release) goes
through `ContractSnapshot.refresh`, which produces a *new* version: tools that were already
authorized take their new declarations, tools that disappeared are dropped, and tools listed for
the first time stay out unless the caller names them in `authorize=` (they are reported in
`pending`). A refresh therefore never authorizes a tool by itself (000: "a list-change signal
prompts refresh, not blanket authorization of newly listed tools").

The version is the SHA-256 of the canonical JSON of the ordered tool list (names, descriptions and
schemas, keys sorted) and of the pending names: any change to the listed tools, reordering and a
newly listed but unauthorized tool included, is a new version. Reordering changes no
authorization, but a version identifies exactly one contract state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from cipr.errors import DataError
from cipr.interface import Interface, Tool


def contract_hash(tools: Sequence[Tool], pending: Sequence[str] = ()) -> str:
    """The version of an ordered tool list (and the names left pending): first 16 hex digits of the
    SHA-256 of its canonical JSON."""
    payload = {"tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                         for t in tools], "pending": list(pending)}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def check_tool_schema(tool: Tool, *, where: str = "<contract>") -> None:
    """Raise DataError (naming the tool) if its parameters are not a valid Draft 2020-12 schema."""
    try:
        Draft202012Validator.check_schema(dict(tool.parameters))
    except SchemaError as e:
        raise DataError(f"parameters are not a valid JSON Schema (Draft 2020-12): {e.message}",
                        file=where, item=tool.name, field="parameters") from e


@dataclass(frozen=True)
class ContractSnapshot:
    """The authorized tools, in the order they are shown, and the version hash of that list.

    - `parent`: the version this one was refreshed from (None for a first snapshot).
    - `pending`: names listed at the last refresh but not authorized (never callable through the guard).
    """

    tools: tuple[Tool, ...]
    version: str
    parent: str | None = None
    pending: tuple[str, ...] = ()

    @classmethod
    def from_tools(cls, tools: Iterable[Tool] | Interface, *, where: str = "<contract>") -> ContractSnapshot:
        """Snapshot a tool list; every schema is checked so a bad one fails here, not at validation."""
        tools = tuple(tools)
        for t in tools:
            check_tool_schema(t, where=where)
        return cls(tools=tools, version=contract_hash(tools))

    @classmethod
    def from_openai(cls, entries: Sequence[Mapping[str, Any]], *, where: str = "<tools>") -> ContractSnapshot:
        return cls.from_tools(Interface.from_openai(entries, where=where), where=where)

    @classmethod
    def from_mcp(cls, result: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                 where: str = "<tools/list>") -> ContractSnapshot:
        return cls.from_tools(Interface.from_mcp(result, where=where), where=where)

    @property
    def interface(self) -> Interface:
        return Interface(self.tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    def __contains__(self, name: object) -> bool:
        return any(t.name == name for t in self.tools)

    def declarations(self, name: str) -> tuple[Tool, ...]:
        """Every authorized declaration of `name` (several after a same-name duplicate)."""
        return tuple(t for t in self.tools if t.name == name)

    def visible(self, shown: Interface | Iterable[Tool] | None) -> tuple[Tool, ...]:
        """The authorized tools among those shown to the model, as the snapshot declares them.

        The snapshot's own declaration is returned even when the shown one differs: what is on
        display is not a contract. `shown=None` means the model was shown the snapshot itself.
        """
        if shown is None:
            return self.tools
        shown_names = {t.name for t in shown}
        return tuple(t for t in self.tools if t.name in shown_names)

    def refresh(self, listed: Iterable[Tool] | Interface, *, authorize: Iterable[str] = (),
                where: str = "<refresh>") -> ContractSnapshot:
        """A new version from a changed tool list; new names stay unauthorized unless in `authorize`.

        Order follows the new list. Tools of the old snapshot that the new list no longer has are
        dropped (a removed capability is removed from the contract too).
        """
        listed = tuple(listed)
        allowed = set(self.names) | set(authorize)
        unknown = set(authorize) - {t.name for t in listed}
        if unknown:
            raise DataError(f"cannot authorize tools the new list does not declare: {sorted(unknown)}",
                            file=where, field="authorize")
        kept = tuple(t for t in listed if t.name in allowed)
        pending = tuple(dict.fromkeys(t.name for t in listed if t.name not in allowed))
        for t in kept:
            check_tool_schema(t, where=where)
        return ContractSnapshot(tools=kept, version=contract_hash(kept, pending), parent=self.version, pending=pending)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "parent": self.parent, "pending": list(self.pending),
                "tools": [t.to_openai() for t in self.tools]}
