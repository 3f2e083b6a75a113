"""CIPR's consistency terms on multi-turn episodes: the turn-aligned rollout KL and the episode relabeling.

An episode (`cipr.train.episodes`) is one response in the single-turn terms' sense: its text is every
assistant turn with the observations between them, and its decisions are those of every turn (the call
format's `decisions` of each turn's text, at their offsets in the episode's text). So the action reader
reads every decision on the multi-turn context in one pass, and the rescoring term is
`cipr.method.consistency.rescoring_kl` with one segment per episode.

Weighting across turns (stated in docs/method.md, tested in tests/test_train_multi_turn.py):
- Rescoring: each decision of an episode weighs 1/n_decisions of that episode, episodes equally (the
  single-turn rule, an episode in place of a response).
- Rollout: the paired episodes (canonical and perturbed copy of one task, each side's G episodes started
  from the same environment state) are compared turn by turn. Group (pair p, turn k): on each side, each
  episode's turn-k decisions are averaged, then the side's episodes that reached turn k with a decision;
  KL(canonical || perturbed) of the two averages. Each pair's turns weigh 1/n_turns (the turns both sides
  reached), pairs equally. Turn 1 starts from the same state on both sides; at later turns each side's
  average is over the states its own episodes reached, so an interface-invariant policy (which reaches the
  same state distribution under both interfaces) has the same average on both sides.

Pure functions over tensors; the index helpers are plain Python over the micro-batch's rows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cipr.formats.base import CallFormat, Decision
from cipr.method.consistency import group_distribution, kl_rows
from cipr.method.relabel import RelabelConfig, fresh_names
from cipr.tools.canonical import rewrite_text

SIDES = ("canonical", "perturbed")


@dataclass(frozen=True)
class TurnSide:
    """One side's decisions in the turn-aligned rollout term.

    Shapes: `decisions` [Ds] (rows of the decision table), `units` [Ds] (the (episode, turn) unit of each,
    0..Us-1), `unit_groups` [Us] (the (pair, turn) group of each unit, 0..Gn-1, shared by both sides)."""

    decisions: torch.Tensor
    units: torch.Tensor
    unit_groups: torch.Tensor


@dataclass(frozen=True)
class TurnIndex:
    """Both sides over the Gn (pair, turn) groups both reached; `group_pairs` [Gn] the pair of each group
    (0..P-1), `group_turns` [Gn] its turn (0-based)."""

    canonical: TurnSide
    perturbed: TurnSide
    group_pairs: torch.Tensor
    group_turns: torch.Tensor


def turn_index(pair_ids: Sequence[int], sides: Sequence[str], sequence: Sequence[int], turns: Sequence[int],
               device: torch.device | str | None = None) -> tuple[TurnIndex | None, dict[str, float]]:
    """Index tensors of the turn-aligned rollout term (None when no (pair, turn) has decisions on both sides)
    and metrics {"pairs_skipped", "turns_skipped"}.

    `pair_ids`, `sides` [B]: each episode's pair and side; `sequence`, `turns` [D]: the episode (row b) and
    the turn of each decision, in decision-table order."""
    if len(pair_ids) != len(sides):
        raise ValueError(f"pair_ids and sides need one entry per episode, got {len(pair_ids)} and "
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
    groups = sorted(g for g, s in reached.items() if len(s) == 2)
    pairs_all = set(pair_ids)
    pairs_kept = sorted({p for p, _ in groups}, key=list(dict.fromkeys(pair_ids)).index)
    metrics = {"pairs_skipped": float(len(pairs_all) - len(pairs_kept)),
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
        out[name] = TurnSide(torch.tensor(dec, dtype=torch.long, device=device),
                             torch.tensor(seg, dtype=torch.long, device=device),
                             torch.tensor(unit_groups, dtype=torch.long, device=device))
    return TurnIndex(out["canonical"], out["perturbed"],
                     torch.tensor([pair_pos[p] for p, _ in groups], dtype=torch.long, device=device),
                     torch.tensor([k for _, k in groups], dtype=torch.long, device=device)), metrics


def turn_rollout_kl(p_canon: torch.Tensor, canon: TurnSide, p_pert: torch.Tensor, pert: TurnSide,
                    group_pairs: torch.Tensor, *, detach_reference: bool = True, eps: float = 1e-6
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """Turn-aligned rollout KL (module docstring): per (pair, turn) group KL(canonical avg || perturbed avg),
    the turns of a pair averaged, then the pairs.

    Shapes: p_canon [Dc, A], p_pert [Dp, A] (the sides' decisions, rows summing to 1, ∅ last); each side's
    `units` [Ds] and `unit_groups` [Us]; group_pairs [Gn]. Returns a scalar and metrics ("rollout/kl",
    "rollout/max" per group, "rollout/tv", "rollout/argmax_agree", "rollout/none_canon", "rollout/none_other",
    "rollout/groups", "rollout/pairs")."""
    if p_canon.shape[1:] != p_pert.shape[1:]:
        raise ValueError(f"the two sides need one action index set, got A={p_canon.shape[1]} and "
                         f"A={p_pert.shape[1]}")
    canon_avg, canon_ids = group_distribution(p_canon, canon.units, canon.unit_groups)
    pert_avg, pert_ids = group_distribution(p_pert, pert.units, pert.unit_groups)
    if not torch.equal(canon_ids.cpu(), pert_ids.cpu()):
        raise ValueError(f"the two sides have different groups: {canon_ids.tolist()} vs {pert_ids.tolist()}")
    ref = canon_avg.detach() if detach_reference else canon_avg
    per_group = kl_rows(ref, pert_avg, eps=eps)
    pair_of = group_pairs.to(per_group.device)[canon_ids.to(group_pairs.device)]
    pairs, inverse = torch.unique(pair_of, return_inverse=True)
    zeros = torch.zeros(len(pairs), dtype=per_group.dtype, device=per_group.device)
    sums = zeros.index_add(0, inverse, per_group)
    counts = zeros.index_add(0, inverse, torch.ones_like(per_group))
    value = (sums / counts).mean() if per_group.numel() else p_pert.sum() * 0.0
    a, b = canon_avg.detach(), pert_avg.detach()
    metrics = {"rollout/kl": float(value.detach()), "rollout/groups": float(per_group.numel()),
               "rollout/pairs": float(len(pairs)),
               "rollout/max": float(per_group.detach().max()) if per_group.numel() else 0.0,
               "rollout/tv": float(0.5 * (a - b).abs().sum(-1).mean()) if a.numel() else 0.0,
               "rollout/argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())
               if a.numel() else 0.0,
               "rollout/none_canon": float(a[:, -1].mean()) if a.numel() else 0.0,
               "rollout/none_other": float(b[:, -1].mean()) if b.numel() else 0.0}
    return value, metrics


@dataclass(frozen=True)
class RelabeledEpisode:
    """An episode with fresh neutral tool names: `prompt`, `response`, the new `tools` (declaration order),
    and `decisions` (offsets in the new response) corresponding one to one to the original's."""

    prompt: str
    response: str
    tools: tuple[str, ...]
    decisions: tuple[Decision, ...]


def relabel_episode(prompt: str, response: str, turn_spans: Sequence[tuple[int, int]], tools: Sequence[str],
                    fmt: CallFormat, config: RelabelConfig | None = None, *, seed: int) -> RelabeledEpisode:
    """(x̃, ỹ) of an episode: `cipr.method.relabel.relabel` turn by turn.

    `turn_spans`: the (start, end) character span in `response` of each assistant turn's text (ascending,
    disjoint); everything else (end tokens, observations, user turns, generation prompts) is context. Every
    whole-word occurrence of a tool name is renamed everywhere (prompt, turns and context, as `relabel`
    does), each turn's decisions are recomputed by the call format on its new text, shifted to the new
    response, and checked against the original's. ValueError when tools repeat a name or a turn's decisions
    do not correspond."""
    config = config or RelabelConfig()
    if len(set(tools)) != len(tools):
        raise ValueError("tool names repeat: relabeling needs one name per tool")
    rng = random.Random(seed)
    words = set(_words(prompt) | _words(response))
    names = fresh_names(tools, config, rng, words - set(tools))
    mapping = dict(zip(tools, names, strict=True))
    pieces: list[str] = []
    decisions: list[Decision] = []
    cursor = 0
    length = 0
    for t, (start, end) in enumerate(turn_spans):
        if start < cursor or end < start or end > len(response):
            raise ValueError(f"turn {t} span ({start}, {end}) is not ascending inside the response")
        context = rewrite_text(response[cursor:start], mapping, "all")
        turn = response[start:end]
        new_turn = rewrite_text(turn, mapping, "all")
        old, new = fmt.decisions(turn), fmt.decisions(new_turn)
        if len(old) != len(new):
            raise ValueError(f"relabeling changed turn {t}'s decisions: {len(old)} before, {len(new)} after")
        offset = length + len(context)
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            expected = mapping.get(a.taken, a.taken) if a.taken is not None else None
            if (a.opener, a.name_suffix, expected) != (b.opener, b.name_suffix, b.taken):
                raise ValueError(f"turn {t} decision {i} does not correspond after relabeling: {a} vs {b}")
            decisions.append(Decision(b.start + offset, b.opener, b.name_suffix, b.taken))
        pieces += [context, new_turn]
        length += len(context) + len(new_turn)
        cursor = end
    pieces.append(rewrite_text(response[cursor:], mapping, "all"))
    return RelabeledEpisode(rewrite_text(prompt, mapping, "all"), "".join(pieces), tuple(names),
                            tuple(decisions))


def _words(text: str) -> set[str]:
    import re

    return set(re.findall(r"\w+", text))
