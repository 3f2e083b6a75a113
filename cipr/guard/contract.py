"""The authorized tool contract: a snapshot of tool names, descriptions and schemas with a version hash.

The guard checks every call against a snapshot, never against whatever tool list is on display at
the moment. A changed tool list (an MCP `notifications/tools/list_changed`, a new release) goes
through `ContractSnapshot.refresh`, which produces a *new* version: tools that were already
authorized take their new declarations, tools that disappeared are dropped, and tools listed for
the first time stay out unless the caller names them in `authorize=` (reported in `pending`): a
refresh never authorizes a tool by itself (the guide, docs/references.md).

The version hashes the canonical JSON of the ordered tool list and the pending names: any change,
reordering and a newly listed unauthorized tool included, is a new version (one contract state each).

A tool schema is untrusted input (it comes from whoever serves the tools), so a snapshot accepts
it only when it can be checked offline and in bounded time (`schema_problem`):
- nesting (objects and arrays together) at most `MAX_SCHEMA_DEPTH` levels, measured iteratively
  before anything recurses into it;
- every `$ref` a JSON pointer into the same schema (`#` or `#/...`) that points at something;
  a remote or relative URI, an anchor, `$dynamicRef`/`$recursiveRef` and a nested `$id` are
  refused, and nothing is ever fetched (`OFFLINE_REGISTRY` refuses every retrieval);
- a valid Draft 2020-12 schema.
A schema that fails any of these is a contract error (`DataError`), never a pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from cipr.core.errors import DataError
from cipr.tools.interface import Interface, Tool


def contract_hash(tools: Sequence[Tool], pending: Sequence[str] = ()) -> str:
    """The version of an ordered tool list (and the names left pending): first 16 hex digits of the
    SHA-256 of its canonical JSON."""
    payload = {"tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                         for t in tools], "pending": list(pending)}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of objects and arrays a tool schema may have (real tool schemas stay under 20)."""

# Keywords whose values are data (never schemas): a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
# Keywords whose values map names to schemas (the names are not keywords).
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_DYNAMIC_REFS = ("$dynamicRef", "$recursiveRef")


def _refuse_retrieval(uri: str) -> Resource:
    raise NoSuchResource(ref=uri)


OFFLINE_REGISTRY: Registry = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
"""A `referencing` registry that never fetches anything: a reference outside the schema stays unresolved."""


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply objects and arrays nest in `value` (a scalar is 0), without recursion; stops at
    `limit + 1`, so a hostile document costs at most its size."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping | list | tuple):
            depth += 1
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (node.values() if isinstance(node, Mapping) else node))
    return deepest


def _resolve_pointer(root: Any, ref: str) -> bool:
    """Whether the local reference `ref` (`#` or `#/a/b`) points at something in `root`."""
    node = root
    for raw in ref[2:].split("/") if ref != "#" else ():
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


def _reference_problem(schema: Mapping[str, Any]) -> str | None:
    """The first reference in `schema` that cannot be resolved offline within it, described; else None."""
    stack: list[tuple[Any, str, bool]] = [(schema, "parameters", False)]
    while stack:
        node, path, named = stack.pop()
        if isinstance(node, list):
            stack.extend((child, f"{path}[{i}]", False) for i, child in enumerate(node))
            continue
        if not isinstance(node, Mapping):
            continue
        if named:
            stack.extend((child, f"{path}.{key}", False) for key, child in node.items())
            continue
        for key in _DYNAMIC_REFS:
            if key in node:
                return f"{key} at {path} is not supported in a tool contract"
        if "$id" in node and node is not schema:
            return (f"a nested $id at {path} is not supported in a tool contract "
                    "(it moves the base of references)")
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str):
                return f"$ref at {path} is not a string"
            if not (ref == "#" or ref.startswith("#/")):
                return (f"$ref {ref!r} at {path} points outside the schema; only local references "
                        "('#' or '#/...') are allowed, and nothing is fetched")
            if not _resolve_pointer(schema, ref):
                return f"$ref {ref!r} at {path} points to nothing in the schema"
        for key, child in node.items():
            if key not in _DATA_KEYWORDS:
                stack.append((child, f"{path}.{key}", key in _NAMED_SCHEMAS))
    return None


def schema_problem(parameters: Any) -> str | None:
    """Why a tool's parameter schema cannot be a contract (too deep, a reference that is remote or
    points nowhere, not a valid Draft 2020-12 schema), or None when it can. Never raises."""
    if not isinstance(parameters, Mapping):
        return "parameters must be a JSON object"
    if nesting_depth(parameters, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return f"parameters nest deeper than {MAX_SCHEMA_DEPTH} levels"
    problem = _reference_problem(parameters)
    if problem is not None:
        return problem
    try:
        Draft202012Validator.check_schema(dict(parameters))
    except SchemaError as e:
        return f"parameters are not a valid JSON Schema (Draft 2020-12): {e.message}"
    return None


def check_tool_schema(tool: Tool, *, where: str = "<contract>") -> None:
    """Raise DataError (naming the tool) if its parameters cannot be a contract (`schema_problem`)."""
    problem = schema_problem(tool.parameters)
    if problem is not None:
        raise DataError(problem, file=where, item=tool.name, field="parameters")


def check_entries_depth(entries: Any, *, where: str) -> None:
    """Raise DataError if a raw tool list nests too deeply to be read (before anything recurses into it)."""
    limit = MAX_SCHEMA_DEPTH + 8  # the schema and the envelope around it (list, entry, function, ...)
    if nesting_depth(entries, limit) > limit:
        raise DataError(f"the tool list nests deeper than {limit} levels (a tool schema may nest at most "
                        f"{MAX_SCHEMA_DEPTH})", file=where, field="parameters")


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
        check_entries_depth(entries, where=where)
        return cls.from_tools(Interface.from_openai(entries, where=where), where=where)

    @classmethod
    def from_mcp(cls, result: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                 where: str = "<tools/list>") -> ContractSnapshot:
        check_entries_depth(result, where=where)
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
        """The authorized tools among those shown (None: the snapshot itself), as the snapshot declares
        them: what is on display is not a contract."""
        if shown is None:
            return self.tools
        shown_names = {t.name for t in shown}
        return tuple(t for t in self.tools if t.name in shown_names)

    def refresh(self, listed: Iterable[Tool] | Interface, *, authorize: Iterable[str] = (),
                where: str = "<refresh>") -> ContractSnapshot:
        """A new version from a changed tool list, in its order; new names stay unauthorized unless in
        `authorize`, and tools it no longer has are dropped."""
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
        return ContractSnapshot(tools=kept, version=contract_hash(kept, pending), parent=self.version,
                                pending=pending)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "parent": self.parent, "pending": list(self.pending),
                "tools": [t.to_openai() for t in self.tools]}
