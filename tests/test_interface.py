"""Interface model: conversions to and from OpenAI tools and MCP tools/list, and bad input."""

import pytest

from cipr.core.errors import DataError
from cipr.tools.interface import Call, Interface, Tool

WEATHER = Tool("get_weather", "Current weather for a city.",
               {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",
                                                                                     "enum": ["c", "f"]}},
                "required": ["city"]})


def test_openai_round_trip():
    iface = Interface((WEATHER, Tool("noop", "Does nothing.")))
    back = Interface.from_openai(iface.to_openai())
    assert back == iface
    assert iface.to_openai()[0] == {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": dict(WEATHER.parameters)}}


def test_mcp_round_trip():
    iface = Interface((WEATHER,))
    listed = iface.to_mcp()
    assert listed["tools"][0]["inputSchema"]["required"] == ["city"]
    assert Interface.from_mcp(listed) == iface
    assert Interface.from_mcp(listed["tools"]) == iface


def test_conversion_copies_schemas():
    d = WEATHER.to_openai()
    d["function"]["parameters"]["properties"]["city"]["type"] = "integer"
    assert WEATHER.properties["city"]["type"] == "string"


def test_bad_tools_name_the_field():
    with pytest.raises(DataError, match=r"file 'tools.json', item 'x7', field 'name'"):
        Interface.from_openai([{"type": "function", "function": {"description": "no name"}}],
                              where="tools.json", item="x7")
    with pytest.raises(DataError, match=r"f\.parameters.*JSON Schema object"):
        Interface.from_mcp({"tools": [{"name": "f", "inputSchema": {"type": "array"}}]})
    with pytest.raises(DataError, match="'tools' list"):
        Interface.from_mcp({"nothing": 1})


def test_duplicates_and_lookup():
    iface = Interface((WEATHER, Tool("get_weather", "Corrupted copy."), Tool("other", "x")))
    assert iface.duplicate_names() == ("get_weather",)
    assert len(iface.declarations("get_weather")) == 2
    assert iface.get("get_weather") is WEATHER
    assert "other" in iface and "missing" not in iface
    assert iface.get("missing") is None


def test_call_key_is_order_free():
    assert Call("f", {"a": 1, "b": 2}).key() == Call("f", {"b": 2, "a": 1}).key()
    assert Call.from_dict(Call("f", {"a": [1]}).to_dict()) == Call("f", {"a": [1]})
