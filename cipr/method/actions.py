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
  `.",`, `."}`, ...). Tokens are compared by their exact bytes, each ordinary token once; added tokens
  (control tokens, specials) are in no sum (`cipr.method.action_plan._Vocabulary`).
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
  (∅) and all other names are packed. One model call or two (`ActionReaderConfig.mode`). Works with
  `attn_implementation` "sdpa" or "eager" (a 4D float mask reaches both unchanged in transformers 5.17); flash
  attention cannot take a tree mask.
- The reader is differentiable and does not change the model's train/eval mode.
- `support.actions_reference.read_actions_bruteforce` computes the same definition with none of this
  module's code (one plain forward per decision and name); the tests compare the two.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from cipr.formats.base import CallFormat, Decision
from cipr.method.action_forward import forward_mode, forward_packed, forward_prefix_cache, plain_head
from cipr.method.action_plan import CONTINUATIONS, DecisionPlan, closing_sums, encode, layout, plan_decision

__all__ = ["CONTINUATIONS", "ActionQuery", "ActionReaderConfig", "ActionReading", "DecisionPlan",
           "plain_head", "plan_decision", "read_actions"]


@dataclass(frozen=True)
class ActionReaderConfig:
    """Options of the action reader.

    - `padding_side`: where batch rows are padded ("right" or "left"; the result does not depend on it).
    - `mode`: "packed" runs sequences and tries in one forward under one tree-shaped mask [B, 1, L, L];
      "prefix_cache" runs the sequences with the plain causal mask, then the tries as a continuation reading
      their key/value cache (mask [B, 1, P, M + P]). Same result, every token once; the second keeps the fast
      causal kernel for the long part (it pays on long sequences, `scripts/bench_actions.py`) but needs the
      key/value cache, which transformers drops under gradient checkpointing, and a plain output head. "auto"
      (default) picks "prefix_cache", or "packed" when either is missing.
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
    - `recompute`: in training with gradients, the decoder layers that train keep only their inputs for
      backward and run again there (`cipr.method.action_forward.recomputing`; in "prefix_cache" the
      sequences' pass, whose activations are nearly all of the reader's): the same gradients bit for bit,
      for one more forward of those layers. Without effect when the model checkpoints already.
    """

    padding_side: Literal["right", "left"] = "right"
    mode: Literal["auto", "packed", "prefix_cache"] = "auto"
    response_logprobs: bool = False
    response_temperature: float = 1.0
    reuse_response: bool = True
    head: Literal["auto", "gather", "model"] = "auto"
    recompute: bool = False

    def __post_init__(self) -> None:
        if not self.response_temperature > 0:
            raise ValueError(f"response_temperature must be > 0, got {self.response_temperature}")


@dataclass(frozen=True)
class ActionQuery:
    """One sequence to read: prompt x, response y, y's decisions, the declared tools and their classes.
    `classes[i]`: the equivalence class (in [0, num_actions)) of `tools[i]`; `written[i]`: how that name is
    written after an opener (JSON escapes quotes; default: the name)."""

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


def read_actions(model: Any, tokenizer: Any, queries: Sequence[ActionQuery], num_actions: int,
                 config: ActionReaderConfig | None = None) -> ActionReading:
    """Action distributions at every decision of every query, in one forward pass of `model` over every token,
    differentiable. B = len(queries), D = total decisions, A = num_actions; `probs` is [D, A + 1] (∅ last),
    rows summing to 1."""
    config = config or ActionReaderConfig()
    if config.padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {config.padding_side!r}")
    if config.mode not in ("auto", "packed", "prefix_cache"):
        raise ValueError(f"mode must be 'auto', 'packed' or 'prefix_cache', got {config.mode!r}")
    mode = forward_mode(model, config.mode, config.head)
    for i, q in enumerate(queries):
        _validate(q, num_actions, i)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    if not queries:
        raise ValueError("no queries to read")
    prompt_ids = encode(tokenizer, [q.prompt for q in queries])
    response_ids = encode(tokenizer, [q.response for q in queries])
    by_query = [[plan_decision(tokenizer, q.response, response_ids[b], d, q.written) for d in q.decisions]
                for b, q in enumerate(queries)]
    laid = [layout(prompt_ids[b], response_ids[b], qplans, config.reuse_response)
            for b, qplans in enumerate(by_query)]
    rows = [row for row, _ in laid]
    nodes = [dn for _, qnodes in laid for dn in qnodes]
    plans = [plan for qplans in by_query for plan in qplans]
    seq_of = [b for b, qplans in enumerate(by_query) for _ in qplans]
    first_node = list(itertools.accumulate((len(row.node_token) for row in rows), initial=0))
    node_base = [first_node[b] for b in seq_of]  # per decision: its row's first node in the flat node list

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
        forward = forward_packed if mode == "packed" else forward_prefix_cache
        keys = list(columns)
        logits = forward(model, rows, config.padding_side, config.head, _pad_id(tokenizer), dtype, device,
                         [b for b, _ in keys], [c for _, c in keys], config.recompute)
        logp = torch.log_softmax(logits.to(float_dtype), dim=-1)
    else:  # no decision and no response log-probs asked for: nothing to run
        logp = torch.zeros(0, 1, dtype=float_dtype, device=device)
    lp_nodes = logp[t(node_at), t(node_toks)] if node_toks else logp.new_zeros(0)
    closing = closing_sums(logp, closings, tokenizer, t)

    n_dec = len(plans)
    log_open = torch.zeros(n_dec, dtype=logp.dtype, device=device)
    scores = torch.zeros(n_dec * width, dtype=logp.dtype, device=device)
    pairs = [(d, node_base[d] + n) for d, dn in enumerate(nodes) for n in dn.opener]
    if pairs:
        log_open = log_open.index_add(0, t([d for d, _ in pairs]), lp_nodes[t([n for _, n in pairs])])
    slots = [(d * width + i, node_base[d] + n) for d, dn in enumerate(nodes)
             for i, path in enumerate(dn.names) for n in path]
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
            raise ValueError(f"{where}: decision start {d.start} outside the response "
                             f"(length {len(q.response)})")
        if not d.opener:
            raise ValueError(f"{where}: decision at {d.start} has an empty opener")


def _pad_id(tokenizer: Any) -> int:
    return next(int(tid) for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if tid is not None)


def _combine(log_open: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor, classes: torch.Tensor,
             num_actions: int) -> torch.Tensor:
    """[D, A+1] distributions from log π(o) [D], name scores [D, N] (valid [D, N]) and classes [D, N]."""
    share = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1) * log_open.exp()[:, None]
    tools = torch.zeros(scores.shape[0], num_actions, dtype=scores.dtype, device=scores.device)
    tools = tools.scatter_add(1, classes, share)
    return torch.cat([tools, (-torch.expm1(log_open))[:, None]], dim=1)


def _response_logprobs(logits: torch.Tensor, logp: torch.Tensor, at: torch.Tensor, tokens: torch.Tensor,
                       temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """log p_T(token) at each response column: `logp` (temperature 1) reused, else log_softmax(logits / T)."""
    if temperature == 1.0:
        return logp[at, tokens]
    scaled = torch.log_softmax(logits[at].to(dtype) / temperature, dim=-1)
    return scaled.gather(-1, tokens[:, None]).squeeze(-1)
