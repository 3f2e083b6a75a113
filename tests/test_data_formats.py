"""Public function-calling formats read directly (cipr/data/row_formats/): xLAM/APIGen, Hermes function
calling (with ToolACE-style rows) and Glaive v2.

The rows below are written here from each format's published description (no public data is copied): for each
format, a file of rows covering its quirks (arguments as JSON strings or objects, Python literals, parallel
calls, tool results, an answer without a call, tools bare, wrapped or as a JSON string) loads to the same
Examples as the same conversations converted by hand to `messages` rows; at least ten malformed rows per
format each raise an error naming the file, the row and the field in the format's own terms, and are counted
under their reason in skip mode. Then: auto-detection, conversion to `messages` rows, per-format stats.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from cipr.core.errors import DataError
from cipr.data.messages import BadRow, load_messages
from cipr.data.row_formats import (
    convert_rows,
    detect_format,
    format_stats,
    load_rows,
    resolve_format,
)
from cipr.data.row_formats.build import json_objects, loose_json
from cipr.tools.interface import Example


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _comparable(examples: list[Example]) -> list[Example]:
    return [replace(e, meta={k: v for k, v in e.meta.items() if k != "file"}) for e in examples]


def _fn(name: str, description: str, properties: dict, required: list) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


def _call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _assert_same_examples(tmp_path: Path, fmt: str, rows: list, hand: list) -> list[Example]:
    """Rows of `fmt` and their hand conversion (same file stem, so same ids and partitions) load alike."""
    source = write_jsonl(tmp_path / fmt / "train.jsonl", rows)
    expected = load_messages(write_jsonl(tmp_path / "messages" / "train.jsonl", hand)).examples
    got = load_rows(source, fmt).examples
    assert _comparable(got) == _comparable(expected)
    assert load_rows(source).examples == got  # auto-detected from the first row
    conversations = load_rows(source, fmt, unit="conversation").examples
    assert _comparable(conversations) == _comparable(load_messages(tmp_path / "messages" / "train.jsonl",
                                                                   unit="conversation").examples)
    return got


# ---------------------------------------------------------------- xLAM / APIGen

WEATHER_XLAM = {"name": "get_weather", "description": "Current weather of a city.",
                "parameters": {"city": {"type": "str", "description": "The city."},
                               "unit": {"type": "str, optional", "description": "celsius or fahrenheit.",
                                        "default": "celsius"}}}
WEATHER = _fn("get_weather", "Current weather of a city.",
              {"city": {"type": "string", "description": "The city."},
               "unit": {"type": "string", "description": "celsius or fahrenheit.", "default": "celsius"}},
              ["city"])
ADD = _fn("add", "Adds two integers.", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])
SEARCH_XLAM = {"name": "search", "description": "Searches the catalog.",
               "parameters": {"q": {"type": "str", "description": "Query."},
                              "limit": {"type": "int, optional", "description": "Most results."},
                              "tags": {"type": "List[str]", "description": "Tags."},
                              "since": {"type": "Optional[datetime]", "description": "Oldest date."}}}
SEARCH = _fn("search", "Searches the catalog.",
             {"q": {"type": "string", "description": "Query."},
              "limit": {"type": "integer", "description": "Most results."},
              "tags": {"type": "array", "description": "Tags.", "items": {"type": "string"}},
              "since": {"type": "datetime", "description": "Oldest date."}}, ["q", "tags"])
NO_CALL = "None of the available tools can do this."

XLAM_ROWS = [
    # tools and answers as JSON strings (the Hub's columns), xLAM parameter specs, one call
    {"id": 1, "query": "Weather in Lisbon?", "tools": json.dumps([WEATHER_XLAM]),
     "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Lisbon"}}])},
    # already decoded; an OpenAI-wrapped tool with a JSON Schema beside an xLAM one; parallel calls, one with
    # its arguments as a JSON string
    {"id": 2, "query": "Add 2 and 3, and find cats.", "tools": [ADD, SEARCH_XLAM],
     "answers": [{"name": "add", "arguments": '{"a": 2, "b": 3}'},
                 {"name": "search", "arguments": {"q": "cats", "tags": ["pets"]}}]},
    # xlam-irrelevance: no call fits
    {"id": 3, "query": "Tell me a joke.", "tools": json.dumps([WEATHER_XLAM]), "answers": "[]"},
    # written as Python literals (single quotes, True, None)
    {"id": 4, "query": "Lights on.",
     "tools": str([{"name": "switch", "description": "Switches.", "parameters": {
         "on": {"type": "bool", "description": "State."}, "room": {"type": "str", "description": "Room.",
                                                                   "default": None}}}]),
     "answers": str([{"name": "switch", "arguments": {"on": True, "room": None}}])},
]
SWITCH = _fn("switch", "Switches.", {"on": {"type": "boolean", "description": "State."},
                                     "room": {"type": "string", "description": "Room.", "default": None}},
             ["on"])
XLAM_HAND = [
    {"id": 1, "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("get_weather", {"city": "Lisbon"})]}]},
    {"id": 2, "tools": [ADD, SEARCH], "messages": [
        {"role": "user", "content": "Add 2 and 3, and find cats."},
        {"role": "assistant", "content": None,
         "tool_calls": [_call("add", {"a": 2, "b": 3}), _call("search", {"q": "cats", "tags": ["pets"]})]}]},
    {"id": 3, "tools": [WEATHER], "messages": [{"role": "user", "content": "Tell me a joke."},
                                               {"role": "assistant", "content": NO_CALL}]},
    {"id": 4, "tools": [SWITCH], "messages": [
        {"role": "user", "content": "Lights on."},
        {"role": "assistant", "content": None, "tool_calls": [_call("switch", {"on": True, "room": None})]}]},
]


def test_xlam_rows_load_as_their_hand_conversion(tmp_path):
    got = _assert_same_examples(tmp_path, "xlam", XLAM_ROWS, XLAM_HAND)
    assert [e.id for e in got] == ["1_m1", "2_m1", "3_m1", "4_m1"]
    assert [len(e.reference) for e in got] == [1, 2, 0, 1] and got[2].response == NO_CALL


# ---------------------------------------------------------------- Hermes function calling (ShareGPT)

HERMES_SYSTEM = ("You are a function calling AI model. You are provided with function signatures within "
                 "<tools></tools> XML tags. Here are the available tools: <tools> {tools} </tools> For each "
                 "function call return a json object with function name and arguments within <tool_call>"
                 "</tool_call> XML tags.")
HERMES_ROWS = [
    {"id": "h-1", "category": "Weather", "conversations": [
        # tools as a Python literal list of wrapped tools, as Hermes writes them
        {"from": "system", "value": HERMES_SYSTEM.replace("{tools}", str([WEATHER]))},
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "gpt",
         "value": "<tool_call>\n{'arguments': {'city': 'Oslo'}, 'name': 'get_weather'}\n</tool_call>"},
        {"from": "tool",
         "value": '<tool_response>\n{"name": "get_weather", "content": {"t": -3}}\n</tool_response>'},
        {"from": "gpt", "value": "It is -3 degrees in Oslo."}]},
    {"id": "h-2", "conversations": [
        # bare tools one after the other; text beside two parallel calls; two results in one turn
        {"from": "system", "value": HERMES_SYSTEM.replace("{tools}", json.dumps(ADD["function"]) + "\n"
                                                          + json.dumps(WEATHER["function"]))},
        {"from": "human", "value": "2+3, and the weather in Rome?"},
        {"from": "gpt",
         "value": 'Both at once.\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}\n'
                  '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
                  "</tool_call>"},
        {"from": "tool", "value": '<tool_response>\n{"name": "add", "content": "5"}\n</tool_response>\n'
                                  "<tool_response>\n{'name': 'get_weather', 'content': {'t': 21}}\n"
                                  "</tool_response>"},
        {"from": "gpt", "value": "5, and 21 degrees."},
        {"from": "human", "value": "Thanks!"},
        {"from": "gpt", "value": "You're welcome."}]},
    {"id": "h-3", "tools": json.dumps([SWITCH]), "conversations": [
        # tools in a row-level column; a system turn without <tools> is kept; a result without a name
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Lights on in the hall."},
        {"from": "gpt",
         "value": "<tool_call>\n{'name': 'switch', 'arguments': {'on': True, 'room': 'hall'}}\n</tool_call>"},
        {"from": "tool", "value": "ok"},
        {"from": "gpt", "value": "Done."}]},
]
HERMES_HAND = [
    {"id": "h-1", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "Oslo"})]},
        {"role": "tool", "name": "get_weather", "content": '{"t": -3}'},
        {"role": "assistant", "content": "It is -3 degrees in Oslo."}]},
    {"id": "h-2", "tools": [ADD["function"], WEATHER["function"]], "messages": [
        {"role": "user", "content": "2+3, and the weather in Rome?"},
        {"role": "assistant", "content": "Both at once.",
         "tool_calls": [_call("add", {"a": 2, "b": 3}), _call("get_weather", {"city": "Rome"})]},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "tool", "name": "get_weather", "content": '{"t": 21}'},
        {"role": "assistant", "content": "5, and 21 degrees."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."}]},
    {"id": "h-3", "tools": [SWITCH], "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Lights on in the hall."},
        {"role": "assistant", "content": "", "tool_calls": [_call("switch", {"on": True, "room": "hall"})]},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "Done."}]},
]


# ToolACE-style: a `system` column listing the functions as a JSON list, calls as Python, results as JSON
TOOLACE_SYSTEM = ("You are an expert in composing functions. Here is a list of functions in JSON format "
                  "that you can invoke:\n" + json.dumps([WEATHER["function"], ADD["function"]]) + ".\nShould "
                  "you decide to return the function call(s), put them in the format of "
                  "[func1(params_name=params_value, params_name2=params_value2...), func2(params)]\n")
TOOLACE_ROW = {"id": "t-1", "system": TOOLACE_SYSTEM, "conversations": [
    {"from": "user", "value": "Weather in Oslo, and 2+3?"},
    {"from": "assistant", "value": '[get_weather(city="Oslo"), add(a=2, b=3)]'},
    {"from": "tool", "value": json.dumps([{"name": "get_weather", "results": {"t": -3}},
                                          {"name": "add", "results": {"sum": 5}}])},
    {"from": "assistant", "value": "It is -3 degrees in Oslo; 2+3 is 5."}]}
TOOLACE_HAND = {"id": "t-1", "tools": [WEATHER["function"], ADD["function"]], "messages": [
    {"role": "user", "content": "Weather in Oslo, and 2+3?"},
    {"role": "assistant", "content": "",
     "tool_calls": [_call("get_weather", {"city": "Oslo"}), _call("add", {"a": 2, "b": 3})]},
    {"role": "tool", "name": "get_weather", "content": '{"t": -3}'},
    {"role": "tool", "name": "add", "content": '{"sum": 5}'},
    {"role": "assistant", "content": "It is -3 degrees in Oslo; 2+3 is 5."}]}


def test_hermes_rows_load_as_their_hand_conversion(tmp_path):
    got = _assert_same_examples(tmp_path, "hermes_fc", [*HERMES_ROWS, TOOLACE_ROW],
                                [*HERMES_HAND, TOOLACE_HAND])
    assert [e.id for e in got] == ["h-1_m1", "h-1_m3", "h-2_m1", "h-2_m4", "h-2_m6", "h-3_m2", "h-3_m4",
                                   "t-1_m1", "t-1_m4"]
    assert got[2].meta["content"] == "Both at once."
    assert [m.name for m in got[3].messages if m.role == "tool"] == ["add", "get_weather"]


# ---------------------------------------------------------------- Glaive function calling v2

GLAIVE_SYSTEM = ("SYSTEM: You are a helpful assistant with access to the following functions. Use them if "
                 "required -\n")
GLAIVE_ROWS = [
    # arguments as a single-quoted JSON string holding an apostrophe: neither JSON nor a Python literal
    {"system": GLAIVE_SYSTEM + json.dumps(WEATHER["function"], indent=4) + "\n",
     "chat": "USER: What's the weather at Rome's airport?\n\n\nASSISTANT: <functioncall> "
             "{\"name\": \"get_weather\", \"arguments\": '{\"city\": \"Rome's airport\"}'} "
             "<|endoftext|>\n\n\nFUNCTION RESPONSE: {\"t\": 19}\n\n\nASSISTANT: It is 19 degrees there. "
             "<|endoftext|>\n"},
    # two functions; an answer without a call first; arguments as an object
    {"system": GLAIVE_SYSTEM + json.dumps(ADD["function"], indent=4) + "\n\n"
     + json.dumps(SEARCH["function"], indent=4),
     "chat": "USER: Hi!\n\n\nASSISTANT: Hello! How can I help? <|endoftext|>\n\n\nUSER: Add 4 and 5.\n\n\n"
             "ASSISTANT: Sure. <functioncall> {\"name\": \"add\", \"arguments\": {\"a\": 4, \"b\": 5}} "
             "<|endoftext|>\n\n\nFUNCTION RESPONSE: {\"result\": 9}\n\n\nASSISTANT: 9. <|endoftext|>"},
    # no functions: the system text is kept
    {"system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
     "chat": "USER: Say hi.\n\n\nASSISTANT: Hi. <|endoftext|>"},
]
GLAIVE_HAND = [
    {"tools": [WEATHER["function"]], "messages": [
        {"role": "user", "content": "What's the weather at Rome's airport?"},
        {"role": "assistant", "content": "",
         "tool_calls": [_call("get_weather", {"city": "Rome's airport"})]},
        {"role": "tool", "content": '{"t": 19}'},
        {"role": "assistant", "content": "It is 19 degrees there."}]},
    {"tools": [ADD["function"], SEARCH["function"]], "messages": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Add 4 and 5."},
        {"role": "assistant", "content": "Sure.", "tool_calls": [_call("add", {"a": 4, "b": 5})]},
        {"role": "tool", "content": '{"result": 9}'},
        {"role": "assistant", "content": "9."}]},
    {"tools": [], "messages": [
        {"role": "system", "content": "You are a helpful assistant, with no access to external functions."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi."}]},
]


def test_glaive_rows_load_as_their_hand_conversion(tmp_path):
    got = _assert_same_examples(tmp_path, "glaive", GLAIVE_ROWS, GLAIVE_HAND)
    assert [e.id for e in got] == ["train_0_m1", "train_0_m3", "train_1_m1", "train_1_m3", "train_1_m5",
                                   "train_2_m2"]
    assert got[0].reference[0].arguments == {"city": "Rome's airport"}
    assert got[1].messages[-1].name == "get_weather"  # a response's tool: the single call before it


# ---------------------------------------------------------------- malformed rows name file, row and field


def _set(path: tuple, value):
    """A change to a copy of a row: set (or, with value KeyError, delete) the item at `path`."""
    def change(row):
        row = copy.deepcopy(row)
        *head, last = path
        target = row
        for key in head:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value(target[last]) if callable(value) else value
        return row
    return change


X = XLAM_ROWS[1]
XLAM_BAD = [  # (change to row 2, field named, reason counted)
    (_set(("query",), KeyError), "query", "missing query"),
    (_set(("query",), 42), "query", "missing query"),
    (_set(("tools",), KeyError), "tools", "missing tools"),
    (_set(("tools",), "[{"), "tools", "tools not valid JSON"),
    (_set(("tools",), '{"name": "add"}'), "tools", "malformed tool"),
    (_set(("tools", 1, "parameters", "q"), "str"), "tools[1].parameters.q", "malformed tool"),
    (_set(("tools", 0, "function", "name"), KeyError), "tools[0]", "malformed tool"),
    (_set(("tools", 1, "name"), "add"), "tools", "duplicate tool name"),
    (_set(("answers",), "[{'name': 'add',"), "answers", "answers not valid JSON"),
    (_set(("answers",), {"name": "add"}), "answers", "malformed call"),
    (_set(("answers", 1, "name"), "find"), "answers[1].name", "call to undeclared tool"),
    (_set(("answers", 1), KeyError), None, None),  # one call is still a row: the control
    (_set(("answers", 0, "name"), ""), "answers[0].name", "call without a name"),
    (_set(("answers", 0, "arguments"), "[2, 3]"), "answers[0].arguments", "arguments not an object"),
    (_set(("answers", 0, "arguments"), '{"a": 2,'), "answers[0].arguments", "arguments not valid JSON"),
]
H = HERMES_ROWS[0]
HERMES_BAD = [  # (change to row h-1, field named, reason counted)
    (_set(("conversations",), KeyError), "conversations", "missing conversations"),
    (_set(("conversations", 1), "Weather in Oslo?"), "conversations[1]", "malformed message"),
    (_set(("conversations", 1, "from"), "customer"), "conversations[1].from", "unknown role"),
    (_set(("conversations", 1, "value"), ["Weather?"]), "conversations[1].value", "non-text content"),
    (_set(("conversations", 0, "value"), lambda v: v.replace("</tools>", "")), "conversations[0].value",
     "malformed message"),
    (_set(("conversations", 0, "value"), lambda v: v.replace("<tools> [", "<tools> [[")),
     "conversations[0].value", "tools not valid JSON"),
    (_set(("conversations", 0, "value"), lambda v: v.replace("'object'", "'array'")),
     "conversations[0].value.tools[0]", "malformed tool"),
    (_set(("conversations", 2, "value"), lambda v: v.replace("</tool_call>", "")), "conversations[2].value",
     "malformed call"),
    (_set(("conversations", 2, "value"), lambda v: v.replace("'Oslo'}", "'Oslo'")),
     "conversations[2].value.tool_call[0]", "call not valid JSON"),
    (_set(("conversations", 2, "value"), lambda v: v.replace("get_weather", "get_forecast")),
     "conversations[2].value.tool_call[0].name", "call to undeclared tool"),
    (_set(("conversations", 2, "value"), lambda v: v.replace("{'city': 'Oslo'}", "'Oslo'")),
     "conversations[2].value.tool_call[0].arguments", "arguments not valid JSON"),
    (_set(("conversations", 2, "value"), lambda v: v.replace("{'city': 'Oslo'}", "['Oslo']")),
     "conversations[2].value.tool_call[0].arguments", "arguments not an object"),
    (_set(("conversations", 3, "value"), lambda v: v.replace("get_weather", "weather")),
     "conversations[3].value.tool_response[0]", "tool result from undeclared tool"),
    (_set(("conversations", 2, "value"), " "), "conversations[2].value", "empty assistant turn"),
    (_set(("conversations",), lambda v: v[:2]), "conversations", "no assistant turn"),
]
G = GLAIVE_ROWS[1]
GLAIVE_BAD = [  # (change to the second row, field named, reason counted)
    (_set(("chat",), KeyError), "chat", "missing chat"),
    (_set(("chat",), lambda v: "Hello.\n" + v), "chat", "malformed message"),
    (_set(("system",), ["SYSTEM:"]), "system", "non-text content"),
    (_set(("system",), lambda v: v[:-3]), "system", "tools not valid JSON"),
    (_set(("system",), lambda v: v.replace('"add"', '"search"')), "system", "duplicate tool name"),
    (_set(("system",), lambda v: v.replace('"name": "add",', "")), "system.function[0]", "malformed tool"),
    (_set(("chat",), lambda v: v.replace('"b": 5}}', '"b": 5}')), "chat[3].functioncall[0]",
     "call not valid JSON"),
    (_set(("chat",), lambda v: v.replace('"name": "add"', '"name": "sum"')), "chat[3].functioncall[0].name",
     "call to undeclared tool"),
    (_set(("chat",), lambda v: v.replace('"name": "add"', '"name": null')), "chat[3].functioncall[0].name",
     "call without a name"),
    (_set(("chat",), lambda v: v.replace('{"a": 4, "b": 5}', "'{\"a\": 4, \"b\": }'")),
     "chat[3].functioncall[0].arguments", "arguments not valid JSON"),
    (_set(("chat",), lambda v: v.replace('{"a": 4, "b": 5}', "[4, 5]")), "chat[3].functioncall[0].arguments",
     "arguments not an object"),
    (_set(("chat",), lambda v: v.replace("Hello! How can I help?", "")), "chat[1]", "empty assistant turn"),
    (_set(("chat",), lambda v: "USER: Hi!\n\n\nUSER: Add 4 and 5."), "chat", "no assistant turn"),
]
TOOLACE_BAD = [  # (change to the ToolACE-style row, field named, reason counted)
    (_set(("conversations", 1, "value"), "[add(2, 3)]"), "conversations[1].value.call[0]", "malformed call"),
    (_set(("conversations", 1, "value"), "[add(a=x, b=1)]"), "conversations[1].value.call[0].arguments",
     "arguments not valid JSON"),
    (_set(("conversations", 1, "value"), "[add(a={1, 2}, b=1)]"), "conversations[1].value.call[0].arguments",
     "arguments not valid JSON"),
    (_set(("conversations", 1, "value"), '[get_weather(city="Oslo"), sum(a=2, b=3)]'),
     "conversations[1].value.call[1].name", "call to undeclared tool"),
    (_set(("conversations", 2, "value"), lambda v: v.replace('"add"', '"sum"')), "conversations[2].value[1]",
     "tool result from undeclared tool"),
]
BAD = {"xlam": ("xlam", X, XLAM_BAD), "hermes_fc": ("hermes_fc", H, HERMES_BAD),
       "glaive": ("glaive", G, GLAIVE_BAD), "toolace": ("hermes_fc", TOOLACE_ROW, TOOLACE_BAD)}
CASES = [(case, i) for case, (_, _, bad) in BAD.items() for i in range(len(bad))]


@pytest.mark.parametrize("case, i", CASES, ids=[f"{case}-{BAD[case][2][i][2]}-{i}" for case, i in CASES])
def test_bad_row_error_names_file_row_and_field(tmp_path, case, i):
    fmt, good, bad = BAD[case]
    change, field, kind = bad[i]
    row = change(good)
    if "id" in row:
        row["id"] = f"{row['id']}-bad"
    path = write_jsonl(tmp_path / "data.jsonl", [good, "", row])  # a blank line 2
    if field is None:
        assert load_rows(path, fmt).rows == 2
        return
    with pytest.raises(BadRow) as ei:
        load_rows(path, fmt)
    e = ei.value
    assert isinstance(e, DataError)
    assert (e.file, e.item, e.field, e.kind) == (str(path), "line 3", field, kind)
    assert f"file '{path}', item 'line 3', field '{field}'" in str(e) and "\n" not in str(e)


@pytest.mark.parametrize("case", sorted(BAD))
def test_skip_mode_counts_every_bad_row_by_reason(tmp_path, case):
    fmt, good, bad = BAD[case]
    rows = [good]
    for k, (change, _, _) in enumerate(bad):
        rows.append(change(good))
        if "id" in good:
            rows[-1]["id"] = f"bad-{k}"
    assert sum(1 for _, field, _ in bad if field is not None) >= (10 if case == fmt else 5)
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    stats = format_stats(path, fmt)
    assert stats["format"] == fmt and stats["rows"] == len(rows)
    assert stats["skipped_rows"] == dict(Counter(kind for _, field, kind in bad if field is not None))
    assert stats["rows_used"] == 1 + sum(1 for _, field, _ in bad if field is None)


def test_whole_row_problems_and_a_json_list(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [XLAM_ROWS[0], '{"query": ', "[1]", XLAM_ROWS[0]])
    data = load_rows(path, "xlam", on_bad_row="skip")
    assert data.skipped == Counter({"row not valid JSON": 1, "row not an object": 1, "duplicate id": 1})
    listed = tmp_path / "x.json"
    listed.write_text(json.dumps([GLAIVE_ROWS[0], GLAIVE_BAD[0][0](GLAIVE_ROWS[0])]))
    with pytest.raises(BadRow, match=r"item 'row 1', field 'chat'"):
        load_rows(listed)


# ---------------------------------------------------------------- detection, conversion, decoding


def test_auto_detection_says_why_and_names_the_keys_it_cannot_place(tmp_path):
    assert detect_format({"messages": [], "tools": []})[0] == "messages"
    assert detect_format(XLAM_ROWS[0]) == ("xlam", "the row has 'query' and 'answers' (xLAM/APIGen)")
    assert detect_format(HERMES_ROWS[0])[0] == "hermes_fc" and detect_format(GLAIVE_ROWS[0])[0] == "glaive"
    with pytest.raises(DataError, match="the first row has keys 'prompt', 'response', which fits none"):
        detect_format({"prompt": "x", "response": "y"})
    path = write_jsonl(tmp_path / "h.jsonl", HERMES_ROWS)
    assert resolve_format(path) == detect_format(HERMES_ROWS[0]) and resolve_format(path, "glaive") == \
        ("glaive", "named")
    with pytest.raises(ValueError, match="unknown data format 'sharegpt'; choose one of messages, xlam"):
        resolve_format(path, "sharegpt")
    with pytest.raises(DataError, match="holds no row"):
        resolve_format(write_jsonl(tmp_path / "empty.jsonl", []))


@pytest.mark.parametrize("fmt, rows", [("xlam", XLAM_ROWS), ("hermes_fc", HERMES_ROWS),
                                       ("glaive", GLAIVE_ROWS)])
def test_converted_rows_are_messages_rows_that_load_alike(tmp_path, fmt, rows):
    path = write_jsonl(tmp_path / fmt / "train.jsonl", [*rows, {"broken": True}])
    with pytest.raises(BadRow):
        convert_rows(path, fmt)
    converted, data = convert_rows(path, fmt, on_bad_row="skip")
    assert len(converted) == len(rows) and sum(data.skipped.values()) == 1
    again = write_jsonl(tmp_path / "out" / "train.jsonl", converted)
    direct = load_rows(path, fmt, on_bad_row="skip").examples
    assert _comparable(load_messages(again).examples) == _comparable(direct)
    assert all(set(r) <= {"id", "tools", "messages"} for r in converted)
    for r in converted:  # one shape, OpenAI's: wrapped tools, wrapped calls with JSON-text arguments
        assert all(t["type"] == "function" and set(t["function"]) >= {"name"} for t in r["tools"])
        for c in (c for m in r["messages"] for c in m.get("tool_calls") or []):
            assert c["type"] == "function" and isinstance(c["function"]["arguments"], str)
            assert isinstance(json.loads(c["function"]["arguments"]), dict)


def test_stats_report_the_format_and_counts(tmp_path):
    stats = format_stats(write_jsonl(tmp_path / "x.jsonl", XLAM_ROWS))
    assert stats["format"] == "xlam" and stats["format_reason"].startswith("the row has 'query'")
    counts = (stats["rows"], stats["examples"], stats["no_call_examples"], stats["parallel_turns"])
    assert counts == (4, 4, 1, 1)


def test_loose_decoding_reads_python_literals_and_never_evaluates():
    assert loose_json("{'a': True, 'b': None, 'c': (1, 2)}") == {"a": True, "b": None, "c": [1, 2]}
    for text in ("__import__('os').system('true')", "{1, 2}", "b'x'", "1j", "{1: 2}", "[1,"):
        with pytest.raises(ValueError, match="nor a Python literal"):
            loose_json(text)
    assert json_objects('{"a": 1}\n\n{"b": 2}, {"c": 3}') == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert json_objects("[{'a': 1}]") == [{"a": 1}] and json_objects('{"a": 1}') == [{"a": 1}]


def test_cipr_data_convert_and_stats_read_a_published_format(tmp_path, capsys):
    from cipr.cli.data import main

    source = write_jsonl(tmp_path / "x.jsonl", [*XLAM_ROWS, {"broken": True}])
    out = tmp_path / "rows.jsonl"
    assert main(["convert", f"path={source}", f"out={out}", "on_bad_row=skip"]) == 0
    assert "format xlam: the row has 'query'" in capsys.readouterr().err
    def content(examples: list[Example]) -> list:
        return [(e.messages, e.interface, e.reference, e.response) for e in examples]

    direct = load_rows(source, "xlam", on_bad_row="skip").examples
    assert content(load_messages(out).examples) == content(direct)
    assert main(["stats", "source=messages", f"path={source}", "format=xlam", "on_bad_row=skip"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["format"] == "xlam" and stats["examples"] == 4
    assert stats["skipped_rows"] == {"missing query": 1}
    assert main(["stats", "source=bfcl", "format=xlam"]) == 2  # format belongs to source=messages


@pytest.mark.parametrize("fmt, rows", [("xlam", XLAM_ROWS), ("hermes_fc", HERMES_ROWS)])
def test_one_cipr_step_trains_on_a_published_format(tmp_path, tiny_dir, fmt, rows):
    """`cipr-train data=messages data.format=FMT`: the rows go through the messages pipeline, paired copies
    and the consistency terms included, on the tiny model."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cipr.cli.train import CONFIG_DIR
    from cipr.train.config import config_from_dict
    from cipr.train.run import run

    copies = [{**r, "id": f"{r.get('id', k)}-{c}"} for c in range(3) for k, r in enumerate(rows)]
    path = write_jsonl(tmp_path / fmt / "train.jsonl", copies)
    overrides = ["data=messages", f"data.path={path}", f"data.format={fmt}", "data.eval_examples=1",
                 "model=tiny", f"model.name_or_path={tiny_dir}", "trainer=smoke", "trainer.max_steps=1",
                 f"trainer.run_dir={tmp_path / 'run'}", "trainer.per_device_train_batch_size=4",
                 "trainer.warm_start.steps=0", "rollout.num_generations=2", "rollout.max_completion_length=8",
                 "logging.progress_bar=false"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = config_from_dict(OmegaConf.to_container(compose("train", overrides=overrides), resolve=True))
    run_dir = run(cfg)
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "step" and "consistency/rescore/kl" in r for r in steps)


def test_the_readmes_example_files_are_the_rows_above():
    """tests/data/{xlam,hermes_fc,glaive}_example.* (the README's "Your own data" commands) hold them."""
    data = Path(__file__).parent / "data"
    assert json.loads((data / "xlam_example.json").read_text()) == XLAM_ROWS
    for name, rows in (("hermes_fc", HERMES_ROWS), ("glaive", GLAIVE_ROWS)):
        assert [json.loads(x) for x in (data / f"{name}_example.jsonl").read_text().splitlines()] == rows
