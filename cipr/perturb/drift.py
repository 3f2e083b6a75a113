"""Held-out interface drift (the drift-repair study, docs/references.md), plus three types it never tested.

Single types (each applied once per called tool unless said otherwise):
- `stale_examples`: the called tool's description gains an example call in which the field the reference needs
  appears under an older name (`naming.drifted_name`). Schema and reference unchanged.
- `renamed_parameters`: one argument the reference passes is renamed in the schema (same generator); reference
  calls and accepted lists follow.
- `distractors`: per called tool, a sibling whose description embeds the original's in a sentence that makes
  it a different operation (history, preview, status, cancellation), under a name extending the original's.
  Not an equivalent.
- `type_narrowing`: one argument the reference passes is narrowed, the first kind available (`_narrowables`);
  when none qualifies (`any`, objects, booleans only), nothing changes (noted).
- `enum_replacement`: the values of an enum argument the reference passes get new spellings (`_replacement`)
  and the reference values are rewritten. Without such an enum, a passed free string (or array of free
  strings) is first narrowed to an enum, so the needed value always changes; otherwise nothing (noted).
- `refactor`: a multi-tool refactor. *Split* when a called tool has a boolean or enum argument that every
  reference call sets (no omission allowed): the tool becomes two, each handling one part of the values (the
  argument disappears when a part has one value), and each call goes to its part. Otherwise *merge*: the
  called tool absorbs another tool (an uncalled one of the list, else another called one, else an unrelated
  pool tool) behind a required `operation` argument whose values are the two tools' names as identifiers
  (values, so canonical names leave them as they are); it keeps its name and the other tool disappears. Split
  tools both map to the source tool; a merged tool maps to both sources: not a bijection, by design.

Composite settings (the study's guard evaluation): `mild` = 2 description changes, 2 schema changes, 1
distractor; `medium` = 3, 3, 3. A description change is a stale-field example, a schema change a parameter
rename; targets are the arguments the reference passes first, then the called tools' other arguments, then
other tools'. Renames happen first, so a stale example of a renamed field shows its actual former name. The
study counts "2종/3종" (two/three kinds); with one kind per family defined there, we read it as the number of
operations of each family.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from cipr.perturb.draft import Draft, Entry, RefCall, with_parameters
from cipr.perturb.naming import drifted_name, slug, unique
from cipr.perturb.pool import pick_unrelated
from cipr.scoring.bfcl import standardize
from cipr.scoring.bfcl_literals import NESTED_TYPES, read_value, write_value
from cipr.tools.interface import Tool

FILLER_VALUES = ("default", "other", "unspecified", "auto", "standard")
ENUM_STYLES = ("prefix", "code", "option")

SIBLINGS: tuple[tuple[str, str, bool], ...] = (
    ("_history", "Lists past requests made to the following operation instead of performing it: "
                 "{desc}", True),
    ("_preview", "Validates the inputs of the following operation and returns a preview without "
                 "performing it: {desc}", True),
    ("_status", "Checks the status of an earlier request to the following operation: {desc}", False),
    ("_cancel", "Cancels a pending request to the following operation: {desc}", False),
)


@dataclass(frozen=True)
class DriftConfig:
    """Counts of each drift family in a composite setting."""

    description_changes: int = 2
    schema_changes: int = 2
    distractors: int = 1


MILD = DriftConfig(2, 2, 1)
MEDIUM = DriftConfig(3, 3, 3)


def language_of(draft: Draft) -> str:
    """python, java or javascript (from `meta["language"]`, else the BFCL partition name)."""
    lang = draft.example.meta.get("language") if hasattr(draft.example.meta, "get") else None
    if lang:
        return str(lang).lower()
    part = draft.example.partition
    return "javascript" if "javascript" in part else "java" if "java" in part else "python"


# ----------------------------------------------------------------------------- values
def _needed_values(draft: Draft, i: int, arg: str) -> list[Any] | None:
    """Every value some call on entry i accepts for `arg` ("" dropped); None when a call (may) omit it."""
    out: list[Any] = []
    calls = draft.calls_on(i)
    if not calls:
        return None
    for c in calls:
        if c.accepted is not None and arg in c.accepted:
            vals = list(c.accepted[arg])
            if "" in vals:
                return None
        elif arg in c.arguments:
            vals = [c.arguments[arg]]
        else:
            return None
        if arg not in c.arguments:
            return None
        out.extend(v for v in vals if v not in out)
    return out


def _placeholder(schema: Any) -> Any:
    if isinstance(schema, dict) and schema.get("enum"):
        return schema["enum"][0]
    t = schema.get("type") if isinstance(schema, dict) else None
    return {"integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}.get(t, "...")


# ----------------------------------------------------------------------------- targets
def _arg_targets(draft: Draft, rng: random.Random) -> list[tuple[Entry, str]]:
    """(entry, argument) pairs in drift priority: passed by the reference, other arguments of called
    tools, arguments of the other tools; shuffled within each tier."""
    called = [draft.entries[i] for i in draft.called()]
    tiers: list[list[tuple[Entry, str]]] = [[], [], []]
    for e in draft.entries:
        i = draft.position(e)
        used = set(draft.used_arguments(i))
        for a in e.tool.properties:
            tier = (0 if a in used else 1) if any(e is c for c in called) else 2
            tiers[tier].append((e, a))
    out: list[tuple[Entry, str]] = []
    for t in tiers:
        rng.shuffle(t)
        out.extend(t)
    return out


def _one_per_called(draft: Draft, rng: random.Random) -> list[tuple[Entry, str | None]]:
    """One (entry, argument) per called tool: an argument its reference passes, else any, else None."""
    out: list[tuple[Entry, str | None]] = []
    for i in draft.called():
        e = draft.entries[i]
        used = draft.used_arguments(i)
        pool = used or list(e.tool.properties)
        out.append((e, rng.choice(pool) if pool else None))
    return out


# ----------------------------------------------------------------------------- operations
def add_stale_example(draft: Draft, entry: Entry, stale: dict[str, str | None], rng: random.Random) -> None:
    """Append to the tool's description one example call in which each field of `stale` appears
    under a stale name (the given one, or a drifted name when None). The example shows the fields
    the reference passes (else the required ones) plus the stale ones, with type placeholders."""
    tool = entry.tool
    props = tool.properties
    shown = draft.used_arguments(draft.position(entry)) or list(tool.required)
    shown = [*shown, *(a for a in stale if a not in shown)]
    names: dict[str, str] = {}
    for a, old in stale.items():
        names[a] = old or drifted_name(a, rng, set(props) | set(names.values()))
    example = {names.get(a, a): _placeholder(props.get(a, {})) for a in shown}
    text = f"{tool.description.strip()} Example: {json.dumps(example, ensure_ascii=False)}".strip()
    entry.tool = Tool(tool.name, text, tool.parameters)
    draft.notes.append(f"stale example in {tool.name}: "
                       + ", ".join(f"{v!r} for {k!r}" for k, v in names.items()))


def rename_parameter(draft: Draft, entry: Entry, arg: str, rng: random.Random) -> str:
    """Rename `arg` of `entry`'s tool to a drifted name; returns the new name."""
    new = drifted_name(arg, rng, set(entry.tool.properties))
    draft.rename_argument(draft.position(entry), arg, new)
    draft.notes.append(f"renamed {entry.tool.name}.{arg} -> {new}")
    return new


def add_overlapping_distractor(draft: Draft, entry: Entry, rng: random.Random) -> None:
    """A sibling of `entry`'s tool with an overlapping description and a different purpose (a sibling
    kind the tool does not have yet, while one is left)."""
    tool = entry.tool
    taken = draft.names()
    fresh = [s for s in SIBLINGS if tool.name + s[0] not in taken]
    suffix, template, same_params = rng.choice(fresh or SIBLINGS)
    name = unique(tool.name + suffix, tool.name, taken)
    params = tool.parameters if same_params else {
        "type": "object", "required": ["request_id"],
        "properties": {"request_id": {"type": "string", "description": "Identifier of the earlier request."}}}
    sib = Tool(name, template.format(desc=tool.description.strip()), params)
    draft.insert(rng.randrange(len(draft.entries) + 1), Entry(sib, (), tool.name, "distractor", {}))
    draft.notes.append(f"overlapping distractor {name}")


NARROWING_KINDS = ("integer", "enum", "items_enum", "int_enum", "enum_subset")
STRING_NARROWINGS = ("enum", "items_enum")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _narrowables(draft: Draft, i: int) -> dict[str, list[tuple[str, list[Any]]]]:
    """Arguments of entry i the reference passes that can be narrowed, by kind:
    - integer: `number` whose needed values are all integers (Python items; Java/JavaScript number
      types are source-literal dialects, left alone) -> `integer`;
    - enum: free `string` with string values -> `enum` of the needed values plus two fillers;
    - items_enum: `array` of free strings -> the same on `items`;
    - int_enum: free `integer` -> `enum` of the needed values plus two fillers;
    - enum_subset: an `enum` of at least four values -> the needed values plus one other.
    "Needed values" are every value an accepted option holds (list elements for arrays); an argument
    that a reference may omit is never narrowed (its default could fall outside the narrowed type)."""
    e = draft.entries[i]
    lang = language_of(draft)
    out: dict[str, list[tuple[str, list[Any]]]] = {k: [] for k in NARROWING_KINDS}
    for a in draft.used_arguments(i):
        s = e.tool.properties[a]
        vals = _needed_values(draft, i, a)
        if not isinstance(s, dict) or not vals:
            continue
        t = s.get("type")
        if isinstance(s.get("enum"), list):
            if len(s["enum"]) >= 4 and all(v in s["enum"] for v in vals):
                out["enum_subset"].append((a, vals))
            continue
        if t == "number" and lang == "python" and all(_is_int(v) for v in vals):
            out["integer"].append((a, vals))
        elif t == "string" and all(isinstance(v, str) and v for v in vals):
            out["enum"].append((a, vals))
        elif t == "integer" and all(_is_int(v) for v in vals):
            out["int_enum"].append((a, vals))
        elif t == "array" and isinstance(s.get("items"), dict) and s["items"].get("type") == "string" \
                and "enum" not in s["items"] and all(isinstance(v, list) for v in vals):
            flat = [x for v in vals for x in v]
            if flat and all(isinstance(x, str) and x for x in flat):
                out["items_enum"].append((a, list(dict.fromkeys(flat))))
    return out


def _set_schema(draft: Draft, entry: Entry, arg: str, schema: dict[str, Any], note: str) -> None:
    props = {k: (schema if k == arg else v) for k, v in entry.tool.properties.items()}
    entry.tool = with_parameters(entry.tool, props, entry.tool.required)
    draft.notes.append(f"narrowed {entry.tool.name}.{arg}: {note}")


def _with_fillers(values: list[Any], fillers: list[Any], rng: random.Random, k: int = 2) -> list[Any]:
    """`values` plus k fillers that differ from them (also after BFCL's string normalization), shuffled."""
    taken = {standardize(v) if isinstance(v, str) else v for v in values}
    free = [f for f in fillers if (standardize(f) if isinstance(f, str) else f) not in taken]
    enum = list(values) + rng.sample(free, min(k, len(free)))
    rng.shuffle(enum)
    return enum


def narrow(draft: Draft, entry: Entry, arg: str, kind: str, values: list[Any], rng: random.Random) -> None:
    """Apply one narrowing of `_narrowables` to `entry`'s argument `arg`."""
    schema = dict(entry.tool.properties[arg])
    if kind == "integer":
        schema["type"] = "integer"
        if "x-bfcl-type" in schema:
            schema["x-bfcl-type"] = "integer"
        return _set_schema(draft, entry, arg, schema, "number -> integer")
    if kind == "enum":
        schema["enum"] = _with_fillers(values, list(FILLER_VALUES), rng)
        return _set_schema(draft, entry, arg, schema, f"string -> enum {schema['enum']}")
    if kind == "items_enum":
        items = dict(schema["items"])
        items["enum"] = _with_fillers(values, list(FILLER_VALUES), rng)
        schema["items"] = items
        return _set_schema(draft, entry, arg, schema, f"array of string -> array of enum {items['enum']}")
    if kind == "int_enum":
        near = [v + d for v in values for d in (-1, 1, 10)] + [0, 1, 100]
        schema["enum"] = _with_fillers(values, list(dict.fromkeys(near)), rng)
        return _set_schema(draft, entry, arg, schema, f"integer -> enum {schema['enum']}")
    if kind == "enum_subset":
        others = [v for v in schema["enum"] if v not in values]
        keep = set(values) | {rng.choice(others)}
        schema["enum"] = [v for v in schema["enum"] if v in keep]
        return _set_schema(draft, entry, arg, schema, f"enum -> subset {schema['enum']}")
    raise ValueError(f"unknown narrowing kind {kind!r}")


def narrow_type(draft: Draft, rng: random.Random) -> None:
    """Narrow one passed argument per called tool: the first kind of NARROWING_KINDS available."""
    done = 0
    for i in draft.called():
        e = draft.entries[i]
        cands = _narrowables(draft, i)
        kind = next((k for k in NARROWING_KINDS if cands[k]), None)
        if kind is not None:
            a, vals = rng.choice(cands[kind])
            narrow(draft, e, a, kind, vals, rng)
            done += 1
    if not done:
        draft.notes.append("no argument to narrow: unchanged")


def _replacement(values: list[Any], arg: str, style: str) -> tuple[dict[Any, Any], str]:
    """New spellings for the string values of an enum: the requested style when its results are
    distinct from each other and from every old value *after BFCL's string normalization* (lower
    case, spaces and `,./-_*^` removed, `cipr.scoring.bfcl.standardize`; upper-casing or re-casing
    a value would be invisible to the scorer), else the next style that works, else an indexed
    prefix. Styles: `prefix` (`units_celsius`), `code` (`CELS`: upper-case leading letters, as short
    as keeps them apart, at least three), `option` (`opt_celsius`). Returns the table and the style."""
    strs = [v for v in values if isinstance(v, str)]
    old = {standardize(v) for v in strs}
    for st in [style] + [s for s in ENUM_STYLES if s != style]:
        if st == "prefix":
            new = {v: f"{slug(arg, 16)}_{slug(v, 32)}" for v in strs}
        elif st == "option":
            new = {v: f"opt_{slug(v, 32)}" for v in strs}
        else:
            new = {}
            for k in range(3, 9):
                new = {v: re.sub(r"[^A-Za-z0-9]", "", v).upper()[:k] or "V" for v in strs}
                if len(set(new.values())) == len(strs):
                    break
        normed = [standardize(x) for x in new.values()]
        if len(set(normed)) == len(normed) and not set(normed) & old:
            return new, st
    return {v: f"{slug(arg, 16)}_{k + 1}_{slug(v, 32)}" for k, v in enumerate(strs)}, "indexed"


def _map_value(v: Any, table: dict[Any, Any]) -> Any:
    if isinstance(v, str):
        return table.get(v, v)
    if isinstance(v, list):
        return [_map_value(x, table) for x in v]
    return v


def _map_literal(value: Any, table: dict[Any, Any], schema: dict[str, Any], language: str) -> Any:
    """`_map_value` for a reference argument: Java/JavaScript arguments are source literals, so they
    are read, mapped and written back with BFCL's converters (`cipr.scoring.bfcl_literals`)."""
    bfcl_type = schema.get("x-bfcl-type")
    if language == "python" or not bfcl_type or not isinstance(value, str):
        return _map_value(value, table)
    items = schema.get("items")
    nested = (items.get("x-bfcl-type")
              if isinstance(items, dict) and bfcl_type in NESTED_TYPES + ("tuple",) else None)
    parsed = read_value(value, language, bfcl_type, nested)
    mapped = _map_value(parsed, table)
    return value if mapped == parsed else write_value(mapped, language, bfcl_type, nested)


def _replace_enum(draft: Draft, entry: Entry, arg: str, rng: random.Random) -> None:
    schema = dict(entry.tool.properties[arg])
    holder = schema if "enum" in schema else dict(schema["items"])
    table, style = _replacement(list(holder["enum"]), arg, rng.choice(ENUM_STYLES))
    holder["enum"] = [table.get(v, v) if isinstance(v, str) else v for v in holder["enum"]]
    if holder is not schema:
        schema["items"] = holder
    if "default" in schema:
        schema["default"] = _map_value(schema["default"], table)
    props = {k: (schema if k == arg else v) for k, v in entry.tool.properties.items()}
    entry.tool = with_parameters(entry.tool, props, entry.tool.required)
    lang = language_of(draft)
    for c in draft.calls_on(draft.position(entry)):
        if arg in c.arguments:
            c.arguments = {**c.arguments, arg: _map_literal(c.arguments[arg], table, schema, lang)}
        if c.accepted is not None and arg in c.accepted:
            c.accepted = {**c.accepted, arg: tuple(_map_value(v, table) if v != "" else v
                                                     for v in c.accepted[arg])}
    draft.notes.append(f"enum values of {entry.tool.name}.{arg} replaced ({style})")


def _enum_args(draft: Draft, i: int) -> list[str]:
    e = draft.entries[i]
    out = []
    for a in draft.used_arguments(i):
        s = e.tool.properties[a]
        if not isinstance(s, dict):
            continue
        holder = s if "enum" in s else s.get("items") if isinstance(s.get("items"), dict) else None
        if holder and "enum" in holder and any(isinstance(v, str) for v in holder["enum"]):
            out.append(a)
    return out


def replace_enum_values(draft: Draft, rng: random.Random) -> None:
    """Replace the values of one passed enum argument per called tool (see the module docstring)."""
    done = 0
    for i in draft.called():
        e = draft.entries[i]
        enums = _enum_args(draft, i)
        if enums:
            _replace_enum(draft, e, rng.choice(enums), rng)
            done += 1
            continue
        cands = _narrowables(draft, i)
        kind = next((k for k in STRING_NARROWINGS if cands[k]), None)
        if kind is not None:
            a, vals = rng.choice(cands[kind])
            narrow(draft, e, a, kind, vals, rng)
            _replace_enum(draft, e, a, rng)
            done += 1
    if not done:
        draft.notes.append("no enum or free string argument passed: unchanged")


# ----------------------------------------------------------------------------- refactor
def _split_candidate(draft: Draft, i: int) -> tuple[str, list[list[Any]]] | None:
    """An argument of entry i to split on and its value groups, or None."""
    e = draft.entries[i]
    for a in draft.used_arguments(i):
        s = e.tool.properties[a]
        if not isinstance(s, dict):
            continue
        if s.get("type") == "boolean" and "enum" not in s:
            groups: list[list[Any]] = [[True], [False]]
        elif isinstance(s.get("enum"), list) and len(s["enum"]) >= 2 and \
                all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in s["enum"]):
            vals = list(s["enum"])
            half = (len(vals) + 1) // 2
            groups = [vals[:half], vals[half:]]
        else:
            continue
        ok = True
        for c in draft.calls_on(i):
            needed = list(c.accepted[a]) if c.accepted is not None and a in c.accepted else \
                [c.arguments[a]] if a in c.arguments else [""]
            if "" in needed or a not in c.arguments or \
                    not any(all(_in_group(v, g) for v in needed) for g in groups):
                ok = False
                break
        if ok:
            return a, groups
    return None


def _raw_value(c: RefCall, arg: str) -> Any:
    """The value a call needs for `arg` as plain data: the first accepted value when BFCL lists them
    (Java/JavaScript reference arguments are source literals), else the argument itself."""
    if c.accepted is not None and arg in c.accepted:
        return next(v for v in c.accepted[arg] if v != "")
    return c.arguments[arg]


def _in_group(v: Any, group: list[Any]) -> bool:
    return any(v == g and isinstance(v, bool) == isinstance(g, bool) for g in group)


def split_tool(draft: Draft, i: int, arg: str, groups: list[list[Any]]) -> None:
    """Replace entry i by one tool per value group of `arg` and route each call to its group."""
    e = draft.entries[i]
    tool = e.tool
    calls = draft.calls_on(i)
    halves: list[Entry] = []
    taken = draft.names()
    for g in groups:
        label = "_or_".join(slug(v) for v in g[:2]) + ("_etc" if len(g) > 2 else "")
        name = unique(f"{tool.name}_{slug(arg)}_{label}", tool.name, taken)
        taken.add(name)
        if len(g) == 1:
            props = {k: v for k, v in tool.properties.items() if k != arg}
            note = f" This tool only handles requests with {arg} = {json.dumps(g[0])}."
        else:
            props = {k: ({**v, "enum": list(g)} if k == arg else v) for k, v in tool.properties.items()}
            note = f" This tool only handles requests whose {arg} is one of {json.dumps(g)}."
        new = with_parameters(tool, props, [r for r in tool.required if r in props])
        new = Tool(name, (tool.description.strip() + note).strip(), new.parameters)
        halves.append(Entry(new, e.sources, None, "split", {k: v for k, v in e.args.items() if k in props}))
    draft.entries[i] = halves[0]
    draft.insert(i + 1, halves[1])
    for c in calls:
        value = _raw_value(c, arg)
        k = next(n for n, g in enumerate(groups) if _in_group(value, g))
        c.entry = i + k
        if len(groups[k]) == 1:
            c.arguments = {a: v for a, v in c.arguments.items() if a != arg}
            if c.accepted is not None:
                c.accepted = {a: v for a, v in c.accepted.items() if a != arg}
    draft.notes.append(f"split {tool.name} on {arg} into {halves[0].tool.name}, {halves[1].tool.name}")


def merge_tools(draft: Draft, i: int, other: Entry | Tool) -> None:
    """Entry i absorbs `other` (an entry of the draft, or an outside tool) behind an `operation` argument."""
    e = draft.entries[i]
    t = e.tool
    u = other.tool if isinstance(other, Entry) else other
    op_t = slug(t.name, 40)
    op_u = unique(slug(u.name, 40), op_t, ())
    props: dict[str, Any] = {"operation": {
        "type": "string", "enum": [op_t, op_u],
        "description": f"Which operation to perform: '{op_t}' or '{op_u}' (see the tool description)."}}
    props.update(t.properties)
    u_map: dict[str, str] = {}
    for k, v in u.properties.items():
        nk = k if k not in props else unique(f"{op_u}_{k}", k, set(props))
        u_map[k] = nk
        props[nk] = v
    params: dict[str, Any] = {"type": "object", "properties": props, "required": ["operation"], "allOf": [
        {"if": {"properties": {"operation": {"const": op_t}}}, "then": {"required": list(t.required)}},
        {"if": {"properties": {"operation": {"const": op_u}}},
         "then": {"required": [u_map[r] for r in u.required if r in u_map]}}]}
    desc = (f"Combined tool. With operation '{op_t}': {t.description.strip()} "
            f"With operation '{op_u}': {u.description.strip()}")
    args = dict(e.args)
    sources = e.sources
    if isinstance(other, Entry):
        args.update({u_map[k]: src for k, src in other.args.items()})
        sources = e.sources + other.sources
    e.tool = Tool(t.name, desc, params)
    e.args = args
    e.sources = sources
    e.role = "merged"

    def tag(c: RefCall, op: str, amap: dict[str, str] | None) -> None:
        c.arguments = {"operation": op, **{(amap or {}).get(k, k): v for k, v in c.arguments.items()}}
        if c.accepted is not None:
            c.accepted = {"operation": (op,), **{(amap or {}).get(k, k): v for k, v in c.accepted.items()}}

    for c in draft.calls_on(i):
        tag(c, op_t, None)
    if isinstance(other, Entry):
        j = draft.position(other)
        for c in draft.calls_on(j):
            tag(c, op_u, u_map)
            c.entry = i
        draft.remove(draft.position(other))
    draft.notes.append(f"merged {u.name} into {t.name} (operation {op_t!r} / {op_u!r})")


def refactor(draft: Draft, rng: random.Random) -> None:
    """Split a called tool when one qualifies, else merge it with another tool."""
    called = draft.called()
    if not called:
        draft.notes.append("nothing called: unchanged")
        return
    order = list(called)
    rng.shuffle(order)
    for i in order:
        cand = _split_candidate(draft, i)
        if cand is not None:
            split_tool(draft, i, *cand)
            return
    target = draft.entries[order[0]]
    uncalled = [e for k, e in enumerate(draft.entries) if k not in called]
    other_called = [draft.entries[k] for k in order[1:]]
    i = draft.position(target)
    if uncalled:
        merge_tools(draft, i, rng.choice(uncalled))
    elif other_called:
        merge_tools(draft, i, rng.choice(other_called))
    else:
        merge_tools(draft, i, pick_unrelated(target.tool, rng, avoid_names=draft.names()))


# ----------------------------------------------------------------------------- types
def stale_examples(draft: Draft, rng: random.Random) -> None:
    for e, a in _one_per_called(draft, rng):
        add_stale_example(draft, e, {a or "input": None}, rng)


def renamed_parameters(draft: Draft, rng: random.Random) -> None:
    renamed = 0
    for e, a in _one_per_called(draft, rng):
        if a is not None:
            rename_parameter(draft, e, a, rng)
            renamed += 1
    if not renamed:
        draft.notes.append("called tools have no arguments: unchanged")


def distractors(draft: Draft, rng: random.Random) -> None:
    for e in [draft.entries[i] for i in draft.called()]:
        add_overlapping_distractor(draft, e, rng)


def composite(draft: Draft, rng: random.Random, config: DriftConfig) -> None:
    """Schema renames, then stale-field examples (one example per tool holding all its stale fields),
    then overlapping distractors; counts from `config`."""
    targets = _arg_targets(draft, rng)
    former: dict[tuple[int, str], str] = {}  # (id(entry), new name) -> old name
    for e, a in targets[:config.schema_changes]:
        former[(id(e), rename_parameter(draft, e, a, rng))] = a
    if len(former) < config.schema_changes:
        draft.notes.append(f"only {len(former)} argument(s) to rename")
    current = _arg_targets(draft, rng)
    # renamed fields first, so their stale examples show the actual former names
    current.sort(key=lambda t: 0 if (id(t[0]), t[1]) in former else 1)
    stale: dict[int, tuple[Entry, dict[str, str | None]]] = {}
    for e, a in current[:config.description_changes]:
        stale.setdefault(id(e), (e, {}))[1][a] = former.get((id(e), a))
    if not current and config.description_changes:
        for i in draft.called()[:1]:
            stale[id(draft.entries[i])] = (draft.entries[i], {"input": None})
    for e, fields in stale.values():
        add_stale_example(draft, e, fields, rng)
    called = [draft.entries[i] for i in draft.called()] or list(draft.entries)
    for k in range(config.distractors):
        add_overlapping_distractor(draft, called[k % len(called)], rng)


__all__ = ["DriftConfig", "MILD", "MEDIUM", "composite", "distractors", "narrow_type", "refactor",
           "renamed_parameters", "replace_enum_values", "stale_examples"]
