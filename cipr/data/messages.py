"""Tool-calling conversations in the ecosystem's common shape: rows of `messages` + `tools`.

The convention of TRL's conversational datasets, OpenAI's chat API and most tool-calling sets on the Hub, so a
researcher can bring their own data (`data.source=messages`, `benchmark=messages`):

    {"id": "...",                                   # optional
     "tools": [{"type": "function", "function": {"name", "description", "parameters"}}, ...],
     "messages": [{"role": "system" | "user" | "assistant" | "tool", "content": ...},
                  {"role": "assistant", "content": null, "tool_calls": [
                       {"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "..."}]}

Inputs (`load_messages(path)`): a `.jsonl` file, a `.json` list of rows, a `.parquet` file, a `datasets`
`save_to_disk` folder (a `DatasetDict` split by split), or a folder of such files (sorted path order,
subfolders included). Also accepted: a bare tool `{"name", "description", "parameters"}`, a bare call
`{"name", "arguments"}`, `tools` as a JSON string (as Hub datasets keep schemas out of Arrow columns),
arguments as a JSON string or an object, the `developer` role (read as `system`), and `content` as a list of
`{"type": "text", "text": ...}` parts (joined by newlines).

What becomes an `Example` (choices):
- Every assistant turn after the row's first user message is a decision and one Example: its prompt every
  message before it, its reference the turn's calls in order (parallel calls included, arguments parsed from
  JSON strings). A turn without calls (declining to call is a decision, a final answer after a tool result
  included) has an empty reference and `response` = its text.
- The text an assistant turn writes beside its calls stays in the prompt of later turns; for the turn's own
  Example it is kept in `meta["content"]`, not in the target (the call format writes its own reasoning).
- A tool message's name (`Message.name`, which canonicalization renames) is its `name`, else that of the
  earlier call whose `id` is its `tool_call_id`, else that of the single call of the assistant turn before it
  (None when that turn made several). Call ids are not kept: `Message` and `Call` have no id field, and the
  call formats do not render them.
- Assistant turns before the first user message (a greeting) are context only; messages after the last
  assistant turn have no target and are not used.
- Ids: the row's `id` (a string or an integer), else `<file stem>_<i>`, i the row's 0-based position in its
  file (blank lines of a JSON-lines file not counted); an Example's id is `<row id>_m<j>`, j the index of its
  assistant turn in `messages`. Partition: the file's stem (the split's name in a saved DatasetDict). `meta`:
  file, item (`line 3`, `row 3`), row_id, turn (j), content.
- Self-distillation trains on whole conversations instead (`unit="conversation"`, `row_conversation`): one
  Example per row, id the row id, every message through the last assistant turn (a greeting included), no
  reference: its assistant turns are the demonstration. Same rows and checks: a row is a trajectory exactly
  when it is usable as examples.

Bad rows (`BadRow`, a `DataError` naming the file, the line of a JSON-lines file or the index of a row
elsewhere, and the field, e.g. `messages[2].tool_calls[0].function.arguments: not valid JSON`): a line that is
not JSON; a row that is not an object; missing `messages` or `tools` (`[]` for a row without tools); a
malformed or duplicated tool; a message that is not an object or has another role; non-text content;
`tool_calls` outside an assistant turn or not a list; a call without a name, of a type other than `function`,
naming an undeclared tool, or whose arguments are not valid JSON or not an object; a tool message naming an
undeclared tool or an unknown `tool_call_id`; an assistant turn with neither calls nor text; a row with no
assistant turn after a user message; an id used by an earlier row. By default the first one raises; with
`on_bad_row="skip"` each is counted under its short reason (`BadRow.kind`) in `MessagesData.skipped`, logged,
and skipped; nothing is dropped silently. Argument names are not checked against the schema (a scorer reports
an undeclared argument as wrong).

Columnar inputs (parquet, saved datasets): Arrow stores a column of objects as one struct type unioned over
all rows, so a key one row lacks reads back as null: null-valued keys are dropped from rows read from those
files (JSON keeps them). The union can also reorder an object's keys (argument order decides canonical
argument ids) and fails on mixed types, so store `tools` and `arguments` as JSON strings in columnar files.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Literal

from cipr.core.errors import ConfigError, DataError, MissingInputError
from cipr.core.io import parse_json, read_json, read_parquet_rows, read_text
from cipr.tools.interface import Call, Example, Interface, Message, Tool

log = logging.getLogger(__name__)

OnBadRow = Literal["raise", "skip"]
ON_BAD_ROW: tuple[str, ...] = ("raise", "skip")
Unit = Literal["turn", "conversation"]
UNITS: tuple[str, ...] = ("turn", "conversation")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
SUFFIXES = (".jsonl", ".json", ".parquet")
SOURCE = "messages"


class BadRow(DataError):
    """A row that cannot become examples; `kind` is the short reason skip mode counts it under."""

    def __init__(self, kind: str, message: str, *, file: str, item: str, field: str | None = None) -> None:
        super().__init__(message, file=file, item=item, field=field)
        self.kind, self.plain = kind, message


@dataclass
class MessagesData:
    """What one load read: the examples, how many rows, the bad rows skipped (by reason), `tools_per_row`
    (declared tools of each row used) and `skip_details` (the first few messages of each skip reason, for
    `cipr-data stats`)."""

    examples: list[Example] = field(default_factory=list)
    rows: int = 0
    skipped: Counter = field(default_factory=Counter)
    skip_details: dict[str, list[str]] = field(default_factory=dict)
    tools_per_row: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RawRow:
    """One row as read: where it is (file, item), its default id, its partition, its value or read error."""

    file: str
    item: str
    default_id: str
    partition: str
    value: Any = None
    error: BadRow | None = None

    def bad(self, kind: str, message: str, field: str | None = None) -> BadRow:
        return BadRow(kind, message, file=self.file, item=self.item, field=field)


# ---------------------------------------------------------------- reading rows


def _drop_nulls(value: Any) -> Any:
    """`value` without null-valued object keys, at any depth (Arrow's struct union adds them)."""
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _jsonl_rows(path: Path) -> Iterator[RawRow]:
    file = str(path)
    lines = [(number, line) for number, line in enumerate(read_text(path).split("\n"), 1) if line.strip()]
    for i, (number, line) in enumerate(lines):
        item, default_id = f"line {number}", f"{path.stem}_{i}"
        try:
            yield RawRow(file, item, default_id, path.stem, parse_json(line, path, line=number))
        except DataError as e:
            yield RawRow(file, item, default_id, path.stem,
                         error=BadRow("row not valid JSON", e.reason, file=file, item=item))


def _json_rows(path: Path) -> Iterator[RawRow]:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError("expected a JSON list of {messages, tools} rows (or use .jsonl, one row a line)",
                        file=str(path))
    for i, row in enumerate(data):
        yield RawRow(str(path), f"row {i}", f"{path.stem}_{i}", path.stem, row)


def _parquet_rows(path: Path) -> Iterator[RawRow]:
    for i, row in enumerate(read_parquet_rows(path)):
        yield RawRow(str(path), f"row {i}", f"{path.stem}_{i}", path.stem, _drop_nulls(row))


def _saved_dataset_rows(folder: Path) -> Iterator[RawRow]:
    """Rows of a `save_to_disk` folder: a Dataset, or each split of a DatasetDict in its order."""
    from datasets import Dataset, load_from_disk

    try:
        loaded = load_from_disk(str(folder))
    except Exception as e:  # datasets raises several types for a folder it cannot read
        raise DataError(f"not a readable saved dataset: {e}", file=str(folder)) from e
    splits = [(folder.name, loaded)] if isinstance(loaded, Dataset) else list(loaded.items())
    for split, ds in splits:
        prefix = "" if isinstance(loaded, Dataset) else f"{split} "
        for i, row in enumerate(ds):
            yield RawRow(str(folder), f"{prefix}row {i}", f"{split}_{i}", split, _drop_nulls(row))


def _file_rows(path: Path) -> Iterator[RawRow]:
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".json":
        return _json_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise DataError(f"unsupported file type {path.suffix!r}: give a {', '.join(SUFFIXES)} file or a folder",
                    file=str(path))


def read_rows(path: str | Path) -> Iterator[RawRow]:
    """Every row under `path` (a file, a saved dataset folder, or a folder of data files), in order."""
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"messages data not found at {path} (give a {', '.join(SUFFIXES)} file or a "
                                f"folder)")
    if path.is_file():
        yield from _file_rows(path)
        return
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        yield from _saved_dataset_rows(path)
        return
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise DataError(f"the folder holds no {', '.join(SUFFIXES)} file and is not a saved dataset",
                        file=str(path))
    for f in files:
        yield from _file_rows(f)


# ---------------------------------------------------------------- one row


def _json_field(value: Any, raw: RawRow, field: str, kind: str) -> Any:
    """`value`, parsed when it is a JSON string (arguments, tools); a BadRow of `kind` when it is not JSON."""
    if not isinstance(value, str):
        return value
    try:
        return parse_json(value, raw.file)
    except DataError as e:
        raise raw.bad(kind, e.reason, field) from None


def _interface(row: Mapping[str, Any], raw: RawRow) -> Interface:
    tools = row.get("tools")
    if tools is None:
        raise raw.bad("missing tools", "missing 'tools' (give [] for a row without tools)", "tools")
    tools = _json_field(tools, raw, "tools", "tools not valid JSON")
    if not isinstance(tools, list):
        raise raw.bad("malformed tool",
                      f"'tools' must be a list of function schemas, got {type(tools).__name__}", "tools")
    out: list[Tool] = []
    for k, entry in enumerate(tools):
        try:
            out.append(Tool.from_openai(entry, where=raw.file, item=raw.item))
        except DataError as e:
            raise raw.bad("malformed tool", e.reason, f"tools[{k}]") from None
    interface = Interface(tuple(out))
    if interface.duplicate_names():
        raise raw.bad("duplicate tool name",
                      f"declares tool names more than once: {list(interface.duplicate_names())}", "tools")
    return interface


def _content(value: Any, raw: RawRow, field: str) -> str:
    """A message's text: a string, null (""), or a list of text parts joined by newlines."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(p, Mapping) and p.get("type", "text") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "\n".join(p["text"] for p in value)
    raise raw.bad("non-text content", "content must be a string, null or a list of {type: text, text} parts",
                  field)


def _calls(value: Any, interface: Interface, raw: RawRow, field: str,
           ids: dict[str, str]) -> tuple[Call, ...]:
    """An assistant turn's `tool_calls`; records each call id's tool name in `ids`."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise raw.bad("malformed call", "tool_calls must be a list", field)
    calls: list[Call] = []
    for k, tc in enumerate(value):
        where = f"{field}[{k}]"
        if not isinstance(tc, Mapping):
            raise raw.bad("malformed call", "a call must be an object", where)
        if tc.get("type", "function") != "function":
            raise raw.bad("unsupported call type", f"call type {tc.get('type')!r} is not 'function'",
                          f"{where}.type")
        if "function" in tc:
            where += ".function"
        name, args = call_parts(tc.get("function", tc), raw, where,
                                lambda value, at, kind: _json_field(value, raw, at, kind))
        if name not in interface:
            raise raw.bad("call to undeclared tool", f"calls {name!r}, which 'tools' does not declare "
                          f"(declared: {', '.join(interface.names) or 'none'})", f"{where}.name")
        if isinstance(tc.get("id"), str):
            ids[tc["id"]] = name
        calls.append(Call(name, args))
    return tuple(calls)


def call_parts(fn: Any, raw: RawRow, where: str,
               decode: Callable[[Any, str, str], Any]) -> tuple[str, dict[str, Any]]:
    """A call's `{name, arguments}` object checked: its name, and its arguments as an object (a string is
    decoded by `decode(value, field, kind)`, null is `{}`); a BadRow naming the field under `where` if not.
    The `messages` reader and every public format's reader (`cipr.data.row_formats`) check calls so."""
    if not isinstance(fn, Mapping):
        raise raw.bad("malformed call", "'function' must be an object", where)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise raw.bad("call without a name", f"the call's name must be a non-empty string, got {name!r}",
                      f"{where}.name")
    args = decode(fn.get("arguments", {}), f"{where}.arguments", "arguments not valid JSON")
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise raw.bad("arguments not an object",
                      f"arguments must be a JSON object, got {type(args).__name__}", f"{where}.arguments")
    return name, dict(args)


def _tool_name(m: Mapping[str, Any], before: Sequence[Message], interface: Interface, ids: Mapping[str, str],
               raw: RawRow, field: str) -> str | None:
    """The tool a tool message answers (module docstring: name, tool_call_id, single earlier call)."""
    name, call_id = m.get("name"), m.get("tool_call_id")
    if name is not None:
        if not isinstance(name, str) or name not in interface:
            raise raw.bad("tool result from undeclared tool",
                          f"names {name!r}, which 'tools' does not declare", f"{field}.name")
        return name
    if call_id is not None:
        if call_id not in ids:
            raise raw.bad("unknown tool_call_id", f"tool_call_id {call_id!r} matches no earlier call's id",
                          f"{field}.tool_call_id")
        return ids[call_id]
    last = next((b for b in reversed(before) if b.role == "assistant"), None)
    return last.calls[0].name if last is not None and len(last.calls) == 1 else None


def _messages(row: Mapping[str, Any], interface: Interface, raw: RawRow) -> list[Message]:
    value = row.get("messages")
    if not isinstance(value, list) or not value:
        raise raw.bad("missing messages", "'messages' must be a non-empty list", "messages")
    out: list[Message] = []
    ids: dict[str, str] = {}
    for j, m in enumerate(value):
        where = f"messages[{j}]"
        if not isinstance(m, Mapping):
            raise raw.bad("malformed message", "a message must be an object", where)
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise raw.bad("unknown role", f"role {m.get('role')!r} is not one of system, user, assistant, "
                          "tool", f"{where}.role")
        content = _content(m.get("content"), raw, f"{where}.content")
        if role != "assistant" and m.get("tool_calls"):
            raise raw.bad("malformed call", f"a {role} message carries tool_calls", f"{where}.tool_calls")
        calls = (_calls(m.get("tool_calls"), interface, raw, f"{where}.tool_calls", ids)
                 if role == "assistant" else ())
        if role == "assistant" and not calls and not content.strip():
            raise raw.bad("empty assistant turn", "an assistant turn with neither tool_calls nor text", where)
        name = _tool_name(m, out, interface, ids, raw, where) if role == "tool" else None
        out.append(Message(role, content, calls, name))
    return out


def _row_id(row: Mapping[str, Any], raw: RawRow) -> str:
    rid = row.get("id")
    if isinstance(rid, str) and rid:
        return rid
    if isinstance(rid, int) and not isinstance(rid, bool):
        return str(rid)
    return raw.default_id


def _parse_row(raw: RawRow) -> tuple[str, Interface, list[Message], list[int]]:
    """(row id, interface, messages, indices of the assistant turns after the first user message) of one
    row; BadRow when it is malformed."""
    if raw.error is not None:
        raise raw.error
    row = raw.value
    if not isinstance(row, Mapping):
        raise raw.bad("row not an object", f"a row must be a JSON object, got {type(row).__name__}")
    interface = _interface(row, raw)
    messages = _messages(row, interface, raw)
    first_user = next((j for j, m in enumerate(messages) if m.role == "user"), len(messages))
    turns = [j for j, m in enumerate(messages) if m.role == "assistant" and j > first_user]
    if not turns:
        raise raw.bad("no assistant turn", "the row has no assistant turn after a user message", "messages")
    return _row_id(row, raw), interface, messages, turns


def row_examples(raw: RawRow) -> tuple[list[Example], int]:
    """The Examples of one row (module docstring) and its number of tools; BadRow when it is malformed."""
    rid, interface, messages, turns = _parse_row(raw)
    examples = [Example(id=f"{rid}_m{j}", messages=tuple(messages[:j]), interface=interface,
                        reference=messages[j].calls,
                        response=None if messages[j].calls else messages[j].content,
                        source=SOURCE, partition=raw.partition,
                        meta={"file": raw.file, "item": raw.item, "row_id": rid, "turn": j,
                              "content": messages[j].content})
                for j in turns]
    return examples, len(interface)


def row_conversation(raw: RawRow) -> Example:
    """One row as a whole conversation (a trajectory, for self-distillation): every message through the
    last assistant turn, no reference (the assistant turns are the demonstration); BadRow when malformed."""
    rid, interface, messages, turns = _parse_row(raw)
    return Example(id=rid, messages=tuple(messages[:turns[-1] + 1]), interface=interface, source=SOURCE,
                   partition=raw.partition, meta={"kind": "trajectory", "style": "messages", "file": raw.file,
                                                  "item": raw.item, "row_id": rid})


# ---------------------------------------------------------------- loading and counting


def checked_path(path: str | None, what: str, option: str) -> Path:
    """`path` (a file or a folder) as a Path; ConfigError saying what `what` (the command choosing this
    source) needs `option` to be when it is unset or names nothing."""
    found = Path(path).expanduser() if path else None
    if found is None or not found.exists():
        raise ConfigError(f"{what} needs {option}=FILE_OR_DIR (a {', '.join(SUFFIXES)} file of messages + "
                          f"tools rows, or a folder of them or saved by datasets); "
                          f"{'it is not set' if found is None else f'{found} does not exist'}")
    return found



def load_messages(path: str | Path, *, on_bad_row: OnBadRow = "raise", unit: Unit = "turn",
                  rows: Iterable[RawRow] | None = None) -> MessagesData:
    """Every row under `path` as Examples; a bad row raises (`on_bad_row="raise"`) or is counted and skipped.

    `unit`: "turn", an Example per assistant turn (`row_examples`: training prompts, evaluation items);
    "conversation", one per row (`row_conversation`: the trajectories self-distillation trains on).
    `rows`: the rows of `path` already read (converted from another format, `cipr.data.row_formats`).
    """
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r}; choose one of {', '.join(UNITS)}")
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row={on_bad_row!r}; choose one of {', '.join(ON_BAD_ROW)}")
    out = MessagesData()
    seen: set[str] = set()
    for raw in read_rows(path) if rows is None else rows:
        out.rows += 1
        try:
            if unit == "turn":
                examples, tools = row_examples(raw)
            else:
                examples = [row_conversation(raw)]
                tools = len(examples[0].interface)
            row_id = examples[0].meta["row_id"]
            if row_id in seen:
                raise raw.bad("duplicate id", f"id {row_id!r} is used by an earlier row", "id")
        except BadRow as e:
            if on_bad_row == "raise":
                hint = "on_bad_row=skip (cipr-train: data.on_bad_row=skip) counts and skips such rows instead"
                raised = BadRow(e.kind, f"{e.reason}; {hint}", file=e.file, item=e.item, field=e.field)
                raised.plain = e.reason  # for a caller that cannot skip rows (an evaluation)
                raise raised from None
            out.skipped[e.kind] += 1
            details = out.skip_details.setdefault(e.kind, [])
            if len(details) < 3:
                details.append(str(e))
            continue
        seen.add(row_id)
        out.examples.extend(examples)
        out.tools_per_row.append(tools)
    if out.skipped:
        log.warning("%s: skipped %d of %d rows (on_bad_row=skip): %s", path, sum(out.skipped.values()),
                    out.rows, dict(out.skipped))
    return out


def messages_stats(data: MessagesData) -> dict[str, Any]:
    """Counts of one load, as `cipr-data stats source=messages` prints them."""
    per_turn = Counter(len(e.reference) for e in data.examples if e.reference)
    tools = data.tools_per_row
    return {
        "rows": data.rows,
        "rows_used": len(tools),
        "examples": len(data.examples),
        "call_examples": sum(per_turn.values()),
        "no_call_examples": sum(1 for e in data.examples if not e.reference),
        "tools_per_row": ({"min": min(tools), "mean": round(mean(tools), 3), "max": max(tools)}
                          if tools else None),
        "calls_per_turn": {str(k): per_turn[k] for k in sorted(per_turn)},
        "parallel_turns": sum(n for k, n in per_turn.items() if k > 1),
        "skipped_rows": dict(sorted(data.skipped.items())),
        "skip_details": data.skip_details,
    }
