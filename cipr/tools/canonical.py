"""Canonicalization adapter: neutral tool and argument ids, applied everywhere, and translation back.

Every tool name becomes `function_01`, `function_02`, ... by position; every argument name becomes
`arg_01`, ... numbered within its tool by the order of its `properties`. Descriptions (but for the tool names
they mention), types, required flags, enums and argument values stay. The same mapping is applied to every
reference to those names: reference calls, BFCL accepted-values lists, alternatives, calls in earlier turns,
tool messages' names, and mentions in text (below).

Choices the paper leaves open (documented here, configurable where it matters):
- Only top-level argument names are renamed; nested object properties keep their names, since they
  are part of values the tool receives rather than the interface's surface.
- Free text (the query, earlier turns, and the descriptions of the tools and of their arguments at
  any depth of the schema, which may name another tool) has *tool* names replaced where they appear
  as whole identifiers. By default (`rewrite_text="identifiers"`) only identifier-like names are replaced
  (containing `_`, `.`, a digit, or an inner capital: `get_weather`, `math.factorial`), so a tool
  called `search` does not rewrite the English word "search". `"all"` replaces every whole-word
  occurrence, `"none"` leaves text unchanged. Argument names are never rewritten in free text:
  they are mostly plain words (`city`, `date`).
- JSON-schema `title`s of the parameters object and of each top-level argument are dropped: schema
  generators (pydantic, as in τ²-bench) write them from the tool's and the argument's names
  ("Reservation Id"), which would show the original names under the neutral ids.
- With duplicated names (a perturbation may declare one name twice), each declaration gets its own
  id; a reference to the name maps to the first declaration, and both ids translate back to it.
- Translating back: a generated name that the canonical interface does not declare is an error
  (`UndeclaredToolError`), never mapped to the closest declared tool. An argument id the tool does
  not declare is passed through unchanged so the scorer sees it as an unknown argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cipr.tools.interface import Call, Example, Interface, Message, Tool

RewriteText = Literal["identifiers", "all", "none"]


class UndeclaredToolError(KeyError):
    """A generated call names a tool the interface does not declare."""

    def __init__(self, name: str, declared: Sequence[str]) -> None:
        self.name, self.declared = name, tuple(declared)
        super().__init__(f"tool {name!r} is not declared by the interface (declared: {', '.join(declared)})")

    def __str__(self) -> str:
        return self.args[0]


def canonical_tool_id(i: int, n: int) -> str:
    """The neutral id of the i-th (0-based) of n tools: function_01 ... (3 digits past 99 tools)."""
    return f"function_{i + 1:0{max(2, len(str(n)))}d}"


def canonical_arg_id(j: int, n: int) -> str:
    return f"arg_{j + 1:0{max(2, len(str(n)))}d}"


def _identifier_like(name: str) -> bool:
    return bool(re.search(r"[_.\d]", name) or re.search(r"[a-z][A-Z]", name))


@dataclass(frozen=True)
class NameMap:
    """The mapping of one interface: `tools[i]` is (canonical id, original name) of the i-th tool;
    `arguments[canonical id]` maps canonical argument ids to original argument names."""

    tools: tuple[tuple[str, str], ...]
    arguments: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def forward(self) -> dict[str, str]:
        """original name -> canonical id (first declaration wins for a duplicated name)."""
        out: dict[str, str] = {}
        for cid, orig in self.tools:
            out.setdefault(orig, cid)
        return out

    @property
    def backward(self) -> dict[str, str]:
        """canonical id -> original name."""
        return dict(self.tools)

    def forward_args(self, original_tool: str) -> dict[str, str]:
        cid = self.forward[original_tool]
        return {orig: carg for carg, orig in self.arguments[cid].items()}

    def rename(self, call: Call) -> Call:
        """An original-name call to canonical ids (unknown names and arguments pass through)."""
        cid = self.forward.get(call.name)
        if cid is None:
            return call
        amap = self.forward_args(call.name)
        return Call(cid, {amap.get(k, k): v for k, v in call.arguments.items()})

    def translate_back(self, call: Call) -> Call:
        """A canonical-id call to the executable API. Raises UndeclaredToolError for undeclared names."""
        back = self.backward
        if call.name not in back:
            raise UndeclaredToolError(call.name, [c for c, _ in self.tools])
        amap = self.arguments.get(call.name, {})
        return Call(back[call.name], {amap.get(k, k): v for k, v in call.arguments.items()})

    def translate_each(self, calls: Sequence[Call]
                       ) -> tuple[tuple[Call, ...], tuple[UndeclaredToolError, ...]]:
        """Translate several calls: the declared ones translated, and the error of each undeclared one."""
        out: list[Call] = []
        errors: list[UndeclaredToolError] = []
        for c in calls:
            try:
                out.append(self.translate_back(c))
            except UndeclaredToolError as e:
                errors.append(e)
        return tuple(out), tuple(errors)

    def translate_calls(self, calls: Sequence[Call]) -> tuple[tuple[Call, ...], tuple[str, ...]]:
        """Translate several calls; undeclared ones are dropped from the result and reported as errors."""
        out, errors = self.translate_each(calls)
        return out, tuple(str(e) for e in errors)

    def to_json(self) -> dict[str, Any]:
        return {"tools": [list(t) for t in self.tools],
                "arguments": {k: dict(v) for k, v in self.arguments.items()}}


def _untitled(schema: Any) -> Any:
    return {k: v for k, v in schema.items() if k != "title"} if isinstance(schema, Mapping) else schema


def canonicalize_interface(interface: Interface) -> tuple[Interface, NameMap]:
    """Neutral ids for an interface's tools and arguments, and the map back."""
    n = len(interface)
    tools: list[Tool] = []
    pairs: list[tuple[str, str]] = []
    args: dict[str, dict[str, str]] = {}
    for i, tool in enumerate(interface):
        cid = canonical_tool_id(i, n)
        names = list(tool.properties)
        amap = {orig: canonical_arg_id(j, len(names)) for j, orig in enumerate(names)}
        params = {k: v for k, v in tool.parameters.items() if k != "title"}
        params["properties"] = {amap[k]: _untitled(v) for k, v in tool.properties.items()}
        if "required" in params:
            params["required"] = [amap.get(r, r) for r in params["required"]]
        tools.append(Tool(cid, tool.description, params))
        pairs.append((cid, tool.name))
        args[cid] = {c: o for o, c in amap.items()}
    return Interface(tuple(tools)), NameMap(tuple(pairs), args)


def rewrite_text(text: str, mapping: Mapping[str, str], mode: RewriteText = "identifiers") -> str:
    """Replace whole-identifier occurrences of mapping's keys in free text (all at once, so a swap of two
    names is a swap). Keys that do not occur in the text are left out of the pattern, and a text naming
    none is returned without compiling one (most texts name no tool)."""
    if mode == "none" or not text:
        return text
    keys = [k for k in mapping if k in text and (mode == "all" or _identifier_like(k))]
    if not keys:
        return text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
                         + r")(?![\w])")
    return pattern.sub(lambda m: mapping[m.group(1)], text)


_VALUE_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
"""Schema keywords whose contents are argument values, never rewritten (names in them are data)."""


def _rewrite_schema(schema: Any, mapping: Mapping[str, str], mode: RewriteText) -> Any:
    """A JSON schema with `rewrite_text` applied to every `description` string, at any depth (argument
    descriptions, nested properties, array items); property names and values are kept."""
    if isinstance(schema, list):
        return [_rewrite_schema(v, mapping, mode) for v in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description" and isinstance(value, str):
            out[key] = rewrite_text(value, mapping, mode)
        elif key == "properties" and isinstance(value, Mapping):  # keys are argument names, values schemas
            out[key] = {name: _rewrite_schema(sub, mapping, mode) for name, sub in value.items()}
        elif key in _VALUE_KEYWORDS:
            out[key] = value
        else:
            out[key] = _rewrite_schema(value, mapping, mode)
    return out


def rewrite_tool_text(tool: Tool, mapping: Mapping[str, str], mode: RewriteText = "identifiers") -> Tool:
    """`tool` with `rewrite_text` applied to its description and to every description in its parameter
    schema: a tool's text may name another tool ("a flight found by search_flights")."""
    if mode == "none":
        return tool
    return tool.with_(description=rewrite_text(tool.description, mapping, mode),
                      parameters=_rewrite_schema(tool.parameters, mapping, mode))


def rewrite_interface_text(interface: Interface, mapping: Mapping[str, str],
                           mode: RewriteText = "identifiers") -> Interface:
    """`rewrite_tool_text` on every tool of `interface` (names, order and schemas' structure kept)."""
    return Interface(tuple(rewrite_tool_text(t, mapping, mode) for t in interface))


def _rename_accepted(accepted: Mapping[str, Any], name: str, nmap: NameMap) -> dict[str, Any]:
    if name not in nmap.forward:
        return dict(accepted)
    amap = nmap.forward_args(name)
    return {amap.get(k, k): v for k, v in accepted.items()}


def apply_name_map(example: Example, interface: Interface, nmap: NameMap,
                   rewrite: RewriteText = "identifiers") -> Example:
    """Rewrite an example onto `interface` whose names `nmap` maps (original -> new names everywhere).
    `interface` holds the new names with the original tools' text (each caller copies the descriptions): tool
    names in it are rewritten here, as in the messages."""
    fwd = nmap.forward

    def msg(m: Message) -> Message:
        return Message(m.role, rewrite_text(m.content, fwd, rewrite), tuple(nmap.rename(c) for c in m.calls),
                       fwd.get(m.name, m.name) if m.name is not None else None)

    accepted = None
    if example.accepted is not None:
        accepted = tuple(_rename_accepted(a, c.name, nmap)
                         for a, c in zip(example.accepted, example.reference, strict=True))
    return example.with_(
        messages=tuple(msg(m) for m in example.messages),
        interface=rewrite_interface_text(interface, fwd, rewrite),
        reference=tuple(nmap.rename(c) for c in example.reference),
        accepted=accepted,
        alternatives=tuple(tuple(nmap.rename(c) for c in alt) for alt in example.alternatives),
    )


def canonicalize(example: Example, rewrite: RewriteText = "identifiers") -> tuple[Example, NameMap]:
    """The example under canonical names, and the map that translates its calls back."""
    interface, nmap = canonicalize_interface(example.interface)
    return apply_name_map(example, interface, nmap, rewrite), nmap
