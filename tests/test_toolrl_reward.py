"""ToolRL reward: every branch by hand-computed values, bounds by property test, and the real targets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cipr.data.toolrl import load_toolrl_parquet, load_toolrl_sft
from cipr.scoring.toolrl_reward import correctness_reward, format_reward, match_score, toolrl_reward
from cipr.tools.interface import Call


def calls_text(*objs, think: str = "ok", response: str | None = None) -> str:
    lines = "\n".join(json.dumps(o) if not isinstance(o, str) else o for o in objs)
    text = f"<think> {think} </think>\n<tool_call>\n{lines}\n</tool_call>"
    return text + (f"\n<response> {response} </response>" if response is not None else "")


def c(name, **params):
    return {"name": name, "parameters": params}


F_A1_B2 = [Call("f", {"a": 1, "b": 2})]


def test_match_score_hand_values():
    assert match_score(["a", "b"], ["a", "b"]) == 1.0
    assert match_score([], []) == 1.0
    assert match_score(["a"], []) == 0.0
    assert match_score(["a", "b"], ["b", "a"]) == 1.0          # multiset, order-free
    assert match_score(["a", "a", "b"], ["a", "c"]) == 1 / 4   # |∩| = 1, |A|+|B|-|∩| = 4
    assert match_score(["f", "g"], ["f"]) == 0.5


def test_exact_match():
    total, m = toolrl_reward(calls_text(c("f", a=1, b=2)), F_A1_B2, False)
    assert (total, m["format"], m["correctness"], m["status"]) == (4.0, 1.0, 3.0, "exact")


def test_wrong_value():
    # S = J(names)=1 + J(keys)=1 + 1 equal value = 3; S_max = 1 + (1 + 2) = 4; 6*3/4 - 3 = 1.5
    total, m = toolrl_reward(calls_text(c("f", a=1, b=3)), F_A1_B2, False)
    assert m["correctness"] == pytest.approx(1.5) and total == pytest.approx(2.5)
    assert (m["S"], m["S_max"]) == (3.0, 4.0)


def test_extra_argument():
    # J(keys) = |{a}| / |{a, c}| = 1/2; S = 1 + 0.5 + 1 = 2.5; S_max = 3; 6*2.5/3 - 3 = 2
    val, _ = correctness_reward(calls_text(c("f", a=1, c=5)), [Call("f", {"a": 1})])
    assert val == pytest.approx(2.0)


def test_wrong_tool_name_is_minimum_but_parsed():
    val, m = correctness_reward(calls_text(c("g", a=1)), [Call("f", {"a": 1})])
    assert val == -3.0 and m["status"] == "partial" and m["S"] == 0.0


def test_parallel_missing_call():
    # names: J([f, g], [f]) = 1/2; f matched: 1 + 1 = 2; g unmatched; S = 2.5; S_max = 1 + 2 + 2 = 5 -> 0
    gt = [Call("f", {"a": 1}), Call("g", {"b": 2})]
    val, m = correctness_reward(calls_text(c("f", a=1)), gt)
    assert val == pytest.approx(0.0) and m["S"] == 2.5 and m["S_max"] == 5.0


def test_parallel_reordered_reaches_max_without_exact_match():
    gt = [Call("f", {"a": 1}), Call("g", {"b": 2})]
    val, m = correctness_reward(calls_text(c("g", b=2), c("f", a=1)), gt)
    assert val == pytest.approx(3.0) and m["status"] == "partial"


def test_best_unused_match_same_name():
    gt = [Call("f", {"x": 1}), Call("f", {"x": 2})]
    # gt f(x=1) takes pd[1] (score 2 beats 1), gt f(x=2) then takes pd[0]: S = 1 + 2 + 2 = 5 = S_max
    assert correctness_reward(calls_text(c("f", x=2), c("f", x=1)), gt)[0] == pytest.approx(3.0)
    # one prediction for two gt calls: J(names) = 1/2, S = 0.5 + 2 = 2.5, S_max = 5
    assert correctness_reward(calls_text(c("f", x=1)), gt)[0] == pytest.approx(0.0)
    # the prediction matches the second gt call better, but the first gt call takes it (greedy, in order):
    # gt1 f(x=1) <- pd f(x=2) with score 1; gt2 gets nothing; S = 0.5 + 1 = 1.5; 6*1.5/5 - 3 = -1.2
    assert correctness_reward(calls_text(c("f", x=2)), gt)[0] == pytest.approx(-1.2)


def test_no_parameter_tools():
    assert correctness_reward(calls_text(c("f")), [Call("f", {})])[0] == 3.0
    # J([], [a]) = 0 and no equal values: total 0 is not > 0, so no match; S = 1, S_max = 2 -> 0
    assert correctness_reward(calls_text(c("f", a=1)), [Call("f", {})])[0] == pytest.approx(0.0)


def test_python_equality_of_values():
    assert correctness_reward(calls_text(c("f", a=1.0, b=2)), F_A1_B2)[0] == 3.0   # 1 == 1.0
    assert correctness_reward(calls_text(c("f", a="1", b=2)), F_A1_B2)[0] == pytest.approx(1.5)


@pytest.mark.parametrize("text, status", [
    ("<think> x </think>\n<response> no call </response>", "missing_tags"),
    ("<think> x </think>\n<tool_call>\n{\"name\": \"f\", \"parameters\": {\"a\": 1}}", "missing_tags"),
    (calls_text('{"name": "f", "parameters": {"a": 1}'), "parse_error"),
    (calls_text(c("f", a=1, b=2), "", c("f", a=1, b=2)), "parse_error"),        # blank line
    ("<think> x </think>\n<tool_call>\n</tool_call>", "parse_error"),            # nothing inside
    (calls_text('["f", {"a": 1}]'), "parse_error"),                                # not an object
    (calls_text({"parameters": {"a": 1}}), "parse_error"),                         # no name
    (calls_text({"name": "f"}), "parse_error"),                                    # same name, no parameters
    (calls_text({"name": "f", "parameters": [1]}), "parse_error"),                 # parameters not an object
])
def test_minimum_when_tags_missing_or_calls_do_not_parse(text, status):
    val, m = correctness_reward(text, F_A1_B2)
    assert (val, m["status"]) == (-3.0, status)


def test_other_name_without_parameters_is_not_an_error():
    # rlla.py never reads "parameters" of a call whose name no gt call has:
    # J([f], [f, g]) = 1/2; f: 1 + 1 = 2; S = 2.5; S_max = 3 -> 2
    val, m = correctness_reward(calls_text(c("f", a=1), {"name": "g"}), [Call("f", {"a": 1})])
    assert val == pytest.approx(2.0) and m["status"] == "partial"


def test_response_only_ground_truth_has_no_correctness_term():
    total, m = toolrl_reward("<think> hi </think>\n<response> Hello! </response>", [], True)
    assert (total, m["format"], m["correctness"], m["status"]) == (1.0, 1.0, 0.0, "no_reference")
    # a call where a response was expected: format fails, correctness is still not scored
    total, m = toolrl_reward(calls_text(c("f", a=1)), [], True)
    assert (total, m["format"], m["correctness"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("text, calls, resp, expected", [
    (calls_text(c("f", a=1)), True, False, 1.0),
    ("  \n" + calls_text(c("f", a=1)) + "\n\n", True, False, 1.0),                 # stripped first
    (calls_text(c("f", a=1)) + "\nmore", True, False, 0.0),                        # trailing text
    (calls_text(c("f", a=1)) + "\n<tool_call>", True, False, 0.0),                 # tag twice
    ("<think> a </think><tool_call>\n{}\n</tool_call>", True, False, 0.0),         # newline missing
    ("<think> a <think> b </think>\n<tool_call>\nx\n</tool_call>", True, False, 1.0),  # think not counted
    (calls_text(c("f", a=1), response="done"), True, True, 1.0),
    (calls_text(c("f", a=1)), True, True, 0.0),
    ("<think> a </think>\n<response> r </response>", False, True, 1.0),
    ("<think> a </think>\n<response> r </response><response>", False, True, 0.0),
    ("<think> a </think>", False, False, 1.0),
    ("<think> a </think>\n<response> r </response>", False, False, 0.0),
    ("no tags at all", True, False, 0.0),
])
def test_format_reward_shapes(text, calls, resp, expected):
    assert format_reward(text, expects_calls=calls, expects_response=resp) == expected


names = st.sampled_from(["f", "g", "h"])
values = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y"]), st.booleans())
call_dicts = st.builds(lambda n, p: {"name": n, "parameters": p}, names,
                       st.dictionaries(st.sampled_from(["a", "b", "c"]), values, max_size=3))


@settings(max_examples=200, deadline=None)
@given(gt=st.lists(call_dicts, min_size=1, max_size=3), pd=st.lists(call_dicts, min_size=1, max_size=4))
def test_bounds_and_self_score(gt, pd):
    ref = [Call(g["name"], g["parameters"]) for g in gt]
    val, _ = correctness_reward(calls_text(*pd), ref)
    assert -3.0 <= val <= 3.0
    total, m = toolrl_reward(calls_text(*gt), ref, False)
    assert (total, m["format"], m["correctness"]) == (4.0, 1.0, 3.0)


def test_released_targets_score_the_maximum(shared_data):
    exs = load_toolrl_parquet(shared_data / "toolrl" / "rlla_4k" / "test.parquet")
    exs += load_toolrl_sft(shared_data / "toolrl" / "rlla_4k_raw" / "rlla_sft.json")
    tags = ("<tool_call>", "</tool_call>", "<response>", "</response>")
    for e in exs:
        total, m = toolrl_reward(e.meta["target"], e.reference, e.response is not None)
        if not e.reference:
            assert total == 1.0, e.id
        elif any(t in e.meta["think"] for t in tags):
            # rlla.py reads the first <tool_call> and counts tags over the whole text: a target whose
            # reasoning mentions the tags (17 SFT targets) scores format 0 and correctness -3
            assert (total, m["status"]) == (-3.0, "parse_error"), e.id
        else:
            assert (total, m["status"]) == (4.0, "exact"), e.id
    assert sum(1 for e in exs if e.reference and any(t in e.meta["think"] for t in tags)) == 17
