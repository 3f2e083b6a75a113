"""The perturbations' word lists and pools, read from `vocabulary.yaml` (shipped in this package).

Keyboard neighbours (typos), common abbreviations and argument synonyms (`cipr.perturb.naming`), unrelated
tools and unrelated arguments (`cipr.perturb.pool`): fixed, hand-written tables, kept as data so they can be
read and edited as lists rather than code. The file is read and checked once, on first use; an entry that
does not fit is one DataError naming the file and the entry's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_checked_yaml
from cipr.tools.interface import Tool

VOCABULARY_FILE = "vocabulary.yaml"
"""The tables, a resource of this package (`cipr.perturb`)."""

_TEXT = {"type": "string", "minLength": 1}
_WORDS = {"type": "object", "minProperties": 1, "additionalProperties": _TEXT}
_ARGUMENT = {"type": "object", "required": ["type", "description"], "additionalProperties": False,
             "properties": {"type": {"enum": ["string", "integer", "number", "boolean"]},
                            "description": _TEXT}}
_SHAPE = {
    "type": "object",
    "required": ["keyboard_neighbours", "abbreviations", "argument_synonyms", "unrelated_tools",
                 "unrelated_arguments"],
    "additionalProperties": False,
    "properties": {
        "keyboard_neighbours": _WORDS,
        "abbreviations": _WORDS,
        "argument_synonyms": _WORDS,
        "unrelated_tools": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "description", "properties", "required"],
            "additionalProperties": False,
            "properties": {"name": _TEXT, "description": _TEXT,
                           "properties": {"type": "object", "additionalProperties": _ARGUMENT},
                           "required": {"type": "array", "items": _TEXT}}}},
        "unrelated_arguments": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "type", "description"], "additionalProperties": False,
            "properties": {"name": _TEXT, **_ARGUMENT["properties"]}}},
    },
}
"""The file's layout, as a JSON Schema."""


@dataclass(frozen=True)
class Vocabulary:
    """The tables: three word maps, the unrelated tools, the unrelated arguments as (name, JSON Schema)."""

    keyboard_neighbours: Mapping[str, str]
    abbreviations: Mapping[str, str]
    argument_synonyms: Mapping[str, str]
    unrelated_tools: tuple[Tool, ...]
    unrelated_arguments: tuple[tuple[str, dict[str, Any]], ...]


@lru_cache(maxsize=4)
def vocabulary(source: Traversable | None = None) -> Vocabulary:
    """The tables of `source` (default: the packaged file), read and checked once; a DataError names the
    file and the entry."""
    source = source or resources.files("cipr.perturb").joinpath(VOCABULARY_FILE)
    where = str(source)
    raw = read_checked_yaml(source, _SHAPE)
    tools = []
    for k, entry in enumerate(raw["unrelated_tools"]):
        missing = [r for r in entry["required"] if r not in entry["properties"]]
        if missing:
            raise DataError(f"requires undeclared arguments {missing}", file=where,
                            item=f"unrelated_tools.{k}", field="required")
        tools.append(Tool(entry["name"], entry["description"],
                          {"type": "object", "properties": dict(entry["properties"]),
                           "required": list(entry["required"])}))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise DataError("a tool name is declared twice", file=where, item="unrelated_tools")
    arguments = tuple((a["name"], {"type": a["type"], "description": a["description"]})
                      for a in raw["unrelated_arguments"])
    return Vocabulary(raw["keyboard_neighbours"], raw["abbreviations"], raw["argument_synonyms"],
                      tuple(tools), arguments)
