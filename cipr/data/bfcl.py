"""BFCL v4 single-turn items with a reference answer, as Examples.

Reads `<root>/bfcl_v4/BFCL_v4_<partition>.json` (one JSON object per line: id, question, function)
and `<root>/bfcl_v4/possible_answer/BFCL_v4_<partition>.json` (id, ground_truth) for the ten
single-turn partitions with reference answers: 2,501 items in all (see PARTITIONS).

Each Example has:
- `messages`: the single turn of BFCL's `question` (a system message, if any, then the user's);
- `interface`: the declared functions, parameters normalized to JSON Schema by `cipr.tools.schema` (the
  BFCL type name kept in `x-bfcl-type`);
- `accepted`: BFCL's accepted-values lists, one mapping per reference call, argument -> tuple of
  accepted values (`""` among them marks an optional argument), unchanged;
- `reference`: one answer written as a prediction: the first accepted value of each argument that
  is not `""` (or `""` itself when it is the only one), dict values and the dicts in a list of
  dicts unwrapped from their own accepted lists the same way; an argument is omitted exactly when
  `""` is accepted and the tool's schema does not require it. Java and JavaScript values are
  written as source literals in strings (`cipr.scoring.bfcl_literals`), as BFCL's models answer,
  so `score_bfcl(example.reference, example)` is correct for every item;
- `meta`: `language` (python, java, javascript), and `anomalies` when the item has any.

Bad input raises DataError naming the file, item id and field: a line that is not JSON, a missing
id/question/function/ground_truth, a question that is not exactly one turn, a duplicate tool name
within an item, a schema that is not an object (or an unknown type name), a reference call to a
tool the item does not declare, answers that do not line up with questions.

BFCL's own data has reference answers that contradict their schemas. These items are kept, their
reference built as above, and each case is recorded in `BfclReport.anomalies` (and the item's
`meta["anomalies"]`): an accepted argument the tool does not declare (`undeclared_argument`), a
required argument the answer does not list (`required_not_in_answer`), an empty accepted-values
list (`empty_accepted`; the reference passes `[]`, the evident intent), a dict entry whose accepted
values are not a list (`non_list_accepted`). A question without an answer is skipped and counted in
`BfclReport.skipped` (there is none in v4).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import parse_json, read_text
from cipr.data.paths import data_root, require_dir
from cipr.scoring.bfcl_literals import NESTED_TYPES, write_value
from cipr.tools.interface import Call, Example, Interface, Message, Tool
from cipr.tools.schema import normalize_schema

# Partition -> number of items with a reference answer (BFCL v4, bfcl-eval 2026.3.23).
PARTITIONS: dict[str, int] = {
    "live_multiple": 1053, "simple_python": 400, "live_simple": 258, "multiple": 200, "parallel": 200,
    "parallel_multiple": 200, "simple_java": 100, "simple_javascript": 50, "live_parallel_multiple": 24,
    "live_parallel": 16,
}
TOTAL = sum(PARTITIONS.values())  # 2,501
IRRELEVANCE: dict[str, int] = {"irrelevance": 240, "live_irrelevance": 884}
"""BFCL v4's abstention items: no call is correct (`load_bfcl_irrelevance`)."""
NO_CALL_ANSWER = "None of the available tools can do this."
_ROLES = ("system", "user", "assistant")
_DICT_TYPES = ("dict", "HashMap", "Hashtable")


def partition_language(partition: str) -> str:
    """python, java or javascript, from the partition name (as BFCL's `is_java` / `is_js`)."""
    if "javascript" in partition:
        return "javascript"
    return "java" if "java" in partition else "python"


@dataclass
class BfclReport:
    """What a load kept, skipped and found odd: counts per partition, skips and anomalies by item."""

    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (file, item, reason)
    anomalies: list[tuple[str, str, str, str]] = field(default_factory=list)  # (item, kind, field, detail)

    def anomaly_counts(self) -> dict[str, int]:
        return dict(Counter(kind for _, kind, _, _ in self.anomalies))

    def to_json(self) -> dict[str, Any]:
        return {"partitions": dict(self.counts), "total": sum(self.counts.values()),
                "skipped": len(self.skipped), "anomalies": self.anomaly_counts()}


_LANGUAGE_HINT = {"python": " Note that the provided function is in Python 3 syntax.",
                  "java": " Note that the provided function is in Java 8 SDK syntax.",
                  "javascript": " Note that the provided function is in JavaScript syntax."}
_LANGUAGE_NAME = {"java": "Java", "javascript": "JavaScript"}


def bfcl_prompt_tool(tool: Tool, language: str) -> Tool:
    """The tool as BFCL shows it to a model (its `add_language_specific_hint_to_function_doc`).

    The description gets BFCL's language note. For Java and JavaScript, whose calls pass source literals in
    strings, every top-level parameter becomes `"type": "string"` with BFCL's hint on its declared type
    (`x-bfcl-type` kept for the scorer); array element types and JavaScript dict entries move into the
    description, as BFCL does. Renderers that want BFCL's presentation call this per tool; the Example keeps
    the typed schema.
    """
    description = tool.description + _LANGUAGE_HINT[language]
    if language == "python":
        return tool.with_(description=description)
    lang = _LANGUAGE_NAME[language]
    properties: dict[str, Any] = {}
    for name, schema in tool.properties.items():
        p = dict(schema)
        declared = p.get("x-bfcl-type", p.get("type", "any"))
        if declared == "any":
            note = f" This parameter can be of any type of {lang} object in string representation."
        else:
            note = f" This is {lang} {declared} type parameter in string representation."
        if declared in NESTED_TYPES and isinstance(p.get("items"), Mapping):
            element = p.pop("items")
            note += (f" The list elements are of type "
                     f"{element.get('x-bfcl-type', element.get('type', 'any'))}; "
                     "they are not in string representation.")
        if language == "javascript" and declared == "dict" and "properties" in p:
            note += (" The dictionary entries have the following schema; they are not in string "
                     "representation. " + json.dumps(p.pop("properties")))
        p["description"] = str(p.get("description", "")) + note
        p["type"] = "string"
        properties[name] = p
    return tool.with_(description=description, parameters={**tool.parameters, "properties": properties})


def bfcl_dir(root: str | Path | None = None) -> Path:
    """`<data root>/bfcl_v4`, which must exist."""
    return require_dir(data_root(root) / "bfcl_v4", "BFCL v4 data")


def load_bfcl(root: str | Path | None = None, partitions: Iterable[str] | None = None, *,
              report: BfclReport | None = None) -> list[Example]:
    """The BFCL v4 items with a reference answer, in PARTITIONS order (or the given partitions), from the data
    root `root` (default `cipr.data.paths.data_root()`); a BfclReport `report` receives the counts, skips and
    anomalies."""
    base = bfcl_dir(root)
    names = list(PARTITIONS) if partitions is None else list(partitions)
    unknown = [p for p in names if p not in PARTITIONS]
    if unknown:
        raise ConfigError(f"unknown BFCL partition(s) {unknown}; choose from {', '.join(PARTITIONS)}")
    report = report if report is not None else BfclReport()
    out: list[Example] = []
    for part in names:
        examples = _load_partition(base, part, report)
        report.counts[part] = len(examples)
        out.extend(examples)
    return out


def load_bfcl_irrelevance(root: str | Path | None = None, partitions: Iterable[str] | None = None
                          ) -> list[Example]:
    """BFCL v4's `irrelevance` and `live_irrelevance` items (or the given ones): the question and tools, no
    reference call (answering without a call is correct, as BFCL scores them), `NO_CALL_ANSWER` as the
    reference text; DataError naming the file, item and field for a malformed one."""
    base = bfcl_dir(root)
    names = list(IRRELEVANCE) if partitions is None else list(partitions)
    unknown = [p for p in names if p not in IRRELEVANCE]
    if unknown:
        raise ConfigError(f"unknown BFCL irrelevance partition(s) {unknown}; choose from "
                          f"{', '.join(IRRELEVANCE)}")
    out = []
    for part in names:
        path = base / f"BFCL_v4_{part}.json"
        out += [Example(q["id"], _messages(q, str(path)), _interface(q, "python", str(path), empty=True), (),
                        response=NO_CALL_ANSWER, source="bfcl", partition=part, meta={"language": "python"})
                for q in _read_jsonl(path)]
    return out


def bfcl_stats(root: str | Path | None = None) -> dict[str, Any]:
    """JSON-ready counts: {"partitions": {name: n}, "total", "skipped", "anomalies": {kind: n}}."""
    report = BfclReport()
    load_bfcl(root, report=report)
    return report.to_json()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError("file not found", file=str(path))
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, path, line=lineno)
        except DataError as e:
            raise DataError(e.reason, file=str(path), item=_guess_id(line), field=f"line {lineno}") from e
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise DataError(f"line {lineno} is not an object with a string id", file=str(path),
                            item=row.get("id") if isinstance(row, dict) else None, field="id")
        rows.append(row)
    return rows


def _guess_id(line: str) -> str | None:
    m = re.search(r'"id"\s*:\s*"([^"]*)"', line)
    return m.group(1) if m else None


def _load_partition(base: Path, part: str, report: BfclReport) -> list[Example]:
    qpath = base / f"BFCL_v4_{part}.json"
    apath = base / "possible_answer" / f"BFCL_v4_{part}.json"
    questions = _read_jsonl(qpath)
    answers: dict[str, dict[str, Any]] = {}
    for row in _read_jsonl(apath):
        if row["id"] in answers:
            raise DataError("duplicate answer id", file=str(apath), item=row["id"], field="id")
        answers[row["id"]] = row
    language = partition_language(part)
    seen: set[str] = set()
    out: list[Example] = []
    for q in questions:
        qid = q["id"]
        if qid in seen:
            raise DataError("duplicate question id", file=str(qpath), item=qid, field="id")
        seen.add(qid)
        answer = answers.get(qid)
        if answer is None:
            report.skipped.append((str(qpath), qid, "no reference answer"))
            continue
        out.append(_example(q, answer, part, language, str(qpath), str(apath), report))
    orphans = [a for a in answers if a not in seen]
    if orphans:
        raise DataError(f"{len(orphans)} answer(s) without a question", file=str(apath), item=orphans[0],
                        field="id")
    return out


def _messages(q: Mapping[str, Any], file: str) -> tuple[Message, ...]:
    turns = q.get("question")
    if not isinstance(turns, list) or len(turns) != 1 or not isinstance(turns[0], list):
        n = len(turns) if isinstance(turns, list) else type(turns).__name__
        raise DataError(f"a single-turn item needs exactly one turn (a list of messages), got {n}", file=file,
                        item=q["id"], field="question")
    out = []
    for i, m in enumerate(turns[0]):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"message must have a role in {_ROLES} and string content, got {m!r}"[:300],
                            file=file, item=q["id"], field=f"question[0][{i}]")
        out.append(Message(m["role"], m["content"]))
    return tuple(out)


def _interface(q: Mapping[str, Any], language: str, file: str, *, empty: bool = False) -> Interface:
    """The item's tools (`empty`: an empty list is allowed, as 4 live_irrelevance items have)."""
    functions = q.get("function")
    if not isinstance(functions, list) or not (functions or empty):
        raise DataError("function must be a non-empty list", file=file, item=q["id"], field="function")
    tools: list[Tool] = []
    names: set[str] = set()
    for i, fn in enumerate(functions):
        where = f"function[{i}]"
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DataError("a function needs a non-empty string name", file=file, item=q["id"],
                            field=f"{where}.name")
        if fn["name"] in names:
            raise DataError(f"duplicate tool name {fn['name']!r}", file=file, item=q["id"],
                            field=f"{where}.name")
        names.add(fn["name"])
        params = normalize_schema(fn.get("parameters"), language=language, where=f"{where}.parameters",
                                  file=file, item=q["id"])
        tools.append(Tool(fn["name"], str(fn.get("description") or ""), params))
    return Interface(tuple(tools))


def _example(q: Mapping[str, Any], answer: Mapping[str, Any], part: str, language: str, qfile: str,
             afile: str, report: BfclReport) -> Example:
    qid = q["id"]
    messages = _messages(q, qfile)
    interface = _interface(q, language, qfile)
    truth = answer.get("ground_truth")
    if not isinstance(truth, list) or not truth:
        raise DataError("ground_truth must be a non-empty list of calls", file=afile, item=qid,
                        field="ground_truth")
    anomalies: list[tuple[str, str, str]] = []
    reference: list[Call] = []
    accepted: list[dict[str, tuple[Any, ...]]] = []
    for i, entry in enumerate(truth):
        where = f"ground_truth[{i}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise DataError("a reference call must be an object with one tool name", file=afile, item=qid,
                            field=where)
        (name, args), = entry.items()
        tool = interface.get(name)
        if tool is None:
            raise DataError(f"the reference calls {name!r}, which the item does not declare "
                            f"(declared: {', '.join(interface.names)})", file=afile, item=qid,
                            field=f"{where}.{name}")
        if not isinstance(args, dict):
            raise DataError("arguments must be an object", file=afile, item=qid, field=f"{where}.{name}")
        ref_args: dict[str, Any] = {}
        for arg, options in args.items():
            field_name = f"{where}.{name}.{arg}"
            if not isinstance(options, list):
                raise DataError(f"accepted values must be a list, got {options!r}"[:200], file=afile,
                                item=qid, field=field_name)
            schema = tool.properties.get(arg)
            if schema is None:
                anomalies.append(("undeclared_argument", field_name, f"{name} does not declare {arg!r}"))
            if "" in options and arg not in tool.required:
                continue
            value = _first(options, schema, language, field_name, afile, qid, anomalies)
            ref_args[arg] = value
        for req in tool.required:
            if req not in args:
                anomalies.append(("required_not_in_answer", f"{where}.{name}.{req}",
                                  f"{name} requires {req!r}, the answer does not list it"))
        reference.append(Call(name, ref_args))
        accepted.append({arg: tuple(options) for arg, options in args.items()})
    for kind, field_name, detail in anomalies:
        report.anomalies.append((qid, kind, field_name, detail))
    meta: dict[str, Any] = {"language": language}
    if anomalies:
        meta["anomalies"] = tuple(f"{kind}: {field_name}" for kind, field_name, _ in anomalies)
    return Example(id=qid, messages=messages, interface=interface, reference=tuple(reference),
                   accepted=tuple(accepted), source="bfcl", partition=part, meta=meta)


def _first(options: Sequence[Any], schema: Mapping[str, Any] | None, language: str, field_name: str,
           file: str, item: str, anomalies: list[tuple[str, str, str]]) -> Any:
    """The reference value of one argument from its accepted values, in the item's language."""
    bfcl_type = schema.get("x-bfcl-type") if schema else None
    items = schema.get("items") if schema else None
    nested_type = (items.get("x-bfcl-type")
                   if isinstance(items, Mapping) and bfcl_type in NESTED_TYPES + ("tuple",) else None)
    if not options:
        if schema is None or schema.get("type") != "array":
            raise DataError("empty accepted-values list for an argument that is not an array", file=file,
                            item=item, field=field_name)
        anomalies.append(("empty_accepted", field_name, "no accepted value; the reference passes []"))
        value: Any = []
    else:
        value = next((o for o in options if o != ""), "")
        if bfcl_type in _DICT_TYPES and isinstance(value, dict):
            value = _unwrap_dict(value, field_name, anomalies)
        elif nested_type in _DICT_TYPES and isinstance(value, list):
            value = [_unwrap_dict(v, f"{field_name}[{j}]", anomalies) if isinstance(v, dict) else v
                     for j, v in enumerate(value)]
    if bfcl_type is None or language == "python":
        return value
    return write_value(value, language, bfcl_type, nested_type)


def _unwrap_dict(value: Mapping[str, Any], field_name: str,
                 anomalies: list[tuple[str, str, str]]) -> dict[str, Any]:
    """A dict argument's accepted dict -> one value: each entry's first accepted one, optional ones out."""
    out: dict[str, Any] = {}
    for key, choices in value.items():
        if not isinstance(choices, list):
            anomalies.append(("non_list_accepted", f"{field_name}.{key}",
                              f"accepted value {choices!r} is not a list"))
            out[key] = choices
        elif "" not in choices:
            out[key] = next((c for c in choices if c != ""), "") if choices else []
    return out
