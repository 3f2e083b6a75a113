"""The tool-interface model: Tool, Interface, Call, Message, Example.

Parameters are standard JSON Schema objects (BFCL's dialects are normalized at load time by
`cipr.tools.schema`). Objects are frozen dataclasses; collections are tuples so an Example can be shared
between threads and perturbations without copies. Argument dicts are plain dicts by convenience:
treat them as read-only (helpers here always build new ones).

An Interface may declare the same name twice (held-out perturbations do that on purpose); loaders
reject duplicates in *source* data, and `Interface.declarations(name)` returns every declaration.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cipr.core.errors import DataError


@dataclass(frozen=True)
class Tool:
    """One declared tool: `parameters` is a JSON Schema of type object."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @property
    def properties(self) -> Mapping[str, Any]:
        return self.parameters.get("properties", {}) or {}

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("required", []) or [])

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(self.properties)

    def with_(self, **changes: Any) -> Tool:
        return replace(self, **changes)

    def to_openai(self, *, copy_schema: bool = True) -> dict[str, Any]:
        """OpenAI `tools` entry: {"type": "function", "function": {name, description, parameters}};
        `copy_schema=False` shares the schema dict (for a caller that serializes it at once)."""
        params = copy.deepcopy(dict(self.parameters)) if copy_schema else self.parameters
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": params}}

    def to_mcp(self) -> dict[str, Any]:
        """MCP `tools/list` entry: {name, description, inputSchema}."""
        return {"name": self.name, "description": self.description,
                "inputSchema": copy.deepcopy(dict(self.parameters))}

    @classmethod
    def from_openai(cls, entry: Mapping[str, Any], *, where: str = "<tools>",
                    item: str | None = None) -> Tool:
        fn = entry.get("function", entry) if isinstance(entry, Mapping) else None
        if not isinstance(fn, Mapping):
            raise DataError("tool entry is not an object", file=where, item=item, field="tools")
        return cls._build(fn.get("name"), fn.get("description", ""), fn.get("parameters"), where, item)

    @classmethod
    def from_mcp(cls, entry: Mapping[str, Any], *, where: str = "<tools/list>",
                 item: str | None = None) -> Tool:
        if not isinstance(entry, Mapping):
            raise DataError("tool entry is not an object", file=where, item=item, field="tools")
        return cls._build(entry.get("name"), entry.get("description", ""), entry.get("inputSchema"), where,
                          item)

    @classmethod
    def _build(cls, name: Any, description: Any, parameters: Any, where: str, item: str | None) -> Tool:
        if not isinstance(name, str) or not name:
            raise DataError(f"tool name must be a non-empty string, got {name!r}", file=where, item=item,
                            field="name")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise DataError(f"parameters of tool {name!r} must be a JSON Schema object, "
                            f"got {parameters!r}"[:300], file=where, item=item, field=f"{name}.parameters")
        params = copy.deepcopy(dict(parameters))
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        return cls(name=name, description=str(description or ""), parameters=params)


@dataclass(frozen=True)
class Interface:
    """The ordered list of tools the agent is shown."""

    tools: tuple[Tool, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    def __getitem__(self, i: int) -> Tool:
        return self.tools[i]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    def declarations(self, name: str) -> tuple[Tool, ...]:
        """Every tool declared under `name` (more than one after a same-name duplicate)."""
        return tuple(t for t in self.tools if t.name == name)

    def get(self, name: str) -> Tool | None:
        """The first declaration of `name`, or None."""
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def __contains__(self, name: object) -> bool:
        return any(t.name == name for t in self.tools)

    def duplicate_names(self) -> tuple[str, ...]:
        seen: set[str] = set()
        dup: list[str] = []
        for n in self.names:
            if n in seen and n not in dup:
                dup.append(n)
            seen.add(n)
        return tuple(dup)

    def to_openai(self, *, copy_schema: bool = True) -> list[dict[str, Any]]:
        return [t.to_openai(copy_schema=copy_schema) for t in self.tools]

    def to_mcp(self) -> dict[str, Any]:
        """An MCP `tools/list` result: {"tools": [...]}."""
        return {"tools": [t.to_mcp() for t in self.tools]}

    @classmethod
    def from_openai(cls, tools: Iterable[Mapping[str, Any]], *, where: str = "<tools>",
                    item: str | None = None) -> Interface:
        return cls(tuple(Tool.from_openai(t, where=where, item=item) for t in tools))

    @classmethod
    def from_mcp(cls, result: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, where: str = "<tools/list>",
                 item: str | None = None) -> Interface:
        tools = result.get("tools") if isinstance(result, Mapping) else result
        if not isinstance(tools, Sequence):
            raise DataError("an MCP tools/list result needs a 'tools' list", file=where, item=item,
                            field="tools")
        return cls(tuple(Tool.from_mcp(t, where=where, item=item) for t in tools))


@dataclass(frozen=True)
class Call:
    """A tool call: a name and its arguments."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": copy.deepcopy(dict(self.arguments))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Call:
        return cls(name=d["name"], arguments=dict(d.get("arguments", {})))

    def key(self) -> str:
        """A canonical string (for equality, hashing and sorting of call lists)."""
        return json.dumps([self.name, self.arguments], sort_keys=True, default=str)


@dataclass(frozen=True)
class Message:
    """A conversation turn. Assistant turns may carry calls; tool turns carry a result in `content`."""

    role: str
    content: str = ""
    calls: tuple[Call, ...] = ()
    name: str | None = None  # for role == "tool": the tool whose result this is

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.calls:
            d["tool_calls"] = [c.to_dict() for c in self.calls]
        if self.name is not None:
            d["name"] = self.name
        return d


def last_user(messages: Sequence[Message]) -> str:
    """The content of the last user message ("" without one)."""
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


@dataclass(frozen=True)
class Example:
    """A task: the conversation so far, the interface and the reference calls (empty: answer without a call).

    - `reference`: the target calls (for BFCL, the first accepted value of each argument, omitting
      arguments whose accepted values include "" when the schema does not require them).
    - `accepted`: BFCL's accepted-values lists, one mapping per reference call, argument name ->
      tuple of accepted values ("" among them: the argument may be omitted). None for other sources.
    - `alternatives`: further complete answers that are also accepted (RoTBench lists several).
    - `response`: a reference text answer when no call is expected (ToolRL `<response>` rows).
    - `meta`: source-specific extras (language, raw fields) that scorers may read.
    """

    id: str
    messages: tuple[Message, ...]
    interface: Interface
    reference: tuple[Call, ...] = ()
    accepted: tuple[Mapping[str, tuple[Any, ...]], ...] | None = None
    alternatives: tuple[tuple[Call, ...], ...] = ()
    response: str | None = None
    source: str = ""
    partition: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "reference", tuple(self.reference))
        object.__setattr__(self, "alternatives", tuple(tuple(a) for a in self.alternatives))
        if self.accepted is not None:
            object.__setattr__(self, "accepted", tuple(self.accepted))

    def with_(self, **changes: Any) -> Example:
        return replace(self, **changes)

    @property
    def query(self) -> str:
        """The content of the last user message."""
        return last_user(self.messages)
