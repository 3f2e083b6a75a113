"""`cipr.method.pairing`: index tensors of the consistency terms, by hand and against a per-pair loop."""

from __future__ import annotations

import random

import pytest
import torch

from cipr.method.consistency import kl_rows, rollout_kl
from cipr.method.pairing import decision_rows, rollout_index


def test_rollout_index_by_hand():
    # rows:      0    1    2    3    4    5    6
    pair_ids = [7, 7, 7, 3, 3, 9, 9]
    sides = ["perturbed", "canonical", "canonical", "canonical", "perturbed", "canonical", "perturbed"]
    decided = [True, True, True, True, True, True, False]  # pair 9's perturbed side has no decision
    sequence = [0, 1, 1, 2, 3, 4, 5]  # row 1 has two decisions, row 6 none
    index, metrics = rollout_index(pair_ids, sides, decided, sequence)
    assert metrics == {"pairs_skipped": 1.0}
    canon, pert = index.canonical, index.perturbed
    # pairs in order of first appearance: 7 -> group 0, 3 -> group 1
    assert canon.rows == [1, 2, 3]
    assert canon.decisions.tolist() == [1, 2, 3, 4]
    assert canon.segments.tolist() == [0, 0, 1, 2]
    assert canon.groups.tolist() == [0, 0, 1]
    assert pert.rows == [0, 4]
    assert pert.decisions.tolist() == [0, 5]
    assert pert.segments.tolist() == [0, 1]
    assert pert.groups.tolist() == [0, 1]


def test_rollout_index_without_complete_pairs():
    index, metrics = rollout_index([1, 1, 2], ["canonical", "perturbed", "canonical"], [True, False, True],
                                   [0, 2])
    assert index is None
    assert metrics == {"pairs_skipped": 2.0}


def test_rollout_index_refuses_bad_input():
    with pytest.raises(ValueError, match="one entry per response"):
        rollout_index([1, 1], ["canonical"], [True, True], [0, 1])
    with pytest.raises(ValueError, match="'canonical' or 'perturbed'"):
        rollout_index([1], ["other"], [True], [0])


def test_decision_rows():
    assert decision_rows([2, 0], [0, 1, 1, 2, 2, 3]).tolist() == [0, 3, 4]
    assert decision_rows([], [0, 1]).tolist() == []
    assert decision_rows([5], [0, 1]).dtype == torch.long


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
    decided = [b in sequence for b in range(rows)]
    probs = torch.softmax(torch.randn(len(sequence), actions, generator=torch.Generator().manual_seed(seed),
                                      dtype=torch.float64), -1)
    index, metrics = rollout_index(pair_ids, sides, decided, sequence)
    expected = _loop_rollout_kl(probs, pair_ids, sides, sequence)
    canon, pert = index.canonical, index.perturbed
    value, kl_metrics = rollout_kl(probs[canon.decisions], canon.segments, probs[pert.decisions],
                                   pert.segments, canon_groups=canon.groups, pert_groups=pert.groups)
    assert float(value) == pytest.approx(expected, rel=1e-9)
    assert metrics["pairs_skipped"] == len(set(pair_ids)) - kl_metrics["rollout/groups"]
