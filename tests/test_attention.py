"""Grouped-query attention without key/value copies: same outputs as transformers' eager attention."""

from __future__ import annotations

import pytest
import torch

from cipr.attention import GROUPED, grouped_attention, grouped_decode, grouped_scores, register, use_grouped
from cipr.errors import ConfigError


class _Module(torch.nn.Module):
    num_key_value_groups = 3


def _eager(query, key, value, mask, scaling):
    """transformers' eager attention (repeat_kv, then per-head attention), written out."""
    g = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(g, dim=1)
    v = value.repeat_interleave(g, dim=1)
    w = torch.matmul(query, k.transpose(2, 3)) * scaling
    if mask is not None:
        w = w + mask
    w = torch.softmax(w.float(), dim=-1).to(query.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), w


@pytest.mark.parametrize("lq", [1, 5])
@pytest.mark.parametrize("mask_heads", [None, 1, 6])
def test_grouped_attention_matches_eager_by_loop_over_heads(lq, mask_heads):
    torch.manual_seed(0)
    b, k, g, t, d = 2, 2, 3, 7, 4
    q, key, value = torch.randn(b, k * g, lq, d), torch.randn(b, k, t, d), torch.randn(b, k, t, d)
    mask = None if mask_heads is None else torch.randn(b, mask_heads, lq, t).masked_fill(
        torch.rand(b, mask_heads, lq, t) < 0.3, -1e9)
    out, weights = grouped_scores(q, key, value, mask, 0.5)
    expected, expected_w = _eager(q, key, value, mask, 0.5)
    assert out.shape == (b, lq, k * g, d) and weights.shape == (b, k * g, lq, t)
    assert torch.allclose(out, expected, atol=1e-6) and torch.allclose(weights, expected_w, atol=1e-6)
    dispatched, dispatched_w = grouped_attention(_Module().eval(), q, key, value, mask, 0.5)
    assert torch.allclose(dispatched, expected, atol=1e-6)
    assert (dispatched_w is None) if lq == 1 else torch.equal(dispatched_w, weights)  # decode: fused, no weights
    for h in range(k * g):  # query head h reads key/value head h // g
        w = torch.softmax(q[:, h] @ key[:, h // g].transpose(1, 2) * 0.5 + (0 if mask is None else
                          mask[:, 0 if mask_heads == 1 else h]), dim=-1)
        assert torch.allclose(out[:, :, h], w @ value[:, h // g], atol=1e-6)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_decode_matches_the_unfused_path_with_left_padding(dtype, kernel, monkeypatch):
    """One query position over a left-padded cache (the mask's finfo.min columns) at SmolLM2-135M's head
    shapes: the fused kernel (SDPA's, or CIPR's for float32 where `kernel`) gives the unfused values to
    rounding, shape [B, 1, H, D]."""
    from cipr import cpu_kernels

    calls = []
    real = cpu_kernels.decode_attention
    monkeypatch.setattr(cpu_kernels, "decode_attention", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(1)
    b, k, g, t, d = 3, 3, 3, 40, 64
    q = torch.randn(b, k * g, 1, d, dtype=dtype)
    key, value = torch.randn(b, k, t, d, dtype=dtype), torch.randn(b, k, t, d, dtype=dtype)
    mask = torch.zeros(b, 1, 1, t + 5, dtype=dtype)  # longer than the cache, as transformers may pass it
    mask[0, ..., :7] = torch.finfo(dtype).min
    mask[2, ..., :30] = torch.finfo(dtype).min
    out = grouped_decode(q, key, value, mask, d ** -0.5, kernel=kernel)
    expected, _ = grouped_scores(q, key, value, mask, d ** -0.5)
    assert out.shape == (b, 1, k * g, d) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), expected.float(), atol=tol)
    assert torch.allclose(out[2].float(), grouped_decode(q[2:], key[2:, :, 30:], value[2:, :, 30:], None,
                                                         d ** -0.5, kernel=kernel)[0].float(), atol=tol)  # padding ignored
    assert len(calls) == (2 if kernel and dtype == torch.float32 else 0)


@pytest.fixture(scope="module")
def tiny_model32(tiny_tokenizer):
    """float32: eager attention in float64 turns left-padded rows into NaN (its mask is -inf there)."""
    from cipr.testing import tiny_model

    return tiny_model(tiny_tokenizer).eval()


def test_registered_attention_gives_eager_logits_in_a_cached_batch(tiny_model32):
    """Left-padded batch, prefill then two cached decoding steps: logits equal eager's."""
    from transformers import DynamicCache

    register()
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    logits = {}
    for impl in ("eager", GROUPED):
        tiny_model32.set_attn_implementation(impl)
        cache, m, x = DynamicCache(config=tiny_model32.config), mask, ids
        pos = (m.cumsum(-1) - 1).clamp(min=0)
        steps = []
        with torch.no_grad():
            for _ in range(3):
                out = tiny_model32(input_ids=x, attention_mask=m, position_ids=pos, past_key_values=cache)
                steps.append(out.logits[:, -1])
                x = out.logits[:, -1].argmax(-1)[:, None]
                pos = pos[:, -1:] + 1
                m = torch.cat([m, m.new_ones(2, 1)], dim=1)
        logits[impl] = torch.stack(steps)
    assert torch.isfinite(logits["eager"]).all()
    assert torch.allclose(logits["eager"], logits[GROUPED], atol=1e-5)


def test_cpu_evaluation_decodes_with_grouped_attention_and_the_reader_switches_to_sdpa():
    from cipr.eval.config import EvalConfig
    from cipr.eval.evaluate import load_model, reader_attention

    model, _ = load_model(EvalConfig(model="tiny", device="cpu"))
    assert model.config._attn_implementation == GROUPED
    with reader_attention(model):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == GROUPED


def test_attention_switch_restores_and_leaves_other_families_alone(tiny_model32):
    from cipr.attention import attention

    tiny_model32.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="inside"):
        with attention(tiny_model32, GROUPED):
            assert tiny_model32.config._attn_implementation == GROUPED
            raise RuntimeError("inside")
    assert tiny_model32.config._attn_implementation == "sdpa"
    tiny_model32.config.model_type = "gemma2"  # soft-capped attention: not reproduced, so not switched
    try:
        with attention(tiny_model32, GROUPED):
            assert tiny_model32.config._attn_implementation == "sdpa"
        assert not use_grouped(tiny_model32)
        with pytest.raises(ConfigError, match="gemma2"):
            use_grouped(tiny_model32, required=True)
        assert tiny_model32.config._attn_implementation == "sdpa"
    finally:
        tiny_model32.config.model_type = "llama"
    with pytest.raises(ValueError, match="softcap"):
        grouped_attention(_Module(), torch.zeros(1, 6, 1, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4),
                          None, 1.0, softcap=30.0)
