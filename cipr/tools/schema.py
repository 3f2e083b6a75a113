"""BFCL parameter dialects to standard JSON Schema, once, at load time.

BFCL declares parameters in three dialects: Python-flavoured JSON Schema (`"dict"`, `"float"`,
`"tuple"`, `"any"`), Java type names (`String`, `long`, `ArrayList`, `HashMap`, ...) and JavaScript
ones (`String`, `Boolean`, `Bigint`, `dict`, ...). `normalize_schema` rewrites every `type` into a
standard JSON Schema type, recursively through `properties`, `items` and `additionalProperties`,
and keeps the original name in `x-bfcl-type` on every node that had one, so the BFCL scorer can
apply its per-language rules (Java and JavaScript values are source literals passed as strings;
Python's `any` means a string) after a perturbation has renamed tools and arguments.

Choices the specification leaves open:
- `any` (and JavaScript's empty type `""`, which BFCL's own data uses once, for a nested property of
  `simple_javascript_23`) becomes *no* `type` keyword: JSON Schema's "any value". The original name
  stays in `x-bfcl-type`.
- A node without a `type` stays without one (no constraint) and gets no `x-bfcl-type`.
- Names that are already standard JSON Schema (`object`, `number`, `null`, ...) are accepted in every
  language and kept; the common aliases BFCL's own converters accept (`list`, `bool`, `int`) too.
- Non-standard keywords (`optional`, `default`, ...) are kept: validators ignore unknown keywords.
- An unknown type name is an error (DataError naming the field), never guessed.
- Java `Set` gets `uniqueItems: true`; the other collections only their element type.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cipr.core.errors import DataError

LANGUAGES = ("python", "java", "javascript")

# Standard JSON Schema type names (and their BFCL aliases) accepted in every language.
_STANDARD: dict[str, str | None] = {
    "string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
    "array": "array", "object": "object", "null": "null",
    "dict": "object", "float": "number", "tuple": "array", "list": "array", "bool": "boolean",
    "int": "integer", "any": None,
}

_JAVA: dict[str, str | None] = {
    "String": "string", "char": "string", "Character": "string",
    "byte": "integer", "short": "integer", "int": "integer", "long": "integer",
    "Byte": "integer", "Short": "integer", "Integer": "integer", "Long": "integer",
    "float": "number", "double": "number", "Float": "number", "Double": "number",
    "boolean": "boolean", "Boolean": "boolean",
    "Array": "array", "ArrayList": "array", "List": "array", "Set": "array", "Queue": "array",
    "Stack": "array",
    "HashMap": "object", "Hashtable": "object", "Map": "object",
    "any": None, "Any": None, "Object": None,
}

_JAVASCRIPT: dict[str, str | None] = {
    "String": "string", "number": "number", "Number": "number", "Bigint": "integer", "BigInt": "integer",
    "Boolean": "boolean", "Array": "array", "Object": "object", "any": None, "Any": None, "": None,
}

_DIALECTS: dict[str, dict[str, str | None]] = {
    "python": _STANDARD,
    "java": {**_STANDARD, **_JAVA},
    "javascript": {**_STANDARD, **_JAVASCRIPT},
}


def json_type(bfcl_type: str, language: str = "python") -> str | None:
    """The standard JSON Schema type of a BFCL type name (None: any value). KeyError if unknown."""
    return _DIALECTS[language][bfcl_type]


def normalize_schema(schema: Any, *, language: str = "python", where: str = "parameters",
                     file: str | None = None, item: str | None = None) -> dict[str, Any]:
    """A standard JSON Schema object for a BFCL `parameters` schema; the input is not modified.

    `where` names the field for error messages (e.g. `function[0].parameters`), `file` and `item` its source.
    DataError when it is not an object schema (not a mapping, or a top-level type other than dict/object), or
    a type name is unknown for `language` (python, java, javascript).
    """
    if language not in _DIALECTS:
        raise ValueError(f"unknown BFCL language {language!r}; expected one of {', '.join(LANGUAGES)}")
    if not isinstance(schema, Mapping):
        raise DataError(f"parameters must be a JSON Schema object, got {type(schema).__name__}",
                        file=file, item=item, field=where)
    top = schema.get("type", "object")
    if top not in ("dict", "object"):
        raise DataError(f"parameters must have type dict/object, got {top!r}", file=file, item=item,
                        field=where)
    out = _normalize(schema, _DIALECTS[language], where, file, item)
    out["type"] = "object"
    out.setdefault("properties", {})
    return out


def _normalize(node: Any, dialect: Mapping[str, str | None], where: str, file: str | None,
               item: str | None) -> dict[str, Any]:
    if not isinstance(node, Mapping):
        raise DataError(f"a schema must be an object, got {node!r}"[:200], file=file, item=item, field=where)
    out: dict[str, Any] = {}
    if "type" in node:  # first, so rendered schemas read naturally
        name = node["type"]
        if not isinstance(name, str) or name not in dialect:
            raise DataError(f"unknown type {name!r}", file=file, item=item, field=f"{where}.type")
        if dialect[name] is not None:
            out["type"] = dialect[name]
        out["x-bfcl-type"] = name
        if name == "Set":
            out["uniqueItems"] = True
    for key, value in node.items():
        if key == "properties":
            if not isinstance(value, Mapping):
                raise DataError("properties must be an object", file=file, item=item,
                                field=f"{where}.properties")
            out[key] = {name: _normalize(sub, dialect, f"{where}.{name}", file, item)
                        for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out[key] = _normalize(value, dialect, f"{where}[]", file, item)
        elif key == "additionalProperties" and isinstance(value, Mapping):
            out[key] = _normalize(value, dialect, f"{where}{{}}", file, item)
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
                raise DataError(f"required must be a list of names, got {value!r}"[:200], file=file,
                                item=item, field=f"{where}.required")
            out[key] = list(value)
        elif key != "type":
            out[key] = copy.deepcopy(value)
    return out
