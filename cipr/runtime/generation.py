"""Generation with a transformers model: the stop tokens, batched greedy decoding, and sampling.

Every in-process caller generates here (the evaluation's HF backend, the guard, the service, the
training probes, distillation's live episodes, GRPO's HF rollouts), so a completion ends at the same
token wherever it is produced: the first end-of-turn token (`end_token_ids`: the model's and the
tokenizer's eos plus `END_OF_TURN_TOKENS` present in the vocabulary).

- `Greedy`: greedy decoding of a batch of prompts with the in-place key/value cache of
  `cipr.runtime.kv_cache` (options in `GreedyConfig`), in a loop hand-written around the model's
  forward: it beats transformers' best `generate` setting at batch 8 (`scripts/ab_decode_stack.py`,
  docs/benchmarks.md). `drop_finished=false` uses `model.generate`.
- `sample_shared_prefill`: sampling (GRPO's rollouts) through transformers' `generate` with its own
  cache; each distinct prompt is prefilled once for its G samples.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


def end_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """The token ids that end a turn: eos of the model's generation config and of the tokenizer, and every
    `END_OF_TURN_TOKENS` entry the vocabulary holds."""
    ids: set[int] = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                   tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(x) for x in source)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


def cut_at_end(row: Sequence[int], end_ids: set[int], *, keep_end: bool = False) -> list[int]:
    """`row` up to its first end token (included when `keep_end`), or whole when it has none."""
    cut = next((i for i, t in enumerate(row) if t in end_ids), None)
    return list(row) if cut is None else list(row[:cut + (1 if keep_end else 0)])


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _full_attention(model: Any) -> bool:
    """Whether every layer of the model's cache is a plain full-attention `DynamicLayer` (what
    `cipr.runtime.kv_cache.LeftPaddedBatch` can fill; sliding-window layers are not)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    config = getattr(model, "config", None)
    return config is not None and all(type(x) is DynamicLayer for x in DynamicCache(config=config).layers)


@dataclass
class GreedyConfig:
    """Greedy decoding: `batch_size` prompts per batch, longest first (less padding).

    `drop_finished`: decode with `Greedy`'s own loop, which removes a sequence from the batch (and its
    rows from the KV cache) as soon as it ends its turn, so the batch does not keep paying for finished
    rows while the longest one runs on; False uses `model.generate`. Both give the same tokens (tested).

    `prefill` (own loop only): `per_item` runs each prompt's prefill alone, unpadded, writing its keys
    and values into its row of the left-padded batch cache (`cipr.runtime.kv_cache.LeftPaddedBatch`,
    whose buffers are kept for the next batch); `batched` runs one padded forward over the batch; `auto`
    is `per_item` on CPU for full-attention models and `batched` elsewhere: on CPU a prefill is
    compute-bound, so batching gains nothing while padding and the masked attention cost extra
    (docs/benchmarks.md). Not done: chunked prefill interleaved with decoding (a prototype gained
    nothing within a batch).

    `prefix_reuse` (per-item prefill only): a prompt that starts with the same tokens as the one
    prefilled before it in the same call (a shared system prompt, or a whole tool list) copies that
    prompt's keys and values for the common start and computes only the rest (at least its last
    token). The states are kept for one call only (the model may change between calls). Causal
    attention makes the copied states the ones a full forward computes, up to float rounding (tested);
    `timing["prefix_reused_tokens"]` counts them.
    """

    batch_size: int = 8
    max_new_tokens: int = 512
    sort_by_length: bool = True
    drop_finished: bool = True
    prefill: Literal["auto", "batched", "per_item"] = "auto"
    prefix_reuse: bool = True


class Greedy:
    """Greedy decoding of token-id prompts with one model (`GreedyConfig`). `run(prompts, limits)` returns
    each prompt's new tokens up to and including its first end token (or `limits[i]`, default
    `config.max_new_tokens`), in prompt order; a caller's batches share prompt states until `forget()`.
    `timing` sums wall seconds and tokens of prefill and decode forwards."""

    def __init__(self, model: Any, tokenizer: Any, config: GreedyConfig | None = None):
        self.model, self.config = model, config or GreedyConfig()
        self.end_ids = end_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        forward = getattr(model, "forward", None)
        self._logits_to_keep = (forward is not None
                                and "logits_to_keep" in inspect.signature(forward).parameters)
        self._full_attention = _full_attention(model)
        self.timing = {"prefill_seconds": 0.0, "prefill_tokens": 0, "decode_seconds": 0.0, "decode_tokens": 0,
                       "decode_steps": 0, "prefix_reused_tokens": 0}
        self._kv_buffers: list[Any] = []  # per-item prefill's key/value buffers, lent to the next batch
        self._previous: tuple[list[int], list[Any]] | None = None  # last prompt prefilled in this call

    def run(self, prompts: Sequence[Sequence[int]], limits: Sequence[int] | None = None,
            stops: Sequence[Callable[[], bool] | None] | None = None) -> list[list[int]]:
        """New tokens for each prompt (see the class docstring); one batch, whatever its size. `stops[i]`,
        when given, is asked before each decoding step: True ends row i there (a client that went away)."""
        limits = [self.config.max_new_tokens] * len(prompts) if limits is None else list(limits)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            if self.config.drop_finished and self.per_item_prefill(device):
                rows = self._greedy(*self._prefill_per_item(prompts, max(limits), device), limits, stops)
            else:
                ids, mask = self._left_pad(prompts, device)
                rows = self._greedy(*self._prefill_batched(ids, mask), limits, stops) \
                    if self.config.drop_finished else self._generate(ids, mask, max(limits))
        return [cut_at_end(row[:n], self.end_ids, keep_end=True) for row, n in zip(rows, limits, strict=True)]

    def forget(self) -> None:
        """Drop the kept prompt states: `prefix_reuse` works between the batches of one caller's call (the
        model may change between calls, e.g. during training)."""
        self._previous = None

    def per_item_prefill(self, device: Any) -> bool:
        """Whether a batch is prefilled prompt by prompt (`GreedyConfig.prefill`)."""
        if self.config.prefill != "auto":
            return self.config.prefill == "per_item"
        return device.type == "cpu" and self._full_attention

    def _left_pad(self, prompts: Sequence[Sequence[int]], device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        return ids, mask

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> list[list[int]]:
        from transformers import GenerationConfig

        gen_config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                      pad_token_id=self.pad_id, eos_token_id=sorted(self.end_ids))
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config)
        return out[:, ids.shape[1]:].tolist()

    def _last_only(self) -> dict[str, int]:
        return {"logits_to_keep": 1} if self._logits_to_keep else {}

    def _prefill_batched(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[Any, Any, Any, Any]:
        """(cache, attention mask, next positions, first tokens) of one left-padded forward over the batch;
        positions follow the attention mask, as `generate` computes them, and only the last position's logits
        are computed."""
        from cipr.runtime.kv_cache import growing_cache

        cache = growing_cache(self.model.config)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        start = time.perf_counter()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, **self._last_only())
        tok = out.logits[:, -1].argmax(-1)
        tok.tolist()  # waits for the device: the time below is of the work
        self.timing["prefill_seconds"] += time.perf_counter() - start
        self.timing["prefill_tokens"] += int(mask.sum())
        return cache, mask, pos[:, -1] + 1, tok

    def _prefill_per_item(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                          device: Any) -> tuple[Any, Any, Any, Any]:
        """`_prefill_batched`'s result, from one unpadded forward per prompt (`GreedyConfig.prefill`)."""
        from cipr.runtime.kv_cache import LeftPaddedBatch

        start = time.perf_counter()
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        batch = LeftPaddedBatch(self.model.config, lengths, capacity=width + max_new_tokens,
                                reuse=self._kv_buffers)
        toks, reused = [], 0
        try:
            for i, tokens in enumerate(prompts):  # each prompt's states go straight into its row of the cache
                tokens = list(tokens)
                m, prefix = 0, None
                if self.config.prefix_reuse and self._previous is not None:
                    m = min(common_prefix(tokens, self._previous[0]), len(tokens) - 1)
                    prefix = [(k[:, :m], v[:, :m]) for k, v in self._previous[1]] if m else None
                x = torch.tensor([tokens[m:]], device=device)
                out = self.model(input_ids=x, past_key_values=batch.row(i, prefix), use_cache=True,
                                 **self._last_only())
                toks.append(out.logits[0, -1].argmax(-1))
                reused += m
                if self.config.prefix_reuse:
                    self._previous = (tokens, batch.states(i))
        except BaseException:
            self._previous = None  # it may point into this batch's buffers, which a retry reuses
            raise
        # the batch's buffers are decoded into next: keep a copy of the last prompt
        if self._previous is not None:
            self._previous = (self._previous[0], [(k.clone(), v.clone()) for k, v in self._previous[1]])
        lengths_t = torch.tensor(lengths, device=device)
        mask = (torch.arange(width, device=device)[None, :] >= (width - lengths_t)[:, None]).long()
        tok = torch.stack(toks)
        tok.tolist()
        self.timing["prefill_seconds"] += time.perf_counter() - start
        self.timing["prefill_tokens"] += sum(lengths) - reused
        self.timing["prefix_reused_tokens"] += reused
        return batch.batch(), mask, lengths_t, tok

    def _greedy(self, cache: Any, mask: Any, next_pos: Any, tok: Any, limits: Sequence[int],
                stops: Sequence[Callable[[], bool] | None] | None = None) -> list[list[int]]:
        """Greedy decoding from a prefilled batch; a row leaves the batch (and the in-place cache) once it
        emits an end token or reaches its limit."""
        rows: list[list[int]] = [[] for _ in range(mask.shape[0])]
        active = torch.arange(mask.shape[0], device=mask.device)
        end = torch.tensor(sorted(self.end_ids), device=mask.device)
        limit = torch.tensor(list(limits), device=mask.device)
        toks = tok.tolist()
        for step in range(max(limits)):
            for r, t in zip(active.tolist(), toks, strict=True):
                rows[r].append(t)
            keep = ~torch.isin(tok, end) & (limit[active] > step + 1)
            if stops is not None:
                asked = [not (stops[r] and stops[r]()) for r in active.tolist()]
                keep &= torch.tensor(asked, device=keep.device)
            if not bool(keep.any()):
                break
            if not bool(keep.all()):
                idx = keep.nonzero().squeeze(-1)
                cache.batch_select_indices(idx)
                active, tok, mask, next_pos = active[idx], tok[idx], mask[idx], next_pos[idx]
            start = time.perf_counter()
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
            tok = logits.argmax(-1)
            toks = tok.tolist()  # waits for the device
            self.timing["decode_seconds"] += time.perf_counter() - start
            self.timing["decode_tokens"] += len(toks)
            self.timing["decode_steps"] += 1
        return rows


def greedy_texts(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int,
                 batch_size: int = 8) -> list[tuple[list[int], str]]:
    """(new token ids up to and including the end token, text before it) per prompt, greedy, special tokens
    kept. For callers that decode a few prompts with a model they are training (probes, live episodes): its
    train/eval mode is restored."""
    was_training = model.training
    model.eval()
    greedy = Greedy(model, tokenizer, GreedyConfig(batch_size=batch_size, max_new_tokens=max_new_tokens))
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    out: list[tuple[list[int], str]] = []
    try:
        greedy.forget()
        for s in range(0, len(ids), batch_size):
            for row in greedy.run(ids[s:s + batch_size]):
                text = tokenizer.decode(cut_at_end(row, greedy.end_ids), skip_special_tokens=False)
                out.append((row, text))
    finally:
        model.train(was_training)
    return out


def consecutive_runs(prompt_ids: Sequence[Sequence[int]]) -> list[tuple[list[int], int]]:
    """Runs of identical consecutive prompts as (prompt ids, count): TRL repeats each prompt G times."""
    runs: list[tuple[list[int], int]] = []
    for ids in prompt_ids:
        ids = list(ids)
        if runs and runs[-1][0] == ids:
            runs[-1] = (ids, runs[-1][1] + 1)
        else:
            runs.append((ids, 1))
    return runs


def sample_shared_prefill(model: Any, runs: Sequence[tuple[list[int], int]], pad_id: int,
                          eos_ids: Sequence[int], generation_config: Any, device: Any) -> list[list[int]]:
    """Sample completions for runs of identical prompts, computing each distinct prompt's prefill once.

    The distinct prompts (left-padded) run through the model up to their last token; the cache is copied once
    per sample (`batch_select_indices`) and `generate` continues from the last prompt token with the position
    ids a full prefill would use. The sampled distribution is that of TRL's path (on CPU the G-fold prefill is
    most of the generation time); completions are cut after their first end token, as TRL does. Cache and
    attention are transformers' own: CIPR's replacements fell short of the 1.3x end to end a hand-written
    replacement must earn (docs/benchmarks.md).
    """
    from trl.trainer.utils import pad

    prompts = [torch.tensor(ids) for ids, _ in runs]
    ids = pad(prompts, padding_value=pad_id, padding_side="left").to(device)
    mask = pad([torch.ones_like(t) for t in prompts], padding_value=0, padding_side="left").to(device)
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                  use_cache=True, logits_to_keep=1).past_key_values  # only the cache is used
    counts = torch.tensor([n for _, n in runs], device=device)
    index = torch.repeat_interleave(torch.arange(len(runs), device=device), counts)
    cache.batch_select_indices(index)
    out = model.generate(input_ids=ids[index], attention_mask=mask[index], past_key_values=cache,
                         generation_config=generation_config)
    stops = {int(e) for e in eos_ids}
    return [cut_at_end(row, stops, keep_end=True) for row in out[:, ids.size(1):].tolist()]
