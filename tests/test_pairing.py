"""`cipr.method.pairing`: index tensors of the consistency terms, by hand and against a per-pair loop, and the
pairs built from an engine-neutral view of a batch (`Response`s), shapes stated in the module docstring."""

from __future__ import annotations

import random

import pytest
import torch
from support.reference_kl import rescoring_kl, rollout_kl

from cipr.formats import get_format
from cipr.method.consistency import kl_rows, mean_kl, renormalized
from cipr.method.pairing import (
    Response,
    build_rescore,
    build_rollout,
    pair_relabeled,
    relabeled,
    rollout_index,
    rows_by_response,
)
from cipr.method.relabel import RelabelConfig, Relabeling
from cipr.tools.interface import Call


def test_rollout_index_by_hand():
    # rows:      0    1    2    3    4    5    6
    pair_ids = [7, 7, 7, 3, 3, 9, 9]
    sides = ["perturbed", "canonical", "canonical", "canonical", "perturbed", "canonical", "perturbed"]
    sequence = [0, 1, 1, 2, 3, 4, 5]  # row 1 has two decisions, row 6 none: pair 9 has one side only
    index, metrics = rollout_index(pair_ids, sides, sequence, [0] * len(sequence))
    assert metrics == {"pairs_skipped": 1.0, "turns_skipped": 1.0}
    canon, pert = index.canonical, index.perturbed
    # pairs in order of first appearance: 7 -> group 0, 3 -> group 1
    assert index.group_pairs.tolist() == [0, 1] and index.group_turns.tolist() == [0, 0]
    assert canon.decisions.tolist() == [1, 2, 3, 4]
    assert canon.units.tolist() == [0, 0, 1, 2]
    assert canon.unit_groups.tolist() == [0, 0, 1]
    assert pert.decisions.tolist() == [0, 5]
    assert pert.units.tolist() == [0, 1]
    assert pert.unit_groups.tolist() == [0, 1]


def test_rollout_index_without_complete_pairs():
    index, metrics = rollout_index([1, 1, 2], ["canonical", "perturbed", "canonical"], [0, 2], [0, 0])
    assert index is None
    assert metrics == {"pairs_skipped": 2.0, "turns_skipped": 2.0}


def test_rollout_index_refuses_bad_input():
    with pytest.raises(ValueError, match="one entry per response"):
        rollout_index([1, 1], ["canonical"], [0, 1], [0, 0])
    with pytest.raises(ValueError, match="one entry per decision"):
        rollout_index([1], ["canonical"], [0, 0], [0])
    with pytest.raises(ValueError, match="'canonical' or 'perturbed'"):
        rollout_index([1], ["other"], [0], [0])


def test_rows_by_response():
    assert rows_by_response([0, 1, 1, 3], 4) == [(0,), (1, 2), (), (3,)]
    assert rows_by_response([], 2) == [(), ()]


def _loop_rollout_kl(probs: torch.Tensor, pair_ids: list[int], sides: list[str],
                     sequence: list[int]) -> float:
    """Rollout KL pair by pair: per side, mean over responses of each response's mean decision."""
    kls = []
    for pair in dict.fromkeys(pair_ids):
        means = {}
        for side in ("canonical", "perturbed"):
            responses = [probs[[d for d, b in enumerate(sequence) if b == row]].mean(0)
                         for row in range(len(pair_ids)) if pair_ids[row] == pair and sides[row] == side
                         and row in sequence]
            if responses:
                means[side] = torch.stack(responses).mean(0)
        if len(means) == 2:
            kls.append(kl_rows(means["canonical"][None], means["perturbed"][None])[0])
    return float(torch.stack(kls).mean())


@pytest.mark.parametrize("seed", range(5))
def test_rollout_index_matches_a_per_pair_loop(seed):
    rng = random.Random(seed)
    rows, actions = 24, 5
    pair_ids = [rng.randrange(6) for _ in range(rows)]
    sides = [rng.choice(["canonical", "perturbed"]) for _ in range(rows)]
    sequence = sorted(b for b in range(rows) for _ in range(rng.choice([0, 1, 1, 2, 3])))
    probs = torch.softmax(torch.randn(len(sequence), actions, generator=torch.Generator().manual_seed(seed),
                                      dtype=torch.float64), -1)
    index, metrics = rollout_index(pair_ids, sides, sequence, [0] * len(sequence))
    expected = _loop_rollout_kl(probs, pair_ids, sides, sequence)
    canon, pert = index.canonical, index.perturbed
    value, kl_metrics = rollout_kl(probs[canon.decisions], canon.units, probs[pert.decisions],
                                   pert.units, canon_groups=canon.unit_groups, pert_groups=pert.unit_groups)
    assert float(value) == pytest.approx(expected, rel=1e-9)
    assert metrics["pairs_skipped"] == len(set(pair_ids)) - kl_metrics["rollout/groups"]


FMT = get_format("hermes")
TOOLS = ("function_01", "function_02", "function_03")


def _response(b: int, pair: int, side: str, calls: list[str], start: int, draw: int = 0,
              targets: tuple[int, ...] | None = None) -> tuple[Response, int]:
    text = FMT.render_target([Call(n, {"arg_01": "x"}) for n in calls], response=None if calls else "No.")
    rows = tuple(range(start, start + len(FMT.decisions(text))))
    return Response(f"ex{pair}", pair, side, draw, f"<prompt {pair}> use {', '.join(TOOLS)}", text, TOOLS,
                    (0, 1, 2), rows, targets=targets), start + len(rows)


def _probs(rows: int, seed: int) -> torch.Tensor:
    noise = torch.randn(rows, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.softmax(noise, -1)


def _view() -> list[Response]:
    out, start = [], 0
    for b, (pair, side, calls, draw) in enumerate([(4, "canonical", ["function_02"], 0),
                                                   (4, "perturbed", ["function_01"], 0),
                                                   (4, "canonical", [], 1),
                                                   (8, "canonical", ["function_03", "function_01"], 0),
                                                   (8, "perturbed", [], 0)]):
        r, start = _response(b, pair, side, calls, start, draw)
        out.append(r)
    return out


def test_the_rescoring_pairs_of_a_view_are_each_canonical_decision_against_its_copy():
    view = _view()
    d = sum(len(r.rows) for r in view)
    probs = _probs(d, 0)
    relabeling = Relabeling(RelabelConfig(), 11)
    batch = relabeled(view, FMT, relabeling, step=3)
    assert batch.kept == [0, 2, 3] and batch.failures == 0  # the canonical responses, in order
    for i, q in zip(batch.kept, batch.queries, strict=True):
        assert len(q.decisions) == len(view[i].rows)
        assert all(new != old for new, old in zip(q.tools, TOOLS, strict=True))
    assert relabeled(view, FMT, relabeling, step=3) == batch  # seeded by (run seed, step, example, draw)
    assert relabeled(view, FMT, relabeling, step=4).queries[0].tools != batch.queries[0].tools
    other = _probs(sum(len(q.decisions) for q in batch.queries), 2)
    calls: list = []
    pairs, counts = build_rescore(view, probs, lambda qs: calls.append(qs) or other, FMT, relabeling, 3)
    assert calls == [batch.queries] and counts == {"consistency/relabel_failures": 0.0}
    rows = [d for i in batch.kept for d in view[i].rows]
    assert torch.equal(pairs.p_ref, renormalized(probs[rows]))
    assert torch.equal(pairs.p_other, renormalized(other))
    assert pairs.segments.tolist() == [0, 0, 1, 2, 2, 2] and pairs.targets is None  # N = 6 rows
    assert pairs.p_ref.shape == pairs.p_other.shape == (6, 4)
    expected, _ = rescoring_kl(renormalized(probs[rows]), renormalized(other), pairs.segments)
    assert torch.equal(mean_kl(pairs.p_ref, pairs.p_other, pairs.segments)[0], expected)


def test_targets_travel_with_their_decisions_and_unknown_ones_are_minus_one():
    view = _view()
    view[3] = Response(**{**view[3].__dict__, "targets": (2, 0, -1)})
    probs = torch.full((sum(len(r.rows) for r in view), 4), 0.25, dtype=torch.float64)
    batch = relabeled(view, FMT, Relabeling(RelabelConfig(), 0), 0)
    pairs = pair_relabeled(view, probs, batch, torch.full((6, 4), 0.25, dtype=torch.float64))
    assert pairs.targets.tolist() == [-1, -1, -1, 2, 0, -1]


def test_the_rollout_pairs_of_a_view_are_the_index_functions():
    view = _view()
    d = sum(len(r.rows) for r in view)
    probs = _probs(d, 1)
    pairs, counts = build_rollout(view, probs)
    sequence = [b for b, r in enumerate(view) for _ in r.rows]
    index, _ = rollout_index([r.pair for r in view], [r.side for r in view], sequence, [0] * len(sequence))
    c, p = index.canonical, index.perturbed
    exact = renormalized(probs)
    expected, _ = rollout_kl(exact[c.decisions], c.units, exact[p.decisions], p.units,
                             canon_groups=c.unit_groups, pert_groups=p.unit_groups)
    assert counts == {"consistency/pairs_skipped": 0.0} and pairs.segments.tolist() == [0, 1]
    assert torch.equal(mean_kl(pairs.p_ref.detach(), pairs.p_other, pairs.segments)[0], expected)
    turned = [Response(**{**r.__dict__, "turns": tuple(range(len(r.rows)))}) for r in view]
    by_turn, counts = build_rollout(turned, probs, by_turn=True)
    assert counts == {"consistency/pairs_skipped": 0.0, "consistency/turns_skipped": 2.0}
    assert by_turn.segments.tolist() == [0, 0, 1]  # (pair 4, turns 0 and 1), (pair 8, turn 0): both sides
