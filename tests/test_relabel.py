"""Relabeling (x, y) -> (x̃, ỹ) (`cipr.method.relabel`, every engine's one relabeler): fresh names
everywhere, decisions in correspondence turn by turn, the seed's one rule, rescoring KL end to end."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reference_kl import rescoring_kl

from cipr.formats import get_format
from cipr.method.actions import ActionQuery, read_actions
from cipr.method.relabel import RelabelConfig, Relabeling, relabel, relabel_seed
from cipr.tools.interface import Call, Interface, Message, Tool

NAMES = [f"function_{i:02d}" for i in range(1, 9)]
SCHEMA = {"type": "object", "properties": {"arg_01": {"type": "string"}}}
INTERFACE = Interface(tuple(Tool(n, f"Tool number {i}.", SCHEMA) for i, n in enumerate(NAMES)))


def _pair(tok, fmt_name: str, calls: list[Call]) -> tuple[str, str]:
    fmt = get_format(fmt_name)
    prompt = fmt.render_prompt(tok, [Message("user", "Use function_03 if it helps; arg_01 is free text.")],
                               INTERFACE)
    return prompt, fmt.render_target(calls, response=None if calls else "Nothing to do.", think="thinking")


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


@pytest.mark.parametrize("fmt_name", ["toolrl", "hermes", "react", "webshop"])
@pytest.mark.parametrize("scheme", ["function", "tool", "random"])
def test_fresh_names_everywhere_and_decisions_correspond(tiny_tokenizer, fmt_name, scheme):
    calls = [Call("function_02", {"arg_01": "a"})]
    if fmt_name in ("toolrl", "hermes"):
        calls.append(Call("function_07", {"arg_01": "b"}))
    prompt, response = _pair(tiny_tokenizer, fmt_name, calls)
    r = relabel(prompt, response, NAMES, get_format(fmt_name), RelabelConfig(scheme=scheme), seed=3)
    assert len(set(r.tools)) == len(NAMES) and \
        all(new != old for new, old in zip(r.tools, NAMES, strict=True))
    assert r.mapping == dict(zip(NAMES, r.tools, strict=True))
    prefix = {"function": "function_", "tool": "tool_", "random": "fn_"}[scheme]
    assert all(t.startswith(prefix) for t in r.tools)
    # every old name that is not also a new name is gone; every tool's new name appears in the prompt
    gone = set(NAMES) - set(r.tools)
    assert not (gone & _words(r.prompt)) and not (gone & _words(r.response))
    assert all(t in _words(r.prompt) for t in r.tools)
    assert [d.taken for d in r.decisions] == [r.mapping[c.name] for c in calls] + (
        [None] if fmt_name in ("toolrl", "hermes") else [])
    assert len(get_format(fmt_name).decisions(response)) == len(r.decisions)
    # "arg_01" and the rest of the text are untouched: undo the renaming and get the original back
    back = {v: k for k, v in r.mapping.items()}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, back)) + r")\b")
    assert pattern.sub(lambda m: back[m.group(1)], r.prompt) == prompt
    assert pattern.sub(lambda m: back[m.group(1)], r.response) == response


def test_seeded_and_avoids_words_in_the_text(tiny_tokenizer):
    prompt, response = _pair(tiny_tokenizer, "toolrl", [Call("function_01", {"arg_01": "x"})])
    fmt = get_format("toolrl")
    a = relabel(prompt, response, NAMES, fmt, seed=1)
    assert relabel(prompt, response, NAMES, fmt, seed=1) == a
    assert relabel(prompt, response, NAMES, fmt, seed=2).tools != a.tools
    # a small pool with every free name but eight taken by words in the text: the eight must be used
    taken = " ".join(f"tool_{k:02d}" for k in range(9, 13))
    r = relabel(prompt + taken, response, NAMES, fmt, RelabelConfig(scheme="tool", pool=12), seed=0)
    assert set(r.tools) == {f"tool_{k:02d}" for k in range(1, 9)}
    with pytest.raises(ValueError, match="pool"):
        relabel(prompt, response, NAMES, fmt, RelabelConfig(scheme="tool", pool=5), seed=0)
    with pytest.raises(ValueError, match="repeat"):
        relabel(prompt, response, ["function_01", "function_01"], fmt, seed=0)


def test_the_run_seed_is_resolved_once():
    """`perturb.relabel.seed` when set, else the run's seed; each draw's seed is `relabel_seed` of it."""
    assert Relabeling.of(RelabelConfig(), 5).seed == 5 and Relabeling.of(None, 5).seed == 5
    assert Relabeling.of(RelabelConfig(seed=9), 5).seed == 9
    assert Relabeling.of(RelabelConfig(seed=9), 5).seed_for(3, "ex", 1) == relabel_seed(9, 3, "ex", 1)


@pytest.mark.parametrize("fmt_name", ["toolrl", "hermes"])
def test_names_in_rendered_descriptions_are_relabeled(tiny_tokenizer, fmt_name):
    """A description naming another tool is part of the prompt text, so the rescoring view renames it too."""
    fmt = get_format(fmt_name)
    tools = (Tool("function_01", "Search flights.", SCHEMA),
             Tool("function_02", "Book a flight found by function_01; arg_01 is its id.", {
                 "type": "object", "properties": {"arg_01": {"type": "string",
                                                             "description": "An id from function_01."}}}))
    prompt = fmt.render_prompt(tiny_tokenizer, [Message("user", "Book UA512.")], Interface(tools))
    response = fmt.render_target([Call("function_02", {"arg_01": "UA512"})], think="thinking")
    r = relabel(prompt, response, ["function_01", "function_02"], fmt, seed=4)
    flights, book = r.tools
    assert f"Book a flight found by {flights}; arg_01 is its id." in r.prompt
    assert f"An id from {flights}." in r.prompt and "function_01" not in _words(r.prompt) - {flights, book}
    assert [d.taken for d in r.decisions] == [book, None]  # the call, then the end of the turn


def test_broken_correspondence_raises(tiny_tokenizer):
    prompt, response = _pair(tiny_tokenizer, "toolrl", [Call("function_01", {"arg_01": "x"})])

    class Shifty(type(get_format("toolrl"))):
        """A format whose decisions depend on the literal name (so relabeling changes them)."""

        def decisions(self, text):
            return super().decisions(text) if "function_01" in text else super().decisions(text)[:1]

    with pytest.raises(ValueError, match="changed turn 0's decisions"):
        relabel(prompt, response, NAMES, Shifty(), seed=0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(NAMES), min_size=0, max_size=4), st.integers(0, 1000))
def test_property_decisions_correspond(called, seed):
    from support.tiny_models import tiny_tokenizer

    tok = test_property_decisions_correspond.tok = getattr(test_property_decisions_correspond, "tok", None) \
        or tiny_tokenizer()
    prompt, response = _pair(tok, "toolrl", [Call(n, {"arg_01": n}) for n in called])
    r = relabel(prompt, response, NAMES, get_format("toolrl"), seed=seed)
    assert [d.taken for d in r.decisions] == [r.mapping.get(d.taken) if d.taken else None
                                              for d in get_format("toolrl").decisions(response)]
    # argument values equal to old names are renamed too (whole-word rule), consistently with the calls
    parsed = get_format("toolrl").parse(r.response)
    assert [c.name for c in parsed.calls] == [r.mapping[n] for n in called]


def test_rescoring_kl_end_to_end(tiny_tokenizer, tiny_model):
    fmt = get_format("toolrl")
    # a short prompt (ToolRL's own is 1,400 tokens), so that a few SFT steps teach the tiny model to call
    prompt = "<|im_start|>user\nTools: " + ", ".join(NAMES) + ". Weather?<|im_end|>\n<|im_start|>assistant\n"
    response = fmt.render_target([Call("function_02", {"arg_01": "a"}), Call("function_05", {"arg_01": "b"})],
                                 think="go")
    r = relabel(prompt, response, NAMES, fmt, seed=0)
    canon = ActionQuery.from_format(fmt, prompt, response, NAMES)
    relab = ActionQuery.from_format(fmt, r.prompt, r.response, r.tools)
    # teach the canonical side its own decisions through the reader (differentiable), so calls carry mass
    model = copy.deepcopy(tiny_model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        opt.zero_grad()
        p = read_actions(model, tiny_tokenizer, [canon], len(NAMES)).probs
        (-(p[0, 1].log() + p[1, 4].log() + p[2, -1].log())).backward()
        opt.step()
    half = len(canon.decisions)
    assert len(relab.decisions) == half == 3

    def kl() -> tuple[torch.Tensor, dict]:
        probs = read_actions(model, tiny_tokenizer, [canon, relab], len(NAMES)).probs
        return rescoring_kl(probs[:half], probs[half:], torch.zeros(half, dtype=torch.long))

    value, metrics = kl()
    assert value.item() > 0.05 and metrics["rescore/decisions"] == 3
    # descending the rescoring KL alone brings the relabeled side toward the canonical one
    for _ in range(10):
        opt.zero_grad()
        kl()[0].backward()
        opt.step()
    assert kl()[0].item() < 0.5 * value.item()
    model.zero_grad()
    value, _ = kl()
    value.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
