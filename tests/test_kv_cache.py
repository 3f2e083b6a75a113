"""The in-place appending key/value cache holds what transformers' DynamicLayer holds, step by step."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from cipr.runtime.kv_cache import GrowingLayer, LeftPaddedBatch, growing_cache


def test_growing_layer_matches_dynamic_layer_through_appends_selection_and_crop():
    torch.manual_seed(0)
    ours, ref = GrowingLayer(), DynamicLayer()
    steps = [5, 1, 1, 70, 1, 3]  # the 70 forces the buffer to grow past its first capacity
    rows = 4
    for i, n in enumerate(steps):
        k, v = torch.randn(rows, 2, n, 8), torch.randn(rows, 2, n, 8)
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), i
        if i == 2:
            for layer in (ours, ref):
                layer.batch_select_indices(torch.tensor([0, 2, 3]))
            rows = 3
    assert ours.get_seq_length() == ref.get_seq_length() == sum(steps)
    for layer in (ours, ref):  # not increasing: a reorder with a repeat (the copying path)
        layer.batch_select_indices(torch.tensor([2, 0, 0]))
    assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    ours.crop(-4)
    ref.crop(-4)
    k, v = torch.randn(3, 2, 2, 8), torch.randn(3, 2, 2, 8)
    got, want = ours.update(k, v), ref.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_growing_cache_gives_the_model_the_same_logits(tiny_tokenizer):
    from support.tiny_models import tiny_model
    from transformers import DynamicCache

    model = tiny_model(tiny_tokenizer).eval()
    ids = torch.randint(3, 200, (2, 7))
    logits = []
    for cache in (growing_cache(model.config), DynamicCache(config=model.config)):
        assert isinstance(cache.layers[0], GrowingLayer) == (len(logits) == 0)
        x, steps = ids, []
        with torch.no_grad():
            for _ in range(4):
                out = model(input_ids=x, past_key_values=cache, use_cache=True)
                steps.append(out.logits[:, -1])
                x = out.logits[:, -1:].argmax(-1)
        logits.append(torch.stack(steps))
    assert torch.equal(logits[0], logits[1])


def test_left_padded_batch_places_each_row_at_the_right_and_reserves_room():
    """Rows of 3 and 5 tokens [1, K=2, n, D=4] per layer: row 0 right-aligned after 2 zero positions,
    row 1 full; buffers [2, 2, capacity=9, 4]; a decoding step appends into the reserved room."""
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=16)
    batch = LeftPaddedBatch(config, [3, 5], capacity=9)
    states = {}
    for i, n in enumerate([3, 5]):
        cache = batch.row(i)
        for j, layer in enumerate(cache.layers):
            k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
            got_k, got_v = layer.update(k, v)
            assert torch.equal(got_k, k) and torch.equal(got_v, v)  # what attention reads for this prompt
            states[i, j] = (k, v)
        with pytest.raises(RuntimeError, match="one prefill forward"):
            cache.layers[0].update(k, v)
    out = batch.batch()
    assert out.get_seq_length() == 5
    for j, layer in enumerate(out.layers):
        assert isinstance(layer, GrowingLayer)
        assert layer.keys.shape == (2, 2, 5, 4) and layer._key_buffer.shape == (2, 2, 9, 4)
        (k0, v0), (k1, v1) = states[0, j], states[1, j]
        assert torch.equal(layer.keys[0, :, 2:], k0[0]) and torch.equal(layer.values[0, :, 2:], v0[0])
        assert torch.equal(layer.keys[1], k1[0]) and torch.equal(layer.values[1], v1[0])
        assert not layer.keys[0, :, :2].any() and not layer.values[0, :, :2].any()
    k = torch.randn(2, 2, 1, 4)
    keys, _ = out.layers[0].update(k, k)
    assert keys.shape == (2, 2, 6, 4) and torch.equal(keys[:, :, 5:], k)
    assert out.layers[0]._key_buffer.shape[-2] == 9  # appended into the reserved room, no regrowth


def test_left_padded_batch_gives_the_model_each_prompts_own_logits(tiny_tokenizer):
    """Prefilling through a batch row gives the logits of a prompt's own DynamicCache forward, and the
    first decoding step of the batch those of each prompt continued alone."""
    from support.tiny_models import tiny_model
    from transformers import DynamicCache

    model = tiny_model(tiny_tokenizer).eval()
    prompts = [torch.randint(3, 200, (1, n)) for n in (4, 9, 6)]
    batch = LeftPaddedBatch(model.config, [p.shape[1] for p in prompts], capacity=12)
    nxt = torch.randint(3, 200, (3, 1))
    with torch.no_grad():
        alone = []
        for i, p in enumerate(prompts):
            cache = DynamicCache(config=model.config)
            want = model(input_ids=p, past_key_values=cache, use_cache=True).logits[0, -1]
            got = model(input_ids=p, past_key_values=batch.row(i), use_cache=True).logits[0, -1]
            torch.testing.assert_close(got, want)
            step = model(input_ids=nxt[i:i + 1], past_key_values=cache, use_cache=True).logits[0, -1]
            alone.append(step)
        lengths = torch.tensor([p.shape[1] for p in prompts])
        mask = (torch.arange(9)[None, :] >= (9 - lengths)[:, None]).long()
        mask = torch.cat([mask, mask.new_ones(3, 1)], dim=1)
        out = model(input_ids=nxt, attention_mask=mask, position_ids=lengths[:, None],
                    past_key_values=batch.batch(), use_cache=True).logits[:, -1]
    torch.testing.assert_close(out, torch.stack(alone), rtol=1e-4, atol=1e-5)


def test_left_padded_batch_refuses_sliding_window_layers_and_unfilled_rows():
    from transformers import LlamaConfig, MistralConfig

    config = MistralConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=8,
                           sliding_window=4)
    with pytest.raises(ValueError, match="full attention"):
        LeftPaddedBatch(config, [3])
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=8)
    batch = LeftPaddedBatch(config, [3, 2])
    batch.row(0).layers[0].update(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    with pytest.raises(ValueError, match=r"rows \[1\] were not prefilled"):
        batch.batch()
    with pytest.raises(ValueError,
                       match=r"row 1 holds one sequence of 2 tokens; got keys of shape \(1, 1, 3, 4\)"):
        batch.row(1).layers[0].update(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    with pytest.raises(ValueError, match="row 1: a prefix of 2 positions for a prompt of 2 tokens"):
        batch.row(1, [(torch.randn(1, 2, 4), torch.randn(1, 2, 4))])
    # 1 + 2 > 2
    with pytest.raises(ValueError, match=r"row 1 holds one sequence of 2 tokens; .* after 1 cached"):
        batch.row(1, [(torch.randn(1, 1, 4), torch.randn(1, 1, 4))]).layers[0].update(
            torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))
    with pytest.raises(ValueError, match="prefix has 2 layers, the model 1"):
        batch.row(1, [(torch.randn(1, 1, 4), torch.randn(1, 1, 4))] * 2)
    with pytest.raises(ValueError, match=r"row 1: 0 of 1 layers prefilled"):
        batch.states(1)


def test_left_padded_batch_reuses_buffers_that_fit_and_zeroes_their_padding():
    """A second, smaller batch writes into views of the first batch's buffers (same storage), with its
    left padding zeroed over the first batch's values; a batch that needs more room gets new buffers."""
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=8)
    reuse: list = []

    def fill(lengths, capacity):
        batch = LeftPaddedBatch(config, lengths, capacity=capacity, reuse=reuse)
        for i, n in enumerate(lengths):
            batch.row(i).layers[0].update(torch.full((1, 1, n, 4), float(i + 1)),
                                          torch.full((1, 1, n, 4), -1.0))
        return batch.batch().layers[0]

    first = fill([5, 5, 5], 8)
    storage = first._key_buffer.untyped_storage().data_ptr()
    second = fill([2, 4], 6)
    assert second._key_buffer.untyped_storage().data_ptr() == storage  # reused
    assert second._key_buffer.shape == (2, 1, 6, 4) and second.keys.shape == (2, 1, 4, 4)
    assert not second.keys[0, :, :2].any() and not second.values[0, :, :2].any()
    assert (second.keys[0, :, 2:] == 1).all() and (second.keys[1] == 2).all()
    third = fill([3], 20)
    assert third._key_buffer.untyped_storage().data_ptr() != storage and reuse[0][0].shape == (1, 1, 20, 4)


def test_a_row_prefilled_after_a_copied_prefix_holds_a_full_prefill_and_gives_its_logits(tiny_tokenizer):
    """Prompt b shares its first 5 tokens with prompt a: row 1 takes a's states for them (`states`) and
    its forward runs on b's last 4 tokens only, at positions 5-8. Its logits and cached keys/values are
    those of b's own full forward (to rounding), and the copied positions equal a's exactly."""
    from support.tiny_models import tiny_model
    from transformers import DynamicCache

    model = tiny_model(tiny_tokenizer).eval()
    a = torch.randint(3, 200, (1, 7))
    b = torch.cat([a[:, :5], torch.randint(3, 200, (1, 4))], dim=1)
    batch = LeftPaddedBatch(model.config, [7, 9], capacity=12)
    with torch.no_grad():
        model(input_ids=a, past_key_values=batch.row(0), use_cache=True)
        prefix = [(k[:, :5], v[:, :5]) for k, v in batch.states(0)]
        assert len(prefix) == model.config.num_hidden_layers and prefix[0][0].shape[-2] == 5
        got = model(input_ids=b[:, 5:], past_key_values=batch.row(1, prefix), use_cache=True).logits[0, -1]
        full = DynamicCache(config=model.config)
        want = model(input_ids=b, past_key_values=full, use_cache=True).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (k, v), (k0, v0), layer in zip(batch.states(1), batch.states(0), full.layers, strict=True):
        assert k.shape == (model.config.num_key_value_heads, 9, k.shape[-1])
        torch.testing.assert_close(k, layer.keys[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, layer.values[0], rtol=1e-4, atol=1e-5)
        assert torch.equal(k[:, :5], k0[:, :5]) and torch.equal(v[:, :5], v0[:, :5])
    cache = batch.batch()
    assert cache.get_seq_length() == 9 and not cache.layers[0].keys[0, :, :2].any()  # row 0 left-padded
