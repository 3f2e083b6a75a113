"""One decoding step of a llama-family model that calls its layers directly, for CPU generation.

A step through `model.forward` pays, on top of the layers' own work, a fixed cost in transformers'
per-call plumbing: building the attention mask from the 2-D one, output classes, keyword routing and
decorators at every level. On CPU at batch size 1, where the step's matrix products already stream the
weights near the memory bandwidth, that cost is a measurable part of the step: `scripts/bench_eval.py
--compare-direct` (SmolLM2-135M, 2 cores, a fresh clone, 64 steps alternating) printed per-step time
ratios of 0.941 [quartiles 0.870-1.003] at 1 row and 0.970 [0.907-1.030] at 8 rows, direct over
`model.forward`; `--no-direct-decode` runs the whole benchmark through `model.forward`.

`decode_step` runs the same modules in the same order with the same operations as the families'
`forward`: the embedding, the model's rotary embedding, and per layer the input norm, the q/k/v
projections, the family's own `apply_rotary_pos_emb`, the cache update, the attention function the
model is set to, o_proj and the residual, the post-attention norm, the MLP and the residual; then the
final norm and the output head at the last position. Same logits as `model.forward` (tested bit for bit
on tiny llama, mistral and qwen2 models, with and without left padding). Linear layers are called as
modules, so their forward hooks and swapped forwards (`cipr.packed_gemm`'s packed weights) still apply.

`supports` gates it: a `LlamaForCausalLM`, `MistralForCausalLM` or `Qwen2ForCausalLM` (exact classes)
whose decoder layers are that family's, with no sliding-window layer, attention set to `cipr_grouped`
(whose mask is eager's additive float mask, built here the same way) and no accelerate hooks; any other
model decodes through `model.forward`.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

FAMILIES = {"LlamaForCausalLM": "LlamaDecoderLayer", "MistralForCausalLM": "MistralDecoderLayer",
            "Qwen2ForCausalLM": "Qwen2DecoderLayer"}
"""Model class -> its decoder layer class: the structures `decode_step` reproduces."""


def supports(model: Any) -> bool:
    """Whether `decode_step` computes this model's decoding step (see the module docstring)."""
    from cipr.attention import GROUPED

    layer_class = FAMILIES.get(type(model).__name__)
    inner = getattr(model, "model", None)
    if layer_class is None or inner is None or getattr(model.config, "_attn_implementation", None) != GROUPED:
        return False
    if getattr(model.config, "sliding_window", None) is not None and type(model).__name__ == "MistralForCausalLM":
        return False
    layers = list(getattr(inner, "layers", []))
    if not layers or any(type(layer).__name__ != layer_class or
                         getattr(layer.self_attn, "sliding_window", None) is not None for layer in layers):
        return False
    return not any(hasattr(m, "_hf_hook") for m in (model, inner, *layers))


def decode_step(model: Any, tokens: torch.Tensor, positions: torch.Tensor, cache: Any,
                mask: torch.Tensor | None) -> torch.Tensor:
    """Logits [B, V] of the next token after one decoding step of `model` (one `supports` accepts).

    tokens [B] (the last token of each row), positions [B] (its position), `cache` the batch's key/value
    cache holding the T - 1 positions before (appended to here), mask [B, T] (1 for a real token, 0 for
    left padding, the new token included) or None. A mask whose first column is all 1 (no row padded:
    padding is on the left) is not applied, as attention without a mask computes the same.
    """
    from cipr.attention import grouped_attention

    inner = model.model
    rope = sys.modules[type(inner.layers[0].self_attn).__module__].apply_rotary_pos_emb
    x = inner.embed_tokens(tokens[:, None])
    cos, sin = inner.rotary_emb(x, positions[:, None])
    additive = None
    if mask is not None and not bool(mask[:, 0].all()):
        additive = torch.zeros(mask.shape[0], 1, 1, mask.shape[1], dtype=x.dtype, device=x.device)
        additive.masked_fill_(mask[:, None, None, :] == 0, torch.finfo(x.dtype).min)
    b = x.shape[0]
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).view(b, 1, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, 1, -1, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(b, 1, -1, attn.head_dim).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        k, v = cache.update(k, v, i)
        out, _ = grouped_attention(attn, q, k, v, additive, attn.scaling)
        x = x + attn.o_proj(out.reshape(b, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(inner.norm(x))[:, -1]
