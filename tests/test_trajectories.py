"""Trajectory loaders and the ToyShop environment."""

import json

import pytest

from cipr.core.errors import DataError
from cipr.data.trajectories import load_trajectories, to_agentinstruct, toyshop_trajectories
from cipr.envs.toyshop import ToyShop
from cipr.tools.interface import Call


def test_toyshop_expert_solves_tasks_and_is_deterministic():
    a = toyshop_trajectories(20, seed=1)
    b = toyshop_trajectories(20, seed=1)
    assert [m.content for e in a for m in e.messages] == [m.content for e in b for m in e.messages]
    assert all(e.meta["reward"] == 1.0 for e in a)
    assert a[0].messages[1].role == "assistant" and a[0].messages[1].calls[0].name == "search"
    assert toyshop_trajectories(3, seed=2)[0].messages[0].content != a[0].messages[0].content


def test_toyshop_rewards_partial_matches_and_rejects_invalid_actions():
    shop = ToyShop(seed=0)
    shop.reset(0)
    assert not shop.step(Call("click", {"argument": "Buy Now"})).valid
    assert not shop.step(Call("fly", {"argument": "x"})).valid
    shop.step(Call("search", {"argument": "zzz"}))
    wrong = next(p for p in shop._results if p.kind != shop._task.kind)
    shop.step(Call("click", {"argument": wrong.pid}))
    res = shop.step(Call("click", {"argument": "Buy Now"}))
    assert res.done and res.reward < 1.0


def test_agentinstruct_round_trip(tmp_path):
    exs = toyshop_trajectories(3)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(to_agentinstruct(exs)))
    back = load_trajectories(p)
    assert [m.content for m in back[1].messages] == [m.content for m in exs[1].messages]
    assert [m.calls for m in back[1].messages] == [m.calls for m in exs[1].messages]
    assert back[0].interface.names == ("search", "click")


def test_toolcall_conversations_and_errors(tmp_path):
    rec = {"id": "c1", "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                                     "parameters": {"type": "object"}}}],
           "messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]}
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    ex = load_trajectories(p)[0]
    assert ex.messages[1].calls == (Call("f", {"a": 1}),)
    rec["messages"][1]["tool_calls"][0]["function"]["name"] = "g"
    p.write_text(json.dumps(rec) + "\n")
    with pytest.raises(DataError, match=r"item 'c1', field 'messages\[1\]\.tool_calls\[0\]\.function\.name'"):
        load_trajectories(p)
    p.write_text("{not json\n")
    with pytest.raises(DataError, match="line 1"):
        load_trajectories(p)
    with pytest.raises(FileNotFoundError, match="data.path"):
        load_trajectories(tmp_path / "missing.json")
