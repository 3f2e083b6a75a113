"""The paper's comparison (Table 1) as a study: its analysis (specs: configs/study/ladder.yaml,
configs/study/cpu_ladder.yaml; run by `cipr-study`).

Each point (an algorithm trained with a seed, from one shared warm start) is evaluated by cipr-eval as the
paper does: the model under the names it was trained with, as deployed (ToolRL-GRPO and function masking
with original names; multi-interface and CIPR through the canonicalization adapter), and ToolRL-GRPO also
through the adapter (the paper's gray rows): the arm's `names` label. cipr-eval runs the cost and latency
types in both tool orders; `consistency.enabled=true` adds the held-out consistency metric. The row label is
the arm's `method` label.

The report (`study_report`): Table 1's layout (rows = methods and their names, columns = groups, Mean, Gap)
with 95% intervals; the consistency metric per group; differences of every method against ToolRL-GRPO and
multi-interface, paired over items (an item's score averaged over a method's seeds); a plot. The warm start
is not evaluated as a Base row (evaluate it with cipr-eval on its `final/` folder).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_json, write_json_atomic, write_text_atomic
from cipr.eval.consistency_metric import METRICS, SCALE, format_cell, item_values
from cipr.eval.report import (
    ReportConfig,
    item_scores,
    layout,
    report_config_from_meta,
    table,
)
from cipr.eval.stats import mean_estimate, paired_difference

log = logging.getLogger(__name__)

LADDER = "ladder"
DONE = "done.json"
BASE = "warm_start"
GRPO, MI = "ToolRL (GRPO)", "+ multi-interface"
BASE_LABEL = "Base (shared warm start)"
ORDER = (BASE_LABEL, GRPO, "Function masking", MI, "+ CIPR", "+ CIPR w/o rescoring KL",
         "+ CIPR w/o rollout KL")


def _mean_over_seeds(per_seed: Sequence[Mapping[Any, float]]) -> dict[Any, float]:
    acc: dict[Any, list[float]] = defaultdict(list)
    for scores in per_seed:
        for k, v in scores.items():
            acc[k].append(v)
    return {k: math.fsum(v) / len(v) for k, v in acc.items()}


Rows = dict[tuple[str, str], dict[str, Any]]
Run = tuple[str, str, list[dict[str, Any]], list[dict[str, Any]], Mapping[str, Any]]
"""One evaluated point: its label, its method, its cipr-eval results, consistency records and meta."""


def _rows(runs: Sequence[Run]) -> tuple[Rows, Any, ReportConfig]:
    """(method, names) -> per-item accuracy and consistency (seeds averaged); the layout; the config. `runs`:
    per point (its label, its method, its cipr-eval results, its consistency records, its cipr-eval meta)."""
    runs = [r for r in runs if r[2]]
    if not runs:
        raise DataError("no evaluated point has results")
    config = report_config_from_meta(runs[0][4])
    lay = layout([r for _, _, recs, _, _ in runs for r in recs], config)
    grouped: dict[tuple[str, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for label, method, recs, cons, _ in runs:
        scores = item_scores(recs, lay, config)
        cvals = item_values(cons, lay) if cons else {}
        for names, e in scores.items():
            row = grouped[(method, names)]
            row["points"].append(label)
            for g, v in e["groups"].items():
                row[f"group:{g}"].append(v)
            if "mean" in e:
                row["mean"].append(e["mean"])
                orig = e["types"].get(config.original, {})
                row["gap"].append({i: orig[i] - m for i, m in e["mean"].items() if i in orig})
            for m, v in cvals.get(names, {}).items():
                for g, s in v["groups"].items():
                    row[f"{m}:group:{g}"].append(s)
                if v["mean"]:
                    row[f"{m}:mean"].append(v["mean"])
    rank = {m: i for i, m in enumerate(ORDER)}
    keys = sorted(grouped, key=lambda k: (rank.get(k[0], len(ORDER)), k[0], k[1] != "original"))
    rows = {key: {k: (v if k == "points" else _mean_over_seeds(v)) for k, v in grouped[key].items()}
            for key in keys}
    return rows, lay, config


def _est(values: Mapping[Any, float], config: ReportConfig, scale: float = 100.0) -> dict[str, Any]:
    return mean_estimate(list(values.values()), method=config.mean_method,
                         confidence=config.confidence).to_json(scale=scale)


def _diff(a: Mapping[Any, float], b: Mapping[Any, float], config: ReportConfig, scale: float) -> dict:
    est, unpaired = paired_difference(a, b, method=config.mean_method, confidence=config.confidence)
    return {**est.to_json(scale=scale), "unpaired": unpaired}


def row_label(method: str, names: str) -> str:
    return f"{method} ({names} names)"


def _columns(lay: Any) -> list[str]:
    return [*lay.groups, "mean", "gap"]


def _key(col: str) -> str:
    return col if col in ("mean", "gap") else f"group:{col}"


def build_report(runs: Sequence[Run], unfinished: Sequence[str]) -> dict[str, Any]:
    """The comparison: accuracy and consistency per row and column, paired differences against the
    baselines (`_rows` says what `runs` holds)."""
    rows, lay, config = _rows(runs)
    columns = _columns(lay)
    table1: dict[str, Any] = {}
    for (method, names), row in rows.items():
        entry: dict[str, Any] = {"method": method, "names": names, "points": row["points"], "accuracy": {},
                                 "consistency": {}}
        for col in columns:
            if _key(col) in row:
                entry["accuracy"][col] = _est(row[_key(col)], config)
        for m in METRICS:
            entry["consistency"][m] = {col: _est(row[f"{m}:{_key(col)}"], config, SCALE[m]) for col in columns
                                       if f"{m}:{_key(col)}" in row}
        table1[row_label(method, names)] = entry
    baselines = {"grpo": (GRPO, "original"), "multi_interface": (MI, "canonical")}
    diffs: dict[str, Any] = {}
    for bname, bkey in baselines.items():
        if bkey not in rows:
            continue
        base_row = rows[bkey]
        out: dict[str, Any] = {}
        for key, row in rows.items():
            if key == bkey:
                continue
            acc = {col: _diff(row[_key(col)], base_row[_key(col)], config, 100.0) for col in columns
                   if _key(col) in row and _key(col) in base_row}
            cons = {m: {col: _diff(row[f"{m}:{_key(col)}"], base_row[f"{m}:{_key(col)}"], config, SCALE[m])
                        for col in columns if f"{m}:{_key(col)}" in row and f"{m}:{_key(col)}" in base_row}
                    for m in METRICS}
            out[row_label(*key)] = {"accuracy": acc, "consistency": {m: v for m, v in cons.items() if v}}
        diffs[bname] = {"baseline": row_label(*bkey), "rows": out}
    return {"columns": columns, "groups": {g: list(lay.members[g]) for g in lay.groups},
            "mean_groups": list(lay.mean_groups), "confidence": config.confidence, "rows": table1,
            "differences": diffs, "unfinished": list(unfinished)}


def render_ladder(report: Mapping[str, Any], title: str | None = None) -> str:
    """ladder.md: Table 1, the consistency table, and the paired differences against both baselines."""
    cols = report["columns"]
    head = ["Method", "Tool names", *(c.capitalize() if c in ("mean", "gap") else c for c in cols)]
    pct = int(report["confidence"] * 100)
    out = [f"# Ladder{f': {title}' if title else ''}", "",
           f"Accuracy in % with {pct}% half-widths over items; Mean averages the held-out groups "
           f"({', '.join(report['mean_groups'])}); Gap is original minus Mean, paired over items.",
           "", "## Table 1 layout", "",
           table(head, [[e["method"], e["names"], *(format_cell(e["accuracy"].get(c)) for c in cols)]
                        for e in report["rows"].values()])]
    for m in METRICS:
        ccols = [c for c in cols if c not in ("gap", "original")]
        rows = [[e["method"], e["names"], *(format_cell(e["consistency"][m].get(c), m) for c in ccols)]
                for e in report["rows"].values() if e["consistency"].get(m)]
        if rows:
            unit = "nats" if m == "kl" else "%"
            out += ["", f"## Held-out consistency: {m} ({unit})", "",
                    table(["Method", "Tool names", *(c.capitalize() if c == "mean" else c for c in ccols)],
                          rows)]
    for d in report["differences"].values():
        out += ["", f"## Paired differences against {d['baseline']} (row − baseline, {pct}% CI)", "",
                table(["Row", *cols, "paired n"],
                      [[k, *(format_cell(v["accuracy"].get(c), signed=True) for c in cols),
                        str(v["accuracy"].get("mean", {}).get("n", ""))] for k, v in d["rows"].items()])]
        kcols = [c for c in cols if c not in ("gap", "original")]
        kl_rows = [[k, *(format_cell(v["consistency"]["kl"].get(c), "kl", signed=True) for c in kcols)]
                   for k, v in d["rows"].items() if v["consistency"].get("kl")]
        if kl_rows:
            out += ["", "Held-out KL (nats), row − baseline:", "", table(["Row", *kcols], kl_rows)]
    if report["unfinished"]:
        out += ["", "Not finished (not evaluated): " + ", ".join(report["unfinished"]) + "."]
    out.append("")
    return "\n".join(out)


def plot_ladder(report: Mapping[str, Any], path: Path) -> Path:
    """Accuracy per group and held-out KL per group, one bar per row, 95% CI whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(report["rows"].values())
    panels = [("accuracy", [c for c in report["columns"] if c != "gap"], "accuracy (%)")]
    if any(r["consistency"].get("kl") for r in rows):
        kl_columns = [c for c in report["columns"] if c not in ("gap", "original")]
        panels.append(("kl", kl_columns, "held-out KL (nats)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, (metric, cols, label) in zip(axes[0], panels, strict=True):
        width = 0.8 / max(1, len(rows))
        for k, r in enumerate(rows):
            cells = r["accuracy"] if metric == "accuracy" else r["consistency"].get("kl", {})
            vals = [(cells.get(c) or {}).get("value") for c in cols]
            errs = [(cells.get(c) or {}).get("half_width") or 0.0 for c in cols]
            xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(cols))]
            ax.bar(xs, [v if v is not None else 0.0 for v in vals], width, yerr=errs, capsize=2,
                   label=f"{r['method']} ({r['names']})")
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def study_report(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """REPORT/NAME.json ({"title", "comparison", "commands", "cost"}), NAME_tables.md and NAME.png of a
    run of the study engine, from each point's evaluation records and its cipr-eval meta."""
    spec = meta["spec"]
    name, evaluation = spec["name"], next(iter(spec["evaluations"]))
    runs = []
    for label, timing in meta["timings"].items():
        mine = [r for r in records if r["point"] == label and r.get("evaluation") == evaluation]
        if not mine:
            continue
        method = spec["labels"][mine[0]["arm"]]["method"]
        runs.append((label, method, [r for r in mine if r["kind"] == "result"],
                     [r for r in mine if r["kind"] == "consistency" and "skipped" not in r],
                     timing["evaluations"][evaluation]))
    finished = {label for label, *_ in runs}
    unfinished = [f"{a}_s{s}" for s in spec["seeds"] for a in spec["arms"] if f"{a}_s{s}" not in finished]
    comparison = build_report(runs, unfinished)
    report = {"title": spec.get("title"), "comparison": comparison,
              "commands": [f"cipr-study run study={name}"],
              "cost": {"wall_s": round(meta["wall_s"], 1), "points": meta["timings"]}}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / f"{name}.json", report)
    write_text_atomic(out / f"{name}_tables.md", render_ladder(comparison, report["title"]))
    plot_ladder(comparison, out / f"{name}.png")
    return report


def recompute(report_dir: Path, name: str) -> dict[str, Any]:
    """NAME.png again from the committed NAME.json's comparison (`cipr-study report study=NAME`), and
    NAME_tables.md where the run wrote one (docs/results/cpu_ladder.md is prose around the first run's)."""
    report = read_json(report_dir / f"{name}.json")
    plot_ladder(report["comparison"], report_dir / f"{name}.png")
    if (report_dir / f"{name}_tables.md").is_file():
        write_text_atomic(report_dir / f"{name}_tables.md",
                          render_ladder(report["comparison"], report.get("title")))
    return report
