"""Every number of a study's report, from its per-item records and per-step traces alone.

Inputs: the records (one per arm, seed, read step and item), the traces (one per arm, seed and optimizer step)
and the meta the run wrote (the spec, the item ids, timings). Outputs, in REPORT/: NAME.json, NAME.md,
NAME.png (each measure by step, one line per arm, seeds as dots), NAME_frontier.png (held-in KL change
against accuracy change, one cross per arm with both two-way intervals), NAME_trace.png (the traced term
before and after each update) and the inputs as NAME_records.jsonl.gz and NAME_trace.jsonl.gz (gzip, mtime 0),
from which `cipr-study report` rewrites every other file byte for byte.

The analysis (`cipr.experiments.stats`):
- per point and read step, each measure is its mean over the items (`MEASURES`: field × scale);
- each arm against the control (and each contrast against its reference) at each step: the paired
  difference per seed with its Student-t 95% interval (`mean`, `lo`, `hi`); the two-way interval from the
  per-(seed, item) differences, seeds and items resampled independently (`two_way`); the relative difference
  (mean / the reference's mean); the interquartile mean of the per-seed differences and the probability of
  improvement over the reference (rliable's); the smallest difference the design detects at 80% power
  from the observed per-seed SD (`detectable`);
- the decision: the spec's conditions at its step, per candidate arm; the chosen arm is the first that meets
  them all;
- the positive control: per arm, per seed the mean over steps of the traced term after − before the update,
  over seeds with its t interval, and the same minus the control's, paired by seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cipr.core.io import read_json, read_jsonl_gz, write_json_atomic, write_jsonl_gz, write_text_atomic
from cipr.experiments.spec import MEASURES, OPS, Condition
from cipr.experiments.stats import (
    detectable,
    iqm,
    paired_t,
    probability_of_improvement,
    two_way_bootstrap,
)


def finite(obj: Any) -> Any:
    """`obj` with every NaN float as None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else obj
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def t_interval(values: Sequence[float]) -> dict[str, float] | None:
    """`paired_t` of `values` as {mean, lo, hi, sd, n, p} (None for fewer than two)."""
    if len(values) < 2:
        return None
    t = paired_t(values)
    return {"mean": t["mean"], "lo": t["low"], "hi": t["high"], "sd": t["sd"], "n": t["n"], "p": t["p"]}


def _nanmean(values: Sequence[float]) -> float:
    done = [v for v in values if not math.isnan(v)]
    return math.fsum(done) / len(done) if done else float("nan")


def item_matrix(records: Sequence[Mapping[str, Any]], measure: str, arm: str, step: int, seeds: Sequence[int],
                items: Sequence[str]) -> np.ndarray:
    """[seeds, items] of the measure's field × scale at (arm, step) (NaN where a record is missing)."""
    m = MEASURES[measure]
    row, col = {s: k for k, s in enumerate(seeds)}, {i: k for k, i in enumerate(items)}
    out = np.full((len(seeds), len(items)), np.nan)
    for r in records:  # the records of the held-in type only (`analyze` filters them)
        if r["arm"] == arm and int(r["step"]) == step and int(r["seed"]) in row \
                and r.get(m.field) is not None:
            out[row[int(r["seed"])], col[r["item"]]] = float(r[m.field]) * m.scale
    return out


def _per_seed(matrix: np.ndarray) -> list[float]:
    return [float(np.mean(row)) if not np.isnan(row).any() else float("nan") for row in matrix]


def compare(arm: np.ndarray, reference: np.ndarray, *, lower_is_better: bool, draws: int, seed: int
            ) -> dict[str, Any] | None:
    """arm − reference from two [seeds, items] matrices, over the seeds complete in both (module
    docstring)."""
    ok = ~(np.isnan(arm).any(1) | np.isnan(reference).any(1))
    if ok.sum() < 2:
        return None
    a, b = arm[ok].mean(1), reference[ok].mean(1)
    t = paired_t(list(a - b))
    boot = two_way_bootstrap(arm[ok] - reference[ok], draws=draws, seed=seed)
    base = float(b.mean())
    better = (-(a - b) if lower_is_better else (a - b))
    return {"mean": t["mean"], "lo": t["low"], "hi": t["high"], "sd": t["sd"], "n": t["n"], "p": t["p"],
            "two_way": {"lo": boot["low"], "hi": boot["high"]},
            "relative": t["mean"] / base if base else float("nan"), "reference_mean": base,
            "iqm": iqm(list(a - b)),
            "p_improve": probability_of_improvement(list(-a if lower_is_better else a),
                                                    list(-b if lower_is_better else b)),
            "seeds_better": int((better > 0).sum()), "detectable": detectable(t["sd"], t["n"])}


def condition_holds(c: Condition, comparison: Mapping[str, Any] | None) -> bool:
    """Whether condition `c` holds on one comparison (False without one)."""
    if comparison is None:
        return False
    if c.stat in ("low", "high"):
        end = "lo" if c.stat == "low" else "hi"
        value = comparison["two_way"][end] if c.interval == "two_way" else comparison[end]
    else:
        value = comparison[c.stat]
    return bool(OPS[c.op](value, c.value))


def decide(spec: Mapping[str, Any], comparisons: Mapping[str, Any], contrasts: Mapping[str, Any]
           ) -> dict[str, Any]:
    """Per candidate arm, each condition's outcome at the decision step, and the chosen arm (or None)."""
    decision = spec.get("decision")
    if not decision:
        return {"chosen": None, "rule": None, "arms": {}}
    step = str(decision.get("step") or spec["read_at"][-1])
    conditions = [Condition(**c) for c in decision["conditions"]]
    candidates = decision.get("arms") or [a for a in spec["arms"] if a != spec["control"]]
    arms: dict[str, Any] = {}
    for arm in candidates:
        outcomes = []
        for c in conditions:
            if c.against in (None, spec["control"]):
                comp = comparisons[c.measure].get(arm, {}).get(step)
            else:
                comp = contrasts.get(f"{arm}-{c.against}", {}).get(c.measure, {}).get(step)
            outcomes.append(condition_holds(c, comp))
        arms[arm] = {"conditions": outcomes, "qualifies": bool(outcomes) and all(outcomes)}
    chosen = next((a for a in candidates if arms[a]["qualifies"]), None)
    return {"chosen": chosen, "step": int(step), "arms": arms,
            "rule": [c.text(spec["control"]) for c in conditions], "then": decision.get("then") or {}}


def trace_summary(traces: Sequence[Mapping[str, Any]], term: str | None, arms: Sequence[str], control: str,
                  seeds: Sequence[int]) -> dict[str, Any]:
    """Per arm: per seed the mean over steps of the traced term before the update and of after − before; the
    latter over seeds (t) and minus the control's, paired by seed; and the mean over seeds by step."""
    if not term:
        return {}
    before_key, after_key = f"trace/{term}/before", f"trace/{term}/after"
    out: dict[str, Any] = {}
    for arm in arms:
        rows = [t for t in traces if t["arm"] == arm and t.get(before_key) is not None
                and t.get(after_key) is not None]
        by_seed = {s: [t for t in rows if int(t["seed"]) == s] for s in seeds}
        steps = sorted({int(t["step"]) for t in rows})
        change = [float(np.mean([t[after_key] - t[before_key] for t in by_seed[s]])) if by_seed[s]
                  else float("nan") for s in seeds]
        done = [c for c in change if not math.isnan(c)]
        out[arm] = {"before": [float(np.mean([t[before_key] for t in by_seed[s]])) if by_seed[s]
                               else float("nan") for s in seeds],
                    "change": change, "change_t": t_interval(done),
                    "by_step": {str(st): {"before": float(np.mean([t[before_key] for t in rows
                                                                   if int(t["step"]) == st])),
                                          "after": float(np.mean([t[after_key] for t in rows
                                                                  if int(t["step"]) == st]))}
                                for st in steps}}
    for arm in arms:
        if arm != control and control in out:
            diffs = [a - b for a, b in zip(out[arm]["change"], out[control]["change"], strict=True)
                     if not (math.isnan(a) or math.isnan(b))]
            out[arm]["change_vs_control_t"] = t_interval(diffs)
    return out


def analyze(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
            meta: Mapping[str, Any]) -> dict[str, Any]:
    """NAME.json (module docstring)."""
    spec = meta["spec"]
    heldin = (spec.get("items") or {}).get("perturbation")
    records = [r for r in records if "evaluation" not in r
               and (heldin is None or r.get("perturbation", heldin) == heldin)]
    arms, control, read_at = list(spec["arms"]), spec["control"], list(spec["read_at"])
    present = {int(r["seed"]) for r in records}
    seeds = [s for s in spec["seeds"] if s in present]
    items = list(meta["items"])
    boot = spec.get("bootstrap") or {"draws": 4000, "seed": 0}
    matrices = {(m, a, st): item_matrix(records, m, a, st, seeds, items)
                for m in spec["measures"] for a in arms for st in read_at}
    measures = {m: {a: {str(st): _per_seed(matrices[(m, a, st)]) for st in read_at} for a in arms}
                for m in spec["measures"]}

    def comparison(m: str, arm: str, ref: str, st: int) -> dict[str, Any] | None:
        return compare(matrices[(m, arm, st)], matrices[(m, ref, st)],
                       lower_is_better=MEASURES[m].lower_is_better, draws=boot["draws"], seed=boot["seed"])

    comparisons = {m: {a: {str(st): comparison(m, a, control, st) for st in read_at}
                       for a in arms if a != control} for m in spec["measures"]}
    contrasts = {f"{a}-{b}": {m: {str(st): comparison(m, a, b, st) for st in read_at}
                              for m in spec["measures"]} for a, b in spec.get("contrasts") or []}
    finished = [s for s in seeds if all(not math.isnan(measures[m][a][str(st)][seeds.index(s)])
                                        for m in spec["measures"] for a in arms for st in read_at)]
    return {"name": spec["name"], "arms": arms, "control": control, "seeds": seeds,
            "seeds_planned": list(spec["seeds"]), "seeds_finished": finished, "read_at": read_at,
            "n_items": len(items), "measures": measures, "comparisons": comparisons, "contrasts": contrasts,
            "decision": decide(spec, comparisons, contrasts),
            "traces": trace_summary(traces, spec.get("trace_term"), arms, control, seeds),
            "threads": sorted({t.get("threads") for t in meta.get("timings", {}).values()} - {None}),
            "commits": sorted({t.get("commit") for t in meta.get("timings", {}).values()} - {None}),
            "wall_s": meta.get("wall_s")}


def _ci(c: Mapping[str, Any] | None, digits: int, two_way: bool = False) -> str:
    if not c:
        return "n/a"
    lo, hi = (c["two_way"]["lo"], c["two_way"]["hi"]) if two_way else (c["lo"], c["hi"])
    return f"{c['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


DIGITS = {"heldin_kl": 4, "action_accuracy": 1, "p_reference": 3}


def result_paragraph(report: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """The result in words, every number from the report: the positive control first, then the decision,
    then each arm's effects with both intervals."""
    control, traces, arms = report["control"], report["traces"], report["arms"]
    lines: list[str] = []
    planned, finished = report["seeds_planned"], report["seeds_finished"]
    if finished != planned:
        lines += [f"**Incomplete run: {len(finished)} of the {len(planned)} planned seeds finished** (seeds "
                  f"{', '.join(map(str, finished)) or 'none'}); every interval is over the seeds that "
                  f"finished, and the decision is provisional.", ""]
    if traces:
        term = spec.get("trace_term")
        listed = "; ".join(f"{a}: {_ci(traces[a]['change_t'], 4)}" for a in arms if traces[a].get("change_t"))
        held = [a for a in arms if a != control and (traces[a].get("change_t") or {}).get("hi", 0.0) < 0]
        lines += [f"**Positive control** (the `{term}` term on each step's own pairs, after − before the "
                  f"update, mean over steps, nats, t interval over seeds): {listed}. It moved (interval "
                  f"below 0) in {', '.join(held) if held else 'no arm'} of the {len(arms) - 1} trained "
                  f"arms.", ""]
    decision = report["decision"]
    if decision.get("rule"):
        chosen = decision["chosen"]
        then = decision.get("then") or {}
        rule = "; ".join(decision["rule"])
        verdict = (f"**Decision: {chosen} qualifies**" if chosen else "**Decision: no arm qualifies**")
        lines += [f"{verdict} under the pre-registered rule at step {decision['step']} ({rule}). "
                  + " ".join(f"{a}: {'yes' if v['qualifies'] else 'no'} "
                             f"({', '.join('met' if x else 'not met' for x in v['conditions'])})."
                             for a, v in decision["arms"].items())
                  + (f" {then.get('chosen' if chosen else 'none', '')}" if then else ""), ""]
    step = str(decision.get("step") or report["read_at"][-1])
    for arm in arms:
        if arm == control:
            continue
        parts = []
        for m in report["comparisons"]:
            c = report["comparisons"][m][arm][step]
            if c:
                parts.append(f"{m} {_ci(c, DIGITS.get(m, 3))} (t), two-way "
                             f"[{c['two_way']['lo']:+.{DIGITS.get(m, 3)}f}, "
                             f"{c['two_way']['hi']:+.{DIGITS.get(m, 3)}f}], {c['relative']:+.0%} of the "
                             f"control's mean")
        lines.append(f"- {arm} − {control} at step {step}: " + "; ".join(parts) + ".")
    return lines


def render(report: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """NAME.md: the question, the result paragraph and the tables."""
    name, control = report["name"], report["control"]
    lines = [f"# {spec.get('title') or name}", ""]
    if spec.get("question"):
        lines += [f"Question: {spec['question']}", ""]
    if spec.get("preregistration"):
        link = spec["preregistration"]
        lines += [f"Pre-registration: [{link}]({link}) (committed before the run).", ""]
    lines += [f"Every number below is recomputed from `{name}_records.jsonl.gz` and `{name}_trace.jsonl.gz` "
              f"by `cipr-study report study={name}`. {len(report['seeds'])} paired seeds, "
              f"{report['n_items']} items, read at step(s) {', '.join(map(str, report['read_at']))}; "
              f"intervals: t over seeds and the seed × item bootstrap (two-way), 95%.", "", "## Result", ""]
    lines += result_paragraph(report, spec)
    for title, table in (("against the control", {a: {m: report["comparisons"][m][a] for m in
                                                      report["comparisons"]} for a in report["arms"]
                                                  if a != control}),
                         ("contrasts", report["contrasts"])):
        if not table:
            continue
        lines += ["", f"## Comparisons {title} (paired by seed)", "",
                  "| comparison | measure | step | mean [t 95%] | two-way 95% | relative | IQM | "
                  "P(improve) | detectable (80%) |", "|---|---|---|---|---|---|---|---|---|"]
        for who, by_measure in table.items():
            label = who if "-" in who else f"{who}-{control}"
            for m, by_step in by_measure.items():
                d = DIGITS.get(m, 3)
                for st, c in by_step.items():
                    if c:
                        lines.append(f"| {label.replace('-', ' − ')} | {m} | {st} | {_ci(c, d)} | "
                                     f"[{c['two_way']['lo']:+.{d}f}, {c['two_way']['hi']:+.{d}f}] | "
                                     f"{c['relative']:+.0%} | {c['iqm']:+.{d}f} | {c['p_improve']:.2f} | "
                                     f"{c['detectable']:.{d}f} |")
    lines += ["", "## Means over seeds", "", "| arm | step | " + " | ".join(report["measures"]) + " |",
              "|---|---|" + "---|" * len(report["measures"])]
    for arm in report["arms"]:
        for st in report["read_at"]:
            lines.append(f"| {arm} | {st} | " + " | ".join(
                f"{_nanmean(report['measures'][m][arm][str(st)]):.{DIGITS.get(m, 3)}f}"
                for m in report["measures"]) + " |")
    if report["traces"]:
        lines += ["", f"## Training-time traces: `{spec.get('trace_term')}` on each step's own pairs", "",
                  "| arm | before the update (mean over steps) | after − before [t 95%] | "
                  "minus the control's |",
                  "|---|---|---|---|"]
        for arm, t in report["traces"].items():
            lines.append(f"| {arm} | {_nanmean(t['before']):.4f} | {_ci(t['change_t'], 4)} | "
                         f"{_ci(t.get('change_vs_control_t'), 4) if arm != control else '-'} |")
    lines += ["", f"![measures by step]({name}.png)", "", f"![frontier]({name}_frontier.png)", ""]
    if report["traces"]:
        lines += [f"![traces]({name}_trace.png)", ""]
    if report.get("wall_s"):
        lines.append(f"Work time: {report['wall_s']:.0f} s over the points (training, traces and reading); "
                     f"torch threads per point: {', '.join(map(str, report['threads'])) or 'not recorded'}; "
                     f"code: {', '.join(c[:12] for c in report['commits']) or 'not recorded'}.")
    return "\n".join(lines) + "\n"


def plot(report: Mapping[str, Any], spec: Mapping[str, Any], out: Path) -> None:
    """NAME.png, NAME_frontier.png and (with traces) NAME_trace.png (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, arms, read_at, control = report["name"], report["arms"], report["read_at"], report["control"]
    measures = list(report["measures"])
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.8), squeeze=False)
    for ax, m in zip(axes[0], measures, strict=True):
        for k, arm in enumerate(arms):
            x = [st + (k - (len(arms) - 1) / 2) * 0.4 for st in read_at]
            means = [_nanmean(report["measures"][m][arm][str(st)]) for st in read_at]
            line, = ax.plot(x, means, marker="o", label=arm)
            for xi, st in zip(x, read_at, strict=True):
                vals = report["measures"][m][arm][str(st)]
                ax.scatter([xi] * len(vals), vals, s=8, alpha=0.4, color=line.get_color())
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{m} ({MEASURES[m].unit})")
        ax.set_xticks(read_at)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=120)
    plt.close(fig)
    step = str(report["decision"].get("step") or read_at[-1])
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for arm in arms:
        if arm == control or "heldin_kl" not in report["comparisons"] or "action_accuracy" not in \
                report["comparisons"]:
            continue
        kl = report["comparisons"]["heldin_kl"][arm][step]
        acc = report["comparisons"]["action_accuracy"][arm][step]
        if not kl or not acc:
            continue
        base = kl["reference_mean"]
        x, xlo, xhi = (100 * v / base for v in (kl["mean"], kl["two_way"]["lo"], kl["two_way"]["hi"]))
        y, ylo, yhi = acc["mean"], acc["two_way"]["lo"], acc["two_way"]["hi"]
        ax.errorbar([x], [y], xerr=[[x - xlo], [xhi - x]], yerr=[[y - ylo], [yhi - y]], fmt="o", capsize=3,
                    label=arm)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"held-in KL change vs {control} (% of {control}'s mean)")
    ax.set_ylabel(f"action accuracy change vs {control} (points)")
    ax.set_title(f"step {step}: mean, seed x item bootstrap 95% intervals", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{name}_frontier.png", dpi=120)
    plt.close(fig)
    if report["traces"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for arm, t in report["traces"].items():
            xs = sorted(int(s) for s in t["by_step"])
            line, = ax.plot(xs, [t["by_step"][str(s)]["before"] for s in xs], label=f"{arm}: before")
            ax.plot(xs, [t["by_step"][str(s)]["after"] for s in xs], linestyle="--", color=line.get_color(),
                    label=f"{arm}: after")
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{spec.get('trace_term')} on the step's own pairs\n(nats, mean over seeds)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{name}_trace.png", dpi=120)
        plt.close(fig)


def write_report(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Write NAME.json, .md, the plots and the compressed inputs into `out`; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    spec = meta["spec"]
    name = spec["name"]
    order = {a: k for k, a in enumerate(spec["arms"])}
    records = sorted(records, key=lambda r: (order[r["arm"]], int(r["seed"]), int(r["step"]), r["item"]))
    traces = sorted(traces, key=lambda r: (order[r["arm"]], int(r["seed"]), int(r["step"])))
    report = analyze(records, traces, meta)
    write_jsonl_gz(out / f"{name}_records.jsonl.gz", records)
    write_jsonl_gz(out / f"{name}_trace.jsonl.gz", traces)
    write_json_atomic(out / f"{name}.json", finite({**report, "meta": dict(meta)}))
    write_text_atomic(out / f"{name}.md", render(report, spec))
    plot(report, spec, out)
    return report


def recompute(report_dir: Path, name: str) -> dict[str, Any]:
    """Every file again from `report_dir`'s records and traces and the meta its JSON recorded."""
    meta = read_json(report_dir / f"{name}.json")["meta"]
    return write_report(read_jsonl_gz(report_dir / f"{name}_records.jsonl.gz"),
                        read_jsonl_gz(report_dir / f"{name}_trace.jsonl.gz"), meta, report_dir)

