"""ToolRL loaders: counts on the real files, schema conversion, history, prompt round trip, bad input."""

from __future__ import annotations

import json

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cipr.core.errors import DataError
from cipr.data.toolrl import (
    load_toolrl_parquet,
    load_toolrl_sft,
    parse_history,
    render_tool_block,
    summarize,
    toolrl_parameters,
    toolrl_property,
    toolrl_stats,
)
from cipr.tools.interface import Call, Message


@pytest.fixture(scope="module")
def test_parquet(shared_data):
    return shared_data / "toolrl" / "rlla_4k" / "test.parquet"


@pytest.fixture(scope="module")
def sft_json(shared_data):
    return shared_data / "toolrl" / "rlla_4k_raw" / "rlla_sft.json"


@pytest.fixture(scope="module")
def parquet_examples(test_parquet):
    return load_toolrl_parquet(test_parquet)


@pytest.fixture(scope="module")
def sft_examples(sft_json):
    return load_toolrl_sft(sft_json)


def test_parquet_counts(parquet_examples):
    s = summarize(parquet_examples)
    assert (s["total"], s["with_calls"], s["response_only"]) == (80, 71, 9)
    assert len({e.id for e in parquet_examples}) == 80
    assert all(e.partition == "test" and e.source == "toolrl" for e in parquet_examples)


def test_sft_counts_and_reasoning(sft_examples):
    s = summarize(sft_examples)
    assert (s["total"], s["with_calls"], s["response_only"]) == (400, 346, 54)
    assert all(len(e.meta["think"]) > 0 for e in sft_examples)
    assert sum(len(e.meta["think"].split()) > 50 for e in sft_examples) > 350  # real reasoning, not a stub


def test_stats_cover_present_files(shared_data):
    st = toolrl_stats(shared_data)
    assert st["rlla_4k/test.parquet"]["total"] == 80 and st["rlla_4k_raw/rlla_sft.json"]["total"] == 400
    assert "rlla_4k/train.parquet" not in st  # not in the shared copy


def test_first_row_hand_checked(parquet_examples):
    e = parquet_examples[0]
    assert e.id == "toolrl_test_0"
    assert e.interface.names == ("GetPowerBINews", "SingleOffer", "Domain WHOIS Lookup API", "GetNews")
    assert e.messages == (Message("user", "Hey, I'm looking to stay current on Azure services. Could you "
                                          "fetch the latest news on that topic for me?"),)
    assert e.reference == (Call("GetNews", {"page": "1"}),) and e.response is None
    assert e.meta["think"] == \
        "I should use the appropriate tool with proper parameters to respond to the user's need."
    page = e.interface[0].parameters["properties"]["page"]
    assert page == {"type": "integer", "description": "The page number to retrieve.", "x-toolrl-type": "int"}
    assert e.interface[1].parameters["properties"]["singleav"]["default"].startswith("https://www.avito.ma/")
    assert e.interface[0].required == ()


def test_response_only_row(parquet_examples):
    e = parquet_examples[1]
    assert e.reference == () and e.response.startswith('The function "getSentenceLength" can calculate')


def test_every_prompt_round_trips_and_schemas_are_valid(parquet_examples, sft_examples,
                                                        test_parquet, sft_json):
    raw_p = pq.read_table(test_parquet).to_pylist()
    raw_s = json.loads(sft_json.read_text())
    for exs, instr in ((parquet_examples, lambda e: raw_p[e.meta["row"]]["prompt"][0]["content"]),
                       (sft_examples, lambda e: raw_s[e.meta["row"]]["instruction"])):
        for e in exs:
            assert e.meta["system_prefix"] + render_tool_block(e.interface) + e.meta["system_suffix"] == \
                instr(e)
            for t in e.interface:
                jsonschema.Draft202012Validator.check_schema(dict(t.parameters))


def test_multi_turn_history(sft_examples):
    e = sft_examples[16]
    roles = [m.role for m in e.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant",
                     "user", "assistant", "tool"]
    assert e.messages[1].calls == (Call("Get Trending TV Shows", {}),) and e.messages[1].content == ""
    assert e.messages[2].name == "Get Trending TV Shows" and e.messages[2].content.startswith('[{"name"')
    assert e.messages[3].content.startswith("The currently trending TV shows are:")
    assert len(e.meta["history_think"]) == 5
    assert sum(1 for ex in sft_examples if any(m.role != "user" for m in ex.messages)) == 40


def test_data_issues_are_kept_and_reported(parquet_examples, sft_examples, test_parquet):
    flagged = [e.id for e in parquet_examples if e.meta["issues"]]
    assert flagged == ["toolrl_test_9"]  # its target names a truncated tool name
    assert sum(1 for e in sft_examples if e.meta["issues"]) == 10
    with pytest.raises(DataError, match="undeclared tool") as ei:
        load_toolrl_parquet(test_parquet, strict=True)
    assert ei.value.item == "toolrl_test_9" and ei.value.field == "output.tool_call"


@pytest.mark.parametrize("raw, expected", [
    ({"type": "str, optional", "default": "all", "description": "d"},
     {"type": "string", "default": "all", "description": "d"}),
    ({"type": "List[List[int]]", "default": ""},
     {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}),
    ({"type": "List[Union[int, float]]", "default": ""},
     {"type": "array", "items": {"type": ["integer", "number"]}}),
    ({"type": "Tuple[float, float]", "default": ""}, {"type": "array"}),
    ({"type": "Callable[[float], float]", "default": ""}, {}),
    ({"type": ["string", "null"], "default": ""}, {"type": ["string", "null"]}),
    ({"type": "bool, optional", "default": False}, {"type": "boolean", "default": False}),
])
def test_property_conversion(raw, expected):
    prop = toolrl_property(raw)
    assert prop.pop("x-toolrl-type") == raw["type"]
    assert prop == expected


def test_toolrl_parameters_inverts_conversion(sft_examples):
    e = sft_examples[0]
    assert toolrl_parameters(e.interface[0]) == {
        "name": {"description": "The name of the manager to search for", "type": "string", "default": ""}}


def test_parse_history_rejects_stray_text():
    with pytest.raises(DataError, match="outside the dialogue tags"):
        parse_history("**Dialogue Records History**\n<user> hi </user>\nstray", file="f", item="i")
    with pytest.raises(DataError, match="no <user> turn"):
        parse_history("**Dialogue Records History**\n", file="f", item="i")


SYSTEM = ("You are helpful.\n\n**Available Tools**\nIn your response, you can use the following tools:\n"
          "1. Name: get_weather\nDescription: Weather now.\nParameters: "
          '{"city": {"description": "City", "type": "str", "default": ""}}\n\n**Steps for Each Turn**\n...')
GOOD = {"instruction": SYSTEM, "input": "**Dialogue Records History**\n<user> Weather in Oslo? </user>",
        "output": '<think> use it </think>\n<tool_call>\n'
                  '{"name": "get_weather", "parameters": {"city": "Oslo"}}\n'
                  "</tool_call>"}


@pytest.mark.parametrize("change, field", [
    ({"output": "<tool_call>\n{}\n</tool_call>"}, "output"),
    ({"output": '<think> t </think>\n<tool_call>\n{"name": "get_weather", "parameters": {\n</tool_call>'},
     "output.tool_call[0]"),
    ({"output": '<think> t </think>\n<tool_call>\n{"name": 5, "parameters": {}}\n</tool_call>'},
     "output.tool_call[0]"),
    ({"instruction": SYSTEM.replace("Parameters: {", "Parameters: [{")}, "instruction.tools[1].parameters"),
    ({"instruction": SYSTEM.replace("\nDescription: Weather now.", "")}, "instruction.tools[1]"),
    ({"instruction": "no tools"}, "instruction"),
    ({"instruction": SYSTEM.replace("Name: get_weather", "Name: ")}, "instruction.tools[1]"),
    ({"input": None}, "input"),
    ({"input": "**Dialogue Records History**\n<user> a </user>\n<tool_call>\n{oops}\n</tool_call>"},
     "input.tool_call#1[0]"),
])
def test_sft_malformed_items_name_file_item_field(tmp_path, change, field):
    p = tmp_path / "sft.json"
    p.write_text(json.dumps([GOOD, {**GOOD, **change}]))
    with pytest.raises(DataError) as ei:
        load_toolrl_sft(p)
    assert (ei.value.file, ei.value.item, ei.value.field) == (str(p), "toolrl_sft_1", field)


def test_sft_malformed_json(tmp_path):
    p = tmp_path / "sft.json"
    p.write_text('[{"instruction": ')
    with pytest.raises(DataError, match=r"not valid JSON \(.*: line 1 column 18\)"):
        load_toolrl_sft(p)


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def _row(i, gt=GOOD["output"], prompt=None):
    return {"data_source": "rlla", "prompt": prompt or [{"content": SYSTEM, "role": "system"},
                                                         {"content": GOOD["input"], "role": "user"}],
            "ability": "math", "reward_model": {"ground_truth": gt, "style": "rule"},
            "extra_info": {"index": i, "split": "train"}}


def test_parquet_by_path_like_train_split(tmp_path):
    p = tmp_path / "train.parquet"
    _parquet(p, [_row(0), _row(1, gt="<think> t </think>\n<response> Hi </response>")])
    exs = load_toolrl_parquet(p)
    assert [e.id for e in exs] == ["toolrl_train_0", "toolrl_train_1"]
    assert exs[0].reference == (Call("get_weather", {"city": "Oslo"}),) and exs[1].response == "Hi"


@pytest.mark.parametrize("rows, item, field", [
    ([_row(0), _row(0)], "toolrl_train_0", "extra_info.index"),
    ([_row(0), _row(1, prompt=[{"content": SYSTEM, "role": "system"}])], "toolrl_train_1", "prompt"),
    ([_row(0), _row(1, gt="<think> t </think>\n<tool_call>\nnot json\n</tool_call>")], "toolrl_train_1",
     "output.tool_call[0]"),
])
def test_parquet_malformed_rows(tmp_path, rows, item, field):
    p = tmp_path / "train.parquet"
    _parquet(p, rows)
    with pytest.raises(DataError) as ei:
        load_toolrl_parquet(p)
    assert (ei.value.file, ei.value.item, ei.value.field) == (str(p), item, field)


def test_not_a_parquet_file(tmp_path):
    p = tmp_path / "train.parquet"
    p.write_text("not parquet")
    with pytest.raises(DataError, match="parquet") as ei:
        load_toolrl_parquet(p)
    assert ei.value.file == str(p)
