"""The frontier study's consistency-term designs (docs/results/cpu_frontier_preregistration.md), written as a
researcher writes a term of their own: outside the package, through the documented contract of
docs/extending.md (`fn(p_ref, p_other, segments, **options) -> (scalar tensor, dict of floats)`, plus the
context parameters `step`, `max_steps`, `targets` a term may declare).

Both are today's rescoring KL (`cipr.method.consistency.mean_kl`: KL(canonical ‖ relabeled) per decision,
averaged per response, then over responses; the canonical side arrives detached) with one change each:

- `gated_kl`: a correctness gate (FixMatch's "apply the consistency loss only where the clean side is
  right"): a decision whose reference action is known and is not the canonical side's most likely action adds
  nothing; every other decision counts as in `mean_kl` (the divisor is unchanged, so the gate removes the
  wrong decisions' pull without raising the others' weight).
- `ramped_kl`: a linear warm-up of the weight (a schedule): the KL times min(1, (step + 1) / (warmup ·
  max_steps)), so the term starts near 0 while the canonical side is least accurate and is at full weight
  from `warmup` of the run on.

Run with `PYTHONPATH=studies` (the study spec `configs/study/frontier.yaml` adds the folder itself).
"""

from __future__ import annotations

import torch

from cipr.method.consistency import mean_kl


def gated_kl(p_ref: torch.Tensor, p_other: torch.Tensor, segments: torch.Tensor, *, targets: torch.Tensor,
             eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """KL(p_ref ‖ p_other) per row, zero on the rows whose known reference action (targets ≥ 0) is not
    p_ref's argmax, averaged per segment and then over segments (shapes: p_ref, p_other [N, A]; segments,
    targets [N]). Metrics: `kl` (the ungated mean KL), `kept` (share of rows that count)."""
    keep = (targets < 0) | (p_ref.argmax(-1) == targets)
    full, metrics = mean_kl(p_ref, p_other, segments, eps=eps)
    gated, _ = mean_kl(p_ref, torch.where(keep[:, None], p_other, p_ref), segments, eps=eps)
    return gated, {"kl": float(full.detach()), "kept": float(keep.double().mean()) if len(keep) else 0.0,
                   "gated": float(gated.detach())}


def ramped_kl(p_ref: torch.Tensor, p_other: torch.Tensor, segments: torch.Tensor, *, step: int,
              max_steps: int, warmup: float = 0.5, eps: float = 1e-6
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """mean_kl times min(1, (step + 1) / (warmup · max_steps)) (step 0-based; max_steps ≤ 0: full weight).
    Metrics: `kl` (the unscaled KL), `scale`."""
    value, _ = mean_kl(p_ref, p_other, segments, eps=eps)
    span = warmup * max_steps
    scale = min(1.0, (step + 1) / span) if span > 0 else 1.0
    return value * scale, {"kl": float(value.detach()), "scale": scale}
