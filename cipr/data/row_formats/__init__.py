"""Public function-calling data read as it is published: every format becomes `messages` + `tools` rows.

Formats (one reader each, `READERS`): `messages` (the TRL/OpenAI rows `cipr.data.messages` reads), `xlam`
(xLAM/APIGen), `hermes_fc` (NousResearch Hermes function calling and ToolACE-style ShareGPT rows) and `glaive`
(Glaive function-calling v2). Each reader turns a row into a `messages` row, which the `messages` reader
checks and splits into Examples as for any `messages` row: the same ids, skip policy (`on_bad_row`) and files
(`.jsonl`, `.json`, `.parquet`, saved datasets, folders of them). A bad row names its file, its line or row,
and the field in the source's own terms (`answers[0].arguments`, `chat[3]`).

`format="auto"` reads the format from the first row's keys (`detect_format`, which says why); later rows are
read in that format, so a file mixing formats reports the odd rows as bad.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.data.messages import (
    BadRow,
    MessagesData,
    OnBadRow,
    RawRow,
    Unit,
    load_messages,
    messages_stats,
    read_rows,
)
from cipr.data.row_formats.build import Builder
from cipr.data.row_formats.glaive import read_glaive
from cipr.data.row_formats.hermes_fc import read_hermes_fc
from cipr.data.row_formats.xlam import read_xlam

log = logging.getLogger(__name__)

AUTO = "auto"
READERS: dict[str, tuple[str, str, Callable[[Mapping[str, Any], Builder], None]] | None] = {
    "messages": None,
    "xlam": ("tools", "answers", read_xlam),
    "hermes_fc": ("conversations", "conversations", read_hermes_fc),
    "glaive": ("system", "chat", read_glaive),
}
"""Format name -> (source field of the tools, source field of the conversation, reader); None: as is."""
ROW_FORMATS: tuple[str, ...] = tuple(READERS)


def detect_format(row: Any) -> tuple[str, str]:
    """(format name, why) for one row, from its keys; DataError listing the keys when no format fits."""
    keys = sorted(map(str, row)) if isinstance(row, Mapping) else []
    if "messages" in keys:
        return "messages", "the row has 'messages'"
    if {"query", "answers"} <= set(keys):
        return "xlam", "the row has 'query' and 'answers' (xLAM/APIGen)"
    if "conversations" in keys:
        return "hermes_fc", "the row has 'conversations' (ShareGPT turns: Hermes function calling, ToolACE)"
    if "chat" in keys:
        return "glaive", "the row has 'chat' text (Glaive function calling)"
    found = f"keys {', '.join(map(repr, keys))}" if keys else f"a {type(row).__name__}"
    raise DataError(f"format=auto: the first row has {found}, which fits none of the formats (messages: "
                    f"'messages'; xlam: 'query' + 'answers'; hermes_fc: 'conversations'; glaive: 'chat'); "
                    f"name the format")


def check_messages_options(source: str, **given: str) -> None:
    """ConfigError for `data.on_bad_row` or `data.format` set for a source other than `messages`."""
    defaults = {"on_bad_row": "raise", "format": AUTO}
    for key, value in given.items():
        if value != defaults[key] and source != "messages":
            raise ConfigError(f"data.{key}={value} applies to data.source=messages only; remove it")


def resolve_format(path: str | Path, fmt: str = AUTO) -> tuple[str, str]:
    """(format name, why) of the data at `path`: `fmt` when named, else read from its first row."""
    if fmt != AUTO:
        if fmt not in READERS:
            raise ValueError(f"unknown data format {fmt!r}; choose one of {', '.join(ROW_FORMATS)} or {AUTO}")
        return fmt, "named"
    first = next(iter(read_rows(path)), None)
    if first is None:
        raise DataError("format=auto: the data holds no row to read the format from", file=str(path))
    if first.error is not None:
        raise first.error
    return detect_format(first.value)


def converted_rows(path: str | Path, fmt: str) -> Iterator[RawRow]:
    """Every row under `path` as a `messages` row (a row that cannot be converted carries its error)."""
    spec = READERS[fmt]
    for raw in read_rows(path):
        if spec is None or raw.error is not None:
            yield raw
            continue
        tools_field, messages_field, read = spec
        if not isinstance(raw.value, Mapping):
            yield raw  # the messages reader says "row not an object"
            continue
        b = Builder(raw, tools_field, messages_field)
        try:
            read(raw.value, b)
        except BadRow as e:
            yield RawRow(raw.file, raw.item, raw.default_id, raw.partition, error=e)
            continue
        yield b.row(raw.value)


def load_rows(path: str | Path, fmt: str = AUTO, *, on_bad_row: OnBadRow = "raise",
              unit: Unit = "turn") -> MessagesData:
    """Every row under `path`, in format `fmt` (or `auto`), as Examples: `cipr.data.messages.load_messages`
    on the converted rows (same `on_bad_row` and `unit`)."""
    name, why = resolve_format(path, fmt)
    log.info("%s: reading %s rows (%s)", path, name, why)
    return load_messages(path, on_bad_row=on_bad_row, unit=unit, rows=converted_rows(path, name))


def convert_rows(path: str | Path, fmt: str = AUTO, *,
                 on_bad_row: OnBadRow = "raise") -> tuple[list[dict[str, Any]], MessagesData]:
    """The `messages` + `tools` rows of every usable row under `path` (what `cipr-data convert` writes), in
    OpenAI's chat shapes throughout (`openai_shapes`), and the load that checked them (its `skipped` counts
    the rows left out)."""
    rows = list(converted_rows(path, resolve_format(path, fmt)[0]))
    data = load_messages(path, on_bad_row=on_bad_row, unit="conversation", rows=rows)
    by_item = {(r.file, r.item): r.value for r in rows}
    return [openai_shapes(by_item[e.meta["file"], e.meta["item"]]) for e in data.examples], data


def openai_shapes(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with every tool as `{"type": "function", "function": {name, description, parameters}}` and every
    call as `{"type": "function", "function": {"name": ..., "arguments": <JSON text>}}`: the messages format
    the project documents (OpenAI's chat API; TRL's conversational datasets read it), one shape in a file
    whatever shape the source format's reader produced."""
    def tool(t: Mapping[str, Any]) -> dict[str, Any]:
        return dict(t) if t.get("type") == "function" and "function" in t else {"type": "function",
                                                                                  "function": dict(t)}

    def call(c: Mapping[str, Any]) -> dict[str, Any]:
        fn = dict(c["function"]) if "function" in c else {"name": c["name"], "arguments": c.get("arguments")}
        args = fn.get("arguments")
        fn["arguments"] = args if isinstance(args, str) else json.dumps({} if args is None else args,
                                                                        ensure_ascii=False)
        return {**{k: v for k, v in c.items() if k not in ("name", "arguments", "function")},
                "type": "function", "function": fn}

    out = dict(row)
    out["tools"] = [tool(t) for t in row.get("tools") or []]
    out["messages"] = [{**m, "tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls")
                       else dict(m) for m in row.get("messages") or []]
    return out


def format_stats(path: str | Path, fmt: str = AUTO, *, on_bad_row: OnBadRow = "skip") -> dict[str, Any]:
    """`cipr.data.messages.messages_stats` of one load, with the format read and why."""
    name, why = resolve_format(path, fmt)
    data = load_messages(path, on_bad_row=on_bad_row, rows=converted_rows(path, name))
    return {"format": name, "format_reason": why, **messages_stats(data)}


__all__ = ["AUTO", "READERS", "ROW_FORMATS", "convert_rows", "converted_rows", "detect_format",
           "format_stats", "load_rows", "resolve_format"]
