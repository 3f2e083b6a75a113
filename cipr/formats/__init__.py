"""Pluggable call formats, by name: `get_format("toolrl")`, `get_format("hermes", end_decision=False)`.

Each format renders an interface into a prompt and calls into target text, parses calls out of
generated text without ever raising, and lists the decisions in a response (see `base.py`).
`hermes`, `llama3_json`, `gptoss`, `qwen35_xml` and `qwen36_xml` follow a model's own chat template
(tools through `tools=`); `resolve_format("auto", tokenizer)` picks one of them from the tokenizer's
template (`templates.py`).
"""

from __future__ import annotations

from typing import Any

from cipr.formats.base import CallFormat, Decision, ParseResult, supports_native_tools
from cipr.formats.compact import CompactFormat
from cipr.formats.gptoss import GptOssFormat
from cipr.formats.hermes import HermesFormat
from cipr.formats.llama3 import Llama3JsonFormat
from cipr.formats.qwen35 import Qwen35XmlFormat, Qwen36XmlFormat
from cipr.formats.react import ReActFormat, WebShopFormat
from cipr.formats.templates import AUTO, detect_format
from cipr.formats.toolrl import ToolRLFormat

FORMATS: dict[str, type[CallFormat]] = {cls.name: cls for cls in (
    ToolRLFormat, HermesFormat, CompactFormat, ReActFormat, WebShopFormat, Llama3JsonFormat, GptOssFormat,
    Qwen35XmlFormat, Qwen36XmlFormat)}


def get_format(name: str, **options: Any) -> CallFormat:
    """The call format registered as `name`, built with its `options` (e.g. `end_decision=False`)."""
    cls = FORMATS.get(name)
    if name == AUTO:
        raise ValueError(f"call format {AUTO!r} is read from the model's chat template, and no tokenizer "
                         f"is at hand here: name the format ({', '.join(sorted(FORMATS))})")
    if cls is None:
        raise ValueError(f"unknown call format {name!r}; valid names: {', '.join(sorted(FORMATS))}, or "
                         f"{AUTO} (from the chat template)")
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(f"call format {name!r} does not take options {sorted(options)}: {e}") from e


def resolve_format(name: str, tokenizer: Any = None, **options: Any) -> CallFormat:
    """`get_format(name, **options)`, `auto` being the format of `tokenizer`'s template (`detect_format`)."""
    return get_format(detect_format(tokenizer) if name == AUTO and tokenizer is not None else name, **options)


__all__ = ["AUTO", "FORMATS", "CallFormat", "CompactFormat", "Decision", "GptOssFormat", "HermesFormat",
           "Llama3JsonFormat", "ParseResult", "Qwen35XmlFormat", "Qwen36XmlFormat", "ReActFormat",
           "ToolRLFormat", "WebShopFormat", "detect_format", "get_format", "resolve_format",
           "supports_native_tools"]
