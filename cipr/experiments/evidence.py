"""The evidence experiment's analysis (docs/results/cpu_evidence.md; spec: configs/study/cpu_evidence.yaml).

Baseline, multi-interface and CIPR in the supervised regime, each trained with every seed from one shared
warm start by the study engine, then evaluated by two cipr-eval runs on its final weights: `consistency`
(`generate=false consistency.enabled=true`: the teacher-forced reference under the held-in and held-out
types) and `generation` (calls generated on the original interface). What is measured (every quantity on
evaluation items never trained on: the synthetic test split drops items equal to a training item generated
with the same options):
- `original_accuracy`: action accuracy on the unperturbed interface: the most likely action at the
  reference decision is the reference tool (`action_acc_ref` of the consistency metric), under the
  names the arm is deployed with (baseline: original names; multi-interface and CIPR: canonical).
- `heldin_kl`: KL(unperturbed ‖ relabeled) at the reference decisions, the relabeled copy giving every
  tool a fresh `function_XX` id after the adapter (`relabel_function`): what CIPR's rescoring term
  compares, on new items. The positive control. `heldin_kl_unseen`: the same past the first `looked_at`.
- `heldout_kl` / `heldout_accuracy` per held-out type: KL and the perturbed side's action accuracy.
- `full_call_accuracy`: the runner's accuracy of generated calls (name and arguments) on the original
  interface.
Each is a mean over items per seed; arms are summarized by the mean over seeds with a Student-t 95%
interval, and CIPR − multi-interface by the paired (same seed: same data order) differences.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cipr.core.io import read_json, write_json_atomic, write_text_atomic
from cipr.eval.stats import mean_estimate


def point_metrics(records: Sequence[Mapping[str, Any]], types: Sequence[str], heldin: str, looked_at: int
                  ) -> dict[str, Any]:
    """One point's per-item means from its `consistency` and `generation` evaluation records."""
    per_type: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    original: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["evaluation"] != "consistency" or r["kind"] != "consistency" or "skipped" in r:
            continue
        for m in ("kl", "action_acc_pert"):
            if r.get(m) is not None:
                per_type[r["perturbation"]][m][r["id"]].append(float(r[m]))
        if r.get("action_acc_ref") is not None:
            original[r["id"]].append(float(r["action_acc_ref"]))

    def mean_over_items(values: Mapping[str, list[float]], skip: int = 0) -> float:
        items = [math.fsum(v) / len(v) for v in list(values.values())[skip:]]
        return math.fsum(items) / len(items) if items else float("nan")

    scores = [float(r["correct"]) for r in records if r["evaluation"] == "generation"
              and r["kind"] == "result" and r["perturbation"] == "original"]
    return {
        "original_accuracy": mean_over_items(original),
        "kl": {t: mean_over_items(per_type[t]["kl"]) for t in types},
        "heldin_kl_unseen": mean_over_items(per_type[heldin]["kl"], skip=looked_at),
        "accuracy": {t: mean_over_items(per_type[t]["action_acc_pert"]) for t in types},
        "items": len(original),
        "full_call_accuracy": math.fsum(scores) / len(scores) if scores else None,
    }


def _ci(values: Sequence[float]) -> dict[str, Any]:
    est = mean_estimate([v for v in values if v is not None and not math.isnan(v)], method="t")
    return {"mean": est.value, "low": est.low, "high": est.high, "n": est.n}


def build_report(types: Sequence[str], heldin: str, metrics: Mapping[str, Mapping[int, Mapping[str, Any]]],
                 predictions: Mapping[str, str]) -> dict[str, Any]:
    """cpu_evidence.json: per arm the per-seed values, their mean and 95% t interval; paired CIPR − MI."""
    heldout = [t for t in types if t != heldin]
    arms: dict[str, Any] = {}
    for arm, by_seed in metrics.items():
        seeds = sorted(by_seed)
        m = [by_seed[s] for s in seeds]
        arms[arm] = {
            "seeds": seeds,
            "original_accuracy": [x["original_accuracy"] for x in m],
            "heldin_kl": [x["kl"][heldin] for x in m],
            "heldin_kl_unseen": [x["heldin_kl_unseen"] for x in m],
            "heldout_kl": {t: [x["kl"][t] for x in m] for t in heldout},
            "heldout_accuracy": {t: [x["accuracy"][t] for x in m] for t in heldout},
            "heldin_accuracy": [x["accuracy"][heldin] for x in m],
            "full_call_accuracy": [x["full_call_accuracy"] for x in m],
            "items": [x["items"] for x in m],
        }
        a = arms[arm]
        a["summary"] = {"original_accuracy": _ci(a["original_accuracy"]), "heldin_kl": _ci(a["heldin_kl"]),
                        "full_call_accuracy": _ci(a["full_call_accuracy"]),
                        "heldout_kl": {t: _ci(v) for t, v in a["heldout_kl"].items()},
                        "heldout_accuracy_drop": {t: _ci([o - p for o, p in zip(a["original_accuracy"], v,
                                                                               strict=True)])
                                                  for t, v in a["heldout_accuracy"].items()}}
    report: dict[str, Any] = {"arms": arms, "predictions": dict(predictions),
                              "heldin_type": heldin, "heldout_types": heldout}
    if "cipr" in metrics and "multi_interface" in metrics:
        report["paired"] = paired(arms["cipr"], arms["multi_interface"], heldout)
        report["outcome"] = outcome(report["paired"], heldout)
    if "multi_interface" in metrics:  # a λ sweep's points, judged by the same rules (not the predictions)
        report["paired_sweep"] = {a: paired(arms[a], arms["multi_interface"], heldout) for a in arms
                                  if a.startswith("cipr_")}
        report["outcome_sweep"] = {a: outcome(p, heldout) for a, p in report["paired_sweep"].items()}
    return report


def paired(cipr: Mapping[str, Any], mi: Mapping[str, Any], heldout: Sequence[str]) -> dict[str, Any]:
    """CIPR − multi-interface per seed (the seeds both have) and their 95% t interval."""
    common = [s for s in cipr["seeds"] if s in mi["seeds"]]

    def diff(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
        va, vb = dict(zip(cipr["seeds"], a, strict=True)), dict(zip(mi["seeds"], b, strict=True))
        per_seed = [va[s] - vb[s] for s in common]
        return {"per_seed": per_seed, **_ci(per_seed)}

    def drop(arm: Mapping[str, Any], t: str) -> list[float]:
        return [o - p for o, p in zip(arm["original_accuracy"], arm["heldout_accuracy"][t], strict=True)]

    return {"seeds": common,
            "heldin_kl": diff(cipr["heldin_kl"], mi["heldin_kl"]),
            "heldin_kl_unseen": diff(cipr["heldin_kl_unseen"], mi["heldin_kl_unseen"]),
            "original_accuracy": diff(cipr["original_accuracy"], mi["original_accuracy"]),
            "heldout_kl": {t: diff(cipr["heldout_kl"][t], mi["heldout_kl"][t]) for t in heldout},
            "heldout_accuracy_drop": {t: diff(drop(cipr, t), drop(mi, t)) for t in heldout}}


def outcome(p: Mapping[str, Any], heldout: Sequence[str]) -> dict[str, Any]:
    """The predictions' verdicts, by the rules the report states before the run."""
    below = {t: p["heldout_kl"][t]["high"] < 0 for t in heldout}
    return {"P0": bool(p["heldin_kl"]["high"] < 0),
            "P0_unseen_items": bool(p["heldin_kl_unseen"]["high"] < 0),  # a check beside P0, not its verdict
            "P1": {"kl_lower": below,
                   "accuracy_drop_smaller": {t: p["heldout_accuracy_drop"][t]["high"] < 0 for t in heldout}},
            "P2": bool(p["original_accuracy"]["low"] > -0.05)}


def _fmt(ci: Mapping[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    if ci.get("mean") is None or math.isnan(ci["mean"]):
        return "n/a"
    if ci.get("low") is None or math.isnan(ci["low"]):
        return f"{ci['mean'] * scale:.{digits}f}"
    low, high = ci["low"] * scale, ci["high"] * scale
    return f"{ci['mean'] * scale:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def render_tables(report: Mapping[str, Any]) -> str:
    """The measured tables (means over seeds with 95% t intervals), as markdown."""
    heldout = report["heldout_types"]
    arms = report["arms"]
    rows = ["| arm | seeds | original action acc. (%) | full-call acc. (%) | held-in KL (nats) | "
            + " | ".join(f"KL {t}" for t in heldout) + " |",
            "|---" * (5 + len(heldout)) + "|"]
    for name, a in arms.items():
        s = a["summary"]
        rows.append(f"| {name} | {len(a['seeds'])} | {_fmt(s['original_accuracy'], 100, 1)} | "
                    f"{_fmt(s['full_call_accuracy'], 100, 1)} | {_fmt(s['heldin_kl'])} | "
                    + " | ".join(_fmt(s["heldout_kl"][t]) for t in heldout) + " |")
    drops = ["| arm | " + " | ".join(f"drop {t}" for t in heldout) + " |", "|---" * (1 + len(heldout)) + "|"]
    for name, a in arms.items():
        drops.append(f"| {name} | " + " | ".join(_fmt(a["summary"]["heldout_accuracy_drop"][t], 100, 1)
                                                for t in heldout) + " |")
    out = ["Means over seeds with 95% Student-t intervals; accuracy drop = original − perturbed action "
           "accuracy (points).", "", *rows, "", *drops, ""]
    for name, p in [("CIPR", report.get("paired")), *report.get("paired_sweep", {}).items()]:
        if p is None:
            continue
        out += [f"{name} − multi-interface, paired by seed (per-seed values, then mean [95% t interval]):",
                "",
                "| quantity | per seed | mean [95% CI] |", "|---|---|---|",
                f"| held-in KL | {', '.join(f'{v:+.4f}' for v in p['heldin_kl']['per_seed'])} | "
                f"{_fmt(p['heldin_kl'], 1, 4)} |",
                f"| held-in KL, items no choice saw | "
                f"{', '.join(f'{v:+.4f}' for v in p['heldin_kl_unseen']['per_seed'])} | "
                f"{_fmt(p['heldin_kl_unseen'], 1, 4)} |",
                "| original action acc. | "
                f"{', '.join(f'{100 * v:+.1f}' for v in p['original_accuracy']['per_seed'])} | "
                f"{_fmt(p['original_accuracy'], 100, 1)} |"]
        for t in heldout:
            out.append(f"| KL {t} | {', '.join(f'{v:+.4f}' for v in p['heldout_kl'][t]['per_seed'])} | "
                       f"{_fmt(p['heldout_kl'][t], 1, 4)} |")
            out.append(f"| acc. drop {t} | "
                       f"{', '.join(f'{100 * v:+.1f}' for v in p['heldout_accuracy_drop'][t]['per_seed'])} | "
                       f"{_fmt(p['heldout_accuracy_drop'][t], 100, 1)} |")
        out.append("")
    return "\n".join(out)


def plot(report: Mapping[str, Any], path: Path) -> None:
    """Per arm: held-in and held-out KL, and original vs perturbed action accuracy; dots are seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["arms"])
    types = [report["heldin_type"], *report["heldout_types"]]
    fig, (ax_kl, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(len(arms), 1)
    for i, arm in enumerate(arms):
        a = report["arms"][arm]
        kls = [a["heldin_kl"], *(a["heldout_kl"][t] for t in report["heldout_types"])]
        accs = [a["original_accuracy"], a["heldin_accuracy"],
                *(a["heldout_accuracy"][t] for t in report["heldout_types"])]
        for ax, series in ((ax_kl, kls), (ax_acc, accs)):
            xs = [k + (i - (len(arms) - 1) / 2) * width for k in range(len(series))]
            means = [math.fsum(v) / len(v) for v in series]
            ax.bar(xs, means, width, label=arm, alpha=0.7)
            for x, v in zip(xs, series, strict=True):
                ax.scatter([x] * len(v), v, color="black", s=8, zorder=3)
    ax_kl.set_xticks(range(len(types)), [t.replace("_", "\n") for t in types], fontsize=8)
    ax_kl.set_ylabel("KL(unperturbed ‖ perturbed), nats")
    ax_kl.set_title("action KL at the reference decision (held-in first)")
    ax_acc.set_xticks(range(len(types) + 1), ["original", *(t.replace("_", "\n") for t in types)], fontsize=8)
    ax_acc.set_ylabel("action accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.axhline(1 / 3, color="gray", linestyle=":", linewidth=1, label="chance (3 tools)")
    ax_acc.set_title("argmax action = reference tool")
    ax_acc.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def study_report(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """cpu_evidence.json, cpu_evidence_tables.md and cpu_evidence.png of a run of the study engine
    (configs/study/cpu_evidence.yaml): every finished point's metrics from its evaluation records, judged
    against the predictions registered in the spec (`options.predictions`)."""
    spec = meta["spec"]
    options = spec["options"]
    types, heldin, looked_at = options["types"], options["heldin"], options["looked_at"]
    by_point: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_point[(r["arm"], int(r["seed"]))].append(r)
    metrics: dict[str, dict[int, Any]] = defaultdict(dict)
    for arm in spec["arms"]:
        for seed in spec["seeds"]:
            if (arm, seed) in by_point:
                metrics[arm][seed] = point_metrics(by_point[(arm, seed)], types, heldin, looked_at)
    report = build_report(types, heldin, metrics, options["predictions"])
    report["command"] = f"cipr-study run study={spec['name']}"
    report["wall_s"] = round(meta["wall_s"], 1)
    report["wall_s_parts"] = {f"{part}/{label}": round(t[f"{part}_s"], 1)
                              for label, t in meta["timings"].items() for part in ("train", "eval")}
    report["plan"] = {"spec": spec}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "cpu_evidence.json", report)
    write_text_atomic(out / "cpu_evidence_tables.md", render_tables(report))
    plot(report, out / "cpu_evidence.png")
    return report


def recompute(report_dir: Path, name: str = "cpu_evidence") -> dict[str, Any]:
    """cpu_evidence_tables.md and cpu_evidence.png again from the committed cpu_evidence.json (its per-arm,
    per-seed metrics and paired comparisons): `cipr-study report study=cpu_evidence`."""
    report = read_json(report_dir / "cpu_evidence.json")
    write_text_atomic(report_dir / "cpu_evidence_tables.md", render_tables(report))
    plot(report, report_dir / "cpu_evidence.png")
    return report
