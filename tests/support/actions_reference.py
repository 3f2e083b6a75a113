"""Reference action distributions computed from the definition, with none of the one-pass reader's code.

For tests and benchmarks of `cipr.method.actions.read_actions`: it shares with the reader the query type and
the list of continuations (part of the definition) and nothing else. Its own boundaries come from the
character offsets of full-text tokenizations, its own vocabulary texts from decoding each token on
its own, and it runs one plain forward per decision and declared name (one more for o in the
empty-set fallback). The definition (paper Appendix A; see the `cipr.method.actions` module docstring):

    π(a) = π(o) · π(n_a | o) / Σ_b π(n_b | o),    π(∅) = 1 − π(o),
    π(n | o) ∝ P(prefix(n) | x, y<t, o) · Σ_{v: text(v) starts with r(n)} P(v | x, y<t, o, prefix(n)),
    π(o)     = P(prefix(o) | x, y<t) · Σ_{v: text(v) starts with r(o)} P(v | x, y<t, prefix(o)).

With T_n(c) the tokens of `y<t + o + n + suffix + c` (response text, no special tokens added): the
branch point is the last position up to which all of the response, `y<t`, `y<t + o` and every T_n(c)
have the same tokens; prefix(o) ends at the last such position of `y<t + o` and every T_n(c) (o's
tokens shared by all names' texts), r(o) is o's text after it; prefix(n) ends at the last such
position of T_n(c) over the continuations c at or before the name's end, and r(n) is the rest of
`name + suffix`. When no token's text starts with a rest, whole tokens of the text's own
tokenization move into the prefix until one does or nothing is left.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from cipr.method.actions import CONTINUATIONS, ActionQuery

_TEXTS: weakref.WeakKeyDictionary[Any, list[str | None]] = weakref.WeakKeyDictionary()
_STARTING: weakref.WeakKeyDictionary[Any, dict[str, list[int]]] = weakref.WeakKeyDictionary()


def token_texts(tokenizer: Any) -> list[str | None]:
    """Each token decoded on its own; None for added (control and special) tokens."""
    texts = _TEXTS.get(tokenizer)
    if texts is None:
        added = set(tokenizer.added_tokens_decoder)
        decoded = tokenizer.batch_decode([[i] for i in range(len(tokenizer))],
                                         clean_up_tokenization_spaces=False)
        texts = _TEXTS[tokenizer] = [None if i in added else s for i, s in enumerate(decoded)]
    return texts


def starting_with(tokenizer: Any, rest: str) -> list[int]:
    """Ids of the ordinary tokens whose text starts with `rest`."""
    cache = _STARTING.setdefault(tokenizer, {})
    if rest not in cache:
        cache[rest] = [i for i, s in enumerate(token_texts(tokenizer))
                       if s is not None and s.startswith(rest)]
    return cache[rest]


def _tokens(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """(id, end offset) of each token of `text`; the tokens must tile the text."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    out, pos = [], 0
    for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
        if a != pos:
            raise ValueError(f"the reference needs tokens that tile the text; {text!r} has a gap at {pos}")
        out.append((tid, b))
        pos = b
    if pos != len(text):
        raise ValueError(f"the tokens of {text!r} stop at {pos}")
    return out


def _before(tokens: list[tuple[int, int]], pos: int) -> tuple[int, ...] | None:
    """The ids of the tokens that end at or before `pos`, or None when no token ends exactly there."""
    ids = tuple(t for t, end in tokens if end <= pos)
    ends = [end for _, end in tokens if end <= pos]
    return ids if (ends[-1] if ends else 0) == pos else None


def shared_boundary(tokenizations: Sequence[list[tuple[int, int]]], limit: int) -> int:
    """The last character position ≤ `limit` before which every tokenization has the same tokens."""
    candidates = sorted({0, *(end for end in (e for _, e in tokenizations[0]) if end <= limit)}, reverse=True)
    for pos in candidates:
        prefixes = {_before(t, pos) for t in tokenizations}
        if len(prefixes) == 1 and None not in prefixes:
            return pos
    return 0


def _closed(tokenizer: Any, text: str, tokens: list[tuple[int, int]], pos: int) -> tuple[int, str]:
    """(prefix end, rest): the rest `text[pos:]`, or the fallback when no token's text starts with it."""
    rest = text[pos:]
    ends = [end for _, end in tokens if end > pos]
    while rest and not starting_with(tokenizer, rest):
        pos = ends.pop(0)
        rest = text[pos:]
    return pos, rest


def _log_probs(model: Any, ids: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.log_softmax(logits, dim=-1)


def _path_score(tokenizer: Any, logp: torch.Tensor, ids: list[int], start: int, stop: int, rest: str
                ) -> torch.Tensor:
    """log P(ids[start:stop] | ids[:start]) + log Σ_{text(v) starts with rest} P(v | ids[:stop])."""
    score = logp.new_zeros(())
    for j in range(start, stop):
        score = score + logp[j - 1, ids[j]]
    if rest:
        score = score + torch.logsumexp(logp[stop - 1, starting_with(tokenizer, rest)], dim=0)
    return score


def read_actions_bruteforce(model: Any, tokenizer: Any, queries: Sequence[ActionQuery], num_actions: int
                            ) -> torch.Tensor:
    """Action distributions [D, num_actions + 1] (∅ last) by the definition above, one forward per name."""
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for q in queries:
        prompt = list(tokenizer(q.prompt, add_special_tokens=False)["input_ids"])
        response = _tokens(tokenizer, q.response)
        for d in q.decisions:
            ctx = q.response[:d.start]
            head = ctx + d.opener
            own = [_tokens(tokenizer, head + n + d.name_suffix) for n in q.written]
            variants = [[_tokens(tokenizer, head + n + d.name_suffix + c) for c in CONTINUATIONS[1:]]
                        for n in q.written]
            everything = [t for group in zip(own, variants, strict=True) for t in (group[0], *group[1])]
            head_tokens = _tokens(tokenizer, head)
            branch = shared_boundary([response, _tokens(tokenizer, ctx), head_tokens, *everything], len(ctx))
            o_end = shared_boundary([head_tokens, *everything], len(head))
            context = len(_before(head_tokens, branch))
            o_stop, o_rest = _closed(tokenizer, head, head_tokens, o_end)
            o_ids = prompt + list(_before(head_tokens, o_stop))
            shared = len(prompt) + len(_before(head_tokens, o_end))
            scores, log_open = [], None
            for name, tokens, group in zip(q.written, own, variants, strict=True):
                text = head + name + d.name_suffix
                stop, rest = _closed(tokenizer, text, tokens,
                                     shared_boundary([tokens, *group], len(head + name)))
                ids = prompt + list(_before(tokens, stop))
                logp = _log_probs(model, ids)
                scores.append(_path_score(tokenizer, logp, ids, shared, len(ids), rest))
                if log_open is None and o_ids == ids[:len(o_ids)]:
                    log_open = _path_score(tokenizer, logp, ids, len(prompt) + context, len(o_ids), o_rest)
            if log_open is None:  # the fallback moved o's own tokens, which no name's text has
                log_open = _path_score(tokenizer, _log_probs(model, o_ids), o_ids, len(prompt) + context,
                                       len(o_ids), o_rest)
            share = torch.softmax(torch.stack(scores), dim=0) * log_open.exp()
            row = torch.zeros(num_actions, dtype=share.dtype, device=device)
            row = row.index_add(0, torch.tensor(q.classes, device=device), share)
            out.append(torch.cat([row, (-torch.expm1(log_open))[None]]))
    if not out:
        return torch.zeros(0, num_actions + 1, device=device)
    return torch.stack(out)
