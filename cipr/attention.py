"""Grouped-query attention that reads each key/value head once, for CPU decoding.

transformers' eager and (masked) SDPA attention first copy every key/value head once per query head
of its group (`repeat_kv`): SmolLM2-135M has 9 query heads on 3 key/value heads, so each decoding step
copied the whole key/value cache three times, per layer. At batch 8 and ~700 cached tokens that is
~0.66 GB of copying per token, more than the 0.54 GB of weights the step reads (measured with
torch.profiler: `bmm`/`copy_` beside `mm`). Here the query heads of a group are stacked along the
query axis instead, so one matmul per group reads its key/value head in place:

    q [B, H, L, D] -> [B, K, G*L, D];  scores = q @ k^T  [B, K, G*L, T];  softmax;  @ v -> [B, H, L, D]

with H = K*G (query head h uses key/value head h // G, as `repeat_kv` orders them). The arithmetic
is eager attention's (same scaling, additive float mask, float32 softmax), so outputs agree with
`eager` to float rounding (tested). A decoding step (one query position) goes through torch's fused
`scaled_dot_product_attention` on the same group-stacked query instead (`grouped_decode`), which reads
the cache once without writing scores or weights; same values to float rounding. Where CIPR's compiled
CPU kernels load (`cipr.cpu_kernels`, float32 CPU tensors, head dim 64 or 128, at most 8 query heads
per key/value head, no autograd), a decoding step uses their `decode_attention` instead, which streams
the cache faster than SDPA's kernel (`scripts/bench_eval.py` times the three on the model's shapes).

Registered under `GROUPED` with eager's mask builder; the evaluation's `attn_implementation=auto` picks
it on CPU for the families in `MODEL_TYPES` (eager for others), and CPU training rollouts decode with it
(`attention(model, GROUPED)` around generation; the update keeps the model's own attention).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

GROUPED = "cipr_grouped"
MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})
"""Model families whose eager attention is the plain one reproduced here (no soft-capping, sinks or
sliding windows); `supports` gates the automatic choice on them."""


def supports(model: Any) -> bool:
    """Whether `GROUPED` computes this model's attention (its family is in `MODEL_TYPES`)."""
    return getattr(getattr(model, "config", None), "model_type", None) in MODEL_TYPES


def grouped_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention-function signature over `grouped_scores` (prompts, training) and, for a
    single query position without dropout, `grouped_decode` (decoding steps; it returns no weights)."""
    unsupported = [name for name in ("softcap", "s_aux", "sliding_window") if kwargs.get(name) is not None]
    if unsupported:
        raise ValueError(f"{GROUPED} attention has no {', '.join(unsupported)}: load this model with "
                                  "attn_implementation=eager or sdpa")
    if query.shape[2] == 1 and (dropout == 0.0 or not module.training):
        return grouped_decode(query, key, value, attention_mask, scaling), None
    return grouped_scores(query, key, value, attention_mask, scaling, dropout if module.training else 0.0)


def grouped_scores(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                   scaling: float, dropout: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention output [B, L, H, D], weights [B, H, L, T]) from query [B, H, L, D], key/value [B, K, T, D]
    and an additive float mask [B, 1 or H, L, >= T]: eager attention's arithmetic, group-stacked."""
    import torch

    b, h, lq, d = query.shape
    k = key.shape[1]
    g = h // k
    t = key.shape[2]
    scores = torch.matmul(query.reshape(b, k, g * lq, d), key.transpose(2, 3)) * scaling
    scores = scores.view(b, k, g, lq, t)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :t]
        mask = mask[:, :, None] if mask.shape[1] == 1 else mask.unflatten(1, (k, g))
        scores = scores + mask
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=dropout > 0)
    out = torch.matmul(weights.view(b, k, g * lq, t), value)
    return out.view(b, h, lq, value.shape[-1]).transpose(1, 2).contiguous(), weights.view(b, h, lq, t)


def grouped_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                   scaling: float, kernel: bool = True) -> torch.Tensor:
    """`grouped_scores`'s output [B, 1, H, D] for one query position (query [B, H, 1, D]), through
    `scaled_dot_product_attention` on the group-stacked query: its fused CPU kernel reads each key/value
    head once and materializes neither scores, weights nor a broadcast mask; or, with `kernel` where it
    applies (module docstring), `cipr.cpu_kernels.decode_attention`. Same values to float rounding
    (online softmax; tested)."""
    import torch

    b, h, _, d = query.shape
    k, t = key.shape[1], key.shape[2]
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :t]
        if kernel and kernel_applies(query, key, value, mask):
            from cipr import cpu_kernels

            flat = mask.expand(b, 1, 1, t)[:, 0, 0] if mask.shape[1] == mask.shape[2] == 1 else None
            if flat is not None and flat.stride(-1) == 1 and flat.dtype == torch.float32:
                return cpu_kernels.decode_attention(query[:, :, 0], key, value, flat, scaling).view(b, 1, h, d)
        mask = mask if mask.shape[1] == 1 else mask.reshape(b, k, h // k, t)
    elif kernel and kernel_applies(query, key, value, None):
        from cipr import cpu_kernels

        return cpu_kernels.decode_attention(query[:, :, 0], key, value, None, scaling).view(b, 1, h, d)
    out = torch.nn.functional.scaled_dot_product_attention(query.reshape(b, k, h // k, d), key, value,
                                                           attn_mask=mask, scale=scaling)
    return out.reshape(b, 1, h, value.shape[-1])


def kernel_applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether `cipr.cpu_kernels.decode_attention` takes these tensors (see the module docstring)."""
    import torch

    tensors = (query, key, value) if mask is None else (query, key, value, mask)
    if any(x.device.type != "cpu" or x.dtype != torch.float32 for x in tensors):
        return False
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return False
    h, k, d = query.shape[1], key.shape[1], query.shape[3]
    if d not in (64, 128) or h % k or h // k > 8 or key.stride(-1) != 1 or value.stride(-1) != 1:
        return False
    from cipr import cpu_kernels

    return cpu_kernels.load()


def use_grouped(model: Any, required: bool = False) -> bool:
    """Switch a loaded model to `GROUPED` if its family is supported; whether it did.

    `required` (the user asked for it by name): an unsupported family is a ConfigError instead.
    """
    if not supports(model):
        if required:
            from cipr.errors import ConfigError

            raise ConfigError(f"attn_implementation={GROUPED} computes the plain attention of {sorted(MODEL_TYPES)} "
                              f"models; this one is {getattr(model.config, 'model_type', None)!r}")
        return False
    register()
    model.set_attn_implementation(GROUPED)
    return True


def register() -> str:
    """Register `GROUPED` with transformers (attention function and eager's float mask); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(GROUPED, grouped_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED, eager_mask)
    return GROUPED


@contextlib.contextmanager
def attention(model: Any, name: str, replace: tuple[str, ...] = ("eager", "sdpa")) -> Iterator[None]:
    """Run the block with the model's attention set to `name` (registering `GROUPED` if asked), then restore it.

    Only a model whose attention is one of `replace` is switched (to `GROUPED` only if `supports` it);
    any other (flash attention, a custom one, a model without `set_attn_implementation`) runs unchanged.
    """
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if before not in replace or before == name or not hasattr(model, "set_attn_implementation") or (
            name == GROUPED and not supports(model)):
        yield
        return
    if name == GROUPED:
        register()
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
