"""Canonical tool cards: a compact, fixed-layout rendering of one tool for repair prompts.

A card holds the name, the description, and every field's type, required flag and enum values.
Optional fields are listed (a renamed optional field is as much a repair target), nested fields as
`parent.child`. Field descriptions are left out on purpose: drift lives in descriptions (stale field
names), and the card should carry the schema's names, not prose that may contradict them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cipr.guard.validator import describe_type
from cipr.tools.interface import Tool


@dataclass(frozen=True)
class CardField:
    """One argument on a card: dotted name (nested fields as `parent.child`), type, required flag, enum."""

    name: str
    type: str
    required: bool
    enum: tuple[Any, ...] | None = None

    def render(self) -> str:
        text = f"{self.name} ({self.type}{', required' if self.required else ', optional'})"
        if self.enum is not None:
            text += " one of: " + ", ".join(map(_literal, self.enum))
        return text


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class ToolCard:
    """The canonical card of one tool."""

    name: str
    description: str
    fields: tuple[CardField, ...]

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    def render(self) -> str:
        lines = [f"tool: {self.name}", f"description: {self.description.strip() or '(none)'}",
                 "required: " + (", ".join(self.required) or "(none)"), "fields:"]
        lines += [f"  - {f.render()}" for f in self.fields] or ["  (none)"]
        return "\n".join(lines)


def _fields(schema: Mapping[str, Any], prefix: str, depth: int, max_depth: int) -> list[CardField]:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    out: list[CardField] = []
    for name, sub in props.items():
        sub = sub if isinstance(sub, Mapping) else {}
        dotted = f"{prefix}{name}"
        enum = tuple(sub["enum"]) if isinstance(sub.get("enum"), list) else None
        out.append(CardField(dotted, describe_type(sub), name in required, enum))
        if sub.get("properties") and depth < max_depth:
            out.extend(_fields(sub, f"{dotted}.", depth + 1, max_depth))
    return out


def tool_card(tool: Tool, *, max_depth: int = 3) -> ToolCard:
    """The card of `tool`; nested objects expand down to `max_depth` levels."""
    return ToolCard(tool.name, tool.description, tuple(_fields(tool.parameters, "", 1, max_depth)))


def render_cards(tools: list[Tool] | tuple[Tool, ...]) -> str:
    """Several cards, numbered, separated by blank lines (the candidate-set retry shows them all)."""
    return "\n\n".join(f"[{i + 1}]\n{tool_card(t).render()}" for i, t in enumerate(tools))
