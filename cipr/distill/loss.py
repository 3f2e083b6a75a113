"""The self-distillation loss (paper §4.3, Appendix A): pure functions returning (value, metrics).

The task loss is the KL from the teacher (released model, original names) to the student (canonical
names). The sides write action names with different tokens, so it is taken in two parts:

- `token_kl`: KL(teacher || student) of the next-token distributions at the positions that predict
  a token the alignment paired (`cipr.distill.alignment`): the shared text of the assistant turns.
- `action_kl`: KL(teacher || student) of the action distributions (`cipr.method.actions`) at each decision,
  actions indexed by equivalence (tool i under any name is class i, ∅ last), so `search` on the
  teacher side and `function_01` on the student side are one action.

`cipr.distill.batch.batch_loss` sums them as `w_token · token + w_action · action`
(`cipr.method.objective.weighted_sum`) and adds the consistency objective's terms (the rescoring KL, student
under canonical vs relabeled names).

Choices the paper leaves open:
- Direction: forward KL(teacher || student), the teacher as reference (the paper's "KL from the
  released model ... to the student"); the teacher has no gradient.
- Averaging: the token term is the mean over the batch's paired positions (as token-level SFT); the
  action term averages a trajectory's decisions first, then trajectories (the rescoring KL's 1/n_y),
  so long trajectories do not dominate.
- No temperature: the student matches the teacher's distributions as they are.
- Smoothing of the action distributions (`eps`) as in `cipr.method.consistency.kl_rows`; the token term is
  exact (both are softmaxes, never exactly zero).
"""

from __future__ import annotations

import torch

from cipr.method.consistency import kl_rows, segment_mean


def token_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, positions: float | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over P aligned positions of KL(softmax(teacher) || softmax(student)).

    Shapes: teacher_logits, student_logits [P, V]. Returns a scalar (a zero that keeps the graph when
    P = 0) and metrics `distill/token_kl` (the mean over these P), `distill/token_agree` (argmax equal),
    `distill/tokens`. `positions`: divide the sum by this instead of P (data parallel: see
    `cipr.train.distill`).
    """
    if teacher_logits.shape != student_logits.shape or teacher_logits.dim() != 2:
        raise ValueError(f"expected two [P, V] tensors of one shape, got {tuple(teacher_logits.shape)} and "
                         f"{tuple(student_logits.shape)}")
    if teacher_logits.shape[0] == 0:
        value = student_logits.sum() * 0.0
        return value, {"distill/token_kl": 0.0, "distill/token_agree": 0.0, "distill/tokens": 0.0}
    t = torch.log_softmax(teacher_logits.float(), dim=-1)
    s = torch.log_softmax(student_logits.float(), dim=-1)
    per_position = (t.exp() * (t - s)).sum(-1)
    mean = per_position.mean()
    value = mean if positions is None else per_position.sum() / positions
    agree = (teacher_logits.argmax(-1) == student_logits.argmax(-1)).float().mean()
    return value, {"distill/token_kl": float(mean.detach()), "distill/token_agree": float(agree),
                   "distill/tokens": float(teacher_logits.shape[0])}


def action_kl(p_teacher: torch.Tensor, p_student: torch.Tensor, segments: torch.Tensor, *, eps: float = 1e-6
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """KL(teacher || student) of action distributions: per decision, mean per trajectory, mean over
    trajectories.

    Shapes: p_teacher, p_student [D, A] (∅ last, rows sum to 1, one class index set); segments [D]
    (long) the trajectory of each decision. Returns a scalar (a zero that keeps the graph when D = 0)
    and metrics `distill/action_kl`, `distill/action_agree` (argmax equal), `distill/decisions`,
    `distill/none_teacher`, `distill/none_student` (mean π(∅)).
    """
    if segments.shape != p_teacher.shape[:1]:
        raise ValueError(f"segments must be [D] = [{p_teacher.shape[0]}], got {tuple(segments.shape)}")
    if p_teacher.shape[0] == 0:
        return p_student.sum() * 0.0, {"distill/action_kl": 0.0, "distill/action_agree": 0.0,
                                       "distill/decisions": 0.0, "distill/none_teacher": 0.0,
                                       "distill/none_student": 0.0}
    per_decision = kl_rows(p_teacher.detach(), p_student, eps=eps)
    value = segment_mean(per_decision, segments)[0].mean()
    t, s = p_teacher.detach(), p_student.detach()
    return value, {"distill/action_kl": float(value.detach()),
                   "distill/action_agree": float((t.argmax(-1) == s.argmax(-1)).float().mean()),
                   "distill/decisions": float(p_teacher.shape[0]),
                   "distill/none_teacher": float(t[:, -1].mean()),
                   "distill/none_student": float(s[:, -1].mean())}
