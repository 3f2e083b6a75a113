"""Release gate: compare two tool lists and classify every change as drift or a contract change.

Drift keeps every capability and every previously valid call meaningful; the guard (or a robust
policy) should absorb it. A contract change can make a previously valid call invalid or remove
what a workflow relies on; a deployment pipeline should stop on it (`cipr-guard diff` exits 1, as
`diff` does on a difference; 0 when the contract is unchanged, 2 on bad input).

Drift kinds: `renamed_tool`, `renamed_parameter`, `reordered_tools`, `reordered_parameters`,
`reworded_description`, `reworded_parameter_description`, `overlapping_tool_added` (an added tool
whose description overlaps an existing one: the study's distractor, and the shape a malicious
look-alike takes), `added_optional_parameter`, `became_optional`, `widened_type`, `removed_enum`,
`added_enum_values`.

Contract kinds: `removed_tool`, `removed_parameter` (both: a removed capability),
`added_required_parameter`, `became_required`, `narrowed_type`, `changed_type`, `added_enum`,
`removed_enum_values`, `replaced_enum_values`, `changed_constraint` (minimum, pattern,
additionalProperties, ...), `changed_reference` (a `$ref` or the definitions it points into changed:
what the reference accepts is not compared, so any change blocks), `invalid_schema` (a new schema
that cannot be a contract: a remote or dangling `$ref`, nesting beyond the limit, not a valid
schema; see `cipr.guard.contract.schema_problem`), and `added_tool` (a tool unlike any existing one).

Choices the guide (docs/references.md) leaves open:
- Renames are found by matching: an old and a new tool both unmatched by name pair up when
  `0.6 * description similarity + 0.4 * schema similarity >= rename_threshold` (greedy, best first). A
  renamed parameter must keep its type; pairs are scored by description similarity and enum equality.
  Text similarity is difflib's ratio over lowercase words. An added tool overlaps an existing one when
  `text_overlap` of their descriptions reaches `overlap_threshold` (a distractor embedding an existing
  description overlaps fully). A renamed tool's parameters are still compared (rename + narrowed type
  reports both).
- A new tool that overlaps nothing is a new capability. The guide treats new capabilities and side
  effects as authorization changes, and a contract refresh never authorizes a tool by itself, so
  by default it is a contract change (`added_tool_is_contract=False` makes it drift).
- Type comparison treats `integer` as a subset of `number` and a schema without `type` as any
  value, except that a schema with a `$ref` is not read as "any value" (string → `$ref` is a
  `changed_reference`, never a widened type). Constraint keywords and unmodelled composition keywords
  (`allOf`, `not`, `if`, `patternProperties`, ...) are compared for equality only: any change blocks.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import iter_jsonl, parse_json, read_text
from cipr.guard.contract import (
    MAX_SCHEMA_DEPTH,
    check_entries_depth,
    contract_hash,
    nesting_depth,
    schema_problem,
)
from cipr.tools.interface import Interface, Tool

DRIFT, CONTRACT = "drift", "contract"
DRIFT_KINDS = frozenset({
    "renamed_tool", "renamed_parameter", "reordered_tools", "reordered_parameters", "reworded_description",
    "reworded_parameter_description", "overlapping_tool_added", "added_optional_parameter", "became_optional",
    "widened_type", "removed_enum", "added_enum_values"})
CONTRACT_KINDS = frozenset({
    "removed_tool", "removed_parameter", "added_required_parameter", "became_required", "narrowed_type",
    "changed_type", "added_enum", "removed_enum_values", "replaced_enum_values", "changed_constraint",
    "changed_reference", "invalid_schema", "added_tool"})
CONSTRAINT_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
                   "maxLength", "pattern", "format", "minItems", "maxItems", "uniqueItems", "const",
                   "additionalProperties", "minProperties", "maxProperties",
                   "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                   "patternProperties", "propertyNames", "prefixItems", "contains", "minContains",
                   "maxContains", "unevaluatedProperties", "unevaluatedItems")
REFERENCE_KEYS = ("$ref", "$defs", "definitions", "$dynamicRef", "$anchor", "$dynamicAnchor", "$id")


@dataclass(frozen=True)
class DiffConfig:
    """Thresholds of the rename and overlap heuristics (see the module docstring)."""

    rename_threshold: float = 0.6
    overlap_threshold: float = 0.5
    added_tool_is_contract: bool = True

    def __post_init__(self) -> None:
        for name in ("rename_threshold", "overlap_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must be a number from 0 to 1, got {value!r}")


@dataclass(frozen=True)
class Change:
    """One difference: `tool` is the old name (the new one for additions), `path` the parameter path."""

    kind: str
    category: str
    tool: str
    path: str = ""
    old: Any = None
    new: Any = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "category": self.category, "tool": self.tool, "path": self.path,
                "old": self.old, "new": self.new, "detail": self.detail}


@dataclass(frozen=True)
class DiffReport:
    """All changes between two tool lists, with the versions of both."""

    old_version: str
    new_version: str
    changes: tuple[Change, ...] = field(default_factory=tuple)

    @property
    def has_contract_change(self) -> bool:
        return any(c.category == CONTRACT for c in self.changes)

    @property
    def verdict(self) -> str:
        return "block" if self.has_contract_change else "pass"

    def counts(self) -> dict[str, int]:
        return {DRIFT: sum(c.category == DRIFT for c in self.changes),
                CONTRACT: sum(c.category == CONTRACT for c in self.changes)}

    def to_json(self) -> dict[str, Any]:
        return {"old_version": self.old_version, "new_version": self.new_version, "verdict": self.verdict,
                "counts": self.counts(), "changes": [c.to_json() for c in self.changes]}

    def to_markdown(self) -> str:
        counts = self.counts()
        lines = [f"# Tool interface diff: {self.old_version} -> {self.new_version}", "",
                 f"Verdict: **{self.verdict.upper()}** ({counts[CONTRACT]} contract change(s), "
                 f"{counts[DRIFT]} drift change(s))", ""]
        if not self.changes:
            return "\n".join(lines + ["No changes."]) + "\n"
        lines += ["| category | kind | tool | path | old | new | detail |", "|---|---|---|---|---|---|---|"]
        for c in sorted(self.changes, key=lambda c: (c.category != CONTRACT, c.tool, c.path)):
            cells = [c.category, c.kind, c.tool, c.path, _cell(c.old), _cell(c.new), c.detail]
            lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells)
                         + " |")
        return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _change(kind: str, tool: str, path: str = "", old: Any = None, new: Any = None, detail: str = "", *,
            category: str | None = None) -> Change:
    if category is None:
        category = DRIFT if kind in DRIFT_KINDS else CONTRACT
    return Change(kind, category, tool, path, old, new, detail)


def text_similarity(a: str, b: str) -> float:
    """difflib ratio over lowercase word sequences (1.0 for two empty texts)."""
    wa, wb = re.findall(r"\w+", a.lower()), re.findall(r"\w+", b.lower())
    if not wa and not wb:
        return 1.0
    return difflib.SequenceMatcher(None, wa, wb, autojunk=False).ratio()


def text_overlap(a: str, b: str) -> float:
    """Share of the shorter text's words that the longer one contains in order (difflib's matching
    blocks over lowercase words): 1.0 when one description embeds the other."""
    wa, wb = re.findall(r"\w+", a.lower()), re.findall(r"\w+", b.lower())
    if not wa or not wb:
        return 1.0 if not wa and not wb else 0.0
    blocks = difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_matching_blocks()
    return sum(bl.size for bl in blocks) / min(len(wa), len(wb))


def _types(schema: Any) -> frozenset[str]:
    if not isinstance(schema, Mapping):
        return frozenset({"any"})
    t = schema.get("type")
    if isinstance(t, str):
        return frozenset({t})
    if isinstance(t, list):
        return frozenset(map(str, t))
    alts = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alts, list):
        return frozenset().union(*(_types(a) for a in alts))
    return frozenset({"any"})


def _accepts(types: frozenset[str], t: str) -> bool:
    return "any" in types or t in types or (t == "integer" and "number" in types)


def _covers(outer: frozenset[str], inner: frozenset[str]) -> bool:
    """Whether every value of a type in `inner` is accepted by `outer`."""
    if "any" in inner:
        return "any" in outer
    return all(_accepts(outer, t) for t in inner)


def _schema_similarity(a: Tool, b: Tool) -> float:
    """Similarity of two tools' parameter lists: matched (type, required) signatures over the larger list."""
    sig_a = sorted((tuple(sorted(_types(s))), n in a.required) for n, s in a.properties.items())
    sig_b = sorted((tuple(sorted(_types(s))), n in b.required) for n, s in b.properties.items())
    if not sig_a and not sig_b:
        return 1.0
    rest = list(sig_b)
    common = 0
    for s in sig_a:
        if s in rest:
            rest.remove(s)
            common += 1
    return common / max(len(sig_a), len(sig_b))


def tool_similarity(a: Tool, b: Tool) -> float:
    return 0.6 * text_similarity(a.description, b.description) + 0.4 * _schema_similarity(a, b)


def _pair(old: Sequence[str], new: Sequence[str], score: Any,
          threshold: float) -> list[tuple[str, str, float]]:
    scored = sorted(((score(o, n), i, j) for i, o in enumerate(old) for j, n in enumerate(new)),
                    key=lambda x: (-x[0], x[1], x[2]))
    used_o: set[int] = set()
    used_n: set[int] = set()
    pairs = []
    for s, i, j in scored:
        if s < threshold or i in used_o or j in used_n:
            continue
        used_o.add(i)
        used_n.add(j)
        pairs.append((old[i], new[j], s))
    return pairs


def _order_changed(old_order: Sequence[str], new_order: Sequence[str], mapping: Mapping[str, str]) -> bool:
    mapped = [mapping[o] for o in old_order if o in mapping]
    return mapped != [n for n in new_order if n in set(mapped)]


def _compare_enum(tool: str, path: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    eo, en = old.get("enum"), new.get("enum")
    if eo is None and en is None:
        return []
    if eo is None:
        return [_change("added_enum", tool, path, None, en, "values are now restricted")]
    if en is None:
        return [_change("removed_enum", tool, path, eo, None, "values are no longer restricted")]
    key = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
    so, sn = {key(v) for v in eo}, {key(v) for v in en}
    removed = [v for v in eo if key(v) not in sn]
    added = [v for v in en if key(v) not in so]
    if removed and added:
        return [_change("replaced_enum_values", tool, path, removed, added, "values replaced")]
    if removed:
        return [_change("removed_enum_values", tool, path, removed, None, "values no longer accepted")]
    if added:
        return [_change("added_enum_values", tool, path, None, added, "more values accepted")]
    return []


def _compare_schema(tool: str, path: str, old: Any, new: Any, cfg: DiffConfig) -> list[Change]:
    """Changes between two (sub)schemas at `path`: type, enum, constraints, properties, items."""
    old = old if isinstance(old, Mapping) else {}
    new = new if isinstance(new, Mapping) else {}
    out: list[Change] = []
    for key in REFERENCE_KEYS:
        if old.get(key) != new.get(key):
            out.append(_change("changed_reference", tool, path, {key: old.get(key)}, {key: new.get(key)},
                               "what a reference accepts is not compared"))
    to, tn = _types(old), _types(new)
    if to != tn and "$ref" not in old and "$ref" not in new:
        fwd, back = _covers(tn, to), _covers(to, tn)
        if fwd and not back:
            out.append(_change("widened_type", tool, path, sorted(to), sorted(tn)))
        elif back and not fwd:
            out.append(_change("narrowed_type", tool, path, sorted(to), sorted(tn)))
        elif not (fwd and back):
            out.append(_change("changed_type", tool, path, sorted(to), sorted(tn)))
    out += _compare_enum(tool, path, old, new)
    for key in CONSTRAINT_KEYS:
        if key == "additionalProperties" and (isinstance(old.get(key), Mapping)
                                              or isinstance(new.get(key), Mapping)):
            out += _compare_schema(tool, f"{path}{{}}", old.get(key), new.get(key), cfg)
        elif old.get(key) != new.get(key):
            out.append(_change("changed_constraint", tool, f"{path}", {key: old.get(key)},
                               {key: new.get(key)}))
    if "properties" in old or "properties" in new:
        out += _compare_properties(tool, path, old, new, cfg)
    if isinstance(old.get("items"), Mapping) and isinstance(new.get("items"), Mapping):
        out += _compare_schema(tool, f"{path}[]", old["items"], new["items"], cfg)
    return out


def _param_rename_score(old: Mapping[str, Any], new: Mapping[str, Any]) -> float:
    if _types(old) != _types(new):
        return 0.0
    enum_equal = 1.0 if old.get("enum") == new.get("enum") else 0.0
    return 0.5 + 0.3 * text_similarity(str(old.get("description", "")), str(new.get("description", ""))) \
        + 0.2 * enum_equal


def _compare_properties(tool: str, path: str, old: Mapping[str, Any], new: Mapping[str, Any],
                        cfg: DiffConfig) -> list[Change]:
    po, pn = dict(old.get("properties") or {}), dict(new.get("properties") or {})
    ro, rn = set(old.get("required") or []), set(new.get("required") or [])
    prefix = f"{path}." if path else ""
    mapping = {n: n for n in po if n in pn}
    lost = [n for n in po if n not in pn]
    gained = [n for n in pn if n not in po]
    out: list[Change] = []
    for o, n, s in _pair(lost, gained, lambda o, n: _param_rename_score(po[o], pn[n]), cfg.rename_threshold):
        mapping[o] = n
        out.append(_change("renamed_parameter", tool, prefix + o, o, n, f"same type, match score {s:.2f}"))
    for o in lost:
        if o not in mapping:
            out.append(_change("removed_parameter", tool, prefix + o, o, None,
                               "required" if o in ro else "optional"))
    matched_new = set(mapping.values())
    for n in gained:
        if n not in matched_new:
            kind = "added_required_parameter" if n in rn else "added_optional_parameter"
            out.append(_change(kind, tool, prefix + n, None, n))
    if _order_changed(list(po), list(pn), mapping):
        out.append(_change("reordered_parameters", tool, path or "parameters", list(po), list(pn)))
    for o, n in mapping.items():
        where = prefix + o
        if o not in ro and n in rn:
            out.append(_change("became_required", tool, where, "optional", "required"))
        elif o in ro and n not in rn:
            out.append(_change("became_optional", tool, where, "required", "optional"))
        so, sn = po[o] if isinstance(po[o], Mapping) else {}, pn[n] if isinstance(pn[n], Mapping) else {}
        if (" ".join(str(so.get("description", "")).split())
                != " ".join(str(sn.get("description", "")).split())):
            out.append(_change("reworded_parameter_description", tool, where, so.get("description"),
                               sn.get("description")))
        out += _compare_schema(tool, where, so, sn, cfg)
    return out


def diff_interfaces(old: Interface | Sequence[Tool], new: Interface | Sequence[Tool],
                    config: DiffConfig | None = None) -> DiffReport:
    """Every change from `old` to `new`, classified (see the module docstring)."""
    cfg = config or DiffConfig()
    old_tools, new_tools = tuple(old), tuple(new)
    for label, tools in (("old", old_tools), ("new", new_tools)):
        dup = [n for i, n in enumerate(t.name for t in tools) if n in [t.name for t in tools[:i]]]
        if dup:
            raise DataError(f"duplicate tool name(s) {sorted(set(dup))}: a release list must name each "
                            "tool once", file=f"<{label}>", field="name")
    problems = {t.name: schema_problem(t.parameters) for t in new_tools}
    for t in old_tools:
        if nesting_depth(t.parameters, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
            raise DataError(f"parameters nest deeper than {MAX_SCHEMA_DEPTH} levels", file="<old>",
                            item=t.name, field="parameters")
    by_old = {t.name: t for t in old_tools}
    by_new = {t.name: t for t in new_tools}
    mapping = {n: n for n in by_old if n in by_new}
    lost = [t.name for t in old_tools if t.name not in by_new]
    gained = [t.name for t in new_tools if t.name not in by_old]
    changes = [_change("invalid_schema", name, "parameters", None, None, problem)
               for name, problem in problems.items() if problem is not None]
    for o, n, s in _pair(lost, gained, lambda o, n: tool_similarity(by_old[o], by_new[n]),
                         cfg.rename_threshold):
        mapping[o] = n
        changes.append(_change("renamed_tool", o, "", o, n,
                               f"matched by description and schema, score {s:.2f}"))
    for o in lost:
        if o not in mapping:
            changes.append(_change("removed_tool", o, "", o, None, "capability removed"))
    matched_new = set(mapping.values())
    for n in gained:
        if n in matched_new:
            continue
        best = max(old_tools, key=lambda t: text_overlap(t.description, by_new[n].description), default=None)
        overlap = text_overlap(best.description, by_new[n].description) if best else 0.0
        if best is not None and overlap >= cfg.overlap_threshold:
            changes.append(_change("overlapping_tool_added", n, "", None, n,
                                   f"description overlaps {best.name!r} ({overlap:.2f})"))
        else:
            changes.append(_change("added_tool", n, "", None, n, "new capability: needs authorization",
                                   category=CONTRACT if cfg.added_tool_is_contract else DRIFT))
    if _order_changed([t.name for t in old_tools], [t.name for t in new_tools], mapping):
        changes.append(_change("reordered_tools", "", "", [t.name for t in old_tools],
                               [t.name for t in new_tools]))
    for o, n in mapping.items():
        to, tn = by_old[o], by_new[n]
        if " ".join(to.description.split()) != " ".join(tn.description.split()):
            changes.append(_change("reworded_description", o, "", to.description, tn.description))
        if nesting_depth(tn.parameters, MAX_SCHEMA_DEPTH) <= MAX_SCHEMA_DEPTH:
            changes += _compare_schema(o, "", to.parameters, tn.parameters, cfg)
    return DiffReport(contract_hash(old_tools), contract_hash(new_tools), tuple(changes))


def _entry_tool(entry: Any, where: str, index: int) -> Tool:
    from cipr.tools.schema import normalize_schema

    if not isinstance(entry, Mapping):
        raise DataError("a tool entry must be an object", file=where, field=f"tools[{index}]")
    mcp = "inputSchema" in entry
    fn = entry if mcp else (entry.get("function") if isinstance(entry.get("function"), Mapping) else entry)
    key = "inputSchema" if mcp else "parameters"
    params = fn.get(key)
    if isinstance(params, Mapping) and params.get("type") == "dict":  # BFCL's Python dialect
        fn = {**fn, key: normalize_schema(params, where=f"tools[{index}].{key}", file=where,
                                          item=str(fn.get("name")))}
    return Tool.from_mcp(fn, where=where) if mcp else Tool.from_openai(fn, where=where)


def _read_json(text: str, where: str, item: str | None) -> Any:
    """One JSON document, or the row `item` of a JSON-lines file."""
    try:
        return parse_json(text, where)
    except DataError as e:
        if isinstance(e.__cause__, RecursionError):
            raise DataError(f"nests too deeply to read (a tool schema may nest at most {MAX_SCHEMA_DEPTH} "
                            "levels)", file=where) from e
        if not (isinstance(e.__cause__, json.JSONDecodeError) and e.__cause__.msg == "Extra data"):
            raise  # one broken document, not several
    rows = [row for _, row in iter_jsonl(text, where)]
    if item is None:
        raise DataError("a JSON-lines file holds several tool lists: pass the item id", file=where,
                        field="id")
    found = [r for r in rows if isinstance(r, Mapping) and r.get("id") == item]
    if not found:
        raise DataError("no row has this id", file=where, item=item, field="id")
    return found[0]


def load_tool_list(path: str | Path, *, item: str | None = None) -> Interface:
    """A tool list from a JSON file: OpenAI `tools` (wrapped or bare functions), an MCP `tools/list`
    result or its `tools` array, or a BFCL question (`function` list; BFCL's `dict` dialect is
    normalized). A JSON-lines file of BFCL questions needs `item` (the question id)."""
    path = Path(path)
    where = str(path)
    try:
        text = read_text(path)
    except OSError as e:
        raise DataError(f"cannot read the tool list: {e.strerror or e}", file=where) from e
    data = _read_json(text, where, item)
    check_entries_depth(data, where=where)
    if isinstance(data, Mapping) and item is not None and data.get("id") not in (None, item):
        raise DataError(f"the file holds item {data.get('id')!r}, not the requested one", file=where,
                        item=item)
    if isinstance(data, Mapping):
        for key in ("tools", "function", "functions"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            raise DataError("expected a list of tools, or an object with a 'tools' or 'function' list",
                            file=where)
    if not isinstance(data, list):
        raise DataError("expected a list of tools", file=where)
    return Interface(tuple(_entry_tool(e, where, i) for i, e in enumerate(data)))
