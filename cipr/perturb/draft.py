"""A mutable working copy of an Example that perturbations edit, and its conversion back.

Perturbations build the perturbed interface as a list of `Entry`s (tool + what it stands for) and keep the
reference calls attached to entry *positions*, not names, so a same-name duplicate or a renamed tool never
makes a reference ambiguous. `Draft.finish` writes the Example under the original (constructed) names or
canonical ids and returns the Correspondence.

Choices:
- Canonical names are applied AFTER the interface is constructed (paper, Appendix C): ids follow the final
  tool order, argument ids the final property order. A reference call keeps pointing at its declaration, even
  when a same-name duplicate comes first.
- With canonical names, free text (messages, tool and argument descriptions) gets the written names replaced
  as `cipr.tools.canonical.canonicalize` does (first declaration of a name wins). With original names,
  held-out perturbations leave the text alone: the paper keeps the query, so a familiar name in it keeps
  pointing where it now points.
- Calls in earlier turns name source tools; they are rewritten to the source tool's equivalent.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cipr.core.errors import DataError
from cipr.perturb.correspondence import Correspondence
from cipr.tools.canonical import canonical_arg_id, canonical_tool_id, rewrite_text, rewrite_tool_text
from cipr.tools.interface import Call, Example, Interface, Message, Tool, last_user

Names = Literal["original", "canonical"]


def rng_for(seed: int, example_id: str, perturbation: str) -> random.Random:
    """A generator determined by (seed, item id, perturbation): the same triple gives the same draws
    in every process (string seeds are hashed with SHA-512 by `random.Random`)."""
    return random.Random(f"{seed}\x1f{example_id}\x1f{perturbation}")


@dataclass(eq=False)
class Entry:
    """One tool of the perturbed interface and what it stands for (see Correspondence)."""

    tool: Tool
    sources: tuple[str, ...] = ()
    twin_of: str | None = None
    role: str = "equivalent"
    args: dict[str, str] = field(default_factory=dict)  # current argument name -> source argument name


@dataclass(eq=False)
class RefCall:
    """A reference call attached to an entry position; `accepted` is BFCL's accepted-values map."""

    entry: int
    arguments: dict[str, Any]
    accepted: dict[str, Any] | None = None


@functools.lru_cache(maxsize=256)
def arg_ids(n: int) -> tuple[str, ...]:
    return tuple(canonical_arg_id(j, n) for j in range(n))


def with_parameters(tool: Tool, properties: Mapping[str, Any], required: list[str] | tuple[str, ...],
                    **extra: Any) -> Tool:
    """A copy of `tool` with new properties and required list (other schema keywords kept)."""
    params = dict(tool.parameters)
    params["properties"] = dict(properties)
    if required or "required" in params:
        params["required"] = [r for r in required if r in properties]
    params.update(extra)
    return Tool(tool.name, tool.description, params)


def rename_schema_args(parameters: Mapping[str, Any], amap: Mapping[str, str]) -> dict[str, Any]:
    """Parameters with property names renamed through `amap` (properties, required, and the
    `allOf`/`if`/`then` clauses a merged tool carries). Values are shared, not copied."""
    params = dict(parameters)
    props = params.get("properties") or {}
    params["properties"] = {amap.get(k, k): v for k, v in props.items()}
    if "required" in params:
        params["required"] = [amap.get(r, r) for r in params["required"]]
    if "allOf" in params:
        clauses = []
        for clause in params["allOf"]:
            c = dict(clause)
            for key in ("if", "then"):
                if key in c:
                    sub = dict(c[key])
                    if "properties" in sub:
                        sub["properties"] = {amap.get(k, k): v for k, v in sub["properties"].items()}
                    if "required" in sub:
                        sub["required"] = [amap.get(r, r) for r in sub["required"]]
                    c[key] = sub
            clauses.append(c)
        params["allOf"] = clauses
    return params


class Draft:
    """Working copy of `example`: entries (tools), reference calls by position, messages, notes."""

    def __init__(self, example: Example) -> None:
        self.example = example
        self.entries: list[Entry] = [Entry(t, (t.name,), None, "equivalent", {a: a for a in t.properties})
                                     for t in example.interface]
        first: dict[str, int] = {}
        for i, t in enumerate(example.interface):
            first.setdefault(t.name, i)
        self._first = first

        def attach(c: Call, acc: Mapping[str, Any] | None, where: str) -> RefCall:
            if c.name not in first:
                raise DataError(f"reference call names {c.name!r}, which the interface does not declare",
                                item=example.id, field=where)
            return RefCall(first[c.name], dict(c.arguments), dict(acc) if acc is not None else None)

        acc = example.accepted
        self.reference: list[RefCall] = [attach(c, acc[k] if acc is not None else None, "reference")
                                         for k, c in enumerate(example.reference)]
        self.alternatives: list[list[RefCall]] = [[attach(c, None, "alternatives") for c in alt]
                                                  for alt in example.alternatives]
        self.messages: list[Message] = list(example.messages)
        self.notes: list[str] = []

    # ------------------------------------------------------------------ queries
    def all_calls(self) -> list[RefCall]:
        return self.reference + [c for alt in self.alternatives for c in alt]

    def called(self) -> list[int]:
        """Distinct entry positions the reference calls use, in call order."""
        out: list[int] = []
        for c in self.reference:
            if c.entry not in out:
                out.append(c.entry)
        return out

    def names(self) -> set[str]:
        return {e.tool.name for e in self.entries}

    def position(self, entry: Entry) -> int:
        """The current position of `entry` (by identity)."""
        for k, e in enumerate(self.entries):
            if e is entry:
                return k
        raise ValueError("entry is not part of this draft")

    def calls_on(self, i: int) -> list[RefCall]:
        return [c for c in self.all_calls() if c.entry == i]

    def used_arguments(self, i: int) -> list[str]:
        """Arguments of entry i that some reference call passes, in schema order."""
        used = {k for c in self.calls_on(i) for k in c.arguments}
        return [a for a in self.entries[i].tool.properties if a in used]

    @property
    def query(self) -> str:
        return last_user(self.messages)

    # ------------------------------------------------------------------ edits
    def insert(self, pos: int, entry: Entry) -> None:
        """Insert an entry at `pos`; reference calls keep pointing at their tools."""
        self.entries.insert(pos, entry)
        for c in self.all_calls():
            if c.entry >= pos:
                c.entry += 1

    def remove(self, pos: int) -> None:
        """Remove an entry no reference call points at."""
        if any(c.entry == pos for c in self.all_calls()):
            raise ValueError(f"entry {pos} is still referenced")
        del self.entries[pos]
        for c in self.all_calls():
            if c.entry > pos:
                c.entry -= 1

    def reorder(self, order: list[int]) -> None:
        """New entry order: `order[k]` is the old position of the k-th entry."""
        new_pos = {old: k for k, old in enumerate(order)}
        self.entries = [self.entries[old] for old in order]
        for c in self.all_calls():
            c.entry = new_pos[c.entry]

    def rename_argument(self, i: int, old: str, new: str) -> None:
        """Rename argument `old` of entry i to `new` everywhere (schema, calls, accepted lists)."""
        e = self.entries[i]
        if new in e.tool.properties:
            raise ValueError(f"{e.tool.name} already has an argument {new!r}")
        e.tool = Tool(e.tool.name, e.tool.description, rename_schema_args(e.tool.parameters, {old: new}))
        if old in e.args:
            e.args[new] = e.args.pop(old)
        for c in self.calls_on(i):
            if old in c.arguments:
                c.arguments = {new if k == old else k: v for k, v in c.arguments.items()}
            if c.accepted is not None and old in c.accepted:
                c.accepted = {new if k == old else k: v for k, v in c.accepted.items()}

    def set_query(self, text: str) -> None:
        """Replace the content of the last user message."""
        for k in range(len(self.messages) - 1, -1, -1):
            m = self.messages[k]
            if m.role == "user":
                self.messages[k] = Message(m.role, text, m.calls, m.name)
                return
        raise DataError("the example has no user message to perturb", item=self.example.id, field="messages")

    def rename_in_text(self, mapping: Mapping[str, str]) -> None:
        """Replace whole-identifier tool names in free text: the messages and the descriptions of every
        tool and argument (used by relabeling, which renames everywhere)."""
        self.messages = [Message(m.role, rewrite_text(m.content, mapping), m.calls, m.name)
                         for m in self.messages]
        for e in self.entries:
            e.tool = rewrite_tool_text(e.tool, mapping)

    # ------------------------------------------------------------------ output
    def finish(self, *, names: Names = "original", perturbation: str = "",
               meta: Mapping[str, Any] | None = None) -> tuple[Example, Correspondence]:
        """The Example under original (constructed) names or canonical ids, and its Correspondence."""
        if names not in ("original", "canonical"):
            raise ValueError(f"names must be 'original' or 'canonical', got {names!r}")
        n = len(self.entries)
        tools: list[Tool] = []
        arg_maps: list[dict[str, str]] = []  # per entry: current argument -> written argument
        for i, e in enumerate(self.entries):
            if names == "canonical":
                props = list(e.tool.properties)
                amap = dict(zip(props, arg_ids(len(props)), strict=True))
                tools.append(Tool(canonical_tool_id(i, n), e.tool.description,
                                  rename_schema_args(e.tool.parameters, amap)))
            else:
                amap = {a: a for a in e.tool.properties}
                tools.append(e.tool)
            arg_maps.append(amap)
        written = [t.name for t in tools]

        def out_call(c: RefCall) -> Call:
            amap = arg_maps[c.entry]
            return Call(written[c.entry], {amap.get(k, k): v for k, v in c.arguments.items()})

        def out_accepted(c: RefCall) -> dict[str, Any]:
            amap = arg_maps[c.entry]
            return {amap.get(k, k): v for k, v in (c.accepted or {}).items()}

        # source name -> (entry position, source arg -> written arg), for calls in earlier turns
        by_source: dict[str, tuple[int, dict[str, str]]] = {}
        if any(m.calls or m.name is not None for m in self.messages):
            for i, e in enumerate(self.entries):
                for s in e.sources:
                    if s not in by_source:
                        by_source[s] = (i, {src: arg_maps[i].get(cur, cur) for cur, src in e.args.items()})

        def turn_call(c: Call) -> Call:
            if c.name not in by_source:
                return c
            i, amap = by_source[c.name]
            return Call(written[i], {amap.get(k, k): v for k, v in c.arguments.items()})

        text_map: dict[str, str] = {}
        if names == "canonical":
            for e, w in zip(self.entries, written, strict=True):
                text_map.setdefault(e.tool.name, w)
            tools = [rewrite_tool_text(t, text_map) for t in tools]
        messages = []
        for m in self.messages:
            content = rewrite_text(m.content, text_map)
            calls = tuple(turn_call(c) for c in m.calls)
            name = m.name
            if name is not None and name in by_source:
                name = written[by_source[name][0]]
            messages.append(Message(m.role, content, calls, name))

        accepted = None
        if self.example.accepted is not None:
            accepted = tuple(out_accepted(c) for c in self.reference)
        info: dict[str, Any] = {"name": perturbation, "names": names}
        if meta:
            info.update(meta)
        if self.notes:
            info["notes"] = list(self.notes)
        example = self.example.with_(
            messages=tuple(messages), interface=Interface(tuple(tools)),
            reference=tuple(out_call(c) for c in self.reference), accepted=accepted,
            alternatives=tuple(tuple(out_call(c) for c in alt) for alt in self.alternatives),
            meta={**dict(self.example.meta), "perturbation": info})
        corr = Correspondence(
            names=tuple(written),
            sources=tuple(e.sources for e in self.entries),
            twin_of=tuple(e.twin_of for e in self.entries),
            roles=tuple(e.role for e in self.entries),
            arguments=tuple({arg_maps[i][cur]: src for cur, src in e.args.items()}
                            for i, e in enumerate(self.entries)),
            source_names=self.example.interface.names,
            perturbation=perturbation,
            notes=tuple(self.notes))
        return example, corr
