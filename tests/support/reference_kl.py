"""The two consistency KLs written as the paper states them (§3.3), one call each: the reference that
`cipr.method.pairing` + `cipr.method.consistency.mean_kl` (what training computes) are held equal to, bit for
bit (tests/test_objective.py), and a direct form for tests of the math."""

from __future__ import annotations

import torch

from cipr.method.consistency import Direction, group_distribution, kl_rows, row_metrics, segment_mean


def rescoring_kl(p_canon: torch.Tensor, p_relab: torch.Tensor, segments: torch.Tensor, *,
                 detach_reference: bool = True, direction: Direction = "forward", eps: float = 1e-6
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """Rescoring consistency KL: per decision, canonical vs relabeled, mean per response, then over responses.

    Shapes: p_canon, p_relab [D, A] (decision d of the canonical response and the same one of the relabeled; ∅
    last); segments [D] (long) the response of each decision. Returns a scalar (a zero that keeps the graph
    when there are no decisions) and metrics ("rescore/kl", "rescore/max" per decision, "rescore/tv",
    "rescore/argmax_agree", "rescore/none_canon", "rescore/none_other", "rescore/decisions",
    "rescore/responses").
    """
    if segments.shape != p_canon.shape[:1]:
        raise ValueError(f"segments must be [D] = [{p_canon.shape[0]}], got {tuple(segments.shape)}")
    ref = p_canon.detach() if detach_reference else p_canon
    per_decision = kl_rows(ref, p_relab, direction=direction, eps=eps)
    if per_decision.numel() == 0:
        value = p_relab.sum() * 0.0
        responses = 0
    else:
        per_response, ids = segment_mean(per_decision, segments)
        value = per_response.mean()
        responses = len(ids)
    metrics = {"rescore/kl": float(value.detach()), "rescore/decisions": float(per_decision.numel()),
               "rescore/responses": float(responses)}
    metrics.update({f"rescore/{k}": v for k, v in row_metrics(per_decision, p_canon, p_relab).items()})
    return value, metrics


def rollout_kl(p_canon: torch.Tensor, canon_segments: torch.Tensor, p_pert: torch.Tensor,
               pert_segments: torch.Tensor, *, canon_groups: torch.Tensor | None = None,
               pert_groups: torch.Tensor | None = None, detach_reference: bool = True,
               direction: Direction = "forward", eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """Rollout consistency KL: KL between the average action distributions of G responses to x and to x′.

    Shapes: p_canon [Dc, A], p_pert [Dp, A] (decisions of each side's responses, ∅ last, one index set);
    canon_segments [Dc] / pert_segments [Dp] the response of each decision; canon_groups [Rc] / pert_groups
    [Rp] the group (prompt) of each response, None for one group; both sides must have the same group ids. The
    KL of the group averages (`group_distribution`) is averaged over groups. Returns a scalar and metrics
    ("rollout/kl", "rollout/max" per group, "rollout/tv", "rollout/argmax_agree", "rollout/none_canon",
    "rollout/none_other", "rollout/groups").
    """
    if p_canon.shape[1:] != p_pert.shape[1:]:
        raise ValueError(f"the two sides need one action index set, got A={p_canon.shape[1]} and "
                         f"A={p_pert.shape[1]}")
    canon_avg, canon_ids = group_distribution(p_canon, canon_segments, canon_groups)
    pert_avg, pert_ids = group_distribution(p_pert, pert_segments, pert_groups)
    if not torch.equal(canon_ids.cpu(), pert_ids.cpu()):
        raise ValueError(f"the two sides have different groups: {canon_ids.tolist()} vs {pert_ids.tolist()}")
    ref = canon_avg.detach() if detach_reference else canon_avg
    per_group = kl_rows(ref, pert_avg, direction=direction, eps=eps)
    value = per_group.mean() if per_group.numel() else p_pert.sum() * 0.0
    metrics = {"rollout/kl": float(value.detach()), "rollout/groups": float(per_group.numel())}
    metrics.update({f"rollout/{k}": v for k, v in row_metrics(per_group, canon_avg, pert_avg).items()})
    return value, metrics
