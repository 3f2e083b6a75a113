"""Sampling with a shared prefill (cipr/runtime/generation.py) gives the tokens TRL's path gives (greedy),
for unequal prompts and runs."""

from __future__ import annotations

import contextlib

import pytest
import torch
from support.tiny_models import attention_as as attention
from transformers import GenerationConfig

from cipr.runtime.generation import consecutive_runs, sample_shared_prefill


def test_runs_of_identical_prompts():
    assert consecutive_runs([[1, 2], [1, 2], [3], [3], [3], [1, 2]]) == [([1, 2], 2), ([3], 3), ([1, 2], 1)]


@pytest.mark.parametrize("attn", [None, "eager"])
def test_shared_prefill_matches_full_prefill(tiny_model, tiny_tokenizer, attn):
    """The model's own attention (SDPA) or eager: the greedy tokens of a full `generate`."""
    tok = tiny_tokenizer
    texts = ["<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
             "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]
    prompts = [tok(t)["input_ids"] for t in texts]
    rows = [prompts[0]] * 3 + [prompts[1]] * 2
    config = GenerationConfig(do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
    with attention(tiny_model, attn) if attn else contextlib.nullcontext():
        shared = sample_shared_prefill(tiny_model, consecutive_runs(rows), tok.pad_token_id,
                                       [tok.eos_token_id], config, torch.device("cpu"))
    longest = max(len(r) for r in rows)
    ids = torch.tensor([[tok.pad_token_id] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        full = tiny_model.generate(input_ids=ids, attention_mask=mask,
                                   generation_config=config)[:, longest:].tolist()
    expected = [r[:r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in full]
    assert shared == expected
    assert shared[0] == shared[1] == shared[2] and len(shared) == 5
