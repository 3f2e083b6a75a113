"""CIPR's consistency terms on multi-turn episodes: the turn-aligned index of the rollout term and the episode
relabeling (the KLs themselves are `cipr.method.objective`'s: `rollout_pairs` over the index built here).

An episode (`cipr.train.episodes`) is one response in the single-turn terms' sense: its text is every
assistant turn with the observations between them, and its decisions are those of every turn (the call
format's `decisions` of each turn's text, at their offsets in the episode's text). So the action reader
reads every decision on the multi-turn context in one pass, and the rescoring term sees one segment per
episode.

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
