"""Rescoring and rollout consistency KLs: hand-computed values, zeros, gradient signs, shapes, one-sided
mass."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reference_kl import rescoring_kl, rollout_kl

from cipr.method.consistency import group_distribution, kl_rows, segment_mean

T = torch.tensor


def test_kl_rows_hand_computed():
    p, q = T([[0.5, 0.5]]), T([[0.25, 0.75]])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.143841
    assert kl_rows(p, q, eps=0)[0].item() == pytest.approx(expected, abs=1e-7)
    reverse = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)  # 0.130812
    assert kl_rows(p, q, eps=0, direction="reverse")[0].item() == pytest.approx(reverse, abs=1e-7)
    assert kl_rows(T([[1.0, 0.0]]), T([[0.5, 0.5]]), eps=0)[0].item() == pytest.approx(math.log(2), abs=1e-7)


def test_rescoring_means_decisions_per_response_then_responses():
    # response 0: two decisions (KL 0.143841 and 0); response 1: one decision (KL ln 2)
    p = T([[0.5, 0.5], [0.2, 0.8], [1.0, 0.0]])
    q = T([[0.25, 0.75], [0.2, 0.8], [0.5, 0.5]])
    value, metrics = rescoring_kl(p, q, T([0, 0, 1]), eps=0)
    kl0 = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    assert value.item() == pytest.approx(((kl0 + 0) / 2 + math.log(2)) / 2, abs=1e-6)
    assert metrics["rescore/decisions"] == 3 and metrics["rescore/responses"] == 2
    assert metrics["rescore/max"] == pytest.approx(math.log(2), abs=1e-6)
    assert value.shape == ()


def test_zero_when_identical():
    p = torch.softmax(torch.randn(5, 4, generator=torch.Generator().manual_seed(0)), -1)
    assert rescoring_kl(p, p.clone(), T([0, 0, 1, 2, 2]))[0].item() == pytest.approx(0, abs=1e-7)
    assert rollout_kl(p, T([0, 0, 1, 2, 2]), p.clone(), T([0, 0, 1, 2, 2]))[0].item() == \
        pytest.approx(0, abs=1e-7)


def test_one_sided_mass_counts_as_disagreement():
    # classes (tool a, tool b, twin of a, ∅); the canonical side does not declare the twin
    canon = T([[0.5, 0.5, 0.0, 0.0]])
    relab = T([[0.25, 0.25, 0.5, 0.0]])
    value, _ = rescoring_kl(canon, relab, T([0]), eps=0)
    assert value.item() == pytest.approx(math.log(2), abs=1e-6)
    rev, _ = rescoring_kl(canon, relab, T([0]), direction="reverse", eps=1e-6)
    assert math.isfinite(rev.item()) and rev.item() > 5  # smoothed: large but finite


def test_gradient_signs_and_detach():
    canon_logits = T([[2.0, 0.0, -1.0]], requires_grad=True)
    other_logits = T([[0.0, 0.0, 0.0]], requires_grad=True)
    value, _ = rescoring_kl(torch.softmax(canon_logits, -1), torch.softmax(other_logits, -1), T([0]))
    value.backward()
    assert value.item() > 0
    assert canon_logits.grad is None or torch.all(canon_logits.grad == 0)  # reference detached
    g = other_logits.grad[0]
    # d KL(p || softmax(z)) / dz = softmax(z) - p (up to smoothing): raise the canonical favorite, lower the
    # rest
    p = torch.softmax(canon_logits.detach(), -1)[0]
    assert g[0] < 0 and g[1] > 0 and g[2] > 0
    assert torch.allclose(g, torch.full((3,), 1 / 3) - p, atol=1e-4)

    canon_logits.grad = None
    value, _ = rescoring_kl(torch.softmax(canon_logits, -1), torch.softmax(other_logits.detach(), -1), T([0]),
                            detach_reference=False)
    value.backward()
    assert canon_logits.grad.abs().sum() > 0


def test_rollout_group_average_hand_computed():
    # canonical group: response 0 decisions [a, ∅] -> mean (0.5, 0, 0.5); response 1 [b] -> (0, 1, 0)
    canon = T([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]])
    canon_seg = T([0, 0, 1])
    # perturbed group: one response, one decision
    pert = T([[0.5, 0.25, 0.25]])
    avg, ids = group_distribution(canon, canon_seg)
    assert torch.allclose(avg, T([[0.25, 0.5, 0.25]])) and ids.tolist() == [0]
    value, metrics = rollout_kl(canon, canon_seg, pert, T([0]), eps=0)
    expected = 0.25 * math.log(0.25 / 0.5) + 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(1.0)
    assert value.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["rollout/groups"] == 1


def test_rollout_several_groups_and_shapes():
    canon = torch.softmax(torch.randn(6, 4, generator=torch.Generator().manual_seed(1)), -1)
    pert = torch.softmax(torch.randn(5, 4, generator=torch.Generator().manual_seed(2)), -1)
    canon_seg, pert_seg = T([0, 0, 1, 2, 3, 3]), T([0, 1, 2, 2, 3])
    groups = T([0, 0, 1, 1])
    value, _ = rollout_kl(canon, canon_seg, pert, pert_seg, canon_groups=groups, pert_groups=groups)
    per_group = []
    for r in ([0, 1], [2, 3]):
        c, p = torch.isin(canon_seg, T(r)), torch.isin(pert_seg, T(r))
        per_group.append(rollout_kl(canon[c], canon_seg[c] - r[0], pert[p], pert_seg[p] - r[0])[0])
    assert value.item() == pytest.approx(sum(v.item() for v in per_group) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="different groups"):
        rollout_kl(canon, canon_seg, pert, pert_seg, canon_groups=groups, pert_groups=T([0, 0, 2, 2]))
    with pytest.raises(ValueError, match="index set"):
        rollout_kl(canon, canon_seg, pert[:, :3], pert_seg)
    with pytest.raises(ValueError, match="segments"):
        rescoring_kl(canon, canon, T([0, 1]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(2, 6), st.integers(0, 10_000))
def test_loop_equals_vectorized(decisions, actions, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(decisions, actions, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(decisions, actions, generator=g) * 3, -1)
    seg = torch.randint(0, 3, (decisions,), generator=g)
    value, _ = rescoring_kl(p, q, seg, eps=0)
    per_response = {}
    for d in range(decisions):
        kl = sum(p[d, a] * math.log(p[d, a] / q[d, a]) for a in range(actions))
        per_response.setdefault(int(seg[d]), []).append(float(kl))
    expected = sum(sum(v) / len(v) for v in per_response.values()) / len(per_response)
    assert value.item() == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert value.item() >= -1e-6


def test_segment_mean_by_hand_rows_and_vectors():
    """The one per-segment mean: values [N] or [N, A], segments [N] -> (means [S] or [S, A], ids [S])."""
    means, ids = segment_mean(T([1.0, 3.0, 5.0, 10.0]), T([4, 4, 9, 2]))
    assert ids.tolist() == [2, 4, 9] and means.tolist() == [10.0, 2.0, 5.0]
    rows, ids = segment_mean(T([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]), T([1, 1, 0]))
    assert rows.shape == (2, 2) and rows.tolist() == [[0.5, 0.5], [0.5, 0.5]] and ids.tolist() == [0, 1]
