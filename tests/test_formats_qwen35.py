"""Qwen3.5's XML call format (`qwen35_xml`) and Qwen3.6/3.8's (`qwen36_xml`), on a tiny offline tokenizer that
carries TRL's template of each (`qwen3_5_think`, `qwen3_5_nothink`, `qwen3_6`, `qwen3_8`).

(a) a target is what the template renders for the assistant turn: a call, text + call, reasoning + call,
    parallel calls, an answer, values of every JSON type; earlier turns and tool results go through it;
(b) hand-written targets, decisions, typed values read back, parse errors, refusals;
(c) property tests: render → parse round trips with decisions lined up; garbage never raises;
(d) the one-pass action reader equals the brute-force reference on the Qwen3.5 tokenizer, both padding sides.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.actions_reference import read_actions_bruteforce
from support.tiny_models import tiny_model, tiny_tokenizer, trl_template

from cipr.formats import Qwen35XmlFormat, Qwen36XmlFormat, get_format, resolve_format
from cipr.formats.base import Decision
from cipr.formats.qwen35 import FIRST_OPENER, NEXT_OPENER, TEXT_OPENER, read_value, render_value
from cipr.method.actions import ActionQuery, ActionReaderConfig, read_actions
from cipr.tools.interface import Call, Interface, Message, Tool

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATE_FORMAT = {"qwen3_5_think": "qwen35_xml", "qwen3_5_nothink": "qwen35_xml", "qwen3_6": "qwen36_xml",
                   "qwen3_8": "qwen36_xml"}
XML_CORPUS = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n",
              "</tool_call>\n<tool_call>\n<function=function_1>\n</function>\n</tool_call>\n<tool_call>\n",
              "<function=function_10>\n<parameter=arg_01>\nx\n</parameter>\n</function>\n</tool_call>")
"""XML call text for the tiny tokenizer, so that `>` merges with what follows a name (`>\\n`)."""


@functools.cache
def _tokenizer(template: str):
    tok = tiny_tokenizer(template="qwen3", extra_corpus=XML_CORPUS)  # Qwen's control tokens
    tok.chat_template = trl_template(template)
    return tok


def _tool(name: str, *args: str) -> Tool:
    return Tool(name, f"Does {name}.", {"type": "object", "properties": {a: {"type": "string"} for a in args},
                                        "required": list(args)})


WEATHER = Interface((_tool("get_weather", "city"), _tool("math.add", "a", "b")))
ONE = (Call("get_weather", {"city": "Paris"}),)
TWO = (Call("get_weather", {"city": "Paris"}), Call("math.add", {"a": "1", "b": "ü"}))
TYPED = (Call("math.add", {"a": 3, "b": -1.5, "s": "x y", "t": True, "n": None, "l": [1, "ü", False],
                           "d": {"k": None}, "e": ""}),)
ASK = (Message("system", "Be brief."), Message("user", "Weather in Paris?"))
HISTORY = (*ASK, Message("assistant", "", TWO), Message("tool", '{"t": 20}', name="get_weather"),
           Message("tool", "1ü", name="math.add"), Message("assistant", "It is 20."),
           Message("user", "And Rome?"))

# ---------------------------------------------------------------- (a) targets are the template's rendering

CASES = {  # name: (calls, response, think)
    "one call": (ONE, None, None),
    "text and call": (ONE, "Let me look.", None),
    "parallel calls": (TWO, None, None),
    "typed values": (TYPED, None, None),
    "answer": ((), "It is sunny.", None),
    "reasoning and call": (ONE, None, "I need the weather."),
    "reasoning, text and parallel calls": (TWO, "Both.", "Two tools."),
    "reasoning and answer": ((), "Sunny.", "Easy."),
}
# the nothink template's prompt closes an empty think block: no reasoning after it
TEMPLATE_CASES = [(t, c) for t in sorted(TEMPLATE_FORMAT) for c in sorted(CASES)
                  if not (t == "qwen3_5_nothink" and CASES[c][2] is not None)]


def _turn(calls, response, think) -> list[dict]:
    """The assistant turn as an OpenAI-format message, written independently of the format."""
    turn = {"role": "assistant", "content": response or ""}
    if calls:
        turn["tool_calls"] = [{"type": "function",
                               "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls]
    if think is not None:
        turn["reasoning_content"] = think
    return [turn]


@pytest.mark.parametrize(("template", "case"), TEMPLATE_CASES)
def test_target_is_what_the_template_renders_for_the_turn(template, case):
    calls, response, think = CASES[case]
    tok, fmt = _tokenizer(template), get_format(TEMPLATE_FORMAT[template])
    prompt = fmt.render_prompt(tok, ASK, WEATHER)
    chat, tools = fmt.chat(ASK, WEATHER, native_tools=True)
    full = tok.apply_chat_template(chat + _turn(calls, response, think), tools=tools, tokenize=False)
    target = fmt.render_target(calls, response=response, think=think)
    assert full.startswith(prompt)
    head = ""
    if template == "qwen3_5_nothink":
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # the answer comes next
    else:  # the open <think> of the generation prompt is left out: the response opens its think block
        assert prompt.endswith("<|im_start|>assistant\n")
        if think is None:  # the template writes an empty think block into the last turn, as Qwen3's
            head = "<think>\n\n</think>\n\n"
            assert fmt.render_target(calls, response=response, think="") == head + target
    assert full[len(prompt):] == head + target + "<|im_end|>\n"


def test_values_are_written_as_each_template_writes_them():
    args = dict(TYPED[0].arguments)
    three_five = Qwen35XmlFormat().render_target(TYPED)
    assert "<parameter=t>\nTrue\n</parameter>\n<parameter=n>\nNone\n</parameter>" in three_five
    assert '<parameter=l>\n[1, "ü", false]\n</parameter>\n<parameter=d>\n{"k": null}\n</parameter>' \
        in three_five
    assert "<parameter=e>\n\n</parameter>" in three_five and "<parameter=s>\nx y\n</parameter>" in three_five
    three_six = Qwen36XmlFormat().render_target(TYPED)
    assert "<parameter=t>\ntrue\n</parameter>\n<parameter=n>\nnull\n</parameter>" in three_six
    for fmt in (Qwen35XmlFormat(), Qwen36XmlFormat()):
        assert fmt.parse(fmt.render_target(TYPED)).calls == TYPED  # typed values read back either way
    assert [render_value(args[k]) for k in "ab"] == ["3", "-1.5"]


@pytest.mark.parametrize("template", sorted(TEMPLATE_FORMAT))
def test_history_goes_through_the_template(template):
    tok, fmt = _tokenizer(template), get_format(TEMPLATE_FORMAT[template])
    history = fmt.render_prompt(tok, HISTORY, WEATHER)
    assert fmt.render_target(TWO) in history  # an earlier turn's parallel calls, as a target writes them
    assert '<|im_start|>user\n<tool_response>\n{"t": 20}\n</tool_response>\n<tool_response>\n1ü\n' in history
    assert '# Tools\n\nYou have access to the following functions:\n\n<tools>\n{"type": "function"' in history
    with pytest.raises(ValueError, match="only through the chat template's `tools=`"):
        fmt.chat(HISTORY, WEATHER, native_tools=False)


def test_auto_picks_the_format_from_the_tokenizer():
    for template, name in TEMPLATE_FORMAT.items():
        assert resolve_format("auto", _tokenizer(template)).name == name


# ---------------------------------------------------------------- (b) by hand

C1 = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
C2 = ("<tool_call>\n<function=math.add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nü\n</parameter>\n"
      "</function>\n</tool_call>")


def test_target_decisions_and_parse_by_hand():
    f = Qwen35XmlFormat()
    head = "<think>\nhmm\n</think>\n\n"
    text = f.render_target(TWO, response=" Sure. ", think=" hmm ")
    assert text == f"{head}Sure.\n\n{C1}\n{C2}"
    p1 = len(head) + len("Sure.")
    p2 = p1 + 2 + len(C1)
    assert f.decisions(text) == [Decision(p1, TEXT_OPENER, ">", "get_weather"),
                                 Decision(p2, NEXT_OPENER, ">", "math.add"),
                                 Decision(len(text), NEXT_OPENER, ">", None)]
    parsed = f.parse(text)
    assert parsed.ok and parsed.think == "hmm" and parsed.response == "Sure."
    assert parsed.calls == (ONE[0], Call("math.add", {"a": 1, "b": "ü"}))  # "1" reads back as a number
    alone = f.render_target(ONE)
    assert alone == C1 and f.decisions(alone) == [Decision(0, FIRST_OPENER, ">", "get_weather"),
                                                  Decision(len(C1), NEXT_OPENER, ">", None)]
    assert f.render_target([], response="No tool.", think="") == "<think>\n\n</think>\n\nNo tool."
    assert f.decisions("<think>\n\n</think>\n\nNo tool.") == [Decision(19, FIRST_OPENER, ">", None)]
    no_end = Qwen35XmlFormat(end_decision=False)
    assert [d.taken for d in no_end.decisions(text)] == ["get_weather", "math.add"]
    assert f.render_target([Call("f", {})]) == "<tool_call>\n<function=f>\n</function>\n</tool_call>"


def test_values_read_back_typed_and_lenient_layouts():
    words = ("True", "False", "None", "3", "-1.5", "[1, 2]", '{"a": null}', "null")
    assert [read_value(v) for v in words] == [True, False, None, 3, -1.5, [1, 2], {"a": None}, None]
    # the string itself: not JSON, surrounded by whitespace, or a constant JSON would only take loosely
    assert [read_value(v) for v in ("Paris", " 3", "3 ", "NaN", "Infinity", "[1,", "", "true story")] == \
        ["Paris", " 3", "3 ", "NaN", "Infinity", "[1,", "", "true story"]
    f = Qwen35XmlFormat()
    tight = "<tool_call><function=f><parameter=x>a\nb</parameter></function></tool_call>"  # no newlines
    assert f.parse(tight).ok and f.parse(tight).calls == (Call("f", {"x": "a\nb"}),)
    # a value holding tags stays text (it runs to </parameter>)
    tags = {"x": "</tool_call> <tool_call> </function>"}
    tagged = f.render_target([Call("f", tags)])
    assert f.parse(tagged).ok and f.parse(tagged).calls[0].arguments == tags


B = "<tool_call>\n<function=a>\n"


@pytest.mark.parametrize("text, message, names", [
    ("<tool_call>\n{\"name\": \"a\"}\n</tool_call>", "does not open with <function=NAME>", []),
    ("<tool_call>\n<function=a\n</function>\n</tool_call>", "is empty or not closed by '>'", []),
    ("<tool_call>\n<function=>\n</function>\n</tool_call>", "is empty or not closed by '>'", []),
    (B + "<parameter=x\n1\n</parameter>\n</function>\n</tool_call>", "parameter name at char 25", []),
    (B + "<parameter=x>\n1\n</function>\n</tool_call>", "parameter 'x' at char 25 is never closed", []),
    (B + "<parameter=x>\n1\n</parameter>\n<parameter=x>\n2\n</parameter>\n</function>\n</tool_call>",
     "parameter 'x' is given twice", []),
    (B + "junk\n</function>\n</tool_call>", "unexpected text in the call to 'a' at char 25", []),
    (B + "</function>\njunk</tool_call>", "unexpected text after </function> at char 37", []),
    (B + "</function>\n", "<tool_call> at char 0 is never closed", []),
    (B + "</function>\n" + B + "</function>\n</tool_call>", "<tool_call> at char 0 is never closed", ["a"]),
    (C1 + "\n</tool_call>", "stray </tool_call>", ["get_weather"]),
    ("<function=a>\n</function>", "stray <function= at char 0", []),
    ("Sure.\n<think>x</think>", "stray <think>", []),
    ("<think>\ncut off", "never closed by </think>", []),
])
def test_parse_reports_what_is_wrong(text, message, names):
    result = Qwen35XmlFormat().parse(text)
    assert not result.ok and message in result.error, result.error
    assert [c.name for c in result.calls] == names


def test_broken_blocks_with_a_readable_name_are_still_decisions():
    f = Qwen35XmlFormat()
    assert [d.taken for d in f.decisions(B + "<parameter=x>\n1\n</function>\n</tool_call>")] == ["a", None]
    assert [d.taken for d in f.decisions(B + "<parameter=x>\n1")] == ["a"]  # cut off: no end of the turn
    assert f.decisions("<think>\ncut off") == []


@pytest.mark.parametrize("calls, kwargs", [
    ([Call("a>b", {})], {}),
    ([Call("a\nb", {})], {}),
    ([Call("", {})], {}),
    ([Call("a", {"k>": 1})], {}),
    ([Call("a", {"": 1})], {}),
    ([Call("a", {"k": "x</parameter>"})], {}),
    ([], {"response": "see <tool_call>"}),
    ([], {"response": "a </function> b"}),
    ([Call("a", {})], {"think": "x </think> y"}),
])
def test_render_target_refuses_what_could_not_be_read_back(calls, kwargs):
    with pytest.raises(ValueError, match="Qwen3.5 format"):
        Qwen35XmlFormat().render_target(calls, **kwargs)


# ---------------------------------------------------------------- (c) property tests

_CHARS = st.characters(blacklist_categories=("Cs",))
_TAGS = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<think>",
         "</think>")
_NAMES = (st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}(\.[A-Za-z_][A-Za-z0-9_]{0,8})?", fullmatch=True)
          | st.integers(1, 120).map(lambda i: f"function_{i:02d}")
          | st.text(_CHARS, min_size=1, max_size=12).filter(lambda s: ">" not in s and "\n" not in s))
_TAGGY = st.sampled_from([*_TAGS, "\n", ">", "<", '"', "True", "1"])
# a string that reads as JSON comes back typed (module docstring of cipr/formats/qwen35.py): not drawn
_STRINGS = (st.text(_CHARS, max_size=15) | st.lists(_TAGGY | st.text(_CHARS, max_size=3), max_size=4)
            .map("".join)).filter(lambda s: "</parameter>" not in s and read_value(s) == s)
_SCALARS = (st.none() | st.booleans() | st.integers(-10**15, 10**15)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(_CHARS, max_size=15))
_NESTED = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(_CHARS, max_size=6), inner, max_size=3), max_leaves=8)
_ARGS = st.dictionaries(_NAMES, _STRINGS | _NESTED.filter(lambda v: not isinstance(v, str)), max_size=4)
_FREE = st.text(_CHARS, max_size=30).filter(lambda s: s == s.strip() and not any(t in s for t in _TAGS))


@pytest.mark.parametrize("name", ["qwen35_xml", "qwen36_xml"])
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_render_then_parse_round_trips_and_decisions_line_up(name, data):
    fmt = get_format(name)
    names = data.draw(st.lists(_NAMES, min_size=1, max_size=5, unique=True))
    calls = data.draw(st.lists(st.builds(Call, st.sampled_from(names), _ARGS), max_size=4))
    think = data.draw(st.none() | _FREE)
    response = data.draw(_FREE) if not calls or data.draw(st.booleans()) else None
    text = fmt.render_target(calls, response=response, think=think)
    result = fmt.parse(text)
    assert result.ok and result.error is None, (result.error, text)
    assert list(result.calls) == calls and result.think == think and result.response == (response or None)
    decisions = fmt.decisions(text)
    assert [d.taken for d in decisions[:-1]] == [c.name for c in calls] and decisions[-1].taken is None
    for d in decisions[:-1]:
        assert text[d.start:].startswith(d.opener + d.taken + d.name_suffix)
    end = decisions[-1]
    assert len(decisions) == len(calls) + 1 and not text[end.start:].startswith(end.opener)


_FRAGMENTS = [*_TAGS, "\n", "\n\n", " ", ">", "a", "f.x", "1", "True", "{}", '"', "<tool_call>\n<function=",
              "<parameter=x>\n", "\n</parameter>\n", "</function>\n</tool_call>"]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=80) | st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=3), max_size=30)
       .map("".join))
def test_garbage_never_raises_and_decisions_stay_consistent(text):
    fmt = Qwen35XmlFormat()
    result = fmt.parse(text)
    assert result.ok == (result.error is None)
    decisions = fmt.decisions(text)
    starts = [d.start for d in decisions]
    assert starts == sorted(starts) and all(0 <= s <= len(text) for s in starts)
    taken = iter([d.taken for d in decisions if d.taken is not None])
    names = [c.name for c in result.calls]
    assert all(any(n == t for t in taken) for n in names)  # the calls are a subsequence of the decisions
    if result.ok:
        assert [d.taken for d in decisions if d.taken is not None] == names


# ---------------------------------------------------------------- (d) the action reader against the reference

NAMES = ("function_1", "function_10", "function_11", "function_2", "get_weather")


def test_reader_equals_bruteforce_on_the_qwen35_tokenizer():
    tok, fmt = _tokenizer("qwen3_5_think"), Qwen35XmlFormat()
    interface = Interface(tuple(_tool(n, "arg_01") for n in NAMES))
    prompt = fmt.render_prompt(tok, [Message("user", "Weather in Paris?")], interface)[-160:]
    two = [Call(NAMES[1], {"arg_01": "x"}), Call(NAMES[0], {"arg_01": "y"})]
    targets = [fmt.render_target(two, think="ok"),
               fmt.render_target([Call(NAMES[4], {"arg_01": 3})], response="Let me look."),
               fmt.render_target([], response="It is sunny.", think="")]
    classes = tuple(range(len(NAMES)))[::-1]
    queries = [ActionQuery.from_format(fmt, prompt, t, NAMES, classes) for t in targets]
    assert [[d.taken for d in q.decisions] for q in queries] == \
        [[NAMES[1], NAMES[0], None], [NAMES[4], None], [None]]
    model = tiny_model(tok, seed=3).to(torch.float64)
    ref = read_actions_bruteforce(model, tok, queries, len(NAMES))
    assert torch.allclose(ref.sum(-1), torch.ones(len(ref), dtype=torch.float64))
    for mode in ("packed", "prefix_cache"):
        for side in ("left", "right"):
            config = ActionReaderConfig(mode=mode, padding_side=side)
            reading = read_actions(model, tok, queries, len(NAMES), config)
            assert reading.probs.shape == ref.shape and torch.equal(reading.probs == 0, ref == 0)
            assert torch.allclose(reading.probs, ref, atol=1e-5, rtol=0), (mode, side)
            assert torch.allclose(reading.probs[ref > 0].log(), ref[ref > 0].log(), atol=1e-5, rtol=0)
