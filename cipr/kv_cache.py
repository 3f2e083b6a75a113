"""A key/value cache that appends in place, for CPU decoding.

transformers' `DynamicLayer` appends each step's keys and values with `torch.cat`, which copies the
whole cache of the layer at every token: at batch 8 and ~700 cached tokens on SmolLM2-135M that is
~0.26 GB read and written per decoding step, as much memory traffic as half the weights. `GrowingLayer`
keeps each layer's keys and values in a buffer with spare room along the sequence axis (its capacity
doubles when full, so appending is amortized O(new tokens)) and hands attention a view of the filled
part. Same values as `DynamicLayer` (tested); `batch_select_indices` (dropping finished rows) copies the
buffer once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers.cache_utils import DynamicCache, DynamicLayer

if TYPE_CHECKING:
    import torch


class GrowingLayer(DynamicLayer):
    """`DynamicLayer` with an over-allocated buffer: `keys`/`values` are views of its first `length` positions."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0

    def _grow(self, needed: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        capacity = max(2 * needed, 64)
        new_k = keys.new_empty(*keys.shape[:-2], capacity, keys.shape[-1])
        new_v = values.new_empty(*values.shape[:-2], capacity, values.shape[-1])
        if self._length:
            new_k[..., :self._length, :] = self.keys
            new_v[..., :self._length, :] = self.values
        self._key_buffer, self._value_buffer = new_k, new_v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(end, key_states, value_states)
        self._key_buffer[..., self._length:end, :] = key_states
        self._value_buffer[..., self._length:end, :] = value_states
        self._length = end
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._key_buffer = self._key_buffer[indices, ...]
            self._value_buffer = self._value_buffer[indices, ...]
            self.keys = self._key_buffer[..., :self._length, :]
            self.values = self._value_buffer[..., :self._length, :]

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._length = self.get_seq_length()

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._key_buffer, self._value_buffer = self.keys, self.values  # full: the next update grows them


def growing_cache(config: Any) -> DynamicCache:
    """A `DynamicCache` for `config` whose full-attention layers are `GrowingLayer`s (sliding ones unchanged)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def stack_left_padded(caches: list[DynamicCache], config: Any, capacity: int = 0) -> DynamicCache:
    """One batch cache from single-row caches of different lengths, each row right-aligned (left padding).

    Row i holds cache i's keys and values in its last `len_i` positions of `max(len)` and zeros before
    them, the layout a left-padded batch prefill leaves (there the padded positions hold the pad
    tokens' states; here zeros: either way the attention mask hides them). `capacity` reserves room
    along the sequence axis for the tokens still to come, so decoding appends without regrowing.
    Every layer of every cache must be a full-attention `DynamicLayer` or `GrowingLayer` (a prefill-only
    cache is best a plain `DynamicCache`: it holds the prompt's states without spare room).
    """
    full = (DynamicLayer, GrowingLayer)
    if not caches or any(type(layer) not in full for c in caches for layer in c.layers):
        raise ValueError("stack_left_padded needs caches whose layers are all DynamicLayer or GrowingLayer "
                         "(full attention)")
    width = max(c.get_seq_length() for c in caches)
    out = growing_cache(config)
    if len(out.layers) != len(caches[0].layers):
        raise ValueError(f"config has {len(out.layers)} cache layers, the caches {len(caches[0].layers)}")
    for j, layer in enumerate(out.layers):
        first = caches[0].layers[j]
        shape = (len(caches), first.keys.shape[1], max(capacity, width), first.keys.shape[-1])
        keys, values = first.keys.new_zeros(shape), first.values.new_zeros(shape[:-1] + first.values.shape[-1:])
        for i, c in enumerate(caches):
            n = c.layers[j].get_seq_length()
            keys[i, :, width - n:width] = c.layers[j].keys[0]
            values[i, :, width - n:width] = c.layers[j].values[0]
        layer.lazy_initialization(first.keys, first.values)
        layer._key_buffer, layer._value_buffer, layer._length = keys, values, width
        layer.keys, layer.values = keys[..., :width, :], values[..., :width, :]
    return out
