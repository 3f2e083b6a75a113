"""`format=auto`: the call format a tokenizer's chat template implies, read from the template's text.

A family is recognized by the text its template writes for a tool call; every marker of the family must
appear in the template source:

- `hermes` (Qwen2.5, Qwen3, Qwen3-VL, Qwen3-2507; Hermes 2 Pro writes the same): `<tool_call>` blocks
  holding JSON with an `"arguments"` key.
- `llama3_json` (Llama 3.1, 3.2): Llama 3's `<|start_header_id|>` headers and calls as JSON with a
  `"parameters"` key.
- `gptoss` (gpt-oss): messages addressed `to=` `functions.<name>`, with harmony's `<|channel|>` and
  `<|call|>` control tokens.
- `qwen35_xml` (Qwen3.5) and `qwen36_xml` (Qwen3.6, Qwen3.8): XML calls, `<tool_call>\n<function=NAME>`
  written after `\n\n` when the turn has text; Qwen3.5 writes non-string values with `| string`, the
  later ones with `tojson`.

Checked on every template TRL ships (`trl/chat_templates/`, tested): the Qwen2.5/Qwen3 ones are hermes,
llama3_1/llama3_2 llama3_json, gptoss gptoss, qwen3_5_* qwen35_xml, qwen3_6*/qwen3_8* qwen36_xml, and all
others match none. A template that matches no family, or more than one, is an error that names the call
markers found in it (Nemotron 3's XML `<function=...>` in its own turn layout, GLM's `<arg_key>`, Gemma 4's
`<|tool_call>`, LFM2's `<|tool_call_start|>`, ...) or says that it never reads `tools`; an explicit format
name is the way out. A template given as a dict of named templates is read from its `tool_use` entry when
it has one, else from all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
XML_CALL_AFTER_TEXT = "'\\n\\n<tool_call>\\n<function='"
"""How the Qwen3.5+ templates' source writes a call after text (Nemotron 3's writes its calls otherwise)."""


@dataclass(frozen=True)
class Family:
    """A template family: the call format it implies, its models, and the markers its template holds."""

    format: str
    models: str
    markers: tuple[str | re.Pattern[str], ...]

    def matches(self, template: str) -> bool:
        return all((m in template) if isinstance(m, str) else m.search(template) is not None
                   for m in self.markers)

    def describe(self) -> str:
        markers = " + ".join(m if isinstance(m, str) else '"arguments"' for m in self.markers)
        return f"{self.format} ({self.models}: {markers})"


FAMILIES: tuple[Family, ...] = (
    Family("hermes", "Qwen2.5 / Qwen3", ("<tool_call>", re.compile(r'\\?"arguments\\?"\s*:'))),
    Family("llama3_json", "Llama 3.1 / 3.2", ("<|start_header_id|>", '"parameters": ')),
    Family("gptoss", "gpt-oss", ("to=", "functions.", "<|channel|>", "<|call|>")),
    Family("qwen35_xml", "Qwen3.5", (XML_CALL_AFTER_TEXT, "is not string) else args_value | string")),
    Family("qwen36_xml", "Qwen3.6 / 3.8", (XML_CALL_AFTER_TEXT, "string if args_value is string else")),
)

CALL_MARKERS: dict[str, str] = {
    "<tool_call>": "Hermes/Qwen tags",
    "<function=": "XML calls in a turn layout other than Qwen3.5's (Nemotron 3)",
    "<arg_key>": "GLM-4.5 XML arguments",
    "<|tool_call>": "Gemma 4 calls",
    "<|tool_call_start|>": "LFM2 calls",
    "<|python_tag|>": "Llama 3.1 built-in tools",
    "[TOOL_CALLS]": "Mistral's JSON call lists, not supported here: each call needs a 9-character id the "
                    "template checks, which no format here writes",
    "[func_name1(": "Llama 3.2's pythonic calls, not supported here: Python call syntax as the whole turn, "
                    "which no format here parses",
    '"parameters"': "JSON calls with a parameters key",
    "<|start_header_id|>": "Llama 3 headers",
    "<|channel|>": "harmony channels",
    "to=": "harmony recipients",
}
"""Markers an error lists when found, so that it says what the template does hold."""


def template_text(tokenizer: Any) -> str:
    """The chat template source of `tokenizer` (ValueError when it has none)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("tool_use") or "\n".join(v for v in template.values() if isinstance(v, str))
    if not template:
        raise ValueError("format=auto reads the call format from the tokenizer's chat template, and it has "
                         "none: set model.chat_template or name the format")
    return template


def detect_format(tokenizer_or_template: Any) -> str:
    """The call format name of a tokenizer's chat template (or of the template text); ValueError naming what
    was found when no family, or several, match."""
    template = (tokenizer_or_template if isinstance(tokenizer_or_template, str)
                else template_text(tokenizer_or_template))
    found = [f for f in FAMILIES if f.matches(template)]
    if len(found) == 1:
        return found[0].format
    known = "; ".join(f.describe() for f in FAMILIES)
    if found:
        raise ValueError(f"format=auto: the chat template matches several call formats "
                         f"({', '.join(f.format for f in found)}); name one instead")
    markers = [f"{m} ({why})" for m, why in CALL_MARKERS.items() if m in template]
    held = ", ".join(markers) if markers else "none of the known call markers"
    reads = "reads `tools`" if re.search(r"\btools\b", template) else "never reads `tools` (no tool support)"
    raise ValueError(f"format=auto: the chat template matches no call format here (found: {held}; it "
                     f"{reads}). Known families: {known}. Name the format instead "
                     "(model.call_format=... / format=...)")
