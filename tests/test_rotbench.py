"""RoTBench loader (counts, prompt round trip, turns, bad input) and its Content-Filling criterion."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cipr.core.errors import DataError
from cipr.data.rotbench import (
    LEVELS,
    SPLITS,
    load_rotbench,
    load_rotbench_file,
    parse_answer,
    render_tool_list,
    rotbench_file,
    rotbench_stats,
)
from cipr.scoring.rotbench import accepted_answers, content_filling, parse_prediction, rotbench_criteria
from cipr.tools.interface import Call, Example, Interface, Message, Tool

COUNTS = {"First_Turn": dict(zip(LEVELS, (105, 210, 210, 210, 105), strict=True)),
          "Third_Turn": dict(zip(LEVELS, (70, 140, 140, 140, 70), strict=True))}


@pytest.fixture(scope="module")
def all_items(shared_data):
    return {(s, lv): load_rotbench(shared_data, s, lv) for s in SPLITS for lv in LEVELS}


def test_counts_and_scenarios(all_items, shared_data):
    for (split, level), exs in all_items.items():
        assert len(exs) == COUNTS[split][level], (split, level)
        per = len(exs) // 7
        assert Counter(e.meta["scenario"] for e in exs) == \
            dict.fromkeys(("TG", "RS", "DU", "PL", "AM", "IR", "FT"), per)
        assert len({e.id for e in exs}) == len(exs)
    stats = rotbench_stats(shared_data)
    assert {s: {lv: v["items"] for lv, v in d.items()} for s, d in stats.items()} == COUNTS
    assert sum(v["accepted_answers"] for d in stats.values() for v in d.values()) == 1912


def test_prompt_round_trip_and_answers(all_items, shared_data):
    for (split, level), exs in all_items.items():
        raw = json.loads(rotbench_file(shared_data, split, level).read_text())
        for e in exs:
            conv = raw[e.meta["index"]]["conversations"]
            assert e.meta["system_prefix"] + render_tool_list(e.interface) + e.meta["system_suffix"] \
                == conv[0]["value"]
            assert e.messages[0] == Message("user", conv[1]["value"])
            assert len(accepted_answers(e)) == len(conv[-1]["value"])
            assert e.meta["finish_tool"] == e.interface.names[-1]
            assert all(c.name in e.interface for c in accepted_answers(e))


def test_first_item_hand_checked(all_items):
    e = all_items[("First_Turn", "clean")][0]
    assert e.id == "rotbench/First_Turn/clean/000"
    assert e.interface.names == ("get_translation_nllb", "get_translation_baidu", "ask_to_user", "finish")
    assert e.reference == \
        (Call("get_translation_nllb", {"input_text": "See you later", "tgt_lang": "jpn_Jpan",
                                       "src_lang": "eng_Latn", "max_length": "None"}),)
    assert e.alternatives == ((Call("get_translation_baidu", {"text": "See you later", "tgt_lang": "jp"}),),)
    assert e.interface[0].required == ("input_text", "tgt_lang", "src_lang", "max_length")


def test_third_turn_history(all_items):
    for e in all_items[("Third_Turn", "heavy")]:
        roles = [m.role for m in e.messages]
        assert roles[0] == "user" and roles[1] == "assistant" and roles[3] == "assistant" and len(roles) == 5
        assert all(len(m.calls) == 1 for m in e.messages if m.role == "assistant")
        for prev, m in zip(e.messages, e.messages[1:], strict=False):
            if m.role == "tool":
                assert m.name == prev.calls[0].name
    e = all_items[("Third_Turn", "heavy")][0]
    assert e.messages[2] == \
        Message("tool", "ask_to_user() missing 1 required positional argument: 'max_length'",
                name="ask_to_user")


def test_duplicate_tool_names_kept_and_counted(all_items, shared_data):
    flagged = sum(1 for exs in all_items.values() for e in exs if e.meta["issues"])
    assert flagged == 38
    with pytest.raises(DataError, match="more than once"):
        load_rotbench(shared_data, "First_Turn", "clean", strict=True)


def test_unknown_split_or_level():
    with pytest.raises(ValueError, match="level"):
        rotbench_file(None, "First_Turn", "extreme")
    with pytest.raises(ValueError, match="split"):
        rotbench_file(None, "Second_Turn", "clean")


def _item(system=None, answers=None, scenario="TG"):
    tools = [{"name": "t", "description": "d", "parameters": {"type": "object", "properties": {}}},
             {"name": "ask_to_user", "description": "a", "parameters": {"type": "object", "properties": {}}},
             {"name": "finish", "description": "f", "parameters": {"type": "object", "properties": {}}}]
    system = system if system is not None else "Tools:\n" + json.dumps(tools) + "\n\nLet's Begin!"
    answers = answers if answers is not None else ['Thought:\nAction: t\nAction Input: {"a": 1}']
    return {"id": "q", "conversations": [{"from": "system", "value": system},
                                         {"from": "user", "value": "hi"},
                                         {"from": "assistant", "value": answers}], "scenario": scenario}


@pytest.mark.parametrize("bad, field", [
    (_item(answers=['Thought:\nAction: t\nAction Input: {"a": 1']), "conversations[2][0]"),
    (_item(answers=["Thought: nothing"]), "conversations[2][0]"),
    (_item(answers=[]), "conversations[2]"),
    (_item(system="no tools here"), "conversations[0]"),
    (_item(system='Tools: [{"name": "t", "parameters": {"type": "string"}}]'), "t.parameters"),
    (_item(scenario="XX"), "scenario"),
])
def test_malformed_items_name_file_item_field(tmp_path, bad, field):
    p = tmp_path / "clean.json"
    p.write_text(json.dumps([_item(), bad]))
    with pytest.raises(DataError) as ei:
        load_rotbench_file(p, "First_Turn", "clean")
    assert ei.value.file == str(p) and ei.value.item == "rotbench/First_Turn/clean/001"
    assert ei.value.field == field


def test_malformed_json_file(tmp_path):
    p = tmp_path / "clean.json"
    p.write_text("[{")
    with pytest.raises(DataError, match=r"not valid JSON \(.*: line 1 column 3\)") as ei:
        load_rotbench_file(p, "First_Turn", "clean")
    assert ei.value.file == str(p)


def test_parse_answer():
    call, thought = parse_answer('Thought: look it up\nAction: get_x\nAction Input: {"k": "v"}')
    assert call == Call("get_x", {"k": "v"}) and thought == "look it up"


# --- the criterion, hand-built cases -------------------------------------------------------------

def _crit(pred, answers, finish="finish", ask="ask_to_user", **kw):
    return rotbench_criteria(pred, answers, finish_name=finish, ask_name=ask, **kw)


def test_criterion_levels():
    gold = [Call("search", {"q": "cats", "n": "5"})]
    assert _crit(Call("search", {"q": "cats", "n": "5"}), gold) == \
        {"tool_selection": 1.0, "parameter_identification": 1.0, "content_filling": 1.0}
    assert _crit(Call("search", {"q": "dogs", "n": "5"}), gold) == \
        {"tool_selection": 1.0, "parameter_identification": 1.0, "content_filling": 0.0}
    assert _crit(Call("search", {"q": "cats"}), gold) == \
        {"tool_selection": 1.0, "parameter_identification": 0.0, "content_filling": 0.0}
    assert _crit(Call("lookup", {"q": "cats", "n": "5"}), gold)["tool_selection"] == 0.0
    assert _crit(None, gold) == \
        {"tool_selection": 0.0, "parameter_identification": 0.0, "content_filling": 0.0}
    # values compare after json.loads with Python ==: "5" is not 5
    assert _crit(Call("search", {"q": "cats", "n": 5}), gold)["content_filling"] == 0.0


def test_none_values_are_wildcards_but_keys_must_match():
    gold = [Call("tr", {"text": "hi", "max_length": "None"})]
    assert _crit(Call("tr", {"text": "hi", "max_length": "200"}), gold)["content_filling"] == 1.0
    assert _crit(Call("tr", {"text": "hi"}), gold)["content_filling"] == 0.0


def test_alternatives_any_passes():
    gold = [Call("a", {"x": "1"}), Call("b", {"y": "2"})]
    assert _crit(Call("b", {"y": "2"}), gold)["content_filling"] == 1.0
    assert _crit(Call("b", {"y": "3"}), gold) == \
        {"tool_selection": 1.0, "parameter_identification": 1.0, "content_filling": 0.0}


def test_finish_and_ask_positions_skip_values():
    # the last declared tool (here renamed "zz") is RoTBench's finish; its content is not compared
    gold = [Call("zz", {"answer": "Paris"})]
    assert _crit(Call("zz", {"answer": "London"}), gold, finish="zz")["content_filling"] == 1.0
    # a prediction named "finish" stands for the last declared tool
    assert _crit(Call("finish", {"answer": "x"}), gold, finish="zz")["content_filling"] == 1.0
    # second-to-last = ask_to_user, also not compared; any other tool is compared
    gold = [Call("qq", {"question": "Which city?"})]
    assert _crit(Call("qq", {"question": "?"}), gold, finish="zz", ask="qq")["content_filling"] == 1.0
    assert _crit(Call("qq", {"question": "?"}), gold, finish="zz", ask="other")["content_filling"] == 0.0
    # a tool literally named ask_to_user at a noisy level is also not compared (RoTBench compares the label)
    gold = [Call("ask_to_user", {"q": "a"})]
    assert _crit(Call("ask_to_user", {"q": "b"}), gold, finish="zz", ask="other")["content_filling"] == 1.0


def test_quirks_reproduced_and_liftable():
    # empty Action Input fails everything, even when the gold input is empty
    gold = [Call("get_today_date", {})]
    assert _crit(Call("get_today_date", {}), gold)["tool_selection"] == 0.0
    assert _crit(Call("get_today_date", {}), gold, replicate_quirks=False)["content_filling"] == 1.0
    # the "None" key deleted for answer 1 is gone from the prediction when answer 2 is checked
    gold = [Call("tr", {"text": "dog", "max_length": "None"}),
            Call("tr", {"text": "cat", "max_length": "None"})]
    pred = Call("tr", {"text": "cat", "max_length": "None"})
    assert _crit(pred, gold)["content_filling"] == 0.0
    assert _crit(pred, gold, replicate_quirks=False)["content_filling"] == 1.0
    assert pred.arguments == {"text": "cat", "max_length": "None"}  # the caller's call is not mutated


def test_parse_prediction_like_rotbench():
    assert parse_prediction('Thought: x\nAction: f\nAction Input: {"a": 1}') == Call("f", {"a": 1})
    assert parse_prediction('Thought: x\nAction: f\nAction Input: "text"') is None
    assert parse_prediction("Thought: x\nAction: f\nAction Input: {oops") is None
    assert parse_prediction("I will just answer.") is None


def test_gold_answers_as_predictions(all_items):
    exact, lifted = Counter(), Counter()
    for exs in all_items.values():
        for e in exs:
            for a in accepted_answers(e):
                exact[content_filling(a, e)[0]] += 1
                lifted[content_filling(a, e, replicate_quirks=False)[0]] += 1
    assert lifted == {1.0: 1912}
    # RoTBench's own rules reject the 84 empty-input answers and 24 answers after a "None" deletion
    assert exact == {1.0: 1804, 0.0: 108}


def test_content_filling_reads_meta_positions():
    iface = Interface((Tool("a", "d"), Tool("b", "d"), Tool("c", "d")))
    e = Example("x", (Message("user", "q"),), iface, reference=(Call("a", {"k": "v"}),),
                meta={"finish_tool": "a", "ask_tool": "b"})
    value, metrics = content_filling(Call("a", {"k": "other"}), e)
    assert value == 1.0 and metrics["parse_failed"] == 0.0
    value, metrics = content_filling(None, e)
    assert value == 0.0 and metrics["parse_failed"] == 1.0
