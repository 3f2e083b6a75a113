"""A key/value cache that appends in place, for CPU decoding.

transformers' `DynamicLayer` appends with `torch.cat`, copying the layer's whole cache at every token
(docs/benchmarks.md). `GrowingLayer` keeps keys and values in a buffer with spare room along the
sequence axis (capacity doubles when full: appending is amortized O(new tokens)) and hands attention a
view of the filled part; same values as `DynamicLayer` (tested).

`LeftPaddedBatch` builds a decoding batch from prompts prefilled one by one, each forward writing
straight into its row of the batch's buffers (right-aligned, left padding): no per-prompt cache and no
second copy. A prompt that starts like one prefilled before can take that one's keys and values for
the shared start (`row(i, prefix=...)`, `states`) and run its forward on the rest only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from transformers.cache_utils import DynamicCache, DynamicLayer

if TYPE_CHECKING:
    import torch


class GrowingLayer(DynamicLayer):
    """`DynamicLayer` over an over-allocated buffer: `keys`/`values` view its first `length` positions."""

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
        """Keep the rows `indices`. Increasing indices (finished rows leaving the batch) compact the buffer
        in place, copying only the rows that move and only their filled positions; others (reordering,
        repeats) copy the buffer."""
        if self.get_seq_length() > 0:
            idx = indices.tolist()
            if all(a < b for a, b in zip(idx, idx[1:], strict=False)):
                for new, old in enumerate(idx):  # new <= old, ascending: no source is overwritten before read
                    if new != old:
                        self._key_buffer[new, :, :self._length].copy_(self._key_buffer[old, :, :self._length])
                        self._value_buffer[new, :, :self._length].copy_(
                            self._value_buffer[old, :, :self._length])
                self._key_buffer, self._value_buffer = (self._key_buffer[:len(idx)],
                                                        self._value_buffer[:len(idx)])
            else:
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
    """A `DynamicCache` for `config`, full-attention layers `GrowingLayer`s (sliding ones unchanged)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class _RowLayer(DynamicLayer):
    """A prefill-only layer: row `row` of the batch's buffers for layer `layer`, holding `prefix` (the keys
    and values of the prompt's first tokens, computed before) if given; its one update writes the rest."""

    def __init__(self, batch: LeftPaddedBatch, layer: int, row: int,
                 prefix: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.batch, self.layer, self.row = batch, layer, row
        self.offset, self.written = 0, False
        if prefix is not None:
            keys, values = prefix[0][None], prefix[1][None]
            self.lazy_initialization(keys, values)
            self.keys, self.values = batch._write(layer, row, keys, values, 0)
            self.offset = keys.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.written:
            raise RuntimeError("a LeftPaddedBatch row cache takes one prefill forward; decode with batch()")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.batch._write(self.layer, self.row, key_states, value_states,
                                                   self.offset)
        self.written = True
        return self.keys, self.values


class LeftPaddedBatch:
    """Per-prompt prefill caches that fill one left-padded batch cache in place.

    `row(i)` is the cache to pass to prompt i's forward (a single unpadded sequence of `lengths[i]`
    tokens); its keys and values land in the last `lengths[i]` of `max(lengths)` positions of row i, zeros
    before them (the attention mask hides them). `batch()`, once every row is prefilled, is the batch's
    `growing_cache` over those buffers, with room for `capacity` positions in all (appends need no regrowth).
    Full-attention models only: a sliding-window layer keeps only its window, so rows would not align.

    `reuse`, a list the caller keeps across batches, lends the previous batch's buffers to the next one
    when they are large enough (its cache must no longer be in use): fresh memory page-faults on first
    touch.
    """

    def __init__(self, config: Any, lengths: list[int], capacity: int = 0,
                 reuse: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None):
        from transformers.cache_utils import DynamicCache

        probe = DynamicCache(config=config)
        if not lengths or any(type(layer) is not DynamicLayer for layer in probe.layers):
            raise ValueError("LeftPaddedBatch needs prompts and a model whose cache layers are all "
                             "DynamicLayer (full attention)")
        self.config, self.lengths = config, list(lengths)
        self.width = max(self.lengths)
        self.capacity = max(capacity, self.width)
        self.num_layers = len(probe.layers)
        self.reuse = reuse if reuse is not None else []
        self.reuse.extend([None] * (self.num_layers - len(self.reuse)))
        self.buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.num_layers
        self.filled = [0] * len(self.lengths)

    def row(self, i: int, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> DynamicCache:
        """The cache for prompt i's prefill forward. `prefix`, per layer the keys and values [K, m, D] of the
        prompt's first m tokens (another prompt's identical start: `states`), goes into the row first, so
        the forward runs on the prompt's remaining tokens only (positions m onwards)."""
        from transformers.cache_utils import DynamicCache

        if prefix is not None and len(prefix) != self.num_layers:
            raise ValueError(f"prefix has {len(prefix)} layers, the model {self.num_layers}")
        if prefix is not None and not 0 < prefix[0][0].shape[-2] < self.lengths[i]:
            raise ValueError(f"row {i}: a prefix of {prefix[0][0].shape[-2]} positions for a prompt of "
                             f"{self.lengths[i]} tokens; it must leave the forward at least one")
        cache = DynamicCache(config=self.config)
        cache.layers = [_RowLayer(self, j, i, None if prefix is None else prefix[j])
                        for j in range(self.num_layers)]
        return cache

    def states(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, views of the keys and values [K, n, D] of prompt i's n tokens; prompt i must have been
        prefilled. Slice positions [:, :m] of each for a prefix to pass to `row`."""
        if self.filled[i] != self.num_layers:
            raise ValueError(f"row {i}: {self.filled[i]} of {self.num_layers} layers prefilled")
        start = self.width - self.lengths[i]
        return [(k[i, :, start:self.width], v[i, :, start:self.width])  # type: ignore[misc]
                for k, v in self.buffers]

    def _write(self, j: int, i: int, keys: torch.Tensor, values: torch.Tensor,
               offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys/values [1, K, L, D] at prompt positions offset..offset+L of row i in layer j; views of
        the row's positions 0..offset+L. Positions before the prompt are zeroed with the first write."""
        n = self.lengths[i]
        if keys.shape[0] != 1 or keys.shape[-2] == 0 or offset + keys.shape[-2] > n:
            raise ValueError(f"row {i} holds one sequence of {n} tokens; got keys of shape "
                             f"{tuple(keys.shape)} after {offset} cached")
        if self.buffers[j] is None:
            self.buffers[j] = self._buffers(j, keys, values)
        k_buf, v_buf = self.buffers[j]
        start = self.width - n
        end = start + offset + keys.shape[-2]
        if offset == 0:
            k_buf[i, :, :start] = 0  # left padding: masked, but never stale or uninitialized memory
            v_buf[i, :, :start] = 0
        k_buf[i, :, start + offset:end] = keys[0]
        v_buf[i, :, start + offset:end] = values[0]
        if end == self.width:
            self.filled[i] += 1
        return k_buf[i:i + 1, :, start:end], v_buf[i:i + 1, :, start:end]

    def _buffers(self, j: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer j's [rows, K, capacity, D] buffers: views of `reuse[j]` if it is large enough, else new ones
        (kept in `reuse[j]` for the next batch)."""
        rows = len(self.lengths)
        old = self.reuse[j]
        if old is not None and old[0].shape[0] >= rows and old[0].shape[2] >= self.capacity and \
                old[0].shape[1::2] == keys.shape[1::2] and old[1].shape[1::2] == values.shape[1::2] and \
                old[0].dtype == keys.dtype and old[0].device == keys.device:
            return old[0][:rows, :, :self.capacity], old[1][:rows, :, :self.capacity]
        shape = (rows, keys.shape[1], self.capacity)
        new = (keys.new_empty(*shape, keys.shape[-1]), values.new_empty(*shape, values.shape[-1]))
        self.reuse[j] = new
        return new

    def batch(self) -> DynamicCache:
        """The left-padded batch cache (every row must have been prefilled)."""
        missing = [i for i, f in enumerate(self.filled) if f != self.num_layers]
        if missing:
            raise ValueError(f"rows {missing} were not prefilled through every layer")
        out = growing_cache(self.config)
        for layer, buffers in zip(out.layers, self.buffers, strict=True):
            keys, values = buffers  # type: ignore[misc]
            layer.lazy_initialization(keys, values)
            layer._key_buffer, layer._value_buffer, layer._length = keys, values, self.width
            layer.keys, layer.values = keys[..., :self.width, :], values[..., :self.width, :]
        return out
