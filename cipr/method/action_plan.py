"""Token plans of the action reader (`cipr.method.actions`; its docstring gives the rules): the bytes of
each vocabulary token, how each decision's opener and names are tokenized and closed, and the layout of
every decision's name trie after its sequence (what the forward pass reads and what it packs).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cipr.formats.base import Decision

CONTINUATIONS: tuple[str, ...] = ("", ",", "}", ":", "]", ")", " ", "\n", ".", '"', "a", "0")
"""What may follow a name's suffix, tried to find the token boundaries a merge cannot move: the end of
the text first (the text's own tokenization), then one character of each class the pre-tokenizers of
byte-level BPE split on (JSON punctuation, space, newline, quote, letter, digit)."""
WINDOW = 8
"""Response tokens before a decision that are re-tokenized with its opener and names."""


@dataclass(frozen=True)
class DecisionPlan:
    """How one decision is tokenized.

    - `context`: k, the number of response tokens before the branch point.
    - `opener`: token ids of o after the branch point that every name's text shares (names branch after them).
    - `opener_rest`: the bytes of o after those tokens (merged into each name's first token), closed in
      π(o) by the sum over the vocabulary tokens that start with them; empty when o ends on a shared boundary.
    - `opener_extension`: tokens of o scored in π(o) only, before `opener_rest` (the empty-set fallback).
    - `names`: per declared tool, the token ids of its name prefix after `opener` (with any opener tail).
    - `name_rests`: per declared tool, the bytes closed by the vocabulary sum (the rest of name + suffix).
    - `context_backoff` / `opener_backoff`: tokens moved across a boundary (see `cipr.method.actions`).
    """

    context: int
    opener: tuple[int, ...]
    names: tuple[tuple[int, ...], ...]
    context_backoff: int = 0
    opener_backoff: int = 0
    name_rests: tuple[bytes, ...] = ()
    opener_rest: bytes = b""
    opener_extension: tuple[int, ...] = ()


def _lcp(seqs: Sequence[Sequence[int]]) -> int:
    """The length of the longest common prefix of `seqs`."""
    columns = zip(*seqs, strict=False)  # up to the shortest
    return next((i for i, col in enumerate(columns) if col.count(col[0]) != len(col)), min(map(len, seqs)))


def encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


@functools.lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: how a byte-level BPE vocabulary spells each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(rest)})
    return table


def _byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and "ByteLevel" in f"{backend.pre_tokenizer} {backend.decoder}"


class _Vocabulary:
    """The exact bytes each token id spells, and the ordinary tokens whose bytes start with given bytes.

    Byte-level BPE tokens are mapped back to their bytes (decoding would turn part of a UTF-8 character into
    U+FFFD); tokens outside the byte alphabet, and those of other tokenizers, are decoded. Added tokens
    (control tokens, specials included) spell their content but are left out of `starting_with`: the BPE does
    not write them as text.
    """

    def __init__(self, tokenizer: Any) -> None:
        size = len(tokenizer)
        added = set(tokenizer.added_tokens_decoder)
        pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
        table = _byte_of_char() if _byte_level(tokenizer) else {}
        self.bytes: list[bytes] = []
        for i, piece in enumerate(pieces):
            if i in added or not table or any(ch not in table for ch in piece or "\0"):
                text = (piece if i in added and piece
                        else tokenizer.decode([i], clean_up_tokenization_spaces=False))
                self.bytes.append(text.encode("utf-8"))
            else:
                self.bytes.append(bytes(table[ch] for ch in piece))
        order = sorted((t, i) for i, t in enumerate(self.bytes) if t and i not in added)
        self._keys = [t for t, _ in order]
        self._ids = [i for _, i in order]
        self._starting: dict[bytes, tuple[int, ...]] = {}
        self._tensors: dict[tuple[bytes, torch.device], torch.Tensor] = {}

    def spell(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.bytes[i] for i in ids)

    def starting_with(self, prefix: bytes) -> tuple[int, ...]:
        """Ids of the ordinary tokens whose bytes start with `prefix` (cached per prefix)."""
        found = self._starting.get(prefix)
        if found is None:
            lo = bisect.bisect_left(self._keys, prefix)
            hi = lo
            while hi < len(self._keys) and self._keys[hi].startswith(prefix):
                hi += 1
            found = self._starting[prefix] = tuple(sorted(self._ids[lo:hi]))
        return found

    def starting_with_tensor(self, prefix: bytes, device: torch.device) -> torch.Tensor:
        """`starting_with` as a long tensor on `device` (cached)."""
        key = (prefix, device)
        if key not in self._tensors:
            self._tensors[key] = torch.tensor(self.starting_with(prefix), dtype=torch.long, device=device)
        return self._tensors[key]


_VOCABULARIES: weakref.WeakKeyDictionary[Any, _Vocabulary] = weakref.WeakKeyDictionary()


def _vocabulary(tokenizer: Any) -> _Vocabulary:
    """The tokenizer's `_Vocabulary`, built once per tokenizer object."""
    vocab = _VOCABULARIES.get(tokenizer)
    if vocab is None:
        vocab = _VOCABULARIES[tokenizer] = _Vocabulary(tokenizer)
    return vocab


def closing_sums(logp: torch.Tensor, closings: list[tuple[int, int, bytes]], tokenizer: Any, t: Any
                 ) -> torch.Tensor:
    """log Σ_{v: bytes(v) starts with rest} p(v) per (slot, column, rest): a gather and logsumexp per rest."""
    vocab = _vocabulary(tokenizer)
    out = logp.new_zeros(len(closings))
    by_rest: dict[bytes, list[int]] = {}
    for j, (_, _, rest) in enumerate(closings):
        by_rest.setdefault(rest, []).append(j)
    for rest, js in by_rest.items():
        ids = vocab.starting_with_tensor(rest, logp.device)
        at = t([closings[j][1] for j in js])
        out = out.index_copy(0, t(js), torch.logsumexp(logp[at][:, ids], dim=-1))
    return out


def plan_decision(tokenizer: Any, response: str, response_ids: Sequence[int], decision: Decision,
                  tools: Sequence[str]) -> DecisionPlan:
    """The token plan of one decision for tool names as written (`cipr.method.actions` gives the rules)."""
    vocab = _vocabulary(tokenizer)
    first, offset = _window(vocab, response, response_ids, decision.start)
    plan = _plan(tokenizer, vocab, response, response_ids, decision, tools, first, offset)
    return plan if plan is not None else _plan(tokenizer, vocab, response, response_ids, decision, tools,
                                               0, 0)


def _plan(tokenizer: Any, vocab: _Vocabulary, response: str, response_ids: Sequence[int], decision: Decision,
          tools: Sequence[str], first: int, offset: int) -> DecisionPlan | None:
    """`plan_decision` re-tokenizing from token `first` (character `offset`) on; None when that cut is not
    clean: the window's text must re-tokenize to the response's own tokens over its first half (the
    pre-tokenizer runs are then in step)."""
    ctx = response[offset:decision.start]
    head = ctx + decision.opener
    endings = [decision.name_suffix + c for c in CONTINUATIONS]
    encoded = encode(tokenizer, [ctx, head] + [head + n + e for n in tools for e in endings])
    ctx_ids, head_ids, variants = encoded[0], encoded[1], encoded[2:]
    tail = list(response_ids[first:])
    k = _lcp([tail, ctx_ids, head_ids, *variants])
    if first and (_lcp([tail, ctx_ids]) < WINDOW // 2 or k < WINDOW // 2):
        return None
    end = _lcp([head_ids, *variants])
    opener_path, opener_rest = _close(vocab, [], head_ids[end:])
    suffix = decision.name_suffix.encode("utf-8")
    names, rests = [], []
    for t in range(len(tools)):
        group = variants[t * len(endings):(t + 1) * len(endings)]
        own = group[0]  # CONTINUATIONS[0] is the end of the text
        ends = list(itertools.accumulate((len(vocab.bytes[i]) for i in own), initial=0))
        if not vocab.spell(own).endswith(suffix):
            raise ValueError(f"the tokens of name {tools[t]!r} do not spell its suffix "
                             f"{decision.name_suffix!r}")
        name_end = ends[-1] - len(suffix)
        cut = max(j for j in range(end, _lcp(group) + 1) if ends[j] <= name_end)
        path, rest = _close(vocab, own[end:cut], own[cut:])
        names.append(tuple(path))
        rests.append(rest)
    return DecisionPlan(context=first + k, opener=tuple(head_ids[k:end]), names=tuple(names),
                        context_backoff=len(ctx_ids) - k, opener_backoff=len(head_ids) - end,
                        name_rests=tuple(rests), opener_rest=opener_rest, opener_extension=tuple(opener_path))


def _window(vocab: _Vocabulary, response: str, response_ids: Sequence[int], start: int) -> tuple[int, int]:
    """(token index, character offset) where the text re-tokenized for a decision at `start` begins: `WINDOW`
    response tokens before the one holding `start`, at a whole character; (0, 0) when the response's tokens do
    not spell it exactly (a normalizing tokenizer) or it is that short."""
    raw = response.encode("utf-8")
    ends = list(itertools.accumulate((len(vocab.bytes[t]) for t in response_ids), initial=0))
    if ends[-1] != len(raw) or vocab.spell(response_ids) != raw:
        return 0, 0
    i = bisect.bisect_right(ends, len(response[:start].encode("utf-8"))) - 1 - WINDOW
    while i > 0:
        try:
            return i, len(raw[:ends[i]].decode("utf-8"))
        except UnicodeDecodeError:
            i -= 1
    return 0, 0


def _close(vocab: _Vocabulary, path: list[int], rest_ids: Sequence[int]) -> tuple[list[int], bytes]:
    """The path and the rest that closes it; the fallback for a rest no vocabulary token starts with. While
    none does, the first complete token of `rest_ids` (the text's own tokenization of the rest) moves into the
    path; an empty rest needs no sum."""
    rest_ids = list(rest_ids)
    rest = vocab.spell(rest_ids)
    while rest and not vocab.starting_with(rest):
        path = path + rest_ids[:1]
        rest_ids = rest_ids[1:]
        rest = vocab.spell(rest_ids)
    return path, rest


@dataclass
class Row:
    """One sequence laid out for the forward: main tokens (prompt + response), then packed trie nodes. Every
    scored trie node (on the response or packed) has a token and a parent column, whose logits predict it."""

    ids: list[int]
    positions: list[int]
    main: int
    attend_main: list[int] = field(default_factory=list)  # packed node -> last main column it sees
    packed_parent: list[int] = field(default_factory=list)  # packed node -> packed parent (-1: none)
    node_parent_col: list[int] = field(default_factory=list)
    node_token: list[int] = field(default_factory=list)
    node_col: list[int] = field(default_factory=list)  # column of each node (main or packed)


@dataclass
class _Nodes:
    """One decision in its row: node indices of π(o)'s path and of each name's path, and the columns
    whose logits close them (the last node's, or the branch point's when the path is empty)."""

    opener: list[int]
    opener_col: int
    names: list[list[int]]
    name_cols: list[int]


def layout(prompt_ids: list[int], response_ids: list[int], plans: list[DecisionPlan], reuse: bool
           ) -> tuple[Row, list[_Nodes]]:
    """Lay out one sequence and its decisions' tries: the row, and each decision's `_Nodes`."""
    ids = prompt_ids + response_ids
    row = Row(ids=list(ids), positions=list(range(len(ids))), main=len(ids))
    p = len(prompt_ids)
    out: list[_Nodes] = []
    for plan in plans:
        anchor = p + plan.context - 1
        children: dict[tuple[int, int], int] = {}  # (parent column, token) -> row node index
        paths = [list(plan.opener) + list(n) for n in plan.names]
        open_path = list(plan.opener) + list(plan.opener_extension)
        if reuse:  # the longest trie path prefix the response itself follows is read from the sequence
            cont = response_ids[plan.context:]
            follow = max(_lcp([path, cont]) for path in [open_path, *paths])
            parent_col = anchor
            for j in range(follow):
                _add_node(row, children, parent_col, cont[j], p + plan.context + j)
                parent_col = p + plan.context + j
        opener = _walk(row, children, anchor, open_path)
        walked = [_walk(row, children, anchor, path) for path in paths]
        out.append(_Nodes(opener, row.node_col[opener[-1]] if opener else anchor,
                          [w[len(plan.opener):] for w in walked],
                          [row.node_col[w[-1]] if w else anchor for w in walked]))
    return row, out


def _add_node(row: Row, children: dict[tuple[int, int], int], parent_col: int, tok: int, col: int | None
              ) -> int:
    """A trie node under `parent_col`: read from the response at main column `col`, or packed when None."""
    node = len(row.node_token)
    row.node_parent_col.append(parent_col)
    row.node_token.append(tok)
    if col is None:
        col = len(row.ids)
        row.ids.append(tok)
        row.positions.append(row.positions[parent_col] + 1)
        if parent_col < row.main:
            row.attend_main.append(parent_col)
            row.packed_parent.append(-1)
        else:
            row.attend_main.append(row.attend_main[parent_col - row.main])
            row.packed_parent.append(parent_col - row.main)
    children[(parent_col, tok)] = node
    row.node_col.append(col)
    return node


def _walk(row: Row, children: dict[tuple[int, int], int], anchor: int, path: Sequence[int]) -> list[int]:
    """Row node indices along `path` from the branch point, packing the nodes that do not exist yet."""
    parent_col, out = anchor, []
    for tok in path:
        node = children.get((parent_col, tok))
        if node is None:
            node = _add_node(row, children, parent_col, tok, None)
        out.append(node)
        parent_col = row.node_col[node]
    return out
