"""Pluggable call formats, by name: `get_format("toolrl")`, `get_format("hermes", end_decision=False)`.

Each format renders an interface into a prompt and calls into target text, parses calls out of
generated text without ever raising, and lists the decisions in a response (see `base.py`).
"""

from __future__ import annotations

from typing import Any

from cipr.formats.base import CallFormat, Decision, ParseResult, supports_native_tools
from cipr.formats.compact import CompactFormat
from cipr.formats.hermes import HermesFormat
from cipr.formats.react import ReActFormat, WebShopFormat
from cipr.formats.toolrl import ToolRLFormat

FORMATS: dict[str, type[CallFormat]] = {cls.name: cls for cls in (ToolRLFormat, HermesFormat, CompactFormat,
                                                                    ReActFormat, WebShopFormat)}


def get_format(name: str, **options: Any) -> CallFormat:
    """The call format registered as `name`, built with its `options` (e.g. `end_decision=False`)."""
    cls = FORMATS.get(name)
    if cls is None:
        raise ValueError(f"unknown call format {name!r}; valid names: {', '.join(sorted(FORMATS))}")
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(f"call format {name!r} does not take options {sorted(options)}: {e}") from e


__all__ = ["FORMATS", "CallFormat", "CompactFormat", "Decision", "HermesFormat", "ParseResult", "ReActFormat", "ToolRLFormat",
           "WebShopFormat", "get_format", "supports_native_tools"]
