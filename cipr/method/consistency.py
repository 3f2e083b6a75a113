"""CIPR's two consistency losses over action distributions (paper §3.3): pure functions over tensors.

Inputs are action distributions as `cipr.method.actions.read_actions` returns them: rows over one shared
index set of equivalence classes plus ∅ (A columns in all), each row summing to 1; a class one side
does not declare holds 0 there.

Choices the paper leaves open, as parameters with these defaults:
- `detach_reference=True`: the canonical side is the reference and gets no gradient from the
  consistency terms. The canonical interface is the one the adapter runs at inference, so it should
  move only under the task loss; the other side is pulled toward it (as in consistency training with
  a fixed clean branch). With `False`, both sides move, which also lets both drift together, e.g.
  onto ∅, the failure mode the paper reports.
- `direction="forward"`: KL(canonical || other), the canonical side as reference, as the paper states.
  It is finite whenever the other side gives positive mass wherever the canonical side does (true
  for the relabeled and the perturbed interface, which declare every canonical tool); mass the other
  side puts on a tool only it declares lowers its mass elsewhere and so raises the KL. `"reverse"`
  computes KL(other || canonical), which punishes one-sided mass directly but is infinite without
  smoothing.
- `eps=1e-6`: both distributions are smoothed as (p + eps) / (1 + A·eps) before the KL, so exact
  zeros (a one-sided class; π(∅) rounding to 0 when π(o) rounds to 1) give a large finite value, not
  inf or nan. `eps=0` computes the exact KL (0·log 0 = 0).
- Rescoring: each response's decisions are averaged first, then the responses, so a response with
  many parallel calls does not outweigh one with a single call (the paper's 1/n_y average).
- Rollout: a group's distribution is the mean over its G responses of each response's mean over its
  decisions, so every response counts once whatever its number of calls.

`mean_kl` is what training computes, through `cipr.method.objective` (`cipr.method.pairing` builds each
term's pairs). The two terms written as the paper states them, one call each, are in
tests/support/reference_kl.py: the reference the pairs + `mean_kl` are held equal to, bit for bit.
"""

from __future__ import annotations

from typing import Literal

import torch

Direction = Literal["forward", "reverse"]


def _smooth(p: torch.Tensor, eps: float) -> torch.Tensor:
    return (p + eps) / (1 + eps * p.shape[-1]) if eps > 0 else p


def renormalized(probs: torch.Tensor) -> torch.Tensor:
    """[D, A] distributions in float64, each row renormalized to sum to 1 (differentiable): float32 rows
    sum to 1 only within ~1e-7, which makes the KL of two nearly equal distributions slightly negative."""
    p = probs.double()
    return p / p.sum(-1, keepdim=True)


def kl_rows(reference: torch.Tensor, other: torch.Tensor, *, direction: Direction = "forward",
            eps: float = 1e-6) -> torch.Tensor:
    """Per-row KL of [N, A] distributions: KL(reference || other) ("forward") or KL(other || reference)."""
    if reference.shape != other.shape or reference.dim() != 2:
        raise ValueError(f"expected two [N, A] tensors of one shape, got {tuple(reference.shape)} and "
                         f"{tuple(other.shape)}")
    if direction not in ("forward", "reverse"):
        raise ValueError(f"direction must be 'forward' or 'reverse', got {direction!r}")
    p, q = _smooth(reference, eps), _smooth(other, eps)
    if direction == "reverse":
        p, q = q, p
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(dim=-1)


def segment_mean(values: torch.Tensor, segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of values [N, ...] per segment id; returns (means [S, ...], the sorted unique ids [S]). The one
    per-segment mean of every loss (consistency terms, distillation's action KL, the supervised action CE)."""
    ids, inverse = torch.unique(segments, return_inverse=True)
    sums = torch.zeros((len(ids), *values.shape[1:]), dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, inverse, values)
    counts = torch.zeros(len(ids), dtype=values.dtype, device=values.device).index_add(
        0, inverse, torch.ones_like(inverse, dtype=values.dtype))
    return sums / counts.view(-1, *([1] * (values.dim() - 1))), ids


def row_metrics(per_row: torch.Tensor, ref: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    """Diagnostics of paired rows: the largest per-row value, total variation, argmax agreement, ∅ mass."""
    per_row = per_row.detach()
    ref, other = ref.detach(), other.detach()
    return {"max": float(per_row.max()) if per_row.numel() else 0.0,
            "tv": float(0.5 * (ref - other).abs().sum(-1).mean()) if ref.numel() else 0.0,
            "argmax_agree": float((ref.argmax(-1) == other.argmax(-1)).float().mean())
            if ref.numel() else 0.0,
            "none_canon": float(ref[:, -1].mean()) if ref.numel() else 0.0,
            "none_other": float(other[:, -1].mean()) if other.numel() else 0.0}


def mean_kl(p_ref: torch.Tensor, p_other: torch.Tensor, segments: torch.Tensor, *,
            direction: Direction = "forward", eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """The consistency KL of paired rows: KL per row, averaged within each segment, then over segments.

    Shapes: p_ref, p_other [N, A] (row n of one side paired with row n of the other; ∅ last); segments [N]
    (long) the unit each row belongs to (a response's decisions, or a pair's groups). `p_ref` is used as
    given (detach it for a fixed reference). The built-in `rescore` and `rollout` terms of
    `cipr.method.objective`. Returns a scalar (a zero that keeps the graph when N = 0) and metrics "kl",
    "max" (per row), "tv", "argmax_agree", "none_canon", "none_other" (∅ mass of each side), "rows",
    "segments".
    """
    if p_ref.shape != p_other.shape or p_ref.dim() != 2 or segments.shape != p_ref.shape[:1]:
        raise ValueError(f"expected p_ref [N, A], p_other [N, A] and segments [N]; got {tuple(p_ref.shape)}, "
                         f"{tuple(p_other.shape)}, {tuple(segments.shape)}")
    per_row = kl_rows(p_ref, p_other, direction=direction, eps=eps)
    if per_row.numel() == 0:
        value, count = p_other.sum() * 0.0, 0
    else:
        per_segment, ids = segment_mean(per_row, segments)
        value, count = per_segment.mean(), len(ids)
    metrics = {"kl": float(value.detach()), "rows": float(per_row.numel()), "segments": float(count)}
    metrics.update(row_metrics(per_row, p_ref, p_other))
    return value, metrics


def group_distribution(probs: torch.Tensor, segments: torch.Tensor, groups: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Average action distribution per group: ([Gn, A], the sorted group ids [Gn]), from probs [D, A],
    segments [D] (the response of each decision, ids 0..R-1) and groups [R] (each response's group; None: one
    group, id 0): each response's decisions averaged, then the group's responses."""
    if segments.shape != probs.shape[:1]:
        raise ValueError(f"segments must be [D] = [{probs.shape[0]}], got {tuple(segments.shape)}")
    if groups is None:
        groups = torch.zeros(int(segments.max()) + 1 if segments.numel() else 0, dtype=torch.long,
                             device=probs.device)
    if segments.numel() and int(segments.max()) >= len(groups):
        raise ValueError(f"segment id {int(segments.max())} has no group (groups has {len(groups)} entries)")
    per_response, responses = segment_mean(probs, segments)
    return segment_mean(per_response, groups[responses])
