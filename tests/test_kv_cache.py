"""The in-place appending key/value cache holds what transformers' DynamicLayer holds, step by step."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from cipr.kv_cache import GrowingLayer, growing_cache


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
