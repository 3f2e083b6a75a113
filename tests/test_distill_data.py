"""Trajectory data for self-distillation: rendering, turns and decisions, AgentLM's layout, trimming,
splits."""

import json
from pathlib import Path

import pytest

from cipr.cli.data import main as data_main
from cipr.core.config import ConfigError
from cipr.core.errors import DataError
from cipr.data.trajectories import load_trajectories, to_agentinstruct, toyshop_trajectories
from cipr.distill.conversation import UnusableTrajectory, render_conversation, tokenize_rendered
from cipr.distill.data import TRIM_MARK, TrajectoryDataConfig, build_items, load_split, trim
from cipr.distill.naming import named, rename_pairs
from cipr.formats import get_format
from cipr.tools.interface import Call, Example, Message

FMT = get_format("webshop")


def test_turns_and_decisions_are_located_exactly(tiny_tokenizer):
    ex = toyshop_trajectories(1, seed=2)[0]
    r = render_conversation(ex, FMT, tiny_tokenizer)
    assistant = [m for m in ex.messages if m.role == "assistant"]
    assert len(r.turns) == len(assistant) == len(r.decisions)
    assert r.prompt.endswith("<|im_start|>assistant\n") and r.turns[0][0] == r.prompt_end
    for (lo, hi), m, d in zip(r.turns, assistant, r.decisions, strict=True):
        call = m.calls[0]
        argument = call.arguments["argument"]
        assert r.text[lo:hi] == f"Thought: {m.content}\nAction: {call.name}[{argument}]<|im_end|>"
        assert r.response[d.start:].startswith(f"Action: {call.name}[") and d.taken == call.name
    assert r.text.endswith("<|im_end|>")


def test_tokenized_offsets_cover_the_text(tiny_tokenizer):
    r = render_conversation(toyshop_trajectories(1)[0], FMT, tiny_tokenizer)
    tok = tokenize_rendered(tiny_tokenizer, r)
    assert tok.offsets[0][0] == 0 and tok.offsets[-1][1] == len(r.text)
    assert tok.offsets[tok.prompt_len][0] == r.prompt_end
    assert "".join(r.text[a:b] for a, b in tok.offsets) == r.text


def test_no_assistant_turn_is_unusable_and_counted(tiny_tokenizer):
    ex = Example("x", (Message("user", "hello"),), toyshop_trajectories(1)[0].interface)
    with pytest.raises(UnusableTrajectory, match="no assistant turn"):
        render_conversation(ex, FMT, tiny_tokenizer)
    built = build_items([ex, toyshop_trajectories(1)[0]], FMT, tiny_tokenizer)
    assert len(built.items) == 1 and built.skipped == {"no assistant turn": 1}


def test_agentlm_layout_is_parsed_into_calls_and_errors_name_the_turn(tmp_path):
    rec = {"id": "ws1", "conversations": [
        {"from": "human", "value": "You can use search[keywords] and click[value]."},
        {"from": "gpt", "value": "OK"},
        {"from": "human", "value": "WebShop [SEP] Instruction: [SEP] red shoes [SEP] Search"},
        {"from": "gpt",
         "value": "Thought:\nI think I should search for red shoes.\n\nAction:\nsearch[red shoes]"}]}
    p = tmp_path / "ws.json"
    p.write_text(json.dumps([rec]))
    ex = load_trajectories(p)[0]
    assert ex.messages[1] == Message("assistant", "OK")
    assert ex.messages[3] == Message("assistant", "I think I should search for red shoes.",
                                     (Call("search", {"argument": "red shoes"}),))
    canonical, nmap = named(ex, "canonical")
    assert "function_01[keywords]" in canonical.messages[0].content
    assert "function_01 for red shoes" in canonical.messages[3].content
    assert rename_pairs(nmap, ex.interface) == [("argument", "arg_01"), ("click", "function_02"),
                                               ("search", "function_01")]
    rec["conversations"][3]["value"] = "Thought:\nhm\n\nAction:\nbuy[red shoes]"
    p.write_text(json.dumps([rec]))
    with pytest.raises(DataError, match=r"item 'ws1', field 'conversations\[3\]'.*not declared"):
        load_trajectories(p)


def test_trim_cuts_long_user_turns_and_late_turns():
    ex = toyshop_trajectories(1, seed=1)[0]
    out, cut = trim(ex, 50, 2)
    assert sum(m.role == "assistant" for m in out.messages) == 2 and out.messages[-1].role == "assistant"
    long_users = [m for m in ex.messages[:len(out.messages)] if m.role == "user" and len(m.content) > 50]
    assert cut == len(long_users) > 0
    assert all(len(m.content) <= 50 + len(TRIM_MARK) for m in out.messages if m.role == "user")
    assert trim(ex, None, None)[0] == ex


def test_split_is_seeded_disjoint_and_counted(tmp_path):
    cfg = TrajectoryDataConfig(n=10, eval_examples=3, seed=4)
    train, held, counts = load_split(cfg)
    again = load_split(cfg)
    assert [e.id for e in train] == [e.id for e in again[0]] and len(held) == 3 and len(train) == 7
    assert not {e.id for e in train} & {e.id for e in held}
    assert counts["trajectories"] == 10 and counts["held_out"] == 3
    with pytest.raises(ConfigError, match="must exceed"):
        load_split(TrajectoryDataConfig(n=3, eval_examples=3))
    with pytest.raises(ConfigError, match="cipr-data trajectories"):
        load_split(TrajectoryDataConfig(path=str(tmp_path / "missing.json")))


def test_cipr_data_trajectories_writes_a_loadable_file(tmp_path):
    out = tmp_path / "t.json"
    assert data_main(["trajectories", "n=3", "seed=5", f"out={out}"]) == 0
    back = load_trajectories(out)
    ref = toyshop_trajectories(3, seed=5)
    assert [m for e in back for m in e.messages] == [m for e in ref for m in e.messages]
    assert json.loads(out.read_text()) == to_agentinstruct(ref)
    train, held, _ = load_split(TrajectoryDataConfig(path=str(out), n=0, eval_examples=1))
    assert len(train) == 2 and len(held) == 1


def test_json_tool_call_trajectories_render_and_align_under_hermes(tmp_path, tiny_tokenizer):
    from cipr.distill.batch import build_item

    rec = {"id": "tc1",
           "tools": [{"type": "function", "function": {
               "name": "get_weather", "description": "Weather of a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}],
           "messages": [{"role": "user", "content": "Weather in Paris? Use get_weather."},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                        {"role": "tool", "name": "get_weather", "content": "sunny"},
                        {"role": "assistant", "content": "It is sunny in Paris."}]}
    p = tmp_path / "tc.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    item = build_item(load_trajectories(p)[0], get_format("hermes"), tiny_tokenizer)
    assert '"function_01"' in item.student.text and "get_weather" not in item.student.text
    assert [d.taken for d in item.teacher.decisions] == ["get_weather", None, None]
    assert [d.taken for d in item.student.decisions] == ["function_01", None, None]
    assert len(item.alignment) > 10


MESSAGES = Path(__file__).resolve().parent / "data" / "messages_example.jsonl"


def test_messages_rows_are_trajectories(tmp_path, tiny_tokenizer):
    """`data.source=messages`: each row of the shipped example is one trajectory, read by the messages
    reader."""
    from cipr.data.messages import load_messages

    cfg = TrajectoryDataConfig(source="messages", path=str(MESSAGES), n=0, eval_examples=2,
                               max_observation_chars=None, call_format=None)
    train, held, counts = load_split(cfg)
    assert counts == {"trajectories": 10, "held_out": 2, "observations_cut": 0}
    by_id = {e.id: e for e in train + held}
    assert set(by_id) == {e.meta["row_id"] for e in load_messages(MESSAGES).examples}
    flights = by_id["flights-1"]  # every message through the final answer, calls and tool names resolved
    assert [m.role for m in flights.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                  "assistant"]
    assert [c.name for m in flights.messages for c in m.calls] == ["search_flights", "book_flight"]
    assert [m.name for m in flights.messages if m.role == "tool"] == ["search_flights", "book_flight"]
    assert flights.meta["kind"] == "trajectory" and flights.reference == ()
    built = build_items(train + held, get_format("hermes"), tiny_tokenizer, rewrite="identifiers")
    assert len(built.items) == 10 and not built.skipped
    item = next(it for it in built.items if it.example.id == "flights-1")
    # each turn: its call, then the end of the turn; the final answer: the end of the turn alone
    assert [(d.taken, t) for d, t in zip(item.teacher.decisions, item.teacher.turn_of, strict=True)] == [
        ("search_flights", 0), (None, 0), ("book_flight", 1), (None, 1), (None, 2)]
    assert [d.taken for d in item.student.decisions] == ["function_01", None, "function_02", None, None]
    assert "search_flights" not in item.student.text  # book_flight's description names it: renamed too
    rows = [json.loads(x) for x in MESSAGES.read_text().splitlines()]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + json.dumps({"messages": []}) + "\n")
    with pytest.raises(DataError, match="line 11"):
        load_split(TrajectoryDataConfig(source="messages", path=str(bad), n=0, eval_examples=2))
    skip = TrajectoryDataConfig(source="messages", path=str(bad), n=0, eval_examples=2, on_bad_row="skip")
    assert load_split(skip)[2]["bad row: missing tools"] == 1
    with pytest.raises(ConfigError, match="needs data.path"):
        load_split(TrajectoryDataConfig(source="messages"))
    with pytest.raises(ConfigError, match="on_bad_row"):
        load_split(TrajectoryDataConfig(on_bad_row="skip"))


def test_the_messages_data_group_configures_distillation():
    from cipr.distill.data import trajectory_section
    from cipr.distill.evaluate import EvalConfig, check_namings

    group = {"source": "messages", "path": str(MESSAGES), "n": 0}
    section = trajectory_section(group)
    # the model's call format, whole observations
    assert section == {**group, "call_format": None, "max_observation_chars": None}
    assert trajectory_section({"source": "messages", "call_format": "hermes"})["call_format"] == "hermes"
    trajectories = {"source": "trajectories", "call_format": "webshop"}
    assert trajectory_section(trajectories) == trajectories
    with pytest.raises(ConfigError, match="algo=distill trains on agent trajectories"):
        trajectory_section({"source": "synthetic"})
    train, _, _ = load_split(TrajectoryDataConfig(**{**section, "eval_examples": 2}))
    check_namings(train, EvalConfig(namings=("original", "canonical")))
    with pytest.raises(ConfigError, match=r"synonyms renaming has no new name .*namings=\[original,"):
        check_namings(train, EvalConfig())
