"""Power of the frontier study's design, from the dose study's committed records (the pre-registration's
numbers: docs/results/cpu_frontier_preregistration.md).

From `docs/results/cpu_dose_records.jsonl.gz` at step 40, for each λ > 0 against λ = 0 (paired by seed, the
same 64 items): the per-(seed, item) differences of held-in KL and of action accuracy (0/1 per item, in
points), split into a seed part, an item part and a residual (two-way random-effects ANOVA, method of
moments). Then, for a design of `--seeds` seeds and `--items` items:
- the per-seed SD of a difference, sd² = var(seed) + (var(item) + var(residual)) / items, and the smallest
  mean difference a paired t over the seeds detects with 80% power (`cipr.experiments.stats.detectable`);
- by simulation (`--sims` studies of Gaussian seed, item and residual effects with those variances), how
  often the pre-registered accuracy condition (the seed × item bootstrap's lower 95% end ≥ −`--margin`
  points) holds when the true difference is 0, −`--margin` and the dose study's λ = 3 estimate.

    python scripts/frontier_power.py                      # the pre-registration's table (about 2 min)
    python scripts/frontier_power.py --seeds 12 --sims 200

Prints a table; `--json FILE` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from cipr.core.io import read_jsonl_gz
from cipr.experiments.stats import detectable, two_way_bootstrap

ROOT = Path(__file__).resolve().parents[1]


def differences(records: list[dict], lam: float, metric: str, scale: float, step: int = 40) -> np.ndarray:
    """[seeds, items] of (λ − λ=0) for `metric` × `scale` at `step`."""
    values: dict[tuple[float, int, str], float] = {}
    for r in records:
        if int(r["step"]) == step and r.get(metric) is not None:
            values[(float(r["lambda"]), int(r["seed"]), r["id"])] = float(r[metric]) * scale
    seeds = sorted({s for (_, s, _) in values})
    items = sorted({i for (_, _, i) in values})
    return np.array([[values[(lam, s, i)] - values[(0.0, s, i)] for i in items] for s in seeds])


def components(d: np.ndarray) -> dict[str, float]:
    """Two-way random-effects variance components of `d` [S, I] (method of moments, floored at 0)."""
    s, i = d.shape
    grand = d.mean()
    rows, cols = d.mean(1), d.mean(0)
    ms_seed = i * ((rows - grand) ** 2).sum() / (s - 1)
    ms_item = s * ((cols - grand) ** 2).sum() / (i - 1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_resid = (resid ** 2).sum() / ((s - 1) * (i - 1))
    return {"mean": float(grand), "seed": max(float((ms_seed - ms_resid) / i), 0.0),
            "item": max(float((ms_item - ms_resid) / s), 0.0), "residual": float(ms_resid),
            "per_seed_sd": float(rows.std(ddof=1))}


def per_seed_sd(c: dict[str, float], items: int) -> float:
    return math.sqrt(c["seed"] + (c["item"] + c["residual"]) / items)


def pass_rate(c: dict[str, float], truth: float, margin: float, seeds: int, items: int, sims: int,
              draws: int, rng: np.random.Generator) -> float:
    """Share of simulated studies whose bootstrap lower 95% end of the accuracy difference is ≥ −margin."""
    hits = 0
    for k in range(sims):
        d = (truth + rng.normal(0, math.sqrt(c["seed"]), (seeds, 1))
             + rng.normal(0, math.sqrt(c["item"]), (1, items))
             + rng.normal(0, math.sqrt(c["residual"]), (seeds, items)))
        hits += two_way_bootstrap(d, draws=draws, seed=k)["low"] >= -margin
    return hits / sims


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", default=str(ROOT / "docs/results/cpu_dose_records.jsonl.gz"))
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--items", type=int, default=128)
    p.add_argument("--margin", type=float, default=5.0)
    p.add_argument("--sims", type=int, default=300)
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    records = read_jsonl_gz(args.records)
    out: dict[str, dict] = defaultdict(dict)
    rng = np.random.default_rng(0)
    print(f"design: {args.seeds} seeds x {args.items} items; detectable = 80% power, paired t, alpha 0.05")
    print("| lambda | measure | dose mean diff | dose per-seed SD | var seed / item / resid | "
          "predicted per-seed SD | detectable |")
    print("|---|---|---|---|---|---|---|")
    for lam in (1.0, 3.0, 10.0):
        for name, metric, scale in (("heldin_kl", "kl", 1.0), ("action_accuracy", "action_acc_ref", 100.0)):
            c = components(differences(records, lam, metric, scale))
            sd = per_seed_sd(c, args.items)
            mde = detectable(sd, args.seeds)
            out[f"{lam:g}"][name] = {**c, "predicted_sd": sd, "detectable": mde}
            print(f"| {lam:g} | {name} | {c['mean']:+.4f} | {c['per_seed_sd']:.4f} | {c['seed']:.4g} / "
                  f"{c['item']:.4g} / {c['residual']:.4g} | {sd:.4f} | {mde:.4f} |")
    c = out["3"]["action_accuracy"]
    print(f"\nthe accuracy condition (bootstrap lower 95% end >= -{args.margin:g} points) at lambda = 3's "
          f"variance, {args.sims} simulated studies:")
    rates = {}
    for truth in (0.0, -args.margin / 2, -args.margin, c["mean"]):
        rates[f"{truth:+.2f}"] = pass_rate(c, truth, args.margin, args.seeds, args.items, args.sims,
                                           args.draws, rng)
        print(f"  true difference {truth:+.2f} points: holds in {rates[f'{truth:+.2f}']:.0%}")
    out["pass_rate_lambda3"] = rates
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
