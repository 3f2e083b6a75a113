"""cipr.tools.schema: BFCL's parameter dialects to standard JSON Schema."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from cipr.core.errors import DataError
from cipr.tools.schema import json_type, normalize_schema


def test_python_dialect_hand_written():
    raw = {
        "type": "dict",
        "properties": {
            "city": {"type": "string", "description": "City name", "enum": ["Paris", "Rome"]},
            "ratio": {"type": "float", "default": 0.5},
            "point": {"type": "tuple", "items": {"type": "integer"}},
            "payload": {"type": "any"},
            "filters": {"type": "dict", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                                      "weights": {"type": "dict", "properties": {}}}},
            "rows": {"type": "array", "items": {"type": "dict", "properties": {"x": {"type": "float"}}}},
            "untyped": {"description": "no type at all"},
        },
        "required": ["city"],
        "optional": True,
    }
    before = copy.deepcopy(raw)
    out = normalize_schema(raw, language="python", where="function[0].parameters")
    assert raw == before  # the input is left alone
    assert out["type"] == "object" and out["x-bfcl-type"] == "dict" and out["required"] == ["city"]
    assert out["optional"] is True  # unknown keywords are kept (validators ignore them)
    p = out["properties"]
    assert p["city"] == {"type": "string", "x-bfcl-type": "string", "description": "City name",
                         "enum": ["Paris", "Rome"]}
    assert p["ratio"] == {"type": "number", "x-bfcl-type": "float", "default": 0.5}
    assert p["point"] == \
        {"type": "array", "x-bfcl-type": "tuple", "items": {"type": "integer", "x-bfcl-type": "integer"}}
    assert p["payload"] == {"x-bfcl-type": "any"}  # any value: no type keyword
    tags = p["filters"]["properties"]["tags"]
    assert p["filters"]["type"] == "object" and tags["items"] == {"type": "string", "x-bfcl-type": "string"}
    assert p["filters"]["properties"]["weights"]["type"] == "object"
    assert p["rows"]["items"]["type"] == "object"
    assert p["rows"]["items"]["properties"]["x"] == {"type": "number", "x-bfcl-type": "float"}
    assert p["untyped"] == {"description": "no type at all"}
    jsonschema.Draft202012Validator.check_schema(out)


@pytest.mark.parametrize(("name", "expected"), [
    ("String", "string"), ("char", "string"), ("int", "integer"), ("integer", "integer"), ("long", "integer"),
    ("short", "integer"), ("byte", "integer"), ("float", "number"), ("double", "number"),
    ("boolean", "boolean"), ("Array", "array"), ("ArrayList", "array"), ("Set", "array"),
    ("HashMap", "object"), ("Hashtable", "object"), ("any", None), ("dict", "object"),
])
def test_java_type_names(name, expected):
    assert json_type(name, "java") == expected
    out = normalize_schema({"type": "dict", "properties": {"x": {"type": name}}}, language="java")
    assert out["properties"]["x"].get("type") == expected
    assert out["properties"]["x"]["x-bfcl-type"] == name


@pytest.mark.parametrize(("name", "expected"), [
    ("String", "string"), ("number", "number"), ("integer", "integer"), ("float", "number"),
    ("Bigint", "integer"), ("Boolean", "boolean"), ("array", "array"), ("dict", "object"),
    ("object", "object"), ("any", None), ("", None),
])
def test_javascript_type_names(name, expected):
    assert json_type(name, "javascript") == expected


def test_java_collections_keep_element_types():
    raw = {"type": "dict", "properties": {"ids": {"type": "ArrayList", "items": {"type": "long"}},
                                          "tags": {"type": "Set", "items": {"type": "String"}}}}
    out = normalize_schema(raw, language="java")
    assert out["properties"]["ids"] == {"type": "array", "x-bfcl-type": "ArrayList",
                                        "items": {"type": "integer", "x-bfcl-type": "long"}}
    assert out["properties"]["tags"]["uniqueItems"] is True
    jsonschema.Draft202012Validator.check_schema(out)


def test_language_specific_names_are_errors_elsewhere():
    with pytest.raises(DataError) as e:
        normalize_schema({"type": "dict", "properties": {"n": {"type": "long"}}}, language="python",
                         where="function[0].parameters", file="f.json", item="x_1")
    assert (e.value.file, e.value.item, e.value.field) == ("f.json", "x_1", "function[0].parameters.n.type")
    with pytest.raises(DataError, match="unknown type 'HashMap'"):
        normalize_schema({"type": "dict", "properties": {"m": {"type": "HashMap"}}}, language="javascript")


@pytest.mark.parametrize("bad", [None, [], "dict", {"type": "string"}, {"type": "array", "items": {}}])
def test_not_an_object_schema(bad):
    with pytest.raises(DataError) as e:
        normalize_schema(bad, language="python", where="function[2].parameters", item="it")
    assert e.value.field == "function[2].parameters" and e.value.item == "it"


def test_malformed_nested_parts():
    with pytest.raises(DataError) as e:
        normalize_schema({"type": "dict", "properties": {"a": {"type": "dict", "properties": ["x"]}}})
    assert e.value.field == "parameters.a.properties"
    with pytest.raises(DataError) as e:
        normalize_schema({"type": "dict", "properties": {}, "required": "a"})
    assert e.value.field == "parameters.required"
    with pytest.raises(ValueError, match="unknown BFCL language"):
        normalize_schema({"type": "dict"}, language="rust")


def test_every_real_schema_is_valid_json_schema(shared_data):
    """All tool schemas of the 2,501 items, normalized, are valid JSON Schema (2020-12 meta-schema)."""
    from cipr.data.bfcl import load_bfcl

    examples = load_bfcl(shared_data)
    seen = set()
    check = jsonschema.Draft202012Validator.check_schema
    for ex in examples:
        for tool in ex.interface:
            key = (ex.meta["language"], tool.name, repr(tool.parameters))
            if key not in seen:
                seen.add(key)
                check(tool.parameters)
                assert tool.parameters["type"] == "object"
    assert len(seen) > 1000
