"""Call formats that follow the model's own chat template: Qwen2.5/Qwen3 (`hermes`), Llama 3.1/3.2
(`llama3_json`) and gpt-oss (`gptoss`), each on a tiny offline tokenizer that carries TRL's template of that
family.

(a) a format's target is what the template renders for the assistant turn (exact differences spelled out),
(b) hand-written targets, decisions and parse errors, round trips with parallel calls (the property tests of
    tests/test_formats.py also run on these formats),
(c) the one-pass action reader against the brute-force reference on each family's tokenizer,
(d) `format=auto` picks the family from the template, names what it found when none matches, and yields to an
    explicit name. Qwen3.5's XML format has its own file (tests/test_formats_qwen35.py); its auto-detection,
    and Qwen3.6/3.8's, is checked here with every other template TRL ships.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import trl
from jinja2 import TemplateError
from support.actions_reference import read_actions_bruteforce
from support.tiny_models import tiny_model, tiny_tokenizer, trl_template

from cipr.formats import AUTO, GptOssFormat, Llama3JsonFormat, detect_format, get_format, resolve_format
from cipr.formats.base import Decision, native_message
from cipr.formats.gptoss import FIRST_OPENER as OSS_FIRST
from cipr.formats.gptoss import NEXT_OPENER as OSS_NEXT
from cipr.formats.llama3 import FIRST_OPENER as LLAMA_FIRST
from cipr.formats.llama3 import NEXT_OPENER as LLAMA_NEXT
from cipr.method.actions import ActionQuery, ActionReaderConfig, plan_decision, read_actions
from cipr.tools.interface import Call, Interface, Message, Tool

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY_FORMAT = {"qwen2_5": "hermes", "qwen3": "hermes", "llama3_1": "llama3_json", "llama3_2": "llama3_json",
                 "gptoss": "gptoss"}
"""TRL template → the call format of its family."""


@functools.cache
def _tokenizer(template: str):
    return tiny_tokenizer(template=template)


def _tool(name: str, *args: str) -> Tool:
    return Tool(name, f"Does {name}.", {"type": "object", "properties": {a: {"type": "string"} for a in args},
                                        "required": list(args)})


WEATHER = Interface((_tool("get_weather", "city"), _tool("math.add", "a", "b")))
ONE = (Call("get_weather", {"city": "Paris"}),)
TWO = (Call("get_weather", {"city": "Paris"}), Call("math.add", {"a": "1", "b": "ü"}))
ASK = (Message("system", "Be brief."), Message("user", "Weather in Paris?"))
HISTORY = (*ASK, Message("assistant", "", TWO), Message("tool", '{"t": 20}', name="get_weather"),
           Message("tool", "1ü", name="math.add"), Message("assistant", "It is 20."),
           Message("user", "And Rome?"))

# ---------------------------------------------------------------- (a) targets are the template's rendering

CASES = {  # name: (calls, response, think)
    "one call": (ONE, None, None),
    "text and call": (ONE, "Let me look.", None),
    "answer": ((), "It is sunny.", None),
    "reasoning and call": (ONE, None, "I need the weather."),
    "reasoning and answer": ((), "Sunny.", "Easy."),
}


def _turn(template: str, calls, response, think) -> list[dict]:
    """The assistant turn as an OpenAI-format message, written independently of the formats."""
    turn = {"role": "assistant", "content": response or ""}
    if calls:
        turn["tool_calls"] = [{"type": "function",
                               "function": {"name": c.name, "arguments": dict(c.arguments)}}
                              for c in calls]
    if think is not None:
        turn[{"qwen3": "reasoning_content", "gptoss": "thinking"}.get(template, "reasoning")] = think
    return [turn]


def _turn_end(fmt_name: str, calls) -> str:
    """What the template writes after the target: the end-of-turn token (not part of a target), or nothing."""
    return {"hermes": "<|im_end|>\n", "llama3_json": "<|eot_id|>"}.get(fmt_name,
                                                                       "" if calls else "<|return|>")


def _full(tok, fmt, messages, turn: list[dict]) -> tuple[str, str]:
    """(prompt the format renders, the template's text of the conversation with `turn` appended)."""
    prompt = fmt.render_prompt(tok, messages, WEATHER)
    chat, tools = fmt.chat(messages, WEATHER, native_tools=True)
    return prompt, tok.apply_chat_template(chat + turn, tools=tools, tokenize=False)


# Qwen2.5's template has no reasoning (Hermes would write a <think> block into the content): no reasoning
# cases
TEMPLATE_CASES = [(t, c) for t in sorted(FAMILY_FORMAT) for c in sorted(CASES)
                  if not (t == "qwen2_5" and CASES[c][2] is not None)]


@pytest.mark.parametrize(("template", "case"), TEMPLATE_CASES)
def test_target_is_what_the_template_renders_for_the_turn(template, case):
    calls, response, think = CASES[case]
    tok, fmt = _tokenizer(template), get_format(FAMILY_FORMAT[template])
    prompt, full = _full(tok, fmt, ASK, _turn(template, calls, response, think))
    target = fmt.render_target(calls, response=response, think=think)
    assert full.startswith(prompt)
    head = ""
    if template == "qwen3" and think is None:
        # Qwen3's template writes an empty think block into the turn after the last user message; the target
        # has it when the reasoning is given as an empty string
        head = "<think>\n\n</think>\n\n"
        assert fmt.render_target(calls, response=response, think="") == head + target
    assert full[len(prompt):] == head + target + _turn_end(fmt.name, calls)
    if fmt.name == "llama3_json":  # Llama drops the text of a call turn, and has no reasoning
        assert target == fmt.render_target(calls, response=None if calls else response)


@pytest.mark.parametrize("template", sorted(FAMILY_FORMAT))
def test_parallel_calls_and_earlier_turns_render_as_targets(template):
    tok, fmt = _tokenizer(template), get_format(FAMILY_FORMAT[template])
    target = fmt.render_target(TWO)
    turn = _turn(template, TWO, None, None)
    if fmt.name == "llama3_json":
        with pytest.raises(TemplateError, match="single tool-calls"):  # the template has no parallel calls...
            _full(tok, fmt, ASK, turn)
        # ...so they go in as the target text, written verbatim
        turn = [{"role": "assistant", "content": target}]
    elif fmt.name == "gptoss":
        prompt, full = _full(tok, fmt, ASK, turn)
        assert full == prompt + fmt.render_target(TWO[:1])  # the template drops all calls but the first...
        turn = [native_message(Message("assistant", "", (c,))) for c in TWO]
    prompt, full = _full(tok, fmt, ASK, turn)
    head = "<think>\n\n</think>\n\n" if template == "qwen3" else ""  # as in the test above
    # ...and one message per call is the target
    assert full == prompt + head + target + _turn_end(fmt.name, TWO)
    # an earlier turn with the same calls renders as the target too, and the history goes through the template
    history = fmt.render_prompt(tok, HISTORY, WEATHER)
    assert target in history and history.count("get_weather") >= 2
    if fmt.name != "hermes":
        with pytest.raises(ValueError, match="only through the chat template's `tools=`"):
            fmt.chat(HISTORY, WEATHER, native_tools=False)


def test_llama_puts_the_tools_in_the_first_user_message_and_gptoss_in_the_developer_message():
    llama = get_format("llama3_json").render_prompt(_tokenizer("llama3_1"), ASK, WEATHER)
    user = llama.split("<|start_header_id|>user<|end_header_id|>\n\n")[1]
    assert user.startswith("Given the following functions") and '"name": "get_weather"' in user
    assert user.endswith("Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    oss = get_format("gptoss").render_prompt(_tokenizer("gptoss"), ASK, WEATHER)
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions" in oss
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in oss and oss.endswith("<|start|>assistant")


# ------------------------------------------------------------ (b) targets, decisions and parse errors by hand

def test_llama_target_decisions_and_parse_by_hand():
    f = Llama3JsonFormat()
    c1, c2 = ('{"name": "get_weather", "parameters": {"city": "Paris"}}',
              '{"name": "math.add", "parameters": {"a": "1", "b": "ü"}}')
    text = f.render_target(TWO, response="dropped", think="dropped")
    assert text == f"{c1}; {c2}"
    assert f.decisions(text) == [Decision(0, LLAMA_FIRST, '"', "get_weather"),
                                 Decision(len(c1), LLAMA_NEXT, '"', "math.add"),
                                 Decision(len(text), LLAMA_NEXT, '"', None)]
    assert f.parse(text).calls == TWO and f.parse(text).ok
    tagged = f"<|python_tag|>{c1};\n{c2}"  # Llama 3.1's ipython mode, another separator
    assert f.parse(tagged).calls == TWO and f.parse(tagged).ok
    assert [(d.start, d.opener) for d in f.decisions(tagged)] == \
        [(14, LLAMA_FIRST), (15 + len(c1) + 1, LLAMA_FIRST), (len(tagged), LLAMA_NEXT)]
    answer = f.render_target([], response="It is {warm}.", think="dropped")
    assert answer == "It is {warm}." and f.parse(answer).response == answer and not f.parse(answer).calls
    assert f.decisions("  " + answer) == [Decision(2, LLAMA_FIRST, '"', None)]
    assert f.name_text('say "hi"') == 'say \\"hi\\"'
    assert [d.taken for d in Llama3JsonFormat(end_decision=False).decisions(text)] == \
        ["get_weather", "math.add"]


def test_gptoss_target_decisions_and_parse_by_hand():
    f = GptOssFormat()
    m1 = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    m2 = ' to=functions.math.add<|channel|>commentary json<|message|>{"a": "1", "b": "ü"}'
    head = "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant"
    text = f.render_target(TWO, think="hmm")
    assert text == f"{head}{m1}<|call|><|start|>assistant{m2}<|call|>"
    p1 = len(head) + len(m1)
    assert f.decisions(text) == [Decision(len(head), OSS_FIRST, "<|channel|>", "get_weather"),
                                 Decision(p1, OSS_NEXT, "<|channel|>", "math.add"),
                                 Decision(len(text) - len("<|call|>"), OSS_NEXT, "<|channel|>", None)]
    parsed = f.parse(text)
    assert parsed.ok and parsed.calls == TWO and parsed.think == "hmm" and parsed.response is None
    # the text of a call turn is its analysis message, as the template writes `content`
    assert f.render_target(ONE, response="Let me look.") == f.render_target(ONE, think="Let me look.")
    # the runtime stops on <|call|>: a last call without it reads the same, its end decision where <|call|>
    # would be
    cut = text[:-len("<|call|>")]
    assert f.parse(cut).ok and f.parse(cut).calls == TWO and f.decisions(cut) == f.decisions(text)
    answer = f.render_target([], response="Sunny.", think="Easy.")
    assert answer == \
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Sunny."
    start = answer.index("<|channel|>final")
    assert f.decisions(answer) == [Decision(start, OSS_FIRST, "<|channel|>", None)]
    assert f.parse(answer + "<|return|>").response == "Sunny." and f.parse(answer).think == "Easy."
    assert f.render_target([]) == "<|channel|>final<|message|>" and \
        f.decisions("<|channel|>final<|message|>") == \
        [Decision(0, OSS_FIRST, "<|channel|>", None)]


CALL_A = ' to=functions.a<|channel|>commentary json<|message|>'


@pytest.mark.parametrize("name, text, message, names", [
    ("llama3_json", '{"name": "a", "parameters": {"x": }}', "invalid JSON at char 34", []),
    ("llama3_json", '{"name": "a", "arguments": {}}', "has no 'parameters'", []),
    ("llama3_json", '{"name": "a", "parameters": {}}; ', "';' at char 31 is not followed by a call", ["a"]),
    ("llama3_json", '{"name": "a", "parameters": {}} and more',
     "unexpected text after the calls at char 32", ["a"]),
    ("llama3_json", '{"name": "a", "parameters": {}}; {"name": "b", "parameters": [1]}',
     "must be an object", ["a"]),
    ("gptoss", "", "empty response", []),
    ("gptoss", "<|channel|>analysis<|message|>cut off", "never closed by <|end|>", []),
    ("gptoss", CALL_A + '{"x": }<|call|>', "call to 'a': invalid JSON at char 58", []),
    ("gptoss", CALL_A + "[1]<|call|>", "must be a JSON object, got list", []),
    ("gptoss", CALL_A + "{}<|end|>", "closed by <|end|>, not <|call|>", ["a"]),
    ("gptoss", CALL_A + "{} trailing", "unexpected text after the arguments of 'a'", ["a"]),
    ("gptoss", CALL_A.replace("json", "text") + "{}<|call|>", "expected 'commentary json'", ["a"]),
    ("gptoss", "<|channel|>commentary<|message|>x<|end|>", "unknown message header", []),
    ("gptoss", "<|channel|>final<|message|>x<|return|>more", "unexpected text after <|return|>", []),
    ("gptoss", "<|channel|>final<|message|>x<|end|><|start|>assistant" + CALL_A + "{}<|call|>",
     "a message follows the final message", ["a"]),
    ("gptoss", "<|channel|>analysis<|message|>x<|end|>", "neither a call nor a final message", []),
    ("gptoss", "garbage", "message at char 0 has no <|message|>", []),
])
def test_parse_reports_what_is_wrong(name, text, message, names):
    result = get_format(name).parse(text)
    assert not result.ok and message in result.error, result.error
    assert [c.name for c in result.calls] == names


def test_broken_arguments_with_a_readable_name_are_still_decisions():
    assert [d.taken for d in get_format("gptoss").decisions(CALL_A + '{"x": }<|call|>')] == ["a"]
    assert [d.taken for d in get_format("llama3_json").decisions('{"name": "a", "parameters": {"x": }}')] == \
        ["a"]
    assert get_format("gptoss").decisions("<|channel|>analysis<|message|>cut off") == []


# ---------------------------------------------------------------- (c) the action reader against the reference

NAMES = ("function_1", "function_10", "function_11", "function_2", "get_weather")


def _queries(template: str, chars: int = 160) -> list[ActionQuery]:
    """Targets of the family's format: parallel calls (with reasoning where it has some), one call, no
    call."""
    tok, fmt = _tokenizer(template), get_format(FAMILY_FORMAT[template])
    interface = Interface(tuple(_tool(n, "arg_01") for n in NAMES))
    prompt = fmt.render_prompt(tok, [Message("user", "Weather in Paris?")], interface)[-chars:]
    think = None if fmt.name == "llama3_json" or template == "qwen2_5" else "ok"
    targets = [fmt.render_target([Call(NAMES[1], {"arg_01": "x"}), Call(NAMES[0], {"arg_01": "y"})],
                                 think=think),
               fmt.render_target([Call(NAMES[4], {"arg_01": "z"})]),
               fmt.render_target([], response="It is sunny.", think=think)]
    queries = [ActionQuery.from_format(fmt, prompt, t, NAMES, tuple(range(len(NAMES)))[::-1])
               for t in targets]
    assert [[d.taken for d in q.decisions] for q in queries] == \
        [[NAMES[1], NAMES[0], None], [NAMES[4], None], [None]]
    return queries


def _assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and torch.equal(a == 0, b == 0)
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
    assert torch.allclose(a[a > 0].log(), b[b > 0].log(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("template", ["qwen2_5", "qwen3", "llama3_1", "gptoss"])
def test_reader_equals_bruteforce_on_each_family_tokenizer(template):
    tok = _tokenizer(template)
    model = tiny_model(tok, seed=3).to(torch.float64)
    queries = _queries(template)
    ref = read_actions_bruteforce(model, tok, queries, len(NAMES))
    assert torch.allclose(ref.sum(-1), torch.ones(len(ref), dtype=torch.float64))
    for mode, side in (("packed", "left"), ("prefix_cache", "right")):
        reading = read_actions(model, tok, queries, len(NAMES),
                               ActionReaderConfig(mode=mode, padding_side=side))
        _assert_same(reading.probs, ref)
    unpacked = read_actions(model, tok, queries, len(NAMES), ActionReaderConfig(reuse_response=False))
    # taken calls were read from the responses themselves
    assert reading.packed_tokens < unpacked.packed_tokens
    assert torch.allclose(reading.probs, unpacked.probs, atol=1e-12, rtol=0)


def test_gptoss_names_are_closed_by_the_channel_token():
    """`<|channel|>` is a control token no ordinary token starts with: it joins each name's path and nothing
    is summed, so `function_1` and `function_10` stay apart."""
    tok = _tokenizer("gptoss")
    q = _queries("gptoss")[0]
    rids = tok(q.response, add_special_tokens=False)["input_ids"]
    plan = plan_decision(tok, q.response, rids, q.decisions[1], q.written)
    channel = tok.convert_tokens_to_ids("<|channel|>")
    assert plan.name_rests == (b"",) * len(NAMES) and all(ids[-1] == channel for ids in plan.names)
    assert tok.convert_ids_to_tokens(list(plan.opener))[:2] == ["<|call|>", "<|start|>"]


# ---------------------------------------------------------------- (d) format=auto

TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"


def _expected(stem: str) -> str | None:
    if stem.startswith("qwen3_5"):
        return "qwen35_xml"
    if stem.startswith(("qwen3_6", "qwen3_8")):
        return "qwen36_xml"
    if stem.startswith(("qwen2_5", "qwen3")) and not stem.startswith("qwen2_5_vl"):
        return "hermes"
    return {"llama3_1": "llama3_json", "llama3_2": "llama3_json", "gptoss": "gptoss",
            "gptoss_training": "gptoss"}.get(stem)


def test_auto_reads_the_family_of_every_trl_template():
    seen = {}
    for path in sorted(TRL_TEMPLATES.glob("*.jinja")):
        want = _expected(path.stem)
        if want is None:
            with pytest.raises(ValueError, match="matches no call format"):
                detect_format(path.read_text(encoding="utf-8"))
        else:
            seen[path.stem] = detect_format(path.read_text(encoding="utf-8"))
            assert seen[path.stem] == want, path.stem
    assert {"qwen2_5", "qwen3", "llama3_1", "llama3_2", "gptoss", "qwen3_5_think", "qwen3_5_nothink",
            "qwen3_6", "qwen3_8"} <= set(seen)


@pytest.mark.parametrize("template", sorted(FAMILY_FORMAT))
def test_auto_resolves_from_the_tokenizer_and_a_name_overrides(template):
    tok = _tokenizer(template)
    assert resolve_format(AUTO, tok).name == FAMILY_FORMAT[template]
    assert resolve_format("toolrl", tok).name == "toolrl"
    assert resolve_format(AUTO, tok, end_decision=False).end_decision is False


@pytest.mark.parametrize("template, found", [
    ("nemotron_3_nano", "<function= (XML calls in a turn layout other than Qwen3.5's (Nemotron 3)"),
    ("glm4moe", "<arg_key> (GLM-4.5"),
    ("gemma4", "<|tool_call> (Gemma 4"),
    ("llama3", "<|start_header_id|> (Llama 3 headers); it never reads `tools`"),
    ("phi3", "none of the known call markers; it never reads `tools`"),
])
def test_auto_errors_name_what_the_template_holds(template, found):
    with pytest.raises(ValueError, match="matches no call format") as e:
        detect_format(trl_template(template))
    assert found in str(e.value) and "llama3_json (Llama 3.1 / 3.2" in str(e.value)


@pytest.mark.parametrize("template, found", [
    ("{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}"
     "{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls|tojson }}</s>{% endif %}{% endfor %}",
     "[TOOL_CALLS] (Mistral's JSON call lists, not supported here"),
    ("{% if tools %}Call them as [func_name1(params_name1=params_value1), func_name2(params)]: "
     "{{ tools|tojson }}{% endif %}", "[func_name1( (Llama 3.2's pythonic calls, not supported here"),
])
def test_families_not_supported_are_refused_with_the_reason(template, found):
    """Mistral's `[TOOL_CALLS]` and Llama 3.2's pythonic calls (templates written here in their shape)."""
    with pytest.raises(ValueError, match="matches no call format") as e:
        detect_format(template)
    assert found in str(e.value) and "reads `tools`" in str(e.value)


def test_auto_without_a_template_or_tokenizer_and_ambiguous_templates():
    tok = _tokenizer("qwen2_5")
    bare = type("Bare", (), {"chat_template": None})()
    with pytest.raises(ValueError, match="has none"):
        resolve_format(AUTO, bare)
    with pytest.raises(ValueError, match="no tokenizer is at hand"):
        resolve_format(AUTO)
    with pytest.raises(ValueError, match="matches several call formats \\(hermes, llama3_json\\)"):
        detect_format(tok.chat_template + trl_template("llama3_1"))
    named = type("Named", (),
                 {"chat_template": {"default": "{{ messages }}", "tool_use": trl_template("llama3_2")}})()
    assert detect_format(named) == "llama3_json"


def test_eval_reads_auto_from_the_model_folder_tokenizer(tiny_dir):
    from cipr.eval.config import EvalConfig
    from cipr.eval.evaluate import _template_tokenizer

    tok = _template_tokenizer(EvalConfig(model=str(tiny_dir), format=AUTO))
    assert resolve_format(AUTO, tok).name == "hermes"  # the tiny model folder carries Qwen2.5's template
    assert _template_tokenizer(EvalConfig(model=str(tiny_dir), format="toolrl")) is None
    assert _template_tokenizer(EvalConfig(model="http://localhost:1/v1", format=AUTO)) is None
