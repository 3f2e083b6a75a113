"""Every number of the transfer report, recomputed from its per-item records (pre-registered analysis).

Input: the records of `cipr.experiments.transfer` (one per point, item and perturbation type) and the run's
meta (design, timings). Output: cpu_transfer.json, cpu_transfer.md, cpu_transfer.png and the records as
cpu_transfer_records.jsonl.gz (gzip: 0.4 MB, not 5.6), from which `cipr-transfer report` recomputes the rest.

The analysis (docs/results/cpu_transfer_preregistration.md):
- per point, each quantity is a mean over items; arms are compared by the paired difference CIPR −
  multi-interface of those means per seed, tested over seeds (Student t, 95%): `paired_t`;
- primary endpoint: that difference for the primary type's KL(unperturbed ‖ perturbed), over all items;
  decision `shown` when the interval lies below 0, `bounded` when it lies above `BOUND`, else `inconclusive`;
- two-way: the mean of the per-(seed, item) differences with a bootstrap that resamples seeds and items
  independently (`two_way_bootstrap`); robust: per-seed means of log(KL + `LOG_EPS`) differences and per-seed
  `TRIM`-trimmed means of the per-item differences, each tested over seeds;
- the same paired t per split (near, hard), per type for KL and action-accuracy drop, the held-in type (P0,
  the positive control), and original action accuracy (P2: the interval's lower end above −5 points).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cipr.core.io import read_json, read_jsonl_gz, write_json_atomic, write_jsonl_gz, write_text_atomic
from cipr.experiments.stats import paired_t, two_way_bootstrap

BOUND = -0.03
LOG_EPS = 1e-3
TRIM = 0.1
P2_MARGIN = -5.0
ARMS = ("multi_interface", "cipr")


def decision(low: float, high: float, bound: float = BOUND) -> str:
    """`shown` (interval below 0), `bounded` (interval above `bound`), else `inconclusive`."""
    if high < 0:
        return "shown"
    if low > bound:
        return "bounded"
    return "inconclusive"


def matrix(records: Sequence[Mapping[str, Any]], metric: str, kind: str, split: str | None = None,
           transform: Any = None) -> tuple[list[int], list[str], dict[str, np.ndarray]]:
    """(seeds, item ids, arm -> [seeds, items]) of `metric` for perturbation type `kind` (split None: both),
    over the seeds and items every arm has; `transform` maps each value first."""
    values: dict[tuple[str, int, str], float] = {}
    for r in records:
        if r["perturbation"] == kind and (split is None or r["split"] == split) and r.get(metric) is not None:
            v = float(r[metric])
            values[(r["arm"], int(r["seed"]), r["id"])] = transform(v) if transform else v
    arms = sorted({a for a, _, _ in values}, key=lambda a: ARMS.index(a) if a in ARMS else 9)
    seeds = sorted(set.intersection(*[{s for a2, s, _ in values if a2 == a} for a in arms])) if arms else []
    items = sorted(set.intersection(*[{i for a2, _, i in values if a2 == a} for a in arms])) if arms else []
    items = [i for i in items if all((a, s, i) in values for a in arms for s in seeds)]
    return seeds, items, {a: np.array([[values[(a, s, i)] for i in items] for s in seeds]) for a in arms}


def _compare(records: Sequence[Mapping[str, Any]], metric: str, kind: str, split: str | None = None,
             scale: float = 1.0, transform: Any = None, per_seed: Any = None) -> dict[str, Any] | None:
    seeds, items, by_arm = matrix(records, metric, kind, split, transform)
    if set(by_arm) != set(ARMS) or len(seeds) < 2 or not items:
        return None
    summary = per_seed or (lambda m: m.mean(axis=1))
    diffs = (summary(by_arm["cipr"]) - summary(by_arm["multi_interface"])) * scale
    return {**paired_t(diffs), "per_seed": [float(x) for x in diffs], "items": len(items)}


def _drop(r: Mapping[str, Any]) -> Mapping[str, Any]:
    ok = r.get("action_acc_ref") is not None and r.get("action_acc_pert") is not None
    return {**r, "drop": float(r["action_acc_ref"]) - float(r["action_acc_pert"]) if ok else None}


def analyze(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """cpu_transfer.json: per arm the per-seed values, the paired comparisons and the decision."""
    from scipy import stats

    design = meta["design"]
    primary, heldin, types = design["primary"], design["heldin"], design["types"]
    records = [_drop(r) for r in records if "skipped" not in r]
    arms: dict[str, Any] = {}
    for arm in ARMS:
        seeds = sorted({int(r["seed"]) for r in records if r["arm"] == arm})
        if not seeds:
            continue

        def per_seed(metric: str, kind: str, split: str | None = None, scale: float = 1.0,
                     arm: str = arm, seeds: list[int] = seeds) -> list[float]:
            out = []
            for s in seeds:
                v = [float(r[metric]) for r in records if r["arm"] == arm and int(r["seed"]) == s
                     and r["perturbation"] == kind and (split is None or r["split"] == split)
                     and r.get(metric) is not None]
                out.append(math.fsum(v) / len(v) * scale if v else float("nan"))
            return out

        arms[arm] = {"seeds": seeds, "primary_kl": per_seed("kl", primary),
                     "original_accuracy": per_seed("action_acc_ref", primary, scale=100),
                     "kl": {t: per_seed("kl", t) for t in types},
                     "accuracy": {t: per_seed("action_acc_pert", t, scale=100) for t in types},
                     "accuracy_drop": {t: per_seed("drop", t, scale=100) for t in types},
                     "primary_kl_by_split": {s: per_seed("kl", primary, s) for s in ("near", "hard")}}
    seeds, items, by_arm = matrix(records, "kl", primary)
    out: dict[str, Any] = {"arms": arms, "n_items": len({r["id"] for r in records}),
                           "splits": {s: len(design["items"][s]) for s in design["items"]},
                           "design": design, "wall_s": meta.get("wall_s"), "timings": meta.get("timings", {})}
    primary_diff = _compare(records, "kl", primary)
    out["primary"] = primary_diff
    if primary_diff is None:
        out["decision"] = "incomplete: both arms need at least two common seeds"
        return out
    out["decision"] = decision(primary_diff["low"], primary_diff["high"])
    d = by_arm["cipr"] - by_arm["multi_interface"]
    out["two_way"] = two_way_bootstrap(d)
    out["robust"] = {
        "log_kl": _compare(records, "kl", primary, transform=lambda v: math.log(v + LOG_EPS)),
        "trimmed_mean": _compare(records, "kl", primary,
                                 per_seed=lambda m: np.array([stats.trim_mean(row, TRIM) for row in m]))}
    out["by_split"] = {s: _compare(records, "kl", primary, s) for s in ("near", "hard")}
    out["secondary"] = {
        "kl": {t: _compare(records, "kl", t) for t in types},
        "accuracy_drop": {t: _compare(records, "drop", t, scale=100) for t in types},
        "original_accuracy": _compare(records, "action_acc_ref", primary, scale=100)}
    p0 = out["secondary"]["kl"][heldin]
    p2 = out["secondary"]["original_accuracy"]
    out["outcome"] = {"P1_primary": out["decision"], "P0_shown": bool(p0 and p0["high"] < 0),
                      "P2_kept": bool(p2 and p2["low"] > P2_MARGIN)}
    out["share_of_top5"] = {a: _top5_share(by_arm[a]) for a in by_arm}
    out["sensitivity"] = leave_one_seed_out(primary_diff["per_seed"], [int(s) for s in seeds])
    return out


def leave_one_seed_out(diffs: Sequence[float], seeds: Sequence[int]) -> dict[str, Any]:
    """The primary endpoint without its most influential seed (the one whose difference lies farthest from
    the others' mean): that seed, its difference and the paired t over the rest. A reading aid: the
    pre-registered decision uses every seed."""
    x = np.asarray(diffs, dtype=float)
    if len(x) < 4:
        return {}
    rest_means = (x.sum() - x) / (len(x) - 1)
    k = int(np.argmax(np.abs(x - rest_means)))
    return {"seed": int(seeds[k]), "difference": float(x[k]),
            "without": paired_t([float(v) for j, v in enumerate(x) if j != k])}


def _top5_share(m: np.ndarray) -> list[float]:
    """Per seed, the share of the item sum its five largest KLs carry (the tail the robust variants
    address)."""
    return [float(np.sort(row)[-5:].sum() / row.sum()) if row.sum() > 0 else float("nan") for row in m]


def _fmt(c: Mapping[str, Any] | None, digits: int = 4) -> str:
    if not c:
        return "n/a"
    return f"{c['mean']:+.{digits}f} [{c['low']:+.{digits}f}, {c['high']:+.{digits}f}]"


def render(report: Mapping[str, Any]) -> str:
    """cpu_transfer.md: the result paragraph, the design in brief, the tables."""
    d = report["design"]
    p = report.get("primary")
    lines = ["# Transfer on CPU: CIPR against multi-interface training on held-out perturbations", "",
             "Pre-registration: [cpu_transfer_preregistration.md](cpu_transfer_preregistration.md) "
             "(committed before the run). Every number below is recomputed from "
             "`cpu_transfer_records.jsonl.gz` by `cipr-transfer report`. The earlier evidence run "
             "([cpu_evidence.md](cpu_evidence.md)) is the manipulation check it was: the held-in relabeling "
             "its term minimizes.", "", "## Result", ""]
    if p is None:
        lines += [f"Not complete: {report['decision']}.", ""]
        return "\n".join(lines) + "\n"
    rob = report["robust"]
    split = report["by_split"]
    sec = report["secondary"]
    verdicts = {"shown": "**Transfer is shown**", "inconclusive": "**Transfer is left open**",
                "bounded": f"**Bounded (one-sided): a transfer benefit larger than {abs(BOUND)} nats is "
                           f"ruled out**"}
    verdict = verdicts[report["decision"]]
    p0 = sec["kl"][d["heldin"]]
    control = bool(report.get("outcome", {}).get("P0_shown"))
    lines += [_control_sentence(d["heldin"], p0), ""] if not control else []
    lines += [
        f"{verdict} on the primary endpoint: CIPR − multi-interface in held-out `{d['primary']}` action "
        f"KL, mean over {p['items']} items per seed, paired over {p['n']} seeds: {_fmt(p)} nats "
        f"(95% t interval; decision rule: below 0 shown, above {BOUND} bounded). The two-way bootstrap "
        f"over seeds and items gives {_fmt(report['two_way'])}; the robust variants "
        f"{_fmt(rob['log_kl'], 3)} (log KL) and {_fmt(rob['trimmed_mean'])} (10% trimmed mean). "
        f"Near split {_fmt(split['near'])}, hard split {_fmt(split['hard'])}. "
        f"The positive control (held-in `{d['heldin']}` KL, P0): {_fmt(p0)}. "
        f"Original action accuracy, CIPR − multi-interface (P2): "
        f"{_fmt(sec['original_accuracy'], 1)} points.", ""]
    if report["decision"] == "bounded":
        lines += [f"\"Bounded\" is one-sided: the interval lies above {BOUND} nats, so a benefit of CIPR "
                  f"larger than {abs(BOUND)} nats is excluded, not harm: the upper end, "
                  f"{p['high']:+.4f} nats, allows CIPR to raise the held-out KL by that much.", ""]
    sens = report.get("sensitivity") or {}
    if sens:
        lines += [f"Sensitivity (not pre-registered, a reading aid): the most influential seed is seed "
                  f"{sens['seed']} ({sens['difference']:+.4f}); without it the primary difference is "
                  f"{_fmt(sens['without'])} over {sens['without']['n']} seeds.", ""]
    lines += [_what_would_change(report), ""]
    lines += ["## Per type (CIPR − multi-interface, paired over seeds)", "",
              "| type | items | KL difference (nats) | accuracy-drop difference (points) |",
              "|---|---|---|---|"]
    for t in d["types"]:
        kl, drop = sec["kl"][t], sec["accuracy_drop"][t]
        lines.append(f"| {t} | {kl['items'] if kl else 0} | {_fmt(kl)} | {_fmt(drop, 1)} |")
    lines += ["", "## Per arm (mean over seeds)", "",
              "| arm | seeds | original action acc. (%) | "
              + " | ".join(f"KL {t}" for t in d["types"]) + " |",
              "|---|---|---|" + "---|" * len(d["types"])]
    for arm, a in report["arms"].items():
        kls = " | ".join(f"{np.nanmean(a['kl'][t]):.4f}" for t in d["types"])
        lines.append(f"| {arm} | {len(a['seeds'])} | {np.nanmean(a['original_accuracy']):.1f} | {kls} |")
    lines += ["", "Per-seed differences of the primary endpoint: "
              + ", ".join(f"{x:+.4f}" for x in p["per_seed"]) + ".", "",
              "![CIPR − multi-interface per seed, by type and split](cpu_transfer.png)", ""]
    if report.get("wall_s"):
        lines.append(f"Work time: {report['wall_s']:.0f} s over {len(report['timings'])} points "
                     "(training and reading; the shared warm start is inside the first point's training "
                     "time).")
    return "\n".join(lines) + "\n"


def _control_sentence(heldin: str, p0: Mapping[str, Any] | None) -> str:
    """The qualifier the pre-registration (secondary analysis 5) puts first when P0 fails."""
    return (f"**The positive control did not hold**: held-in `{heldin}` KL, CIPR − multi-interface, "
            f"{_fmt(p0)} nats, an interval that does not lie below 0. As pre-registered, the manipulation "
            f"did not take hold at this design, so the primary endpoint below is not read as a test of "
            f"transfer: it neither shows nor rules out transfer of a term that works.")


def _what_would_change(report: Mapping[str, Any]) -> str:
    """One paragraph: what would change the conclusion, from the primary endpoint's own numbers."""
    p = report["primary"]
    half = (p["high"] - p["low"]) / 2
    needed = math.ceil((1.96 * p["sd"] / abs(p["mean"])) ** 2) if p["mean"] else None
    rob = report["robust"]
    agree = all(c and (c["high"] < 0) == (p["high"] < 0) for c in rob.values())
    text = (f"What would change it: the interval's half-width is {half:.4f} nats over {p['n']} seeds "
            f"(per-seed SD {p['sd']:.4f}); ")
    if report["decision"] == "shown":
        text += ("a replication whose interval reaches 0 would; so would a result carried by a few items, "
                 f"which the robust variants {'do not' if agree else 'do'} suggest.")
    elif report["decision"] == "bounded":
        text += (f"an effect smaller than {abs(BOUND)} nats is not excluded, and a larger model or longer "
                 "training could behave differently.")
    else:
        more = f"about {needed} seeds" if needed else "no number of seeds"
        narrow = math.ceil((2 * 1.96 * p["sd"] / abs(BOUND)) ** 2)
        text += (f"at this spread and mean, {more} would be needed for an interval that excludes 0 (and "
                 f"{narrow} for one narrow enough to bound the effect at {abs(BOUND)} nats).")
    return text


def plot(report: Mapping[str, Any], path: Path) -> None:
    """Per type and per split of the primary type: the per-seed differences (dots) and the t interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = report["design"]
    rows = [(t, report["secondary"]["kl"][t]) for t in d["types"]]
    rows += [(f"{d['primary']} ({s})", report["by_split"][s]) for s in ("near", "hard")]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.2))
    for k, (_, c) in enumerate(rows):
        if not c:
            continue
        ax.scatter(c["per_seed"], [k] * len(c["per_seed"]), s=12, alpha=0.6, color="tab:blue")
        ax.errorbar(c["mean"], k, xerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]], fmt="o",
                    color="black", capsize=3)
    ax.axvline(0, color="gray", lw=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("CIPR − multi-interface action KL (nats); dots: seeds, bars: 95% t interval")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


RECORDS = "cpu_transfer_records.jsonl.gz"
"""The per-item records, gzip-compressed JSON lines (the report's only input)."""


def write_report(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Write cpu_transfer.json, .md, .png and the records into `out`; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = analyze(records, meta)
    write_jsonl_gz(out / RECORDS, sorted(records, key=lambda r: (r["arm"], int(r["seed"]), r["split"],
                                                                 r["id"], r["perturbation"])))
    write_json_atomic(out / "cpu_transfer.json", {**report, "meta": dict(meta)})
    write_text_atomic(out / "cpu_transfer.md", render(report))
    if report.get("primary"):
        plot(report, out / "cpu_transfer.png")
    return report


def recompute(report_dir: Path, name: str = "cpu_transfer") -> dict[str, Any]:
    """Every number again from `report_dir`'s records and the meta its JSON recorded."""
    meta = read_json(report_dir / "cpu_transfer.json")["meta"]
    return write_report(read_jsonl_gz(report_dir / RECORDS), meta, report_dir)


def study_report(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The report of a transfer run by the study engine (configs/study/cpu_transfer.yaml), in this analysis'
    design (its arms, types, primary and held-in types, items by split); traces are not part of it."""
    spec = meta["spec"]
    items = spec["items"]
    design = {"arms": list(spec["arms"]), "seeds": list(spec["seeds"]),
              "rescore_weight": spec["labels"]["cipr"]["rescore_weight"],
              "types": [*items["also"], items["perturbation"], *items["secondary"]],
              "primary": items["also"][0],
              "heldin": items["perturbation"], "items": meta["items_by_split"],
              "secondary_items": items["secondary_items"], "eval_seed": items["seed"],
              "perturbation_seed": items["perturbation_seed"], "sweep": spec["base"][0].split("=", 1)[1],
              "train": {}}
    timings = {label: {k: v for k, v in t.items() if k in ("train_s", "eval_s", "reads")}
               for label, t in meta["timings"].items()}
    return write_report(records, {"design": design, "timings": timings, "wall_s": meta["wall_s"]}, out)
