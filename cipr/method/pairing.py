"""Index tensors that feed the consistency losses (`cipr.method.consistency`) from a micro-batch's rollouts:
pure.

A micro-batch holds B responses (rows b = 0..B-1); each belongs to a pair (`pair_ids[b]`), is on the
canonical or the perturbed side of it (`sides[b]`), and has decisions or not (`has_decisions[b]`).
Reading the actions of all rows gives a decision table of D rows; `sequence[d]` is the response
(row b) of decision d, in order.

Shapes, for one side s of `rollout_index` (Rs responses kept, Ds of their decisions):
- `decisions` [Ds] long: rows of the decision table, in table order;
- `segments` [Ds] long: the response of each of those decisions, 0..Rs-1 (position in `rows`);
- `groups` [Rs] long: the pair group of each kept response, 0..P-1 (P complete pairs);
- `rows` (list of Rs ints): the kept responses (row b), pair by pair in order of first appearance.
`decision_rows` returns a `decisions` tensor alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SIDES = ("canonical", "perturbed")


@dataclass(frozen=True)
class SideIndex:
    """One side's decisions, their responses and the responses' pair groups (shapes: module docstring)."""

    rows: list[int]
    decisions: torch.Tensor
    segments: torch.Tensor
    groups: torch.Tensor


@dataclass(frozen=True)
class RolloutIndex:
    """Both sides of the rollout term over the P complete pairs (group ids 0..P-1 on both)."""

    canonical: SideIndex
    perturbed: SideIndex


def decision_rows(responses: Sequence[int], sequence: Sequence[int], device: torch.device | str | None = None
                  ) -> torch.Tensor:
    """[D'] long: the decisions (decision-table rows) whose response is one of `responses`, in order."""
    chosen = set(responses)
    return torch.tensor([d for d, b in enumerate(sequence) if b in chosen], dtype=torch.long, device=device)


def rollout_index(pair_ids: Sequence[int], sides: Sequence[str], has_decisions: Sequence[bool],
                  sequence: Sequence[int], device: torch.device | str | None = None
                  ) -> tuple[RolloutIndex | None, dict[str, float]]:
    """Index tensors of the rollout term (None when no pair is complete) and metrics ({"pairs_skipped"}): a
    pair enters when both sides have a response with a decision; responses without one are left out."""
    if not len(pair_ids) == len(sides) == len(has_decisions):
        raise ValueError("pair_ids, sides and has_decisions need one entry per response, got "
                         f"{len(pair_ids)}, {len(sides)} and {len(has_decisions)}")
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise ValueError(f"sides must be 'canonical' or 'perturbed', got {sorted(unknown)}")
    pairs: dict[int, dict[str, list[int]]] = {}
    for b, (pair, side, decided) in enumerate(zip(pair_ids, sides, has_decisions, strict=True)):
        if decided:
            pairs.setdefault(pair, {name: [] for name in SIDES})[side].append(b)
    complete = [p for p, s in pairs.items() if all(s[name] for name in SIDES)]
    metrics = {"pairs_skipped": float(len(set(pair_ids)) - len(complete))}
    if not complete:
        return None, metrics
    group = {p: g for g, p in enumerate(complete)}
    index = {}
    for name in SIDES:
        rows = [b for p in complete for b in pairs[p][name]]
        response = {b: i for i, b in enumerate(rows)}
        dec = [d for d, b in enumerate(sequence) if b in response]
        index[name] = SideIndex(
            rows=rows,
            decisions=torch.tensor(dec, dtype=torch.long, device=device),
            segments=torch.tensor([response[sequence[d]] for d in dec], dtype=torch.long, device=device),
            groups=torch.tensor([group[pair_ids[b]] for b in rows], dtype=torch.long, device=device))
    return RolloutIndex(index["canonical"], index["perturbed"]), metrics
