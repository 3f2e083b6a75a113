"""`sdpa_gqa` (cipr/runtime/attention.py): the values of transformers' SDPA, without its per-group key/value
copy under a mask on CPU; the evaluation picks it on CPU unless told otherwise."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_module
from support.tiny_models import attention_as, tiny_model

from cipr.runtime.attention import NAME, register, sdpa_gqa_attention_forward


@pytest.fixture(scope="module")
def grouped(tiny_tokenizer):
    """The tiny Qwen2 (4 query heads over 2 key/value heads), weights scaled up so attention is not flat."""
    model = tiny_model(tiny_tokenizer, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4)
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 2
    return model


def _padded_batch(tokenizer):
    tokenizer.padding_side = "left"
    texts = ["a short one", "a much longer prompt that needs no padding at all, word after word", "mid length text"]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def test_same_logits_and_cache_as_sdpa_under_a_padding_mask_without_repeat_kv(grouped, tiny_tokenizer, monkeypatch):
    """Prefill a left-padded batch and decode 4 greedy steps under each implementation: identical logits at every
    step, and transformers' `repeat_kv` runs under `sdpa` but never under `sdpa_gqa`."""
    calls = {"n": 0}
    real = sdpa_module.repeat_kv

    def counting(x, n_rep):
        calls["n"] += 1
        return real(x, n_rep)

    monkeypatch.setattr(sdpa_module, "repeat_kv", counting)
    enc = _padded_batch(tiny_tokenizer)
    assert not bool(enc["attention_mask"].all())  # the batch is padded: a mask reaches attention
    register()
    out = {}
    for impl in ("sdpa", NAME):
        calls["n"] = 0
        with attention_as(grouped, impl), torch.inference_mode():
            o = grouped.generate(**enc, do_sample=False, max_new_tokens=4, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tiny_tokenizer.pad_token_id)
        out[impl] = (o.sequences, torch.stack(o.logits))
        out[impl, "repeat_kv"] = calls["n"]
    assert out["sdpa", "repeat_kv"] > 0 and out[NAME, "repeat_kv"] == 0
    assert torch.equal(out["sdpa"][0], out[NAME][0])
    assert out["sdpa"][1].shape == (4, 3, len(tiny_tokenizer))
    assert torch.allclose(out["sdpa"][1], out[NAME][1], atol=1e-5, rtol=0)


def test_hand_computed_grouped_attention_with_a_mask():
    """Shapes [B, H, Lq, D] x [B, K, Lk, D] -> [B, Lq, H, D]; each query head h reads key/value head h // (H/K),
    and masked positions get no weight (checked against softmax(q k^T / sqrt(D)) v written out)."""
    g = torch.Generator().manual_seed(0)
    b, h, k, lq, lk, d = 2, 4, 2, 3, 5, 8
    q, key, value = (torch.randn(b, h, lq, d, generator=g), torch.randn(b, k, lk, d, generator=g),
                     torch.randn(b, k, lk, d, generator=g))
    mask = torch.ones(b, 1, lq, lk, dtype=torch.bool)
    mask[0, :, :, :2] = False

    class Module:
        num_key_value_groups = h // k

    out, weights = sdpa_gqa_attention_forward(Module(), q, key, value, mask, scaling=d ** -0.5)
    assert weights is None and out.shape == (b, lq, h, d)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // k)
            scores = q[bi, hi] @ key[bi, kv].T / d ** 0.5
            scores = scores.masked_fill(~mask[bi, 0], float("-inf"))
            expected = torch.softmax(scores, -1) @ value[bi, kv]
            assert torch.allclose(out[bi, :, hi], expected, atol=1e-5)


def test_evaluation_loads_sdpa_gqa_on_cpu_unless_told(tmp_path):
    from support.tiny_models import save_tiny

    from cipr.eval.config import EvalConfig
    from cipr.eval.evaluate import load_model

    folder = save_tiny(tmp_path / "tiny")
    auto, _ = load_model(EvalConfig(model=str(folder), device="cpu"))
    assert auto.config._attn_implementation == NAME
    told, _ = load_model(EvalConfig(model=str(folder), device="cpu", attn_implementation="sdpa"))
    assert told.config._attn_implementation == "sdpa"
    eager, _ = load_model(EvalConfig(model=str(folder), device="cpu", attn_implementation="eager"))
    assert eager.config._attn_implementation == "eager"
