"""The forward passes of the action reader (`cipr.method.actions`): the laid-out rows as tensors under a
tree-shaped mask, run in one call ("packed") or as a continuation of the sequences' key/value cache
("prefix_cache"), and the output head applied only where logits are read. Also the recomputation of the
trained decoder layers in backward (`recomputing`), which the supervised regime uses around its forwards.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from cipr.core.checkpoints import zero3_partitioned
from cipr.method.action_plan import Row


def forward_mode(model: Any, mode: str, head: str) -> str:
    """The forward `ActionReaderConfig.mode` runs on `model` ("auto" resolved); ValueError when the model
    cannot run it (gradient checkpointing drops the key/value cache; the mask needs "sdpa" or "eager")."""
    checkpointing = model.training and any(getattr(m, "gradient_checkpointing", False)
                                           for m in model.modules())
    if mode == "prefix_cache" and checkpointing:
        raise ValueError("mode 'prefix_cache' needs the key/value cache, which gradient checkpointing drops "
                         "in training: use mode 'packed' (or 'auto')")
    if mode == "auto":
        mode = "packed" if checkpointing or _resolve_head(model, head) == "model" else "prefix_cache"
    impl = getattr(getattr(getattr(model, "module", model), "config", None), "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"the action reader needs attn_implementation 'sdpa' or 'eager' (a tree-shaped 4D "
                         f"mask); the model uses {impl!r}")
    return mode


def plain_head(model: Any) -> bool:
    """False for a distributed wrapper (DDP, DeepSpeed) or a sharded model: its root forward must run, so
    that gradients are synchronized and sharded weights gathered."""
    config = getattr(model, "config", None)
    return (config is not None and hasattr(model, "get_output_embeddings") and not sharded(model)
            and getattr(config, "final_logit_softcapping", None) is None
            and getattr(config, "logit_scale", None) is None and model.get_output_embeddings() is not None)


def sharded(model: Any) -> bool:
    """An FSDP2 module (`fully_shard`) or a model whose parameters DeepSpeed ZeRO-3 partitions.

    Their weights are whole only inside the root module's forward (FSDP2 unshards there; calling a
    submodule around it fails with "mixed torch.Tensor and DTensor"), so the reader goes through it."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or zero3_partitioned(model)


def recomputed_layers(model: Any) -> list[Any]:
    """The decoder layers whose activations backward needs: from the lowest one with a trained parameter up.
    Empty when the model checkpoints already (`is_gradient_checkpointing`), is sharded (its layers' weights
    are whole only inside their own forward hooks) or has no `.layers`. A DDP or PEFT wrapper is looked
    through."""
    model = getattr(model, "module", model)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    if (getattr(model, "is_gradient_checkpointing", False) or sharded(model)
            or not hasattr(model, "get_decoder")):
        return []
    layers = list(getattr(model.get_decoder(), "layers", None) or [])
    first = next((i for i, layer in enumerate(layers) if any(p.requires_grad for p in layer.parameters())),
                 len(layers))
    return layers[first:]


@contextlib.contextmanager
def recomputing(model: Any, enabled: bool = True) -> Iterator[None]:
    """Inside, when `enabled` and `model` trains with gradients, each of `recomputed_layers` keeps only its
    inputs for backward and is run again there (`torch.utils.checkpoint`, non-reentrant): the same kernels on
    the same inputs, so the gradients are the same bit for bit, for one more forward of those layers.

    A layer called with an empty `DynamicCache` (the sequences' pass of "prefix_cache") writes its keys and
    values there as usual, and its recomputation writes them into a fresh cache of its own, so the cache
    the forward returned is left as it was (gradients still reach the layer through it); a layer given a
    cache that already holds keys for it, or another kind of cache, is not recomputed."""
    layers = recomputed_layers(model) if enabled and model.training and torch.is_grad_enabled() else []
    before = [layer.__dict__.get("forward") for layer in layers]
    try:
        for layer in layers:
            layer.forward = functools.partial(_recomputed, layer.forward, getattr(layer, "self_attn", None))
        yield
    finally:
        for layer, forward in zip(layers, before, strict=True):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward


def _recomputed(forward: Any, attention: Any, *args: Any, **kwargs: Any) -> Any:
    """`forward(*args, **kwargs)` under non-reentrant checkpointing (`recomputing`)."""
    from transformers import DynamicCache

    cache = kwargs.get("past_key_values")
    if cache is not None:
        index = getattr(attention, "layer_idx", None)
        if type(cache) is not DynamicCache or index is None or cache.get_seq_length(index) > 0:
            return forward(*args, **kwargs)
    calls = []

    def run(*a: Any, **k: Any) -> Any:
        if calls and cache is not None:  # the recomputation: a cache of its own, empty as the first one was
            k = {**k, "past_key_values": DynamicCache(config=attention.config)}
        calls.append(1)
        return forward(*a, **k)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def _resolve_head(model: Any, head: str) -> str:
    if head == "gather" and sharded(model):
        raise ValueError("head 'gather' calls the decoder and the output head around the root module, which "
                         "a sharded model (FSDP2, ZeRO-3) does not support; use head 'auto' or 'model'")
    return ("gather" if plain_head(model) else "model") if head == "auto" else head


def forward_packed(model: Any, rows: list[Row], padding_side: str, head: str, pad_id: int, dtype: torch.dtype,
                   device: torch.device, at_rows: list[int], at_cols: list[int], recompute: bool = False
                   ) -> torch.Tensor:
    """Logits [U, V] at (row, row-frame column) pairs: sequences and tries in one forward (`recompute`: its
    trained layers under `recomputing`)."""
    ids, pos, mask, offsets = _collate(rows, padding_side, pad_id, dtype, device)
    r = torch.tensor(at_rows, dtype=torch.long, device=device)
    c = torch.tensor([offsets[b] + col for b, col in zip(at_rows, at_cols, strict=True)], dtype=torch.long,
                     device=device)
    with recomputing(model, recompute):
        return _logits(model, ids, pos, mask, r, c, _resolve_head(model, head))


def _collate(rows: list[Row], padding_side: str, pad_id: int, dtype: torch.dtype, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """input_ids [B, L], position_ids [B, L], additive 4D mask [B, 1, L, L], and each row's column offset."""
    width = max(len(r.ids) for r in rows)
    batch = len(rows)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    pos = torch.zeros((batch, width), dtype=torch.long)
    allowed = torch.zeros((batch, width, width), dtype=torch.bool)
    offsets: list[int] = []
    for b, r in enumerate(rows):
        n, m = len(r.ids), r.main
        o = width - n if padding_side == "left" else 0
        offsets.append(o)
        ids[b, o:o + n] = torch.tensor(r.ids)
        pos[b, o:o + n] = torch.tensor(r.positions)
        allowed[b, o:o + m, o:o + m] = torch.ones(m, m, dtype=torch.bool).tril()
        packed = n - m
        if packed:
            sees = torch.tensor(r.attend_main)
            allowed[b, o + m:o + n, o:o + m] = torch.arange(m)[None, :] <= sees[:, None]
            allowed[b, o + m:o + n, o + m:o + n] = _ancestors(r.packed_parent)
    diag = torch.arange(width)
    allowed[:, diag, diag] = True  # padding rows attend to themselves: no row is fully masked
    mask = torch.zeros((batch, 1, width, width), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return ids.to(device), pos.to(device), mask.to(device), offsets


def _ancestors(packed_parent: list[int]) -> torch.Tensor:
    """[P, P] bool: node j sees node i iff i is j or an ancestor of j (parents come before children)."""
    anc = torch.eye(len(packed_parent), dtype=torch.bool)
    for j, parent in enumerate(packed_parent):
        if parent >= 0:
            anc[j] |= anc[parent]
    return anc


def forward_prefix_cache(model: Any, rows: list[Row], padding_side: str, head: str, pad_id: int,
                         dtype: torch.dtype, device: torch.device, at_rows: list[int], at_cols: list[int],
                         recompute: bool = False) -> torch.Tensor:
    """Same as `forward_packed`, in two calls that each process every token once.

    The sequences go first under plain causal attention (no mask with right padding, so the plain forward's
    kernel; left padding needs one), keeping their key/value cache; the trie nodes follow as a continuation
    reading it, under a tree-shaped mask [B, 1, P, M + P] over the cached sequence and the nodes. Gradients
    flow through the cache. `recompute`: the sequences' call (the long one) under `recomputing`.
    """
    if _resolve_head(model, head) != "gather":
        raise ValueError("mode 'prefix_cache' needs a plain output head (head 'auto' or 'gather'); "
                         "use mode 'packed'")
    batch = len(rows)
    width_m = max(r.main for r in rows)
    width_p = max(len(r.ids) - r.main for r in rows)
    ids_m = torch.full((batch, width_m), pad_id, dtype=torch.long)
    pos_m = torch.zeros((batch, width_m), dtype=torch.long)
    att_m = torch.zeros((batch, width_m), dtype=torch.long)
    ids_p = torch.full((batch, width_p), pad_id, dtype=torch.long)
    pos_p = torch.zeros((batch, width_p), dtype=torch.long)
    allowed = torch.zeros((batch, width_p, width_m + width_p), dtype=torch.bool)
    offsets = []
    for b, r in enumerate(rows):
        m, packed = r.main, len(r.ids) - r.main
        o = width_m - m if padding_side == "left" else 0
        offsets.append(o)
        ids_m[b, o:o + m] = torch.tensor(r.ids[:m])
        pos_m[b, o:o + m] = torch.arange(m)
        att_m[b, o:o + m] = 1
        if packed:
            ids_p[b, :packed] = torch.tensor(r.ids[m:])
            pos_p[b, :packed] = torch.tensor(r.positions[m:])
            allowed[b, :packed, o:o + m] = torch.arange(m)[None, :] <= torch.tensor(r.attend_main)[:, None]
            allowed[b, :packed, width_m:width_m + packed] = _ancestors(r.packed_parent)
    diag = torch.arange(width_p)
    allowed[:, diag, width_m + diag] = True
    decoder = model.get_decoder()
    first_mask = None  # right padding: real tokens never see the pads after them, so plain causal attention
    if padding_side == "left" and not bool(att_m.all()):
        seen = att_m.bool()[:, None, :] & torch.ones(width_m, width_m, dtype=torch.bool).tril()[None]
        seen[:, torch.arange(width_m), torch.arange(width_m)] = True  # no fully masked row (nan in eager)
        first_mask = torch.zeros((batch, 1, width_m, width_m), dtype=dtype)
        first_mask.masked_fill_(~seen[:, None], torch.finfo(dtype).min)
        first_mask = first_mask.to(device)
    with recomputing(model, recompute):
        out = decoder(input_ids=ids_m.to(device), attention_mask=first_mask, position_ids=pos_m.to(device),
                      use_cache=width_p > 0)
    hidden = out.last_hidden_state
    if width_p:
        mask = torch.zeros((batch, 1, width_p, width_m + width_p), dtype=dtype)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        tree = decoder(input_ids=ids_p.to(device), attention_mask=mask.to(device),
                       position_ids=pos_p.to(device), past_key_values=out.past_key_values, use_cache=True)
        hidden = torch.cat([hidden, tree.last_hidden_state], dim=1)
    cols = [offsets[b] + col if col < rows[b].main else width_m + col - rows[b].main
            for b, col in zip(at_rows, at_cols, strict=True)]
    r_t = torch.tensor(at_rows, dtype=torch.long, device=device)
    c_t = torch.tensor(cols, dtype=torch.long, device=device)
    return model.get_output_embeddings()(hidden[r_t, c_t])


def _logits(model: Any, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
            cols: torch.Tensor, head: str) -> torch.Tensor:
    """Logits [U, V] at (rows[i], cols[i]) for every i: one forward of the model."""
    kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": False}
    if head == "gather":
        hidden = model.get_decoder()(**kwargs).last_hidden_state
        return model.get_output_embeddings()(hidden[rows, cols])
    keep = torch.unique(cols)
    return model(**kwargs, logits_to_keep=keep).logits[rows, torch.searchsorted(keep, cols)]
