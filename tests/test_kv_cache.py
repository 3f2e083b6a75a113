"""The in-place appending key/value cache holds what transformers' DynamicLayer holds, step by step."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from cipr.kv_cache import GrowingLayer, growing_cache, stack_left_padded


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
    ours.crop(-4)
    ref.crop(-4)
    k, v = torch.randn(3, 2, 2, 8), torch.randn(3, 2, 2, 8)
    got, want = ours.update(k, v), ref.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_growing_cache_gives_the_model_the_same_logits(tiny_tokenizer):
    from transformers import DynamicCache

    from cipr.testing import tiny_model

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


def test_stack_left_padded_places_each_row_at_the_right_and_reserves_room():
    from transformers import DynamicCache, LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=16)
    caches, states = [], []
    for n, make in ((3, growing_cache), (5, lambda c: DynamicCache(config=c))):
        cache = make(config)
        for layer in cache.layers:
            k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
            layer.update(k, v)
            states.append((k, v))
        caches.append(cache)
    out = stack_left_padded(caches, config, capacity=9)
    assert out.get_seq_length() == 5
    for j, layer in enumerate(out.layers):
        assert layer.keys.shape == (2, 2, 5, 4) and layer._key_buffer.shape == (2, 2, 9, 4)
        (k0, v0), (k1, v1) = states[j], states[len(out.layers) + j]
        assert torch.equal(layer.keys[0, :, 2:], k0[0]) and torch.equal(layer.values[0, :, 2:], v0[0])
        assert torch.equal(layer.keys[1], k1[0]) and torch.equal(layer.values[1], v1[0])
        assert not layer.keys[0, :, :2].any() and not layer.values[0, :, :2].any()
    k = torch.randn(2, 2, 1, 4)
    keys, _ = out.layers[0].update(k, k)
    assert keys.shape == (2, 2, 6, 4) and torch.equal(keys[:, :, 5:], k)
    assert out.layers[0]._key_buffer.shape[-2] == 9  # appended into the reserved room, no regrowth


def test_stack_left_padded_refuses_sliding_window_layers():
    from transformers import DynamicCache, MistralConfig

    config = MistralConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=8,
                           sliding_window=4)
    cache = DynamicCache(config=config)
    assert type(cache.layers[0]).__name__ != "DynamicLayer"
    with pytest.raises(ValueError, match="full attention"):
        stack_left_padded([cache], config)
