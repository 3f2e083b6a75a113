"""Paired differences between two evaluation runs (B − A) per perturbation type, group, Mean and Gap.

Both runs must have evaluated the same items (the harness applies every perturbation to the same
items, so runs of two models pair item by item); only units present in both enter a difference, and
the number left unpaired is reported. Per-item scores, groups and Mean are built exactly as in
`cipr.eval.report`, with the ReportConfig of run A (they must agree on `original` and `group_mode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_json, write_json_atomic, write_text_atomic
from cipr.eval.report import (
    RESULTS,
    RUN_META,
    ReportConfig,
    fmt,
    item_scores,
    layout,
    paired,
    read_results,
    report_config_from_meta,
    table,
)


def _load(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records, _ = read_results(run_dir / RESULTS)
    if not records:
        raise DataError("no results in run directory", file=str(run_dir / RESULTS))
    meta_path = run_dir / RUN_META
    return records, (read_json(meta_path) if meta_path.exists() else {})


def compare_runs(run_a: str | Path, run_b: str | Path, config: ReportConfig | None = None) -> dict[str, Any]:
    """Per tool names present in both runs: B − A per type, group, Mean and Gap, paired over items."""
    run_a, run_b = Path(run_a), Path(run_b)
    rec_a, meta_a = _load(run_a)
    rec_b, meta_b = _load(run_b)
    config = config or report_config_from_meta(meta_a)
    lay = layout(rec_a + rec_b, config, meta_a.get("perturbations", []))
    sa, sb = item_scores(rec_a, lay, config), item_scores(rec_b, lay, config)
    out: dict[str, Any] = {"a": str(run_a), "b": str(run_b), "model_a": meta_a.get("model"),
                           "model_b": meta_b.get("model"), "types": list(lay.types),
                           "groups": list(lay.groups), "names": {}}
    for names in [n for n in sa if n in sb]:
        a, b = sa[names], sb[names]
        entry: dict[str, Any] = {
            "types": {t: paired(b["types"][t], a["types"][t], config) for t in lay.types
                      if t in a["types"] and t in b["types"]},
            "groups": {g: paired(b["groups"][g], a["groups"][g], config) for g in lay.groups
                       if g in a["groups"] and g in b["groups"]},
        }
        if "mean" in a and "mean" in b:
            entry["mean"] = paired(b["mean"], a["mean"], config)
            orig = config.original
            if orig in a["types"] and orig in b["types"]:
                gap_a = {i: a["types"][orig][i] - a["mean"][i] for i in a["types"][orig] if i in a["mean"]}
                gap_b = {i: b["types"][orig][i] - b["mean"][i] for i in b["types"][orig] if i in b["mean"]}
                entry["gap"] = paired(gap_b, gap_a, config)
        out["names"][names] = entry
    if not out["names"]:
        raise DataError(f"the runs share no tool names setting ({sorted(sa)} vs {sorted(sb)})",
                        file=str(run_b))
    if not any(v["n"] for e in out["names"].values() for v in e["types"].values()):
        raise DataError(f"the runs share no (item, perturbation) pair to compare ({run_a} vs {run_b})",
                        file=str(run_b))
    from cipr.eval.consistency_metric import compare_consistency

    consistency = compare_consistency(run_a, run_b, config)
    if consistency:
        out["consistency"] = consistency
    return out


def render_comparison(cmp: Mapping[str, Any]) -> str:
    """Markdown: one table per tool names, rows types / groups / Mean / Gap, cell = B − A ± half-width."""
    out = [f"# {cmp.get('model_b') or cmp['b']} − {cmp.get('model_a') or cmp['a']}", "",
           f"A: `{cmp['a']}`  ", f"B: `{cmp['b']}`", "",
           "Differences in accuracy points (B − A), 95% CIs paired over items."]
    for names, e in cmp["names"].items():
        rows = [[t, fmt(v, signed=True), str(v["n"]), str(v["unpaired"])] for t, v in e["types"].items()]
        rows += [[f"**{g}**", fmt(v, signed=True), str(v["n"]), str(v["unpaired"])]
                 for g, v in e["groups"].items()]
        for k in ("mean", "gap"):
            if k in e:
                rows.append([f"**{k.capitalize()}**", fmt(e[k], signed=True), str(e[k]["n"]),
                             str(e[k]["unpaired"])])
        out += ["", f"## {names} names", "", table(["", "B − A", "paired n", "unpaired"], rows)]
    if cmp.get("consistency"):
        from cipr.eval.consistency_metric import render_consistency_comparison

        out.append(render_consistency_comparison(cmp["consistency"]))
    out.append("")
    return "\n".join(out)


def plot_comparison(cmp: Mapping[str, Any], path: str | Path) -> Path:
    """Horizontal bars of B − A per type and group with CI whiskers, one panel per tool names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(cmp["names"])
    rows = max(len(cmp["names"][n]["types"]) + len(cmp["names"][n]["groups"]) for n in names)
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 1.5 + 0.3 * rows), squeeze=False)
    for ax, n in zip(axes[0], names, strict=True):
        e = cmp["names"][n]
        labels = list(e["types"]) + [f"[{g}]" for g in e["groups"]]
        vals = list(e["types"].values()) + list(e["groups"].values())
        ys = range(len(vals))
        xs = [v["value"] or 0.0 for v in vals]
        err = [[0.0 if v["low"] is None else max(0.0, v["value"] - v["low"]) for v in vals],
               [0.0 if v["high"] is None else max(0.0, v["high"] - v["value"]) for v in vals]]
        colors = ["tab:blue"] * len(e["types"]) + ["tab:orange"] * len(e["groups"])
        ax.barh(list(ys), xs, xerr=err, color=colors, capsize=2)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("B − A (accuracy points, 95% CI)")
        ax.set_title(f"{n} names")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_comparison(run_a: str | Path, run_b: str | Path,
                     out_dir: str | Path | None = None) -> dict[str, Any]:
    """compare.json, compare.md and compare.png in `out_dir` (default: `<run_b>/compare_<run_a name>`)."""
    cmp = compare_runs(run_a, run_b)
    out = Path(out_dir) if out_dir else Path(run_b) / f"compare_{Path(run_a).resolve().name}"
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "compare.json", cmp)
    write_text_atomic(out / "compare.md", render_comparison(cmp))
    plot_comparison(cmp, out / "compare.png")
    cmp["out_dir"] = str(out)
    return cmp
