"""What the consistency terms compare, built from an engine-neutral view of a batch: every engine's pairs.

An engine (GRPO single- and multi-turn, the supervised regime, distillation) describes its batch as a list of
`Response`s (a rollout, an episode, a reference target or a trajectory: its example, pair, side, texts, turns,
tools, its rows in the decision table and the reference action of each decision) beside the decision table
itself, `probs` [D, A]: the action distributions it read at every decision of every response (∅ last). From
that view this module builds the rows the terms of `cipr.method.objective` see:

- `build_rescore`: each canonical response with decisions is relabeled with fresh names
  (`cipr.method.relabel`, seeded by `Relabeling.seed_for(step, example id, draw)`), the copies are read by the
  engine's `Reader`, and each decision of the response is paired with the same decision of its copy (segments:
  the response; targets: the reference action of each decision, -1 unknown). A response whose decisions do
  not survive relabeling is counted (`consistency/relabel_failures`) and left out. `relabeled` then
  `pair_relabeled` do the same in two steps, for an engine that reads the copies in its own forward
  (distillation reads them with its canonical rows).
- `build_rollout`: per group (a pair; for episodes a (pair, turn) both sides reached: `rollout_index`), each
  side's responses averaged per response (per (episode, turn)) and then per group
  (`cipr.method.objective.rollout_pairs`); a pair enters only when both sides have a response with a decision
  (others: `consistency/pairs_skipped`, and `consistency/turns_skipped` for episodes).

Index shapes, for one side (Us units: responses, or episodes' turns; Ds of their decisions): `decisions` [Ds]
long (rows of the decision table, in table order), `units` [Ds] long (the unit of each: 0..Us-1),
`unit_groups` [Us] long (the group of each: 0..Gn-1, shared by both sides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cipr.formats.base import CallFormat
from cipr.method.actions import ActionQuery
from cipr.method.objective import Pairs, rescore_pairs, rollout_pairs
from cipr.method.relabel import Relabeling, relabel

SIDES = ("canonical", "perturbed")
Reader = Callable[[Sequence[ActionQuery]], torch.Tensor]
"""The engine's read of relabeled queries: their action distributions [D', A], decisions in query order."""


@dataclass(frozen=True)
class Response:
    """One response of a batch as the method sees it.

    - `example_id`, `pair`, `side` ("canonical", "perturbed" or "single"): what it answers; `draw`: its index
      among the responses to its prompt in this step (GRPO's G; 0 for a single target).
    - `prompt`, `text`: x and y; `end`: text read after y (the end-of-turn token a rollout ended on, or "");
      `spans`: each turn's (start, end) characters in `text` (None: one turn, the whole text).
    - `tools`, `classes`: the declared names and the equivalence class of each.
    - `rows`: its decisions' rows in the decision table, in order; `turns`: the turn of each (empty: all 0);
      `targets`: the reference action's column at each (-1: none), None where the engine knows none.
    """

    example_id: str
    pair: int
    side: str
    draw: int
    prompt: str
    text: str
    tools: tuple[str, ...]
    classes: tuple[int, ...]
    rows: tuple[int, ...]
    end: str = ""
    spans: tuple[tuple[int, int], ...] | None = None
    turns: tuple[int, ...] = ()
    targets: tuple[int, ...] | None = None


def rows_by_response(sequence: Sequence[int], responses: int) -> list[tuple[int, ...]]:
    """Per response 0..responses-1, its rows in a decision table whose row d belongs to `sequence[d]`."""
    out: list[list[int]] = [[] for _ in range(responses)]
    for d, b in enumerate(sequence):
        out[b].append(d)
    return [tuple(r) for r in out]


@dataclass(frozen=True)
class RelabeledBatch:
    """The relabeled copies of a view: one query per kept response (`kept`: its index in the view)."""

    queries: list[ActionQuery]
    kept: list[int]
    failures: int


def relabeled(view: Sequence[Response], fmt: CallFormat, relabeling: Relabeling, step: int) -> RelabeledBatch:
    """The relabeled (x̃, ỹ + end) of every canonical response with decisions (module docstring)."""
    queries: list[ActionQuery] = []
    kept: list[int] = []
    failures = 0
    for i, r in enumerate(view):
        if r.side != "canonical" or not r.rows:
            continue
        try:
            rel = relabel(r.prompt, r.text, r.tools, fmt, relabeling.config, spans=r.spans,
                          seed=relabeling.seed_for(step, r.example_id, r.draw))
        except ValueError:
            failures += 1
            continue
        queries.append(ActionQuery(rel.prompt, rel.response + r.end, rel.decisions, rel.tools, r.classes,
                                   tuple(fmt.name_text(t) for t in rel.tools)))
        kept.append(i)
    return RelabeledBatch(queries, kept, failures)


def pair_relabeled(view: Sequence[Response], probs: torch.Tensor, batch: RelabeledBatch,
                   p_relabeled: torch.Tensor) -> Pairs:
    """The rescoring pairs: the kept responses' rows of `probs` [D, A] against `p_relabeled` [D', A], the
    copies' decisions in query order; segments [D'] the copy of each; targets [D'] where the view has any."""
    rows = [d for i in batch.kept for d in view[i].rows]
    p_canon = probs[torch.tensor(rows, dtype=torch.long, device=probs.device)]
    counts = torch.tensor([len(q.decisions) for q in batch.queries], dtype=torch.long)
    segments = torch.repeat_interleave(torch.arange(len(counts)), counts).to(p_relabeled.device)
    targets = None
    if any(view[i].targets is not None for i in batch.kept):
        known = [t for i in batch.kept for t in (view[i].targets or (-1,) * len(view[i].rows))]
        targets = torch.tensor(known, dtype=torch.long, device=p_relabeled.device)
    return rescore_pairs(p_canon, p_relabeled, segments, targets=targets)


def build_rescore(view: Sequence[Response], probs: torch.Tensor, read: Reader, fmt: CallFormat,
                  relabeling: Relabeling, step: int) -> tuple[Pairs | None, dict[str, float]]:
    """The rescoring term's pairs (None when no response could be relabeled) and the relabel failures."""
    batch = relabeled(view, fmt, relabeling, step)
    counts = {"consistency/relabel_failures": float(batch.failures)}
    if not batch.queries:
        return None, counts
    return pair_relabeled(view, probs, batch, read(batch.queries)), counts


def build_rollout(view: Sequence[Response], probs: torch.Tensor, *, by_turn: bool = False
                  ) -> tuple[Pairs | None, dict[str, float]]:
    """The rollout term's pairs (None when no pair is complete) and the skip counts (module docstring);
    `by_turn`: episodes, compared turn by turn (else every decision is turn 0)."""
    sequence = [0] * probs.shape[0]
    turns = [0] * probs.shape[0]
    for b, r in enumerate(view):
        for j, d in enumerate(r.rows):
            sequence[d], turns[d] = b, (r.turns[j] if by_turn and r.turns else 0)
    index, skipped = rollout_index([r.pair for r in view], [r.side for r in view], sequence, turns,
                                   device=probs.device)
    counts = {f"consistency/{k}": v for k, v in skipped.items() if by_turn or k != "turns_skipped"}
    if index is None:
        return None, counts
    c, p = index.canonical, index.perturbed
    return rollout_pairs(probs[c.decisions], c.units, c.unit_groups, probs[p.decisions], p.units,
                         p.unit_groups, index.group_pairs), counts


@dataclass(frozen=True)
class SideIndex:
    """One side's rows of the rollout term: `decisions` [Ds], `units` [Ds], `unit_groups` [Us] (module
    docstring; a unit is one response, or one episode's turn)."""

    decisions: torch.Tensor
    units: torch.Tensor
    unit_groups: torch.Tensor


@dataclass(frozen=True)
class RolloutIndex:
    """Both sides over the Gn groups both reached (a group: a pair's turn; single turn: a pair);
    `group_pairs` [Gn] the pair of each group (0..P-1), `group_turns` [Gn] its turn (0-based)."""

    canonical: SideIndex
    perturbed: SideIndex
    group_pairs: torch.Tensor
    group_turns: torch.Tensor


def rollout_index(pair_ids: Sequence[int], sides: Sequence[str], sequence: Sequence[int],
                  turns: Sequence[int], device: torch.device | str | None = None
                  ) -> tuple[RolloutIndex | None, dict[str, float]]:
    """Index tensors of the rollout term (None when no (pair, turn) has decisions on both sides) and
    {"pairs_skipped", "turns_skipped"}: `pair_ids`, `sides` [B] per response; `sequence`, `turns` [D] the
    response and turn of each decision, in table order (single turn: every turn 0).

    Groups are ordered by pair (first appearance) then turn; units by first appearance. Weighting
    (docs/method.md): for pair p and turn k each side averages each response's turn-k decisions, then its
    responses that reached turn k with a decision; a pair's turns weigh 1/n_turns (the turns both sides
    reached), pairs equally."""
    if len(pair_ids) != len(sides):
        raise ValueError(f"pair_ids and sides need one entry per response, got {len(pair_ids)} and "
                         f"{len(sides)}")
    if len(sequence) != len(turns):
        raise ValueError(f"sequence and turns need one entry per decision, got {len(sequence)} and "
                         f"{len(turns)}")
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise ValueError(f"sides must be 'canonical' or 'perturbed', got {sorted(unknown)}")
    reached: dict[tuple[int, int], set[str]] = {}
    for b, k in zip(sequence, turns, strict=True):
        reached.setdefault((pair_ids[b], k), set()).add(sides[b])
    first = {p: i for i, p in reversed(list(enumerate(pair_ids)))}
    groups = sorted((g for g, s in reached.items() if len(s) == 2), key=lambda g: (first[g[0]], g[1]))
    pairs_kept = list(dict.fromkeys(p for p, _ in groups))
    metrics = {"pairs_skipped": float(len(first) - len(pairs_kept)),
               "turns_skipped": float(len(reached) - len(groups))}
    if not groups:
        return None, metrics
    pair_pos = {p: i for i, p in enumerate(pairs_kept)}
    group_pos = {g: i for i, g in enumerate(groups)}
    out = {}
    for name in SIDES:
        units: dict[tuple[int, int], int] = {}
        dec, seg, unit_groups = [], [], []
        for d, (b, k) in enumerate(zip(sequence, turns, strict=True)):
            g = (pair_ids[b], k)
            if sides[b] != name or g not in group_pos:
                continue
            if (b, k) not in units:
                units[(b, k)] = len(units)
                unit_groups.append(group_pos[g])
            dec.append(d)
            seg.append(units[(b, k)])
        out[name] = SideIndex(torch.tensor(dec, dtype=torch.long, device=device),
                              torch.tensor(seg, dtype=torch.long, device=device),
                              torch.tensor(unit_groups, dtype=torch.long, device=device))
    return RolloutIndex(out["canonical"], out["perturbed"],
                        torch.tensor([pair_pos[p] for p, _ in groups], dtype=torch.long, device=device),
                        torch.tensor([k for _, k in groups], dtype=torch.long, device=device)), metrics
