"""Call formats: hand-written targets and decisions, parse errors, property round trips, prompts, real
data."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cipr.formats import FORMATS, GptOssFormat, Llama3JsonFormat, get_format, supports_native_tools
from cipr.formats.base import Decision
from cipr.formats.hermes import FIRST_OPENER, NEXT_OPENER, HermesFormat
from cipr.formats.react import ReActFormat, WebShopFormat
from cipr.formats.toolrl import BLOCK_OPENER, CALL_THINK, RESPONSE_THINK, ToolRLFormat
from cipr.tools.interface import Call, Interface, Message, Tool

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
JSON_CALL = '{"name": "'


def _tool(name: str, *args: str, required: tuple[str, ...] = ()) -> Tool:
    props = {a: {"type": "string", "description": f"the {a}"} for a in args}
    schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return Tool(name, f"Does {name}.", schema)


WEATHER = Interface((_tool("get_weather", "city", required=("city",)), _tool("math.add", "a", "b")))


# ---------------------------------------------------------------- registry

def test_registry_holds_the_formats_by_name():
    assert sorted(FORMATS) == ["compact", "gptoss", "hermes", "llama3_json", "qwen35_xml", "qwen36_xml",
                               "react", "toolrl", "webshop"]
    for name, cls in FORMATS.items():
        fmt = get_format(name)
        assert isinstance(fmt, cls) and fmt.name == name
    assert get_format("toolrl", end_decision=False).end_decision is False


def test_get_format_errors_name_the_valid_formats_and_options():
    with pytest.raises(ValueError, match="valid names: compact, gptoss, hermes, llama3_json, qwen35_xml, "
                                         "qwen36_xml, react, toolrl, webshop, or auto"):
        get_format("json")
    with pytest.raises(ValueError, match="does not take options \\['colour'\\]"):
        get_format("hermes", colour="red")


# ---------------------------------------------------------------- hand-written targets and decisions

def test_toolrl_target_and_decisions_by_hand():
    f = ToolRLFormat()
    text = f.render_target([Call("get_weather", {"city": "Paris"}), Call("math.add", {"a": 1, "b": 2})])
    head = f"<think> {CALL_THINK} </think>\n"
    line1 = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    line2 = '{"name": "math.add", "parameters": {"a": 1, "b": 2}}'
    assert text == f"{head}<tool_call>\n{line1}\n{line2}\n</tool_call>"
    second = len(head) + len("<tool_call>\n") + len(line1) + 1
    close = second + len(line2) + 1
    assert f.decisions(text) == [Decision(len(head), BLOCK_OPENER, '"', "get_weather"),
                                 Decision(second, JSON_CALL, '"', "math.add"),
                                 Decision(close, JSON_CALL, '"', None)]
    assert text[close:] == "</tool_call>"
    assert [d.taken for d in ToolRLFormat(end_decision=False).decisions(text)] == ["get_weather", "math.add"]

    answer = f.render_target([], response="It is sunny.")
    assert answer == f"<think> {RESPONSE_THINK} </think>\n<response> It is sunny. </response>"
    assert f.decisions(answer) == \
        [Decision(len(f"<think> {RESPONSE_THINK} </think>\n"), BLOCK_OPENER, '"', None)]
    parsed = f.parse(answer)
    assert parsed.ok and parsed.calls == () and parsed.response == "It is sunny." and \
        parsed.think == RESPONSE_THINK

    both = f.render_target([Call("f", {})], response="Done.", think="go")
    assert both == ('<think> go </think>\n<tool_call>\n{"name": "f", "parameters": {}}\n</tool_call>\n'
                    '<response> Done. </response>')
    assert [d.taken for d in f.decisions(both)] == ["f", None]
    # ToolRL's data escapes non-ASCII (json.dumps defaults), names too
    assert f.render_target([Call("café", {"v": "é"})], think="t").split("\n")[2] == \
        '{"name": "caf\\u00e9", "parameters": {"v": "\\u00e9"}}'
    assert f.name_text("café") == "caf\\u00e9"


def test_hermes_target_and_decisions_by_hand():
    f = HermesFormat()
    text = f.render_target([Call("get_weather", {"city": "Rome"}), Call("math.add", {"a": 2})],
                           response="Sure.", think="hmm")
    call1 = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    call2 = '<tool_call>\n{"name": "math.add", "arguments": {"a": 2}}\n</tool_call>'
    head = "<think>\nhmm\n</think>\n\n"
    assert text == f"{head}Sure.\n{call1}\n{call2}"
    p1 = len(head) + len("Sure.")
    p2 = p1 + 1 + len(call1)
    assert f.decisions(text) == [Decision(p1, NEXT_OPENER, '"', "get_weather"),
                                 Decision(p2, NEXT_OPENER, '"', "math.add"),
                                 Decision(len(text), NEXT_OPENER, '"', None)]
    parsed = f.parse(text)
    assert parsed.ok and parsed.response == "Sure." and parsed.think == "hmm"

    alone = f.render_target([Call("f", {"x": "ü"})])
    assert alone == '<tool_call>\n{"name": "f", "arguments": {"x": "ü"}}\n</tool_call>'
    assert f.decisions(alone) == \
        [Decision(0, FIRST_OPENER, '"', "f"), Decision(len(alone), NEXT_OPENER, '"', None)]

    answer = "<think>\nhmm\n</think>\n\nNo tool needed."
    assert f.render_target([], response="No tool needed.", think="hmm") == answer
    assert f.decisions(answer) == [Decision(22, FIRST_OPENER, '"', None)]
    assert f.name_text('say "hi"') == 'say \\"hi\\"'


def test_react_and_webshop_targets_and_decisions_by_hand():
    r = ReActFormat()
    text = r.render_target([Call("get_translation_nllb", {"input_text": "See you later"})])
    assert text == 'Thought:\nAction: get_translation_nllb\nAction Input: {"input_text": "See you later"}'
    assert r.decisions(text) == [Decision(9, "Action: ", "\n", "get_translation_nllb")]
    answer = r.render_target([], response="42", think="done")
    assert answer == "Thought: done\nFinal Answer: 42"
    assert r.decisions(answer) == [Decision(14, "Action: ", "\n", None)]
    assert r.parse(answer).response == "42"

    w = WebShopFormat()
    text = w.render_target([Call("search", {"argument": "red shoes"})], think="look")
    assert text == "Thought: look\nAction: search[red shoes]"
    assert w.decisions(text) == [Decision(14, "Action: ", "[", "search")]
    assert w.parse("Thought:\nAction: click[Size [US] 8]").calls == \
        (Call("click", {"argument": "Size [US] 8"}),)
    # the single argument renders under any key (canonical interfaces rename it), parses as "argument"
    assert w.render_target([Call("function_01", {"arg_01": "x"})]) == "Thought:\nAction: function_01[x]"
    # AgentLM writes the action on the line after "Action:"; the parser reads it too
    assert w.parse("Thought:\nI buy.\n\nAction:\nclick[Buy Now]").calls == \
        (Call("click", {"argument": "Buy Now"}),)


@pytest.mark.parametrize("fmt, calls, kwargs", [
    (ReActFormat(), [Call("a", {}), Call("b", {})], {}),
    (ReActFormat(), [Call("a", {})], {"response": "x"}),
    (ReActFormat(), [Call("a b\n", {})], {}),
    (ReActFormat(), [Call("a", {})], {"think": "fine\nAction: b"}),
    (WebShopFormat(), [Call("se[arch", {"argument": "x"})], {}),
    (WebShopFormat(), [Call("search", {"argument": "two\nlines"})], {}),
    (WebShopFormat(), [Call("search", {"a": "x", "b": "y"})], {}),
    (ToolRLFormat(), [Call("a", {})], {"think": "x </think> y"}),
    (HermesFormat(), [], {"response": "see <tool_call>"}),
    (Llama3JsonFormat(), [], {"response": ' {"name": "x"}'}),
    (Llama3JsonFormat(), [], {"response": "a <|eot_id|> b"}),
    (GptOssFormat(), [Call("get weather", {})], {}),
    (GptOssFormat(), [Call("a<|channel|>", {})], {}),
    (GptOssFormat(), [Call("a", {})], {"think": "x<|end|>"}),
    (GptOssFormat(), [Call("a", {})], {"think": "x", "response": "y"}),
    (GptOssFormat(), [], {"response": "<|call|>"}),
])
def test_render_target_refuses_what_could_not_be_parsed_back(fmt, calls, kwargs):
    with pytest.raises(ValueError):
        fmt.render_target(calls, **kwargs)


# ---------------------------------------------------------------- parse errors say what is wrong

T = "<think> x </think>\n"


@pytest.mark.parametrize("name, text, message, names", [
    ("toolrl", '<tool_call>\n{"name": "a", "parameters": {}}\n</tool_call>', "missing <think>", ["a"]),
    ("toolrl", T + '<tool_call>\n{"name": "a", "parameters": {}}\n', "never closed by </tool_call>", ["a"]),
    ("toolrl", T + '<tool_call>\n{"name": "a", "parameters": {"x": }}\n</tool_call>',
     "invalid JSON at char 65", []),
    ("toolrl", T + '<tool_call>\n{"parameters": {}}\n</tool_call>', "has no 'name'", []),
    ("toolrl", T + '<tool_call>\n{"name": "a", "parameters": [1]}\n</tool_call>',
     "'parameters' must be an object", []),
    ("toolrl", T + '<tool_call>\n{"name": "a"}\n</tool_call>', "has no 'parameters'", []),
    ("toolrl", T + "<tool_call>\n\n</tool_call>", "empty <tool_call> block", []),
    ("toolrl", T + "<response> a </response>\n<response> b </response>", "second <response>", []),
    ("toolrl", T + '<tool_call>\n{"name": "a", "parameters": {}}\n</tool_call>\n<tool_call>\n'
     '{"name": "b", "parameters": {}}\n</tool_call>', "second <tool_call> block", ["a", "b"]),
    ("toolrl", T + "hello", "unexpected text at char 19: 'hello'; neither <tool_call> nor <response>", []),
    ("toolrl", T + '<response> a </response>\n<tool_call>\n{"name": "a", "parameters": {}}\n</tool_call>',
     "comes after <response>", ["a"]),
    ("toolrl", "<think> cut off", "never closed by </think>", []),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}', "never closed by </tool_call>", ["a"]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"x": }}\n</tool_call>',
     "invalid JSON at char 45", []),
    ("hermes", '<tool_call>\n{"name": "a", "parameters": {}}\n</tool_call>', "has no 'arguments'", []),
    ("hermes", '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
     "'name' must be a non-empty string", []),
    ("hermes", '<tool_call>\n"text"\n</tool_call>', "is a JSON str, not an object", []),
    ("hermes", "<think>\nstill thinking", "never closed by </think>", []),
    ("hermes", "hi </tool_call>", "stray </tool_call> at char 3", []),
    ("react", "Action: a\nAction Input: {}", "missing 'Thought:'", ["a"]),
    ("react", "Thought: t\nAction: a", "has no 'Action Input:'", []),
    ("react", 'Thought: t\nAction: a\nAction Input: {"x": 1,}', "invalid JSON at char 43", []),
    ("react", "Thought: t\nAction: a\nAction Input: [1]", "is a JSON list, not an object", []),
    ("react", "Thought: t\nAction: a\nAction Input: {}\nObservation: ok",
     "continues past the end of its turn", ["a"]),
    ("react", "Thought: t\nAction: a\nAction Input: {}\nAction: b\nAction Input: {}", "second 'Action:'",
     ["a", "b"]),
    ("react", "Thought: t\nFinal Answer: x\nAction: a\nAction Input: {}",
     "both an Action and a Final Answer", ["a"]),
    ("react", "Thought: t", "no 'Action:' and no 'Final Answer:'", []),
    ("webshop", "Thought: t\nAction: search red", "has no '['", []),
    ("webshop", "Thought: t\nAction: search[red", "does not end with ']'", []),
    ("webshop", "Thought: t\nAction: [red]", "names no tool", []),
])
def test_parse_reports_what_is_wrong(name, text, message, names):
    result = get_format(name).parse(text)
    assert not result.ok and message in result.error
    assert [c.name for c in result.calls] == names


@pytest.mark.parametrize("name", ["toolrl", "hermes"])
def test_tags_inside_json_strings_do_not_end_a_block(name):
    f = get_format(name)
    calls = [Call("a", {"html": "</tool_call>\n<tool_call> <response>"}), Call("b", {"k": '"}}'})]
    text = f.render_target(calls)
    result = f.parse(text)
    assert result.ok and list(result.calls) == calls
    assert [d.taken for d in f.decisions(text)] == ["a", "b", None]


def test_toolrl_close_tag_on_the_call_line_and_multiline_objects():
    f = ToolRLFormat()
    same_line = T + '<tool_call>\n{"name": "a", "parameters": {}}</tool_call>'
    assert f.parse(same_line).ok and [d.taken for d in f.decisions(same_line)] == ["a", None]
    spread = T + '<tool_call>\n{"name": "a",\n "parameters": {}}\n</tool_call>'
    result = f.parse(spread)
    assert "spans several lines" in result.error and result.calls == (Call("a", {}),)
    trailing = T + '<tool_call>\n{"name": "a", "parameters": {}} extra\n</tool_call>'
    assert "unexpected text after the call at char 63: 'extra'" in f.parse(trailing).error


def test_broken_call_with_a_readable_name_is_still_a_decision():
    f = ToolRLFormat()
    text = T + '<tool_call>\n{"name": "a", "parameters": {"x": }}\n</tool_call>'
    assert [d.taken for d in f.decisions(text)] == ["a", None]
    assert f.decisions("<think> cut off") == []
    assert ReActFormat().decisions("Thought: t\nAction: a") == [Decision(11, "Action: ", "\n", "a")]


# ---------------------------------------------------------------- property tests

_CHARS = st.characters(blacklist_categories=("Cs",))
_PLAIN = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}(\.[A-Za-z_][A-Za-z0-9_]{0,8})?", fullmatch=True)
_CANONICAL = st.integers(1, 120).map(lambda i: f"function_{i:02d}")
_SPACED = st.lists(st.from_regex(r"[A-Za-z0-9]{1,6}", fullmatch=True), min_size=2, max_size=3).map(" ".join)
_ANY = st.text(_CHARS, min_size=1, max_size=12)   # quotes, backslashes, unicode, newlines
_TAGGY = st.sampled_from(["<tool_call>", "</tool_call>", "<response>", "</response>", "</think>", '"}}\n',
                          "\nAction: x", "\nAction Input: {}", "Observation:", "[", "]"])
_SCALARS = (st.none() | st.booleans() | st.integers(-10**15, 10**15)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(_CHARS, max_size=15)
            | st.lists(_TAGGY | st.text(_CHARS, max_size=3), max_size=4).map("".join))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(_CHARS, max_size=6), inner, max_size=3), max_leaves=8)
_ARGS = st.dictionaries(st.text(_CHARS, min_size=1, max_size=8) | _PLAIN, _VALUES, max_size=4)

NAMES = {"toolrl": _PLAIN | _CANONICAL | _SPACED | _ANY, "hermes": _PLAIN | _CANONICAL | _SPACED | _ANY,
         "compact": _PLAIN | _CANONICAL | _SPACED | _ANY, "react": _PLAIN | _CANONICAL | _SPACED,
         "webshop": _PLAIN | _CANONICAL | _SPACED, "llama3_json": _PLAIN | _CANONICAL | _SPACED | _ANY,
         "gptoss": _PLAIN | _CANONICAL}
TEMPLATE_ONLY = ("llama3_json", "gptoss")  # tools only through the chat template's `tools=`
_MARKERS = ("Thought:", "Action:", "Action Input:", "Final Answer:", "Observation:")
FORBIDDEN = {"toolrl": ("</think>", "</response>"),
             "hermes": ("<tool_call>", "</tool_call>", "<think>", "</think>"),
             "compact": ("<tool_call>", "</tool_call>", "<think>", "</think>"),
             "llama3_json": ("<|python_tag|>", "<|eot_id|>"),
             "gptoss": ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>",
                        "<|constrain|>")}


def _free_text(name: str) -> st.SearchStrategy[str]:
    def fine(s: str) -> bool:
        if s != s.strip() or any(tag in s for tag in FORBIDDEN.get(name, ())):
            return False
        if name == "llama3_json" and s.startswith("{"):  # a text answer that would read back as a call
            return False
        return not any(line.startswith(_MARKERS) for line in s.split("\n"))
    return st.text(_CHARS, max_size=30).filter(fine)


@st.composite
def _case(draw, name: str):
    """A random interface, calls to its tools (parallel where the format allows), think and response."""
    names = draw(st.lists(NAMES[name], min_size=1, max_size=6, unique=True))
    interface = Interface(tuple(Tool(n, draw(st.text(_CHARS, max_size=20)),
                                     {"type": "object", "properties": {"q": {"type": "string"}}})
                                for n in names))
    if name == "webshop":
        one_line = st.text(_CHARS, max_size=15).filter(lambda s: "\n" not in s and "\r" not in s)
        call = st.builds(lambda n, a: Call(n, {"argument": a}), st.sampled_from(names), one_line)
    else:
        call = st.builds(Call, st.sampled_from(names), _ARGS)
    most = 4 if name in ("toolrl", "hermes", *TEMPLATE_ONLY) else 1
    calls = draw(st.lists(call, min_size=0, max_size=most))
    think = draw(st.none() | _free_text(name))
    if name == "gptoss" and calls and not think:
        think = None  # an empty reasoning of a call turn writes nothing, as gpt-oss's template
    # Llama's template drops a call turn's text, gpt-oss's writes it as the reasoning: no text with calls
    # there
    with_text = most > 1 and name not in TEMPLATE_ONLY and draw(st.booleans())
    response = draw(_free_text(name)) if not calls or with_text else None
    return interface, calls, think, response


def _check_decisions(fmt, text: str, calls) -> None:
    decisions = fmt.decisions(text)
    taken = [d.taken for d in decisions if d.taken is not None]
    assert taken == [c.name for c in calls]
    for d in decisions:
        if d.taken is not None:
            assert text[d.start:].startswith(d.opener + fmt.name_text(d.taken) + d.name_suffix)
    ends = [d for d in decisions if d.taken is None]
    if not calls:
        assert len(decisions) == 1 and len(ends) == 1
    else:
        assert len(ends) == (1 if getattr(fmt, "end_decision", False) else 0)
        if ends:
            assert decisions[-1] is ends[0] and not text[ends[0].start:].startswith(ends[0].opener)


# Qwen3.5's XML format writes string values raw, so a string that reads as JSON comes back typed: its round
# trips draw their own values (tests/test_formats_qwen35.py)
@pytest.mark.parametrize("name", sorted(set(FORMATS) - {"qwen35_xml", "qwen36_xml"}))
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
@pytest.mark.integration
def test_render_then_parse_round_trips_and_decisions_line_up(name, data):
    fmt = get_format(name)
    interface, calls, think, response = data.draw(_case(name))
    text = fmt.render_target(calls, response=response, think=think)
    result = fmt.parse(text)
    assert result.ok, (result.error, text)
    assert result.error is None
    assert list(result.calls) == calls
    if response:
        assert result.response == response
    if think is not None and name != "llama3_json":  # Llama's template has no reasoning: dropped
        assert result.think == think
    _check_decisions(fmt, text, calls)
    if name in TEMPLATE_ONLY:
        assert fmt.chat([Message("user", "hi")], interface, native_tools=True)[1] == interface.to_openai()
        return
    system = fmt.chat([Message("user", "hi")], interface)[0][0]["content"]
    assert all(fmt.name_text(n) in system or n in system or json.dumps(n)[1:-1] in system
               for n in interface.names)


_FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>", "\n", " ",
              '{"name": "', '"', "{", "}", "[", "]", ":", ",", '"parameters": ', '"arguments": ', "{}", "a",
              "f.x", "Thought:", "Action: ", "Action Input: ", "Final Answer:", "Observation:", "\\", "1",
              "null", "; ", "<|python_tag|>", '"parameters": {}}', "<|start|>assistant", " to=functions.",
              "<|channel|>", "commentary json", "analysis", "final", "<|message|>", "<|end|>", "<|call|>",
              "<|return|>", "<function=", ">\n", "</function>", "<parameter=x>\n", "\n</parameter>\n"]
_GARBAGE = st.text(max_size=80) | st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=3),
                                           max_size=30).map("".join)


def _is_subsequence(short: list, long: list) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=300, deadline=None)
@given(text=_GARBAGE)
@pytest.mark.integration
def test_garbage_never_raises_and_decisions_stay_consistent(name, text):
    fmt = get_format(name)
    result = fmt.parse(text)
    assert result.ok == (result.error is None)
    if not result.ok:
        assert isinstance(result.error, str) and result.error
    decisions = fmt.decisions(text)
    starts = [d.start for d in decisions]
    assert starts == sorted(starts) and all(0 <= s <= len(text) for s in starts)
    assert all(d.opener and d.name_suffix for d in decisions)
    taken = [d.taken for d in decisions if d.taken is not None]
    names = [c.name for c in result.calls]
    assert _is_subsequence(names, taken)
    if result.ok:
        assert taken == names


# ---------------------------------------------------------------- prompts

CONVERSATION = (Message("system", "Be brief."), Message("user", "Weather in Paris?"),
                Message("assistant", "",
                        (Call("get_weather", {"city": "Paris"}), Call("math.add", {"a": "1"}))),
                Message("tool", '{"t": 20}', name="get_weather"), Message("tool", "2", name="math.add"),
                Message("assistant", "It is 20."), Message("user", "And Rome?"))


@pytest.fixture(scope="module")
def chatml_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = CHATML
    return tok


def test_hermes_native_tools_and_system_prompt_fallback_render_the_same_prompt(tiny_tokenizer,
                                                                               chatml_tokenizer):
    f = HermesFormat()
    assert supports_native_tools(tiny_tokenizer) and not supports_native_tools(chatml_tokenizer)
    messages, tools = f.chat(CONVERSATION, WEATHER, native_tools=True)
    assert tools == WEATHER.to_openai()
    assert messages[2]["tool_calls"][0] == {"type": "function",
                                            "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris"}}}
    native = f.render_prompt(tiny_tokenizer, CONVERSATION, WEATHER)
    fallback = f.render_prompt(chatml_tokenizer, CONVERSATION, WEATHER)
    assert native == fallback
    system = fallback.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(WEATHER.to_openai()[0], ensure_ascii=False) in system
    assert '<|im_start|>user\n<tool_response>\n{"t": 20}\n</tool_response>\n<tool_response>\n2\n' \
           '</tool_response><|im_end|>' in fallback
    assert fallback.endswith("<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n")
    # no system message: the fallback carries the tools in a default system prompt
    bare = f.render_prompt(chatml_tokenizer, [Message("user", "hi")], WEATHER)
    assert bare.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")


ONE_CALL = (Message("system", "Be brief."), Message("user", "Weather in Paris?"),
            Message("assistant", "I look it up.", (Call("get_weather", {"city": "Paris"}),)),
            Message("tool", '{"t": 20}', name="get_weather"), Message("assistant", "It is 20."),
            Message("user", "And Rome?"))


@pytest.mark.parametrize("name", ["toolrl", "react", "webshop"])
def test_prompt_formats_put_the_tools_in_the_system_prompt(name, tiny_tokenizer, chatml_tokenizer):
    fmt = get_format(name)
    messages, tools = fmt.chat(ONE_CALL, WEATHER, native_tools=True)
    assert tools is None and messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("Be brief.\n\n")
    for tok in (tiny_tokenizer, chatml_tokenizer):
        prompt = fmt.render_prompt(tok, ONE_CALL, WEATHER)
        system = prompt.split("<|im_end|>")[0]
        assert "get_weather" in system and "math.add" in system and "# Tools" not in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
    if name == "toolrl":
        assert len(messages) == 2 and \
            '<obs> [{"name": "get_weather", "results": {"t": 20}}] </obs>' in messages[1]["content"]
    else:
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert messages[2]["content"].startswith("Thought: I look it up.\nAction: get_weather")
        assert messages[3]["content"] == 'Observation: {"t": 20}'
        assert messages[4]["content"] == "Thought:\nFinal Answer: It is 20."


def test_toolrl_history_lists_required_arguments_and_wraps_observations():
    system, user = (m["content"] for m in ToolRLFormat().chat(CONVERSATION, WEATHER)[0])
    assert ('1. Name: get_weather\nDescription: Does get_weather.\nParameters: {"city": {"type": "string", '
            '"description": "the city"}}\nRequired: ["city"]\n2. Name: math.add') in system
    assert user.startswith("**Dialogue Records History**\n<user> Weather in Paris? </user>\n\n<think> ")
    assert ('</tool_call>\n<obs> [{"name": "get_weather", "results": {"t": 20}}, '
            '{"name": "math.add", "results": 2}] </obs>\n\n<think> ') in user


# ---------------------------------------------------------------- real data

def test_toolrl_prompts_and_targets_reproduce_the_released_data(shared_data):
    import pyarrow.parquet as pq

    from cipr.data.toolrl import load_toolrl_parquet, load_toolrl_sft

    f = ToolRLFormat()
    parquet = shared_data / "toolrl" / "rlla_4k" / "test.parquet"
    sft = shared_data / "toolrl" / "rlla_4k_raw" / "rlla_sft.json"
    rows = pq.read_table(parquet).to_pylist()
    raw = [({p["role"]: p["content"] for p in r["prompt"]}, r["reward_model"]["ground_truth"]) for r in rows]
    raw += [({"system": o["instruction"], "user": o["input"]}, o["output"])
            for o in json.loads(sft.read_text())]
    examples = load_toolrl_parquet(parquet) + load_toolrl_sft(sft)
    assert len(examples) == len(raw) == 480
    for ex, (prompt, target) in zip(examples, raw, strict=True):
        chat, tools = f.chat(ex.messages, ex.interface)
        assert tools is None
        assert [m["content"] for m in chat] == [prompt["system"], prompt["user"]], ex.id
        parsed = f.parse(target)
        assert parsed.ok, (ex.id, parsed.error)
        assert parsed.calls == ex.reference and parsed.response == ex.response
        assert f.render_target(ex.reference, response=ex.response, think=ex.meta["think"]) == target, ex.id
        _check_decisions(f, target, list(ex.reference))


def test_rotbench_prompts_and_answers_reproduce_the_released_data(shared_data):
    from cipr.data.rotbench import LEVELS, SPLITS, load_rotbench, rotbench_file

    f = ReActFormat()
    items = answers = non_ascii = earlier = 0
    for split in SPLITS:
        for level in LEVELS:
            raw = json.loads(rotbench_file(shared_data, split, level).read_text())
            for ex, obj in zip(load_rotbench(shared_data, split, level), raw, strict=True):
                items += 1
                chat, _ = f.chat(ex.messages, ex.interface)
                assert chat[0]["content"] == obj["conversations"][0]["value"], ex.id
                for turn, message in zip(obj["conversations"][1:-1], chat[1:], strict=True):
                    role, value = turn["from"], turn["value"]
                    if role == "function":
                        assert message == {"role": "user", "content": f"Observation: {value}"}
                    else:
                        assert message["role"] == role
                        assert message["content"] == value or not value.isascii(), ex.id
                        earlier += role == "assistant"
                for answer, call in zip(ex.meta["answers"],
                                        ex.reference + tuple(a[0] for a in ex.alternatives), strict=True):
                    answers += 1
                    parsed = f.parse(answer)
                    assert parsed.ok and parsed.calls == (call,), (ex.id, parsed.error)
                    again = f.render_target([call], think=parsed.think)
                    if answer.isascii():
                        assert again == answer, ex.id
                    else:  # a few gold answers keep non-ASCII raw; we write json.dumps escapes
                        non_ascii += 1
                        assert f.parse(again).calls == (call,)
                    _check_decisions(f, answer, [call])
    assert (items, earlier, answers, non_ascii) == (1400, 1120, 1912, 8)


def test_compact_lists_each_tool_in_a_few_words_and_calls_like_hermes(tiny_tokenizer, chatml_tokenizer):
    tools = Interface((Tool("get_weather", "Get the weather for a city.", {
        "type": "object", "properties": {"city": {"type": "string", "description": "City name."},
                                         "days": {"type": "integer", "description": "Days ahead.",
                                                  "minimum": 1},
                                         "units": {"type": "string", "description": "Units.",
                                                   "enum": ["metric", "imperial"]}},
        "required": ["city"]}), _tool("noop")))
    compact, hermes = get_format("compact"), get_format("hermes")
    messages = [Message("user", "Weather in Paris?")]
    for tok in (tiny_tokenizer, chatml_tokenizer):  # also where the template could render tools= itself
        prompt = compact.render_prompt(tok, messages, tools)
        assert ("- get_weather(city, days?, units?): Get the weather for a city.\n"
                "  city: City name. days: Days ahead (integer). units: Units; one of metric, imperial."
                in prompt)
        assert "\n- noop(): Does noop.\n" in prompt and '"minimum"' not in prompt
        assert len(tok(prompt).input_ids) < \
            len(tok(hermes.render_prompt(chatml_tokenizer, messages, tools)).input_ids)
    target = compact.render_target([Call("get_weather", {"city": "Paris"})])
    assert target == hermes.render_target([Call("get_weather", {"city": "Paris"})])
    assert compact.decisions(target) == hermes.decisions(target) and \
        compact.parse(target) == hermes.parse(target)
