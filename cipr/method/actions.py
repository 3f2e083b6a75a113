"""Action distributions read from tool-name token probabilities, all decisions in one pass over the tokens.

At a decision t of a response y to a prompt x (see `cipr.formats.base.Decision`), with `o` the text
that opens a call and `n_a` the name of declared tool a (paper §3.3, Appendix A):

    π(a) = π(o) · π(n_a | o) / Σ_b π(n_b | o)     over the declared tools b,
    π(∅) = 1 − π(o).

Actions are indexed by equivalence classes supplied by the caller (`ActionQuery.classes`), so the
distributions of two interfaces live on one index set of `num_actions` classes plus ∅ (the last
column). A class that no declared tool of a sequence maps to gets probability 0 there, so mass that
one side puts on a tool the other does not declare (a twin) counts as disagreement.

Choices the paper leaves open, made here:
- The probability of a name is the probability of writing it, whatever follows its end. A name is
  followed by the format's `name_suffix` (`"` for JSON, `[` for WebShop, a newline for ReAct), and
  real text closes it with a merged token (SmolLM2 and Qwen write `"get_weather", ` as ` "`,`get`,`_`,
  `weather`,`",`,...), so scoring the suffix as a token of its own would measure a continuation the
  model rarely writes. Instead (Appendix A):
      π(n | o) ∝ P(prefix(n) | x, y<t, o) · Σ_{v: bytes(v) start with r(n)} P(v | x, y<t, o, prefix(n)),
  prefix(n) being the name's tokens up to its last *stable* boundary and r(n) the rest of
  `name + suffix` (always the whole suffix, and any last characters of the name that merge with it).
  A boundary is stable when it lies at or before the name's end and the tokens before it are the
  same in the tokenizations of `y<t + o + name + suffix + c` for every c in `CONTINUATIONS` (the end of
  the text and one character of each class byte-level pre-tokenizers split on), so no merge with the
  suffix or with what follows it can move it. The sum is one logsumexp over a vocabulary subset of
  the log-softmax at the column of the last prefix token, which the pass computes anyway. It keeps
  `function_1` from taking `function_10`'s mass (`function_1`'s rest is `"`, and no token starting
  with `0` starts with `"`); `foo.` closes with whatever merges with its dot (prefix `foo`, rest `."`:
  `.",`, `."}`, ...). Tokens are compared by their exact bytes (byte-level BPE tokens mapped back to
  bytes, so a token holding part of a UTF-8 character counts; other tokenizers' tokens decoded), each
  ordinary token once; added tokens (the template's control tokens, specials included) are not in any
  sum. The vocabulary's bytes are built once per tokenizer object, the ids per rest once.
- o by the same rule, with `opener_backoff` > 0 when o's last characters merge with the names
  (SmolLM2 writes `Action: function_01` as `Action`,`:`,` function`,...): o's tokens are those every
  name's text shares (`Action`,`:`), r(o) is the rest of o (` `), and
      π(o) = P(`Action`,`:` | x, y<t) · Σ_{v: bytes(v) start with r(o)} P(v | x, y<t, `Action:`),
  the probability of writing the whole opener whatever follows; π(∅) = 1 − π(o). Names are scored
  from o's shared tokens, r(o) inside each name's first token (` function`), so the name
  distribution is conditioned on `Action:` (r(o)'s own probability cancels in the normalization).
  `context_backoff` > 0: the context's last characters merge with o; their tokens are then scored as
  part of o, so π(o) also includes the probability of those characters.
- Empty sum: when no ordinary token starts with a rest (BPE rarely allows it: a rest that spans
  several of the text's own tokens), whole tokens of the text's own tokenization move from the rest
  into the path, one at a time, until some token starts with what remains or nothing remains (no
  sum). For o the moved tokens are scored in π(o) only (`opener_extension`); names still branch at
  o's shared tokens. A name never gets probability 0 from an empty set.
- A tool name declared twice gets one term per declaration, as the formula reads: the declarations
  split the name's mass equally (the text cannot tell them apart).
- Parallel calls: each call is a decision (the format lists one per call opening, plus the one where
  the turn ends), so a response with two calls contributes three distributions.
- Tokenization: prompt and response are tokenized separately without adding special tokens (the
  chat template already wrote them), as a trainer concatenates prompt and completion ids; a response
  is re-tokenized from its text, which may differ from the ids a sampler produced. For each decision
  we tokenize the response's text before it (`ctx`), `ctx + o`, and `ctx + o + name + suffix + c`
  for every declared name and continuation. The branch point k is the longest common token prefix of
  those and of the full response's tokens; o's tokens are the further common prefix of `ctx + o` and
  all the name strings; each name's prefix tokens follow up to its stable boundary. Only the text
  from `WINDOW` response tokens before the decision is re-tokenized (the tokens before are the
  response's own): the cut is kept when that text re-tokenizes to the response's own tokens over
  the first half of the window (the pre-tokenizer runs are then in step) and the branch point lies
  past that half, else the whole text is used (the reference tokenizes the whole text; tests agree).
- One pass over every token per batch: each decision's name trie (shared prefixes merged, o as its
  trunk) is packed after its sequence; a trie node attends to the sequence up to the branch point,
  to its trie ancestors and to itself (a tree-shaped 4D mask), with position ids continuing from the
  branch point. Where the response itself continues along the trie (the taken call), those nodes are
  read from the sequence and not packed again; the opener of a decision the response does not take
  (∅) and all other names are packed. Mode "packed" runs it as one model call with the mask over
  sequence and tries; mode "prefix_cache" runs the sequence under plain causal attention and the
  tries as a continuation that reads its key/value cache (same result, faster attention, smaller
  mask); see `ActionReaderConfig`. Works with `attn_implementation` "sdpa" or "eager" (a 4D float
  mask reaches both unchanged in transformers 5.17); flash attention cannot take a tree mask.
- The reader is differentiable and does not change the model's train/eval mode.
- `support.actions_reference.read_actions_bruteforce` computes the same definition with none of this
  module's code (one plain forward per decision and name); the tests compare the two.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from cipr.core.checkpoints import zero3_partitioned
from cipr.formats.base import CallFormat, Decision

CONTINUATIONS: tuple[str, ...] = ("", ",", "}", ":", "]", ")", " ", "\n", ".", '"', "a", "0")
"""What may follow a name's suffix, tried to find the token boundaries a merge cannot move: the end of
the text first (the text's own tokenization), then one character of each class the pre-tokenizers of
byte-level BPE split on (JSON punctuation, space, newline, quote, letter, digit)."""
WINDOW = 8
"""Response tokens before a decision that are re-tokenized with its opener and names."""


@dataclass(frozen=True)
class ActionReaderConfig:
    """Options of the action reader.

    - `padding_side`: where batch rows are padded ("right" or "left"; the result does not depend on it).
    - `mode`: "packed" runs sequences and tries in one forward under one tree-shaped mask [B, 1, L, L];
      "prefix_cache" runs the sequences with the plain causal mask, then the tries as a continuation
      reading their key/value cache (mask [B, 1, P, M + P]). Both process every token once and give
      the same result; the second keeps the fast causal attention kernel for the long part and a
      small mask, which pays off on long sequences (see `scripts/bench_actions.py`), but needs the
      key/value cache, which transformers drops under gradient checkpointing in training, and a plain
      output head.
      "auto" (default) picks "prefix_cache", or "packed" when either is missing.
    - `response_logprobs`: also return each response token's log-probability (so a trainer can fold
      the action read into the forward it already does).
    - `response_temperature`: the temperature of those log-probabilities, log_softmax(logits / T), as a
      GRPO trainer scores tokens at its sampling temperature; the action distributions are always read
      at temperature 1.
    - `reuse_response`: read trie nodes the response itself follows from the sequence instead of
      packing them (same result, fewer tokens).
    - `head`: "auto" applies the output head only at the positions needed (hidden states of the
      decoder, then `get_output_embeddings()`) when the model's head is a plain projection, else
      calls the full model with `logits_to_keep`; "gather" / "model" force one of the two.
    """

    padding_side: Literal["right", "left"] = "right"
    mode: Literal["auto", "packed", "prefix_cache"] = "auto"
    response_logprobs: bool = False
    response_temperature: float = 1.0
    reuse_response: bool = True
    head: Literal["auto", "gather", "model"] = "auto"

    def __post_init__(self) -> None:
        if not self.response_temperature > 0:
            raise ValueError(f"response_temperature must be > 0, got {self.response_temperature}")


@dataclass(frozen=True)
class ActionQuery:
    """One sequence to read: prompt x, response y, y's decisions, the declared tools and their classes.

    `classes[i]` is the equivalence class (in [0, num_actions)) of the tool named `tools[i]`;
    `written[i]` is how that name is written after an opener (JSON escapes quotes; default: the name).
    """

    prompt: str
    response: str
    decisions: tuple[Decision, ...]
    tools: tuple[str, ...]
    classes: tuple[int, ...]
    written: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", tuple(self.decisions))
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))
        object.__setattr__(self, "written", tuple(self.written) or self.tools)

    @classmethod
    def from_format(cls, fmt: CallFormat, prompt: str, response: str, tools: Sequence[str],
                    classes: Sequence[int] | None = None) -> ActionQuery:
        """A query whose decisions the call format finds in `response`; classes default to positions."""
        return cls(prompt, response, tuple(fmt.decisions(response)), tuple(tools),
                   tuple(range(len(tools))) if classes is None else tuple(classes),
                   tuple(fmt.name_text(t) for t in tools))


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
    - `context_backoff` / `opener_backoff`: tokens moved across a boundary (see module docstring).
    """

    context: int
    opener: tuple[int, ...]
    names: tuple[tuple[int, ...], ...]
    context_backoff: int = 0
    opener_backoff: int = 0
    name_rests: tuple[bytes, ...] = ()
    opener_rest: bytes = b""
    opener_extension: tuple[int, ...] = ()


@dataclass
class ActionReading:
    """What the reader returns for a batch of B sequences with D decisions in all.

    - `probs` [D, num_actions + 1]: action distributions, decisions in sequence order, ∅ last.
    - `sequence` [D] (long): which sequence each decision belongs to (the losses' `segments`).
    - `log_open` [D]: log π(o).
    - `plans`: the tokenization plan of each decision.
    - `response_ids`, `response_logprobs` [B, R], `response_mask` [B, R] (bool): with
      `response_logprobs`, each response token and its log-probability (right-padded), else None.
    - `packed_tokens`: trie tokens packed after the sequences (beyond the sequences themselves).
    """

    probs: torch.Tensor
    sequence: torch.Tensor
    log_open: torch.Tensor
    plans: list[DecisionPlan]
    response_ids: torch.Tensor | None = None
    response_logprobs: torch.Tensor | None = None
    response_mask: torch.Tensor | None = None
    packed_tokens: int = 0


def _lcp(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs[1:]):
            return i
    return n


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


@functools.lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: how a byte-level BPE vocabulary spells each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(rest)})
    return table


def _byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and "ByteLevel" in f"{backend.pre_tokenizer} {backend.decoder}"


class _Vocabulary:
    """The exact bytes each token id spells, and the ordinary tokens whose bytes start with given bytes.

    Byte-level BPE tokens are mapped back to their bytes (decoding would turn a token holding part
    of a UTF-8 character into U+FFFD); tokens outside the byte alphabet, and every token of other
    tokenizers, are decoded. Added tokens (the chat template's control tokens, specials included)
    spell their content but are left out of `starting_with`: they are not text the BPE writes.
    """

    def __init__(self, tokenizer: Any) -> None:
        size = len(tokenizer)
        added = set(tokenizer.added_tokens_decoder)
        pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
        table = _byte_of_char() if _byte_level(tokenizer) else {}
        self.bytes: list[bytes] = []
        for i, piece in enumerate(pieces):
            if i in added or not table or any(ch not in table for ch in piece or "\0"):
                text = piece if i in added and piece else tokenizer.decode([i], clean_up_tokenization_spaces=False)
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


def _validate(q: ActionQuery, num_actions: int, index: int) -> None:
    where = f"query {index}"
    if not q.tools:
        raise ValueError(f"{where}: no declared tools; an action distribution needs at least one")
    if len(q.classes) != len(q.tools) or len(q.written) != len(q.tools):
        raise ValueError(f"{where}: {len(q.tools)} tools but {len(q.classes)} classes and {len(q.written)} "
                         f"written names")
    bad = [c for c in q.classes if not 0 <= c < num_actions]
    if bad:
        raise ValueError(f"{where}: classes {bad} outside [0, {num_actions})")
    if not q.prompt:
        raise ValueError(f"{where}: empty prompt; decisions condition on at least one prompt token")
    for d in q.decisions:
        if not 0 <= d.start <= len(q.response):
            raise ValueError(f"{where}: decision start {d.start} outside the response (length {len(q.response)})")
        if not d.opener:
            raise ValueError(f"{where}: decision at {d.start} has an empty opener")


def _close(vocab: _Vocabulary, path: list[int], rest_ids: Sequence[int]) -> tuple[list[int], bytes]:
    """The path and the rest it is closed by; the fallback for a rest no vocabulary token starts with.

    `rest_ids` is the text's own tokenization of the rest. While no ordinary token starts with the
    rest, its first complete token moves into the path; an empty rest (everything moved) needs no sum.
    """
    rest_ids = list(rest_ids)
    rest = vocab.spell(rest_ids)
    while rest and not vocab.starting_with(rest):
        path = path + rest_ids[:1]
        rest_ids = rest_ids[1:]
        rest = vocab.spell(rest_ids)
    return path, rest


def _window(vocab: _Vocabulary, response: str, response_ids: Sequence[int], start: int) -> tuple[int, int]:
    """(token index, character offset) where the text to re-tokenize for a decision at `start` begins.

    `WINDOW` response tokens before the one holding `start`, at a whole character; (0, 0) when the
    response's tokens do not spell it exactly (a normalizing tokenizer) or it is that short.
    """
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


def plan_decision(tokenizer: Any, response: str, response_ids: Sequence[int], decision: Decision,
                  tools: Sequence[str]) -> DecisionPlan:
    """The token plan of one decision for tool names as written (see the module docstring for the rules)."""
    vocab = _vocabulary(tokenizer)
    first, offset = _window(vocab, response, response_ids, decision.start)
    plan = _plan(tokenizer, vocab, response, response_ids, decision, tools, first, offset)
    return plan if plan is not None else _plan(tokenizer, vocab, response, response_ids, decision, tools, 0, 0)


def _plan(tokenizer: Any, vocab: _Vocabulary, response: str, response_ids: Sequence[int], decision: Decision,
          tools: Sequence[str], first: int, offset: int) -> DecisionPlan | None:
    """`plan_decision` re-tokenizing the response from token `first` (character `offset`) on.

    None when that cut is not clean: the window's text must re-tokenize to the response's own
    tokens over its first half (then the pre-tokenizer runs are in step and every later token agrees).
    """
    ctx = response[offset:decision.start]
    head = ctx + decision.opener
    endings = [decision.name_suffix + c for c in CONTINUATIONS]
    encoded = _encode(tokenizer, [ctx, head] + [head + n + e for n in tools for e in endings])
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
            raise ValueError(f"the tokens of name {tools[t]!r} do not spell its suffix {decision.name_suffix!r}")
        name_end = ends[-1] - len(suffix)
        cut = max(j for j in range(end, _lcp(group) + 1) if ends[j] <= name_end)
        path, rest = _close(vocab, own[end:cut], own[cut:])
        names.append(tuple(path))
        rests.append(rest)
    return DecisionPlan(context=first + k, opener=tuple(head_ids[k:end]), names=tuple(names),
                        context_backoff=len(ctx_ids) - k, opener_backoff=len(head_ids) - end,
                        name_rests=tuple(rests), opener_rest=opener_rest, opener_extension=tuple(opener_path))


@dataclass
class _Row:
    """One sequence laid out for the forward: main tokens (prompt + response), then packed trie nodes.

    Every scored trie node (mapped onto the response or packed) has a parent column, whose logits
    predict it, and a token.
    """

    ids: list[int]
    positions: list[int]
    main: int
    attend_main: list[int] = field(default_factory=list)  # packed node -> last main column it sees
    packed_parent: list[int] = field(default_factory=list)  # packed node -> packed parent (-1: none)
    node_parent_col: list[int] = field(default_factory=list)
    node_token: list[int] = field(default_factory=list)
    node_col: list[int] = field(default_factory=list)  # column of each node (main or packed)


def _add_node(row: _Row, children: dict[tuple[int, int], int], parent_col: int, tok: int, col: int | None) -> int:
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


def _walk(row: _Row, children: dict[tuple[int, int], int], anchor: int, path: Sequence[int]) -> list[int]:
    """Row node indices along `path` from the branch point, packing the nodes that do not exist yet."""
    parent_col, out = anchor, []
    for tok in path:
        node = children.get((parent_col, tok))
        if node is None:
            node = _add_node(row, children, parent_col, tok, None)
        out.append(node)
        parent_col = row.node_col[node]
    return out


@dataclass
class _Nodes:
    """One decision in its row: node indices of π(o)'s path and of each name's path, and the columns
    whose logits close them (the last node's, or the branch point's when the path is empty)."""

    opener: list[int]
    opener_col: int
    names: list[list[int]]
    name_cols: list[int]


def _layout(prompt_ids: list[int], response_ids: list[int], plans: list[DecisionPlan], reuse: bool
            ) -> tuple[_Row, list[_Nodes]]:
    """Lay out one sequence and its decisions' tries: the row, and each decision's `_Nodes`."""
    ids = prompt_ids + response_ids
    row = _Row(ids=list(ids), positions=list(range(len(ids))), main=len(ids))
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


def _pad_id(tokenizer: Any) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return int(tid)
    return 0


def _collate(rows: list[_Row], padding_side: str, pad_id: int, dtype: torch.dtype, device: torch.device
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


def _sharded(model: Any) -> bool:
    """An FSDP2 module (`fully_shard`) or a model whose parameters DeepSpeed ZeRO-3 partitions.

    Their weights are whole only inside the root module's forward (FSDP2 unshards there; calling a
    submodule around it fails with "mixed torch.Tensor and DTensor"), so the reader goes through it."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or zero3_partitioned(model)


def plain_head(model: Any) -> bool:
    """False for a distributed wrapper (DDP, DeepSpeed) or a sharded model: its root forward must run, so
    that gradients are synchronized and sharded weights gathered."""
    config = getattr(model, "config", None)
    return (config is not None and hasattr(model, "get_output_embeddings") and not _sharded(model)
            and getattr(config, "final_logit_softcapping", None) is None and getattr(config, "logit_scale", None) is None
            and model.get_output_embeddings() is not None)


def _logits(model: Any, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
            cols: torch.Tensor, head: str) -> torch.Tensor:
    """Logits [U, V] at (rows[i], cols[i]) for every i: one forward of the model."""
    kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": False}
    if head == "gather":
        hidden = model.get_decoder()(**kwargs).last_hidden_state
        return model.get_output_embeddings()(hidden[rows, cols])
    keep = torch.unique(cols)
    return model(**kwargs, logits_to_keep=keep).logits[rows, torch.searchsorted(keep, cols)]


def _resolve_head(model: Any, head: str) -> str:
    if head == "gather" and _sharded(model):
        raise ValueError("head 'gather' calls the decoder and the output head around the root module, which a "
                         "sharded model (FSDP2, ZeRO-3) does not support; use head 'auto' or 'model'")
    return ("gather" if plain_head(model) else "model") if head == "auto" else head


def _forward_packed(model: Any, rows: list[_Row], config: ActionReaderConfig, pad_id: int, dtype: torch.dtype,
                    device: torch.device, at_rows: list[int], at_cols: list[int]) -> torch.Tensor:
    """Logits [U, V] at (row, row-frame column) pairs: sequences and tries in one forward."""
    ids, pos, mask, offsets = _collate(rows, config.padding_side, pad_id, dtype, device)
    r = torch.tensor(at_rows, dtype=torch.long, device=device)
    c = torch.tensor([offsets[b] + col for b, col in zip(at_rows, at_cols, strict=True)], dtype=torch.long,
                     device=device)
    return _logits(model, ids, pos, mask, r, c, _resolve_head(model, config.head))


def _forward_prefix_cache(model: Any, rows: list[_Row], config: ActionReaderConfig, pad_id: int, dtype: torch.dtype,
                          device: torch.device, at_rows: list[int], at_cols: list[int]) -> torch.Tensor:
    """Same as `_forward_packed`, in two calls that each process every token once.

    The sequences go first with plain causal attention (no mask with right padding: the attention
    kernel of a plain forward; left padding needs an explicit mask) and their key/value cache; the trie nodes follow as a continuation that reads that cache, with a
    tree-shaped mask [B, 1, P, M + P] over the cached sequence and the nodes. Gradients flow through
    the cache.
    """
    if _resolve_head(model, config.head) != "gather":
        raise ValueError("mode 'prefix_cache' needs a plain output head (head 'auto' or 'gather'); use mode 'packed'")
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
        o = width_m - m if config.padding_side == "left" else 0
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
    if config.padding_side == "left" and not bool(att_m.all()):
        seen = att_m.bool()[:, None, :] & torch.ones(width_m, width_m, dtype=torch.bool).tril()[None]
        seen[:, torch.arange(width_m), torch.arange(width_m)] = True  # no fully masked row (nan in eager)
        first_mask = torch.zeros((batch, 1, width_m, width_m), dtype=dtype)
        first_mask.masked_fill_(~seen[:, None], torch.finfo(dtype).min)
        first_mask = first_mask.to(device)
    out = decoder(input_ids=ids_m.to(device), attention_mask=first_mask, position_ids=pos_m.to(device),
                  use_cache=width_p > 0)
    hidden = out.last_hidden_state
    if width_p:
        mask = torch.zeros((batch, 1, width_p, width_m + width_p), dtype=dtype)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        tree = decoder(input_ids=ids_p.to(device), attention_mask=mask.to(device), position_ids=pos_p.to(device),
                       past_key_values=out.past_key_values, use_cache=True)
        hidden = torch.cat([hidden, tree.last_hidden_state], dim=1)
    cols = [offsets[b] + col if col < rows[b].main else width_m + col - rows[b].main
            for b, col in zip(at_rows, at_cols, strict=True)]
    r_t = torch.tensor(at_rows, dtype=torch.long, device=device)
    c_t = torch.tensor(cols, dtype=torch.long, device=device)
    return model.get_output_embeddings()(hidden[r_t, c_t])


def _ancestors(packed_parent: list[int]) -> torch.Tensor:
    """[P, P] bool: node j sees node i iff i is j or an ancestor of j (parents come before children)."""
    anc = torch.eye(len(packed_parent), dtype=torch.bool)
    for j, parent in enumerate(packed_parent):
        if parent >= 0:
            anc[j] |= anc[parent]
    return anc


def _combine(log_open: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor, classes: torch.Tensor,
             num_actions: int) -> torch.Tensor:
    """[D, A+1] distributions from log π(o) [D], name scores [D, N] (valid [D, N]) and classes [D, N]."""
    share = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1) * log_open.exp()[:, None]
    tools = torch.zeros(scores.shape[0], num_actions, dtype=scores.dtype, device=scores.device)
    tools = tools.scatter_add(1, classes, share)
    return torch.cat([tools, (-torch.expm1(log_open))[:, None]], dim=1)


def _checkpointing(model: Any) -> bool:
    """Whether gradient checkpointing is active (it drops the key/value cache in training)."""
    return model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def _check_attention(model: Any) -> None:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"the action reader needs attn_implementation 'sdpa' or 'eager' (a tree-shaped 4D mask); "
                         f"the model uses {impl!r}")


def read_actions(model: Any, tokenizer: Any, queries: Sequence[ActionQuery], num_actions: int,
                 config: ActionReaderConfig | None = None) -> ActionReading:
    """Action distributions at every decision of every query, in one forward pass of `model` over every token.

    Shapes: B = len(queries), D = total decisions, A = num_actions; `probs` is [D, A + 1] (∅ last),
    each row sums to 1. Differentiable with respect to the model's parameters.
    """
    config = config or ActionReaderConfig()
    if config.padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {config.padding_side!r}")
    if config.mode not in ("auto", "packed", "prefix_cache"):
        raise ValueError(f"mode must be 'auto', 'packed' or 'prefix_cache', got {config.mode!r}")
    checkpointing = _checkpointing(model)
    if config.mode == "prefix_cache" and checkpointing:
        raise ValueError("mode 'prefix_cache' needs the key/value cache, which gradient checkpointing drops in "
                         "training: use mode 'packed' (or 'auto')")
    if config.mode != "auto":
        mode = config.mode
    else:
        mode = "packed" if checkpointing or _resolve_head(model, config.head) == "model" else "prefix_cache"
    _check_attention(getattr(model, "module", model))
    for i, q in enumerate(queries):
        _validate(q, num_actions, i)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    if not queries:
        raise ValueError("no queries to read")
    prompt_ids = _encode(tokenizer, [q.prompt for q in queries])
    response_ids = _encode(tokenizer, [q.response for q in queries])
    plans: list[DecisionPlan] = []
    rows: list[_Row] = []
    nodes: list[_Nodes] = []
    seq_of: list[int] = []
    node_base: list[int] = []  # per decision: index of its row's first node in the flat node list
    total_nodes = 0
    for b, q in enumerate(queries):
        qplans = [plan_decision(tokenizer, q.response, response_ids[b], d, q.written) for d in q.decisions]
        row, qnodes = _layout(prompt_ids[b], response_ids[b], qplans, config.reuse_response)
        nodes += qnodes
        node_base += [total_nodes] * len(qplans)
        total_nodes += len(row.node_token)
        plans += qplans
        rows.append(row)
        seq_of += [b] * len(qplans)

    # every (row, column) whose logits are read, once: node parents, closing columns, response tokens
    columns: dict[tuple[int, int], int] = {}

    def at(b: int, col: int) -> int:
        return columns.setdefault((b, col), len(columns))

    node_at = [at(b, c) for b, r in enumerate(rows) for c in r.node_parent_col]
    node_toks = [tok for r in rows for tok in r.node_token]
    closings: list[tuple[int, int, bytes]] = []  # (slot, column index, rest); slot -1 - d: π(o) of decision d
    width = max((len(q.tools) for q in queries), default=1)
    for d, (plan, dn) in enumerate(zip(plans, nodes, strict=True)):
        b = seq_of[d]
        if plan.opener_rest:
            closings.append((-1 - d, at(b, dn.opener_col), plan.opener_rest))
        for i, (rest, col) in enumerate(zip(plan.name_rests, dn.name_cols, strict=True)):
            if rest:
                closings.append((d * width + i, at(b, col), rest))
    resp_at: list[int] = []
    resp_toks: list[int] = []
    if config.response_logprobs:
        for b in range(len(queries)):
            p = len(prompt_ids[b])
            resp_at += [at(b, p - 1 + j) for j in range(len(response_ids[b]))]
            resp_toks += response_ids[b]

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    float_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if columns:
        forward = _forward_packed if mode == "packed" else _forward_prefix_cache
        keys = list(columns)
        logits = forward(model, rows, config, _pad_id(tokenizer), dtype, device, [b for b, _ in keys],
                         [c for _, c in keys])
        logp = torch.log_softmax(logits.to(float_dtype), dim=-1)
    else:  # no decision and no response log-probs asked for: nothing to run
        logp = torch.zeros(0, 1, dtype=float_dtype, device=device)
    lp_nodes = logp[t(node_at), t(node_toks)] if node_toks else logp.new_zeros(0)
    closing = _closing_sums(logp, closings, _vocabulary(tokenizer), t)

    n_dec = len(plans)
    log_open = torch.zeros(n_dec, dtype=logp.dtype, device=device)
    scores = torch.zeros(n_dec * width, dtype=logp.dtype, device=device)
    pairs = [(d, node_base[d] + n) for d, dn in enumerate(nodes) for n in dn.opener]
    if pairs:
        log_open = log_open.index_add(0, t([d for d, _ in pairs]), lp_nodes[t([n for _, n in pairs])])
    slots = [(d * width + i, node_base[d] + n) for d, dn in enumerate(nodes) for i, path in enumerate(dn.names)
             for n in path]
    if slots:
        scores = scores.index_add(0, t([s for s, _ in slots]), lp_nodes[t([n for _, n in slots])])
    opens = [(-1 - s, j) for j, (s, _, _) in enumerate(closings) if s < 0]
    if opens:
        log_open = log_open.index_add(0, t([d for d, _ in opens]), closing[t([j for _, j in opens])])
    names = [(s, j) for j, (s, _, _) in enumerate(closings) if s >= 0]
    if names:
        scores = scores.index_add(0, t([s for s, _ in names]), closing[t([j for _, j in names])])
    valid = torch.zeros(n_dec, width, dtype=torch.bool)
    classes = torch.zeros(n_dec, width, dtype=torch.long)
    for d, b in enumerate(seq_of):
        valid[d, :len(queries[b].tools)] = True
        classes[d, :len(queries[b].tools)] = torch.tensor(queries[b].classes)
    probs = _combine(log_open, scores.view(n_dec, width), valid.to(device), classes.to(device), num_actions)

    reading = ActionReading(probs=probs, sequence=t(seq_of), log_open=log_open, plans=plans,
                            packed_tokens=sum(len(r.ids) - r.main for r in rows))
    if config.response_logprobs:
        longest = max(len(r) for r in response_ids)
        resp_mask = torch.zeros(len(queries), longest, dtype=torch.bool, device=device)
        for b, r in enumerate(response_ids):
            resp_mask[b, :len(r)] = True
        lp_resp = _response_logprobs(logits, logp, t(resp_at), t(resp_toks), config.response_temperature,
                                     float_dtype) if resp_toks else logp.new_zeros(0)
        reading.response_ids = torch.zeros(len(queries), longest, dtype=torch.long, device=device)
        reading.response_ids[resp_mask] = t(resp_toks)
        reading.response_logprobs = torch.zeros(len(queries), longest, dtype=logp.dtype, device=device)
        reading.response_logprobs = reading.response_logprobs.masked_scatter(resp_mask, lp_resp)
        reading.response_mask = resp_mask
    return reading


def _response_logprobs(logits: torch.Tensor, logp: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor,
                       temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """log p_T(token) at each response column: `logp` (temperature 1) reused, else log_softmax(logits / T)."""
    if temperature == 1.0:
        return logp[at, tokens]
    scaled = torch.log_softmax(logits[at].to(dtype) / temperature, dim=-1)
    return scaled.gather(-1, tokens[:, None]).squeeze(-1)


def _closing_sums(logp: torch.Tensor, closings: list[tuple[int, int, bytes]], vocab: _Vocabulary,
                  t: Any) -> torch.Tensor:
    """log Σ_{v: bytes(v) starts with rest} p(v) at each closing's column: one gather and logsumexp per rest."""
    out = logp.new_zeros(len(closings))
    by_rest: dict[bytes, list[int]] = {}
    for j, (_, _, rest) in enumerate(closings):
        by_rest.setdefault(rest, []).append(j)
    for rest, js in by_rest.items():
        ids = vocab.starting_with_tensor(rest, logp.device)
        at = t([closings[j][1] for j in js])
        out = out.index_copy(0, t(js), torch.logsumexp(logp[at][:, ids], dim=-1))
    return out
