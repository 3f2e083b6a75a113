"""From `results.jsonl` to `summary.json`, `report.md` and `plots/*.png` (paper Tables 1, 6 and 10).

Aggregation (all accuracies in percent in the outputs):
- An item's score for one type is its correctness averaged over its tool orders (as the paper's cost
  and latency entries); a type's accuracy is their mean (intervals: `cipr.eval.stats`). Every order
  also gets its own accuracy.
- A group (a column of Table 1) in `item_mean` mode (BFCL: every type is applied to the same items)
  averages, per item, the scores of the group's types that the item was run under; its interval is
  the normal one over those per-item scores. In `pool` mode (RoTBench: each level has its own item
  list) every (type, item) pair is one unit, which gives the paper's pooled-corrupted column.
- Mean is, per item, the average of its held-out group scores (`ReportConfig.mean_groups`; by
  default every group except the original's and `in_distribution`, which is not held out); Gap is
  original minus mean, paired over the items that have both.
- When a run evaluates both `original` and `canonical` names, canonical minus original is reported
  per type and group, paired item by item (RoTBench's Table 10 pairing).
- A record whose backend failed counts as incorrect (the item was asked and not answered) and is
  counted under `backend_error`, so a flaky endpoint cannot raise accuracy by shrinking the item set.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import DataError
from cipr.core.io import decode_text, iter_jsonl, read_json, write_json_atomic, write_text_atomic
from cipr.eval.stats import Estimate, accuracy, mean_estimate, paired_difference
from cipr.eval.taxonomy import CLASSES

RESULTS = "results.jsonl"
RUN_META = "run.json"
SUMMARY = "summary.json"
REPORT = "report.md"
PLOTS = "plots"
ORIGINAL_GROUP = "original"
NOT_HELD_OUT = ("original", "in_distribution")
RECORD_FIELDS = ("id", "partition", "names", "perturbation", "group", "order", "correct", "taxonomy")


@dataclass(frozen=True)
class ReportConfig:
    """How records are aggregated. `original` names the unperturbed type (BFCL `original`, RoTBench
    `clean`); `mean_groups` the groups averaged into Mean (None: all but `NOT_HELD_OUT`)."""

    original: str = "original"
    mean_groups: tuple[str, ...] | None = None
    group_mode: Literal["item_mean", "pool"] = "item_mean"
    proportion_method: Literal["wilson", "normal"] = "wilson"
    mean_method: Literal["normal", "t"] = "normal"
    confidence: float = 0.95


def read_results(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Records of a results.jsonl, and the number of unreadable lines (a torn last line after a crash);
    a malformed line elsewhere is a DataError."""
    path = Path(path)
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    lines: list[tuple[int, Any]] = list(iter_jsonl(decode_text(data[:end], path), path))
    tail, torn = data[end:], 0
    if tail.strip():  # the file does not end with "\n": a write cut short, unless the line is whole
        try:
            lines.append((data.count(b"\n") + 1, json.loads(tail.decode("utf-8"))))
        except ValueError:  # not JSON, or cut inside a multi-byte character
            torn = 1
    records: list[dict[str, Any]] = []
    for number, rec in lines:
        if not isinstance(rec, dict):
            raise DataError(f"line {number} is not a JSON object", file=str(path), field="results")
        missing = [k for k in RECORD_FIELDS if k not in rec]
        if missing:
            raise DataError(f"line {number} lacks {', '.join(missing)}", file=str(path), item=rec.get("id"),
                            field=missing[0])
        records.append(rec)
    return records, torn


def _est(e: Estimate) -> dict[str, Any]:
    return e.to_json(scale=100.0)


def _ordered(values: Iterable[str], preferred: Sequence[str] = ()) -> list[str]:
    seen = list(dict.fromkeys(values))
    head = [v for v in dict.fromkeys(preferred) if v in seen]
    return head + [v for v in seen if v not in head]


def type_scores(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """names -> perturbation -> item id -> correctness averaged over tool orders."""
    acc: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in records:
        acc[(r["names"], r["perturbation"], r["id"])].append(1.0 if r["correct"] else 0.0)
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for (names, pert, item), v in acc.items():
        out[names][pert][item] = math.fsum(v) / len(v)
    return out


def _group_scores(scores: Mapping[str, Mapping[str, float]], types: Sequence[str],
                  mode: str) -> dict[Any, float]:
    if mode == "pool":
        return {(t, i): s for t in types for i, s in scores.get(t, {}).items()}
    per_item: dict[str, list[float]] = defaultdict(list)
    for t in types:
        for i, s in scores.get(t, {}).items():
            per_item[i].append(s)
    return {i: math.fsum(v) / len(v) for i, v in per_item.items()}


def _mean_of(per_item: Mapping[Any, float], cfg: ReportConfig) -> Estimate:
    return accuracy(list(per_item.values()), proportion_method=cfg.proportion_method,
                    mean_method=cfg.mean_method, confidence=cfg.confidence)


@dataclass(frozen=True)
class Layout:
    """Which types a run holds, in order, and how they group (from the records' `group` fields)."""

    types: tuple[str, ...]
    groups: tuple[str, ...]
    members: Mapping[str, tuple[str, ...]]
    group_of: Mapping[str, str]
    mean_groups: tuple[str, ...]


def layout(records: Sequence[Mapping[str, Any]], config: ReportConfig,
           preferred: Sequence[str] = ()) -> Layout:
    """Types in order (`config.original` first, then `preferred`, then as met), groups, Mean's groups."""
    group_of: dict[str, str] = {}
    for r in records:
        prev = group_of.setdefault(r["perturbation"], r["group"])
        if prev != r["group"]:
            raise DataError(f"perturbation {r['perturbation']!r} is in groups {prev!r} and {r['group']!r}",
                            item=r["id"], field="group")
    types = _ordered((r["perturbation"] for r in records), [config.original, *preferred])
    groups = _ordered((group_of[t] for t in types), [group_of.get(config.original, ORIGINAL_GROUP)])
    members = {g: tuple(t for t in types if group_of[t] == g) for g in groups}
    original_group = group_of.get(config.original)
    mean_groups = tuple(g for g in (config.mean_groups or groups) if g in members and g != original_group
                        and (config.mean_groups is not None or g not in NOT_HELD_OUT))
    return Layout(tuple(types), tuple(groups), members, group_of, mean_groups)


def item_scores(records: Sequence[Mapping[str, Any]], lay: Layout,
                config: ReportConfig) -> dict[str, dict[str, Any]]:
    """Per names: `types` (type -> item -> score), `groups` (group -> unit -> score) and, in
    `item_mean` mode with held-out groups, `mean` (item -> average of its held-out group scores)."""
    out: dict[str, dict[str, Any]] = {}
    for names, sc in type_scores(records).items():
        groups = {g: _group_scores(sc, lay.members[g], config.group_mode) for g in lay.groups}
        groups = {g: v for g, v in groups.items() if v}
        entry: dict[str, Any] = {"types": dict(sc), "groups": groups}
        held = [g for g in lay.mean_groups if g in groups]
        if held and config.group_mode == "item_mean":
            per_item: dict[Any, list[float]] = defaultdict(list)
            for g in held:
                for i, v in groups[g].items():
                    per_item[i].append(v)
            entry["mean"] = {i: math.fsum(v) / len(v) for i, v in per_item.items()}
            entry["mean_groups"] = held
        out[names] = entry
    return out


def paired(a: Mapping[Any, float], b: Mapping[Any, float], config: ReportConfig) -> dict[str, Any]:
    """a − b paired over common units, as a percent estimate dict with the unpaired count."""
    est, unpaired = paired_difference(a, b, method=config.mean_method, confidence=config.confidence)
    return {**_est(est), "unpaired": unpaired}


def summarize(records: Sequence[Mapping[str, Any]], config: ReportConfig = ReportConfig(),
              meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary.json content: per names, accuracy per type, order, group and partition, Mean, Gap,
    taxonomy counts; canonical − original when both were run."""
    meta = dict(meta or {})
    lay = layout(records, config, meta.get("perturbations", []))
    scores = item_scores(records, lay, config)
    by_names: dict[str, Any] = {}
    for names in _ordered(scores, ["original", "canonical"]):
        recs = [r for r in records if r["names"] == names]
        sc = scores[names]
        out_types: dict[str, Any] = {}
        for t in lay.types:
            if t not in sc["types"]:
                continue
            trecs = [r for r in recs if r["perturbation"] == t]
            orders = _ordered(r["order"] for r in trecs)
            out_types[t] = {
                "group": lay.group_of[t],
                "accuracy": _est(_mean_of(sc["types"][t], config)),
                "orders": {o: _est(_mean_of({r["id"]: float(r["correct"]) for r in trecs if r["order"] == o},
                                            config)) for o in orders},
                "taxonomy": dict(Counter(r["taxonomy"] for r in trecs)),
            }
        entry: dict[str, Any] = {
            "types": out_types,
            "groups": {g: {"types": [t for t in lay.members[g] if t in sc["types"]],
                           "accuracy": _est(_mean_of(v, config))} for g, v in sc["groups"].items()},
        }
        if "mean" in sc:
            entry["mean"] = {"groups": sc["mean_groups"], "accuracy": _est(mean_estimate(
                list(sc["mean"].values()), method=config.mean_method, confidence=config.confidence))}
            if config.original in sc["types"]:
                entry["gap"] = paired(sc["types"][config.original], sc["mean"], config)
        parts: dict[str, dict[str, Any]] = {}
        for part in _ordered(r["partition"] for r in recs):
            ids = {r["id"] for r in recs if r["partition"] == part}
            types_p = {t: _est(_mean_of(sub, config)) for t in out_types
                       if (sub := {i: v for i, v in sc["types"][t].items() if i in ids})}
            groups_p = {g: _est(_mean_of(sub, config)) for g, v in sc["groups"].items()
                        if (sub := {u: x for u, x in v.items()
                                    if (u[1] if isinstance(u, tuple) else u) in ids})}
            parts[part] = {"n_items": len(ids), "types": types_p, "groups": groups_p}
        entry["partitions"] = parts
        entry["taxonomy"] = {
            "original": dict(Counter(r["taxonomy"] for r in recs if r["perturbation"] == config.original)),
            "held_out": dict(Counter(r["taxonomy"] for r in recs if lay.group_of[r["perturbation"]]
                                     in lay.mean_groups)),
        }
        by_names[names] = entry
    summary: dict[str, Any] = {
        "meta": meta,
        "config": asdict(config),
        "n_records": len(records),
        "n_items": len({r["id"] for r in records}),
        "types": list(lay.types),
        "groups": {g: list(lay.members[g]) for g in lay.groups},
        "mean_groups": list(lay.mean_groups),
        "names": by_names,
        "failures": dict(Counter(r["error"] for r in records if r.get("error") in
                                 ("backend_error", "parse_failure", "undeclared_tool", "scorer_error"))),
    }
    if "original" in scores and "canonical" in scores:
        can, orig = scores["canonical"], scores["original"]
        summary["canonical_minus_original"] = {
            "types": {t: paired(can["types"][t], orig["types"][t], config) for t in lay.types
                      if t in can["types"] and t in orig["types"]},
            "groups": {g: paired(can["groups"][g], orig["groups"][g], config) for g in lay.groups
                       if g in can["groups"] and g in orig["groups"]},
        }
        if "mean" in can and "mean" in orig:
            summary["canonical_minus_original"]["mean"] = paired(can["mean"], orig["mean"], config)
    return summary


def fmt(e: Mapping[str, Any] | None, signed: bool = False) -> str:
    """`72.4 ± 1.8` from an estimate dict (percent); `n/a` when missing."""
    if not e or e.get("value") is None:
        return "n/a"
    v = f"{e['value']:+.1f}" if signed else f"{e['value']:.1f}"
    hw = e.get("half_width")
    return v if hw is None else f"{v} ± {hw:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(summary: Mapping[str, Any], title: str | None = None) -> str:
    """report.md: a Table 1-shaped group table, a Table 6-shaped type table, orders, taxonomy, partitions."""
    meta = summary.get("meta", {})
    names_list = list(summary["names"])
    groups = list(summary["groups"])
    title = title or f"Evaluation: {meta.get('model', '?')} on {meta.get('benchmark', '?')}"
    out = [f"# {title}", ""]
    out.append(f"{summary['n_records']} records, {summary['n_items']} items; accuracy in % with "
               f"{int(summary['config']['confidence'] * 100)}% confidence half-widths.")
    if meta:
        keep = {k: meta[k] for k in ("model", "benchmark", "format", "backend", "names", "limit", "seed")
                if k in meta}
        out.append("")
        out.append("Run: " + ", ".join(f"{k}={v}" for k, v in keep.items()))
    build = meta.get("build") or {}
    if build.get("skipped") or build.get("not_applicable"):
        skipped = ", ".join(f"{t} {n}" for t, n in build.get("skipped", {}).items())
        out += [""] + ([f"Items a perturbation could not be applied to (reasons in run.json): {skipped}."]
                       if skipped else []) + [f"Not applicable: {x}."
                                              for x in build.get("not_applicable", [])]
    # Table 1 shape: one row per tool names; columns = groups, Mean, Gap.
    cols = groups + (["Mean", "Gap"] if any("mean" in summary["names"][n] for n in names_list) else [])
    rows = []
    for n in names_list:
        e = summary["names"][n]
        row = [n] + [fmt(e["groups"].get(g, {}).get("accuracy")) for g in groups]
        if "Mean" in cols:
            row += [fmt(e.get("mean", {}).get("accuracy")), fmt(e.get("gap"))]
        rows.append(row)
    out += ["", "## Accuracy by group (Table 1 shape)", "", table(["Tool names", *cols], rows)]
    # Table 6 shape: one row per type, grouped, with the group mean (or pooled) rows.
    pooled_or_mean = "pooled" if summary["config"]["group_mode"] == "pool" else "mean"
    rows = []
    for g in groups:
        for t in summary["groups"][g]:
            rows.append([t, g] + [fmt(summary["names"][n]["types"].get(t, {}).get("accuracy"))
                                  for n in names_list])
        if len(summary["groups"][g]) > 1:
            rows.append([f"**{pooled_or_mean} {g}**", g]
                        + [fmt(summary["names"][n]["groups"].get(g, {}).get("accuracy")) for n in names_list])
    diff = summary.get("canonical_minus_original")
    header = ["Perturbation", "Group", *names_list]
    if diff:
        header.append("canonical − original")
        for r in rows:
            is_group = r[0].startswith("**")
            key = r[0].removeprefix(f"**{pooled_or_mean} ").removesuffix("**")
            src = diff["groups"] if is_group else diff["types"]
            r.append(fmt(src.get(key), signed=True))
    out += ["", "## Accuracy by perturbation type (Table 6 shape)", "", table(header, rows)]
    # Table 10 shape (few types, e.g. RoTBench levels): one row per tool names, a column per type and per
    # multi-type group (the pooled corrupted levels).
    if len(summary["types"]) <= 8:
        multi = [g for g in groups if len(summary["groups"][g]) > 1]
        header = ["Tool names", *summary["types"],
                  *(f"{g} (pooled)" if summary["config"]["group_mode"] == "pool" else f"{g} (mean)"
                    for g in multi)]
        rows = [[n] + [fmt(summary["names"][n]["types"].get(t, {}).get("accuracy")) for t in summary["types"]]
                + [fmt(summary["names"][n]["groups"].get(g, {}).get("accuracy")) for g in multi]
                for n in names_list]
        out += ["", "## Accuracy by type, one row per tool names (Table 10 shape)", "", table(header, rows)]
    # Tool orders, where a type was run in several.
    rows = []
    for n in names_list:
        for t, e in summary["names"][n]["types"].items():
            if len(e["orders"]) > 1:
                rows.append([n, t] + [f"{o}: {fmt(v)}" for o, v in e["orders"].items()])
    if rows:
        width = max(len(r) for r in rows)
        rows = [r + [""] * (width - len(r)) for r in rows]
        out += ["", "## By tool order", "", table(["Tool names", "Perturbation"] +
                                                    [f"order {i + 1}" for i in range(width - 2)], rows)]
    rows = []
    for cls in CLASSES:
        cells = []
        for n in names_list:
            for part in ("original", "held_out"):
                counts = summary["names"][n]["taxonomy"][part]
                total = sum(counts.values())
                c = counts.get(cls, 0)
                cells.append(f"{c} ({100 * c / total:.1f}%)" if total else "–")
        if any(not c.startswith("0 ") and c != "–" for c in cells):
            rows.append([cls, *cells])
    header = ["Class"] + [f"{n} / {p}" for n in names_list for p in ("original", "held-out")]
    out += ["", "## Failure taxonomy (Appendix E)", "", table(header, rows)]
    # Partitions (by group: a column per type would not fit).
    for n in names_list:
        parts = summary["names"][n]["partitions"]
        if len(parts) > 1:
            rows = [[p, str(v["n_items"])] + [fmt(v["groups"].get(g)) for g in groups]
                    for p, v in parts.items()]
            out += ["", f"## By partition ({n} names)", "", table(["Partition", "items", *groups], rows)]
    out.append("")
    return "\n".join(out)


def plot_summary(summary: Mapping[str, Any], plots_dir: str | Path) -> list[Path]:
    """plots/accuracy_by_type.png (bars with CI whiskers) and plots/taxonomy.png (stacked shares)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    names_list = list(summary["names"])
    types = list(summary["types"])
    width = 0.8 / max(1, len(names_list))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(types) * max(1, len(names_list))), 4.5))
    for j, n in enumerate(names_list):
        xs, ys, errs = [], [], [[], []]
        for i, t in enumerate(types):
            e = summary["names"][n]["types"].get(t, {}).get("accuracy")
            if not e or e["value"] is None:
                continue
            xs.append(i + (j - (len(names_list) - 1) / 2) * width)
            ys.append(e["value"])
            lo, hi = e["low"], e["high"]
            errs[0].append(0.0 if lo is None else max(0.0, e["value"] - lo))
            errs[1].append(0.0 if hi is None else max(0.0, hi - e["value"]))
        ax.bar(xs, ys, width=width, yerr=errs, capsize=2, label=f"{n} names")
    ax.set_xticks(range(len(types)), types, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.set_title("Accuracy by perturbation type (95% CI)")
    fig.tight_layout()
    paths = [plots_dir / "accuracy_by_type.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(names_list), figsize=(max(6.0, 0.5 * len(types)) * len(names_list), 4.5),
                             squeeze=False)
    for ax, n in zip(axes[0], names_list, strict=True):
        ts = [t for t in types if t in summary["names"][n]["types"]]
        bottom = [0.0] * len(ts)
        for k, cls in enumerate(CLASSES):
            shares = []
            for t in ts:
                counts = summary["names"][n]["types"][t]["taxonomy"]
                total = sum(counts.values()) or 1
                shares.append(100 * counts.get(cls, 0) / total)
            if any(shares):
                ax.bar(range(len(ts)), shares, bottom=bottom, label=cls, color=plt.cm.tab20(k % 20))
                bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
        ax.set_xticks(range(len(ts)), ts, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("share of responses (%)")
        ax.set_title(f"Failure taxonomy, {n} names")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(plots_dir / "taxonomy.png")
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def report_config_from_meta(meta: Mapping[str, Any]) -> ReportConfig:
    """The ReportConfig a run recorded in run.json (defaults for anything it did not)."""
    rc = dict(meta.get("report", {}))
    if rc.get("mean_groups") is not None:
        rc["mean_groups"] = tuple(rc["mean_groups"])
    return ReportConfig(**rc)


Section = Callable[[Path, dict[str, Any], ReportConfig], str]
"""An extra report section: (run dir, summary, config) -> markdown, adding its figures to the summary."""


def write_report(run_dir: str | Path, config: ReportConfig | None = None,
                 sections: Sequence[Section] = ()) -> dict[str, Any]:
    """Read a run directory's results.jsonl (and run.json), write summary.json, report.md, plots/;
    `sections` (e.g. `cipr.eval.consistency_metric.attach`) add theirs after the accuracy tables."""
    run_dir = Path(run_dir)
    meta_path = run_dir / RUN_META
    meta = read_json(meta_path) if meta_path.exists() else {}
    config = config or report_config_from_meta(meta)
    records, torn = read_results(run_dir / RESULTS)
    if not records:
        raise DataError("no results to report", file=str(run_dir / RESULTS))
    summary = summarize(records, config, {k: v for k, v in meta.items() if k != "report"})
    summary["torn_lines"] = torn
    extra = "".join(section(run_dir, summary, config) for section in sections)
    write_json_atomic(run_dir / SUMMARY, summary)
    write_text_atomic(run_dir / REPORT, render_markdown(summary) + extra)
    plot_summary(summary, run_dir / PLOTS)
    return summary


