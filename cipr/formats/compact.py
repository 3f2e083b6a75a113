"""Hermes calls with the tools listed in a few words each: prompts short enough to train on 2 cores.

The calls, their parsing and the decisions are Hermes's (`cipr.formats.hermes`); only the system prompt's tool
list changes. A tool is one line, its name, its arguments (`?` after an optional one) and its description,
then one line per argument with its description, its type when not a string, and its allowed values:

    - function_01(arg_01, arg_02, arg_03?): Estimate the travel time between two places.
      arg_01: Starting point. arg_02: End point. arg_03: Travel mode; one of driving, walking.

It is much shorter than the Hermes tool list (`tests/test_formats_compact.py` compares the lengths).
Everything needed to choose a tool (its description) and fill the call (argument ids, meanings, types, enums)
is kept; JSON Schema keywords with no bearing on a call (patterns, formats, bounds) are dropped. The list
always goes into the system prompt, also with a template that renders `tools=` (Qwen's would write the full
Hermes list).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cipr.formats.hermes import HermesFormat
from cipr.tools.interface import Interface, Tool

HEAD = "\n\nTools:"
TAIL = ("\n\nCall a tool with <tool_call>\n"
        "{\"name\": <tool name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>")


def _argument(name: str, schema: Any) -> str:
    schema = schema if isinstance(schema, dict) else {}
    text = f"{name}: {str(schema.get('description', '')).strip().rstrip('.')}"
    kind = schema.get("type")
    if kind and kind != "string":
        text += f" ({kind})"
    if isinstance(schema.get("enum"), list):
        text += "; one of " + ", ".join(str(v) for v in schema["enum"])
    return text + "."


def tool_line(tool: Tool) -> str:
    """One tool as its signature line and, when it has arguments, one line of argument descriptions."""
    required = set(tool.required)
    args = ", ".join(a + ("" if a in required else "?") for a in tool.argument_names)
    line = f"\n- {tool.name}({args}): {tool.description.strip()}"
    if tool.argument_names:
        line += "\n  " + " ".join(_argument(a, tool.properties[a]) for a in tool.argument_names)
    return line


@dataclass(frozen=True)
class CompactFormat(HermesFormat):
    """Hermes calls, compact tool list (module docstring)."""

    name = "compact"
    uses_native_tools = False

    def tools_text(self, interface: Interface) -> str:
        if not len(interface):
            return ""
        return HEAD + "".join(tool_line(t) for t in interface) + TAIL
