"""Self-distillation loss terms: hand-computed values, loop vs vectorized, shapes, gradients."""

import math

import pytest
import torch

from cipr.distill.loss import action_kl, token_kl
from cipr.method.consistency import kl_rows


def test_token_kl_hand_computed():
    t = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    s = torch.log(torch.tensor([[0.25, 0.75], [0.9, 0.1]]))
    value, m = token_kl(t, s)
    expected = (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75) + 0.0) / 2
    assert value.item() == pytest.approx(expected, abs=1e-6)
    assert m["distill/tokens"] == 2.0 and m["distill/token_agree"] == 0.5


def test_token_kl_is_zero_for_equal_logits_and_keeps_the_graph_when_empty():
    x = torch.randn(3, 11)
    assert token_kl(x, x.clone())[0].item() == pytest.approx(0.0, abs=1e-6)
    s = torch.zeros(0, 5, requires_grad=True)
    value, m = token_kl(torch.zeros(0, 5), s)
    value.backward()
    assert value.item() == 0.0 and m["distill/tokens"] == 0.0 and s.grad is not None


def test_token_kl_gradient_moves_student_toward_teacher():
    t = torch.tensor([[2.0, 0.0, -1.0]])
    s = torch.zeros(1, 3, requires_grad=True)
    token_kl(t, s)[0].backward()
    # d KL / d s = softmax(s) - softmax(t): negative where the teacher has more mass
    assert torch.allclose(s.grad, torch.softmax(s.detach(), -1) - torch.softmax(t, -1), atol=1e-6)


def test_action_kl_averages_per_trajectory_then_over_trajectories():
    p_t = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.2, 0.6]])
    p_s = torch.tensor([[0.25, 0.75, 0.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6]])
    seg = torch.tensor([0, 0, 1])
    value, m = action_kl(p_t, p_s, seg, eps=0.0)
    d0 = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    d1 = math.log(2)
    assert value.item() == pytest.approx(((d0 + d1) / 2 + 0.0) / 2, abs=1e-6)
    assert m["distill/decisions"] == 3.0 and m["distill/action_agree"] == pytest.approx(2 / 3)
    assert m["distill/none_teacher"] == pytest.approx(0.2)


def test_action_kl_loop_equals_vectorized():
    torch.manual_seed(0)
    p_t = torch.softmax(torch.randn(9, 4), -1)
    p_s = torch.softmax(torch.randn(9, 4), -1)
    seg = torch.tensor([0, 0, 0, 2, 2, 5, 5, 5, 5])
    value, _ = action_kl(p_t, p_s, seg)
    per = [kl_rows(p_t[seg == k], p_s[seg == k]).mean() for k in (0, 2, 5)]
    assert value.item() == pytest.approx(torch.stack(per).mean().item(), abs=1e-6)


def test_action_kl_teacher_gets_no_gradient_and_shapes_are_checked():
    p_t = torch.softmax(torch.randn(2, 3), -1).requires_grad_(True)
    p_s = torch.softmax(torch.randn(2, 3), -1).requires_grad_(True)
    action_kl(p_t, p_s, torch.tensor([0, 1]))[0].backward()
    assert p_t.grad is None and p_s.grad is not None
    with pytest.raises(ValueError, match="segments must be"):
        action_kl(p_t, p_s, torch.tensor([0]))
    with pytest.raises(ValueError, match="one shape"):
        token_kl(torch.zeros(2, 3), torch.zeros(2, 4))
