"""The paper's comparison from a ladder sweep folder: export, evaluate and compare every finished point.

    SWEEP_DIR/                       `cipr-train -m +sweep=ladder` (configs/train/sweep/ladder.yaml)
      warm_start/                    the shared SFT warm start (the Base row, when it exists)
      <algo>_rs<w>_ro<w>_s<seed>/    one run folder per point
      ladder/
        exports/<point>/             `cipr.runtime.export` of the point's final weights
        evals/<point>/               a `cipr-eval` run folder (+ consistency.jsonl), and done.json
        ladder.md, ladder.json, ladder.png

Each point is evaluated as the paper does (Table 1): the model under the names it was trained with,
as deployed (ToolRL-GRPO and function masking with original names; multi-interface and CIPR through the
canonicalization adapter), and Base and ToolRL-GRPO also through the adapter (the paper's gray rows).
cipr-eval runs the cost and latency types in both tool orders. The held-out consistency metric
(`cipr.eval.consistency_metric`) is on unless `consistency=false`.

The report: Table 1's layout (rows = methods and their names, columns = groups, Mean, Gap) with 95%
intervals; the consistency metric per group; differences of every method against ToolRL-GRPO and
multi-interface, paired over items (an item's score averaged over a method's seeds); a plot. A point
is evaluated once: `done.json` records checkpoint and options, and a rerun with the same ones skips it.
Unfinished points are listed, not evaluated.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cipr.core.config import override_text
from cipr.core.errors import ConfigError, DataError
from cipr.core.io import read_json, write_json_atomic, write_text_atomic
from cipr.core.run_folder import STAGES_JSON, read_result_stage
from cipr.eval.consistency_metric import METRICS, SCALE, format_cell, item_values, read_records
from cipr.eval.report import (
    RESULTS,
    RUN_META,
    ReportConfig,
    item_scores,
    layout,
    read_results,
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


@dataclass
class LadderConfig:
    """Options of `cipr-ladder` (module docstring).

    - `sweep_dir`: the sweep folder of `cipr-train -m +sweep=ladder`.
    - `eval`: cipr-eval options for every evaluation (`eval.benchmark=bfcl eval.limit=50 eval.backend=vllm`
      on the command line); `benchmark` defaults to `synthetic`.
    - `consistency`: also read the held-out consistency metric.
    - `base`: evaluate the shared warm start as the Base row when the sweep has one.
    - `out_dir`: the report's folder (null: SWEEP_DIR/ladder).
    """

    sweep_dir: str
    eval: dict[str, Any] = field(default_factory=dict)
    consistency: bool = True
    base: bool = True
    out_dir: str | None = None

    def __post_init__(self) -> None:
        fixed = [k for k in self.eval if k in ("model", "out_dir", "names")]
        if fixed:
            raise ConfigError(f"eval.{fixed[0]}: cipr-ladder sets model, out_dir and names for every point")

    @property
    def eval_overrides(self) -> list[str]:
        """`eval` as cipr-eval command-line overrides."""
        return [f"{k}={override_text(v)}" for k, v in self.eval.items()]


@dataclass(frozen=True)
class Point:
    """A finished (or unfinished) run of the sweep, with the method label and names it is evaluated under."""

    name: str
    run_dir: Path
    method: str
    names: tuple[str, ...]
    finished: bool
    seed: int | None


def method_label(algo: Mapping[str, Any]) -> str:
    """The paper's row label for a run's `algo` section."""
    name = algo.get("name")
    if name == "cipr":
        terms = algo.get("terms") or {}

        def weight(name: str) -> float:
            alias = algo.get(f"{name}_weight")
            return float(alias if alias is not None else (terms.get(name) or {}).get("weight") or 0.0)

        rs, ro = weight("rescore"), weight("rollout")
        if rs and ro:
            return "+ CIPR"
        return "+ CIPR w/o rescoring KL" if ro else "+ CIPR w/o rollout KL" if rs else "+ CIPR (no KL)"
    labels = {"grpo": GRPO, "multi_interface": MI, "masking": "Function masking", "sft": "SFT"}
    return labels.get(name, str(name))


def eval_names(algo: Mapping[str, Any], perturb: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """Names a point is evaluated under: as deployed, plus the adapter for ToolRL-GRPO (gray rows); the
    training names from the run's `perturb` section (older runs: `algo`)."""
    trained = (perturb or {}).get("names") or algo.get("names")
    if algo.get("name") == "grpo":
        return ("original", "canonical")
    return ("canonical",) if trained == "canonical" else ("original",)


def discover(sweep_dir: Path) -> list[Point]:
    """Every run folder of the sweep (a folder with config.json), sorted by method then seed."""
    points = []
    for cfg_path in sorted(sweep_dir.glob("*/config.json")):
        run_dir = cfg_path.parent
        if run_dir.name in (BASE, LADDER):
            continue
        config = read_json(cfg_path)
        algo = config.get("algo", {})
        finished = (run_dir / STAGES_JSON).is_file() and \
            (run_dir / read_result_stage(run_dir) / "stage.json").is_file()
        if not (run_dir / STAGES_JSON).is_file() and (run_dir / "metrics.jsonl").is_file():
            log.warning("%s: no %s (a run folder from before its trainer recorded its stages): counted as "
                        "not finished; train the point again in a new folder", run_dir, STAGES_JSON)
        names = eval_names(algo, config.get("perturb"))
        points.append(Point(run_dir.name, run_dir, method_label(algo), names, finished,
                            config.get("trainer", {}).get("seed")))
    return points


def _base_point(sweep_dir: Path) -> Point | None:
    folder = sweep_dir / BASE
    if not (folder / "stage.json").is_file() or not (folder / "final").is_dir():
        return None
    return Point(BASE, folder, BASE_LABEL, ("original", "canonical"), True, None)


def _export(point: Point, out: Path, call_format: str | None) -> tuple[Path, bool]:
    """Export `point` into `out` unless it already holds this export; (folder, whether it exported)."""
    from cipr.runtime.export import ExportConfig, export, locate, same_export

    if point.name == BASE:
        source, cfg = point.run_dir / "final", ExportConfig(call_format=call_format, names="original")
    else:
        source, cfg = point.run_dir, ExportConfig()
    if out.is_dir() and same_export(out, locate(source)):
        return out, False
    return export(source, out, cfg), True


def _evaluate(point: Point, model_dir: Path, eval_dir: Path, config: LadderConfig) -> bool:
    """Evaluate an export into `eval_dir` unless done.json says this checkpoint and options are done."""
    from cipr.eval.config import compose_eval_config
    from cipr.eval.evaluate import evaluate
    from cipr.runtime.export import read_manifest

    manifest = read_manifest(model_dir)
    identity = {"source": manifest.source if manifest else str(model_dir), "overrides": config.eval_overrides,
                "consistency": config.consistency, "names": list(point.names)}
    done = eval_dir / DONE
    if done.is_file() and read_json(done) == identity:
        return False
    overrides = ["benchmark=synthetic", *config.eval_overrides, f"model={model_dir}", f"out_dir={eval_dir}",
                 f"names=[{','.join(point.names)}]", f"consistency.enabled={str(config.consistency).lower()}"]
    evaluate(compose_eval_config(overrides))
    write_json_atomic(done, identity)
    return True


def run_ladder(config: LadderConfig) -> dict[str, Any]:
    """Export and evaluate every finished point (skipping finished work), then write the report (returned)."""
    sweep_dir = Path(config.sweep_dir).expanduser()
    if not sweep_dir.is_dir():
        raise DataError("not a folder: give the sweep folder of `cipr-train -m +sweep=ladder`",
                        file=str(sweep_dir))
    out = Path(config.out_dir).expanduser() if config.out_dir else sweep_dir / LADDER
    points = discover(sweep_dir)
    if not points:
        raise DataError("no run folders (*/config.json) in this folder: is it a ladder sweep folder?",
                        file=str(sweep_dir))
    base = _base_point(sweep_dir) if config.base else None
    finished = [p for p in points if p.finished] + ([base] if base else [])
    call_format = read_json(points[0].run_dir / "config.json")["model"].get("call_format")
    work = {"exported": [], "evaluated": [], "skipped": []}
    for p in finished:
        model_dir, exported = _export(p, out / "exports" / p.name, call_format)
        evaluated = _evaluate(p, model_dir, out / "evals" / p.name, config)
        (work["exported"] if exported else work["skipped"]).append(f"export:{p.name}")
        (work["evaluated"] if evaluated else work["skipped"]).append(f"eval:{p.name}")
    report = build_report(out / "evals", finished, [p for p in points if not p.finished])
    report["work"] = work
    write_json_atomic(out / "ladder.json", report)
    write_text_atomic(out / "ladder.md", render_ladder(report, sweep_dir))
    plot_ladder(report, out / "ladder.png")
    report["out_dir"] = str(out)
    return report


def _mean_over_seeds(per_seed: Sequence[Mapping[Any, float]]) -> dict[Any, float]:
    acc: dict[Any, list[float]] = defaultdict(list)
    for scores in per_seed:
        for k, v in scores.items():
            acc[k].append(v)
    return {k: math.fsum(v) / len(v) for k, v in acc.items()}


Rows = dict[tuple[str, str], dict[str, Any]]


def _rows(evals: Path, points: Sequence[Point]) -> tuple[Rows, Any, ReportConfig]:
    """(method, names) -> per-item accuracy and consistency (seeds averaged); the layout; the config."""
    runs: list[tuple[Point, list[dict[str, Any]], list[dict[str, Any]]]] = []
    config = None
    for p in points:
        records, _ = read_results(evals / p.name / RESULTS)
        if not records:
            continue
        meta = read_json(evals / p.name / RUN_META)
        config = config or report_config_from_meta(meta)
        runs.append((p, records, [r for r in read_records(evals / p.name) if "skipped" not in r]))
    if config is None:
        raise DataError("no evaluated point has results", file=str(evals))
    lay = layout([r for _, recs, _ in runs for r in recs], config)
    grouped: dict[tuple[str, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for p, recs, cons in runs:
        scores = item_scores(recs, lay, config)
        cvals = item_values(cons, lay) if cons else {}
        for names, e in scores.items():
            row = grouped[(p.method, names)]
            row["points"].append(p.name)
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


def build_report(evals: Path, points: Sequence[Point], unfinished: Sequence[Point]) -> dict[str, Any]:
    """ladder.json: accuracy and consistency per row and column, paired differences against the baselines."""
    rows, lay, config = _rows(evals, points)
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
            "differences": diffs, "unfinished": [p.name for p in unfinished]}


def render_ladder(report: Mapping[str, Any], sweep_dir: Path | None = None) -> str:
    """ladder.md: Table 1, the consistency table, and the paired differences against both baselines."""
    cols = report["columns"]
    head = ["Method", "Tool names", *(c.capitalize() if c in ("mean", "gap") else c for c in cols)]
    pct = int(report["confidence"] * 100)
    out = [f"# Ladder{f': {sweep_dir}' if sweep_dir else ''}", "",
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


def recompute(report_dir: Path) -> dict[str, Any]:
    """cpu_ladder.png again from the committed cpu_ladder.json's comparison (the ladder report the run wrote;
    cpu_ladder.md is prose around it): `cipr-study report study=cpu_ladder`."""
    report = read_json(report_dir / "cpu_ladder.json")
    plot_ladder(report["comparison"], report_dir / "cpu_ladder.png")
    return report
