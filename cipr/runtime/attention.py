"""`sdpa_gqa`: transformers' SDPA attention, with grouped-query heads handed to torch's SDPA under a mask on CPU.

transformers' `sdpa_attention_forward` passes `enable_gqa=True` to `scaled_dot_product_attention` only
when there is no attention mask; with one (a left-padded decoding batch, the action reader's tree-shaped
mask) it first copies every key/value head once per query head (`repeat_kv`), because on CUDA a mask
sends `enable_gqa` to the slow math kernel. torch's CPU kernel takes `enable_gqa` with a mask and gives the
same values (tested bit-for-bit against `sdpa`), without the copy, which at batch 8 is most of a decoding
step of SmolLM2-135M (9 query heads over 3 key/value heads). Everywhere else (no mask, not CPU, one
key/value head per query head, a position bias) this is transformers' own function, unchanged.

It is registered under its own name through transformers' attention and mask interfaces (the supported
extension points), so `attn_implementation="sdpa_gqa"` selects it and "sdpa" stays transformers' own.
The A/B of the whole evaluation with and without it: `scripts/ab_decode_stack.py`, docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

NAME = "sdpa_gqa"


def sdpa_gqa_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                               dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                               **kwargs: Any) -> tuple[Any, None]:
    """Attention output [B, Lq, H, D] for query [B, H, Lq, D], key/value [B, K, Lk, D] (H a multiple of K)
    and a mask broadcastable to [B, 1, Lq, Lk] or None; the signature of transformers' attention functions."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (attention_mask is None or not grouped or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register `sdpa_gqa` with transformers (idempotent); returns its name for `attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
