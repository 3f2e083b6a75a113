"""Every number of the dose study's report, recomputed from its per-item records and training traces.

Inputs: the records of the study engine's cpu_dose spec (one per point, checkpoint and calibration
item), the traces (one per point and optimizer step) and the run's meta (design, timings). Outputs:
cpu_dose.json, cpu_dose.md, cpu_dose.png (held-in KL and original accuracy by step and λ),
cpu_dose_trace.png (each step's term on its own pairs before and after the update) and the inputs as
cpu_dose_records.jsonl.gz and cpu_dose_trace.jsonl.gz (gzip, mtime 0: the same rows give the same bytes),
from which `cipr-study report study=cpu_dose` recomputes the rest.

The analysis (docs/results/cpu_dose_preregistration.md):
- per point and checkpoint, the held-in KL and the original action accuracy are means over the items;
- each λ > 0 is compared with λ = 0 at the same step by the paired difference per seed (Student t, 95%);
- decision rule: the smallest λ, then the earliest step, whose mean KL difference is at most −`REDUCTION` of
  λ = 0's mean KL at that step, whose interval lies below 0, and whose mean accuracy difference is at least
  `ACCURACY_MARGIN` points; none if no (λ, step) qualifies;
- traces: per point, the mean over steps of (after − before) and of the before-value by step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cipr.core.io import read_json, read_jsonl_gz, write_json_atomic, write_jsonl_gz, write_text_atomic
from cipr.experiments.stats import detectable, paired_t, two_way_bootstrap

REDUCTION = 0.30
ACCURACY_MARGIN = -2.0
RECORDS = "cpu_dose_records.jsonl.gz"
TRACES = "cpu_dose_trace.jsonl.gz"
THREADS = ("Threads: the λ = 0 points of seeds 0 and 2, and the resumed halves of their λ = 3 points, "
           "trained on two torch threads a process; every other point trained and was read on one "
           "(cpu_dose_run.md). The thread count changes the order of floating-point sums, not what is "
           "computed; its effect on the outcome was not measured.")
"""Written beside the tables: how the points ran, which the records do not hold."""
RULE = (f"the smallest lambda, then the earliest step, whose paired held-in KL difference against "
        f"lambda = 0 at the same step is at most -{REDUCTION:.0%} of lambda = 0's mean with a 95% t interval "
        f"below 0, and whose mean original-accuracy difference is at least {ACCURACY_MARGIN:+.0f} points; "
        f"none if no point qualifies")


def key(lam: float) -> str:
    """A λ as the JSON key it is reported under ("0", "1", "2.5")."""
    return f"{lam:g}"


def per_seed(records: Sequence[Mapping[str, Any]], metric: str, lam: float, step: int, seeds: Sequence[int],
             scale: float = 1.0) -> list[float]:
    """Per seed (in `seeds` order), the mean of `metric` over the items of point (λ, seed) at `step` (NaN
    where a seed has none)."""
    values: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if float(r["lambda"]) == lam and int(r["step"]) == step and r.get(metric) is not None:
            values[int(r["seed"])].append(float(r[metric]))
    return [math.fsum(values[s]) / len(values[s]) * scale if values[s] else float("nan") for s in seeds]


def decide(comparisons: Mapping[str, Mapping[str, Any]], lambdas: Sequence[float], steps: Sequence[int]
           ) -> dict[str, Any] | None:
    """The pre-registered rule (module docstring) over `comparisons[λ key][step]`: the dose, or None."""
    for lam in sorted(v for v in lambdas if v > 0):
        for step in sorted(steps):
            c = comparisons.get(key(lam), {}).get(str(step))
            if c and c["qualifies"]:
                return {"lambda": lam, "step": step}
    return None


def compare(kl: Mapping[str, Mapping[str, list[float]]], acc: Mapping[str, Mapping[str, list[float]]],
            lam: float, step: int) -> dict[str, Any] | None:
    """λ against λ = 0 at `step`, paired over the seeds both have: KL and accuracy differences, the relative
    reduction and whether the rule's three conditions hold."""
    a, b = np.array(kl[key(0.0)][str(step)]), np.array(kl[key(lam)][str(step)])
    x, y = np.array(acc[key(0.0)][str(step)]), np.array(acc[key(lam)][str(step)])
    ok = ~(np.isnan(a) | np.isnan(b) | np.isnan(x) | np.isnan(y))
    if ok.sum() < 2:
        return None
    d_kl, d_acc = paired_t(list(b[ok] - a[ok])), paired_t(list(y[ok] - x[ok]))
    base = float(a[ok].mean())
    reduction = -d_kl["mean"] / base if base > 0 else float("nan")
    qualifies = bool(reduction >= REDUCTION and d_kl["high"] < 0 and d_acc["mean"] >= ACCURACY_MARGIN)
    return {"kl_difference": d_kl, "accuracy_difference": d_acc, "control_kl": base,
            "relative_reduction": reduction, "qualifies": qualifies, "seeds": int(ok.sum())}


def trace_summary(traces: Sequence[Mapping[str, Any]], lambdas: Sequence[float], seeds: Sequence[int]
                  ) -> dict[str, Any]:
    """Per λ: per seed the mean over steps of the term before the update and of (after − before); and the
    mean over seeds of the before-value at each step."""
    out: dict[str, Any] = {}
    for lam in lambdas:
        rows = [t for t in traces if float(t["lambda"]) == lam and t.get("before") is not None
                and t.get("after") is not None]
        by_seed = {s: [t for t in rows if int(t["seed"]) == s] for s in seeds}
        steps = sorted({int(t["step"]) for t in rows})
        out[key(lam)] = {
            "before": [float(np.mean([t["before"] for t in by_seed[s]])) if by_seed[s] else float("nan")
                       for s in seeds],
            "change": [float(np.mean([t["after"] - t["before"] for t in by_seed[s]])) if by_seed[s]
                       else float("nan") for s in seeds],
            "by_step": {str(st): float(np.mean([t["before"] for t in rows if int(t["step"]) == st]))
                        for st in steps}}
        done = [c for c in out[key(lam)]["change"] if not math.isnan(c)]
        out[key(lam)]["change_t"] = paired_t(done) if len(done) > 1 else None
    control = out.get(key(0.0))
    for lam in lambdas:  # a reading aid, not pre-registered: the update's effect beyond the task loss's
        if lam > 0 and control is not None and len(seeds) > 1:
            diffs = [c - b for c, b in zip(out[key(lam)]["change"], control["change"], strict=True)]
            ok = [d for d in diffs if not math.isnan(d)]
            out[key(lam)]["change_vs_control_t"] = paired_t(ok) if len(ok) > 1 else None
    return out


def analyze(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
            meta: Mapping[str, Any]) -> dict[str, Any]:
    """cpu_dose.json: the per-seed values, the comparisons against λ = 0, the traces and the decision."""
    design = meta["design"]
    lambdas, steps, planned = list(design["lambdas"]), list(design["steps"]), list(design["seeds"])
    records = [r for r in records if "skipped" not in r]
    present = {int(r["seed"]) for r in records}
    seeds = [s for s in planned if s in present]  # a run cut short reports the seeds it has, and says so
    kl = {key(lam): {str(st): per_seed(records, "kl", lam, st, seeds) for st in steps} for lam in lambdas}
    acc = {key(lam): {str(st): per_seed(records, "action_acc_ref", lam, st, seeds, 100.0) for st in steps}
           for lam in lambdas}
    comparisons = {key(lam): {str(st): compare(kl, acc, lam, st) for st in steps}
                   for lam in lambdas if lam > 0}
    for lam in lambdas:  # added after the run (issue 63): the seed x item interval and the design's reach
        for st in steps:
            c = comparisons.get(key(lam), {}).get(str(st))
            if c:
                c["two_way"] = {m: two_way_difference(records, m, scale, lam, st, seeds)
                                for m, scale in (("kl", 1.0), ("action_acc_ref", 100.0))}
                c["detectable"] = {"kl": detectable(c["kl_difference"]["sd"], c["seeds"]),
                                   "accuracy": detectable(c["accuracy_difference"]["sd"], c["seeds"])}
    dose = decide(comparisons, lambdas, steps)
    return {"lambdas": lambdas, "steps": steps, "seeds": seeds, "seeds_planned": planned,
            "n_items": len({r["id"] for r in records}), "heldin": design["heldin"],
            "heldin_kl": kl, "accuracy": acc, "comparisons": comparisons,
            "decision": {"dose": dose, "rule": RULE}, "traces": trace_summary(traces, lambdas, seeds),
            "wall_s": meta.get("wall_s"), "timings": meta.get("timings", {}), "design": design}


def two_way_difference(records: Sequence[Mapping[str, Any]], metric: str, scale: float, lam: float, step: int,
                       seeds: Sequence[int]) -> dict[str, float] | None:
    """λ − λ=0 at `step` over the (seed, item) pairs both have: the seed × item bootstrap interval
    (`cipr.experiments.stats.two_way_bootstrap`, 4,000 draws, seed 0)."""
    values: dict[tuple[float, int, str], float] = {}
    for r in records:
        if int(r["step"]) == step and r.get(metric) is not None:
            values[(float(r["lambda"]), int(r["seed"]), r["id"])] = float(r[metric]) * scale
    items = sorted({i for (_, _, i) in values})
    rows = [[values[(lam, s, i)] - values[(0.0, s, i)] for i in items] for s in seeds
            if all((lam, s, i) in values and (0.0, s, i) in values for i in items)]
    return two_way_bootstrap(np.array(rows)) if len(rows) > 1 else None


def finished_seeds(report: Mapping[str, Any]) -> list[int]:
    """The design's seeds with a held-in KL at every (λ, step): the seeds the comparisons rest on."""
    return [s for i, s in enumerate(report["seeds"])
            if all(not math.isnan(report["heldin_kl"][key(lam)][str(st)][i])
                   for lam in report["lambdas"] for st in report["steps"])]


def _mean(values: Sequence[float]) -> float:
    """The mean over the values that are not NaN (NaN, without numpy's warning, when none is)."""
    done = [v for v in values if not math.isnan(v)]
    return math.fsum(done) / len(done) if done else float("nan")


def _fmt(c: Mapping[str, Any] | None, digits: int = 4) -> str:
    if not c:
        return "n/a"
    return f"{c['mean']:+.{digits}f} [{c['low']:+.{digits}f}, {c['high']:+.{digits}f}]"


def result_paragraph(report: Mapping[str, Any]) -> list[str]:
    """The result in words, each sentence computed from the report: the positive control first (the term
    on each step's own pairs, which the update optimizes directly: pre-registered analysis 2), then the
    decision, what λ = 0 alone does to the held-in KL (analysis 3) and what follows for Stage B."""
    lambdas, steps, traces = report["lambdas"], report["steps"], report["traces"]
    trained = [lam for lam in lambdas if lam > 0]
    held = [lam for lam in trained if (traces[key(lam)].get("change_t") or {}).get("high", 0.0) < 0]
    failed = [lam for lam in trained if lam not in held]
    listed = ", ".join(f"λ = {lam:g} {_fmt(traces[key(lam)]['change_t'])}" for lam in trained)
    control = traces.get(key(0.0), {}).get("change_t")
    versus = ", ".join(f"λ = {lam:g} {_fmt(traces[key(lam)].get('change_vs_control_t'))}" for lam in trained)
    verdict = (f"It held (interval below 0) at λ = {', '.join(f'{v:g}' for v in held)}" if held
               else "It held at no λ")
    if failed:
        verdict += (f"; not at λ = {', '.join(f'{v:g}' for v in failed)}, where, as pre-registered, the "
                    f"held-in result is not read as a dose-response")
    moved = control is not None and (control["high"] < 0 or control["low"] > 0)
    finished, planned = finished_seeds(report), report.get("seeds_planned", report["seeds"])
    lines = []
    if finished != planned:
        lines += [f"**Incomplete run: {len(finished)} of the {len(planned)} pre-registered seeds finished** "
                  f"(seeds {', '.join(map(str, finished)) or 'none'} of {', '.join(map(str, planned))}). "
                  f"Every interval below is a t interval over the finished seeds "
                  f"({max(len(finished) - 1, 0)} degrees of freedom), so the decision below is provisional: "
                  f"the pre-registered rule is applied as written, to fewer seeds than planned.", ""]
    lines += [f"**Positive control (the term on each step's own pairs, which the update optimizes "
              f"directly).** After − before the update, mean over steps, nats, 95% t interval over seeds: "
              f"{listed}. {verdict}.", "",
              f"At λ = 0, where the term is computed but not trained on, after − before was {_fmt(control)}: "
             + ("the task loss alone moves the term on its pairs." if moved else
                "no change from the task loss alone is resolved.")
             + f" Each λ's change minus λ = 0's, paired by seed (a reading aid, not pre-registered): "
               f"{versus}.", ""]
    dose = report["decision"]["dose"]
    provisional = "" if finished == planned else " (provisional)"
    scope = (f"among λ ∈ {{{', '.join(f'{v:g}' for v in trained)}}} at steps "
             f"{', '.join(map(str, steps))} of this recipe (the embedded SmolLM2-135M, this synthetic data)")
    if dose is None:
        lines.append(f"**Decision{provisional}: no dose qualifies** {scope} under the pre-registered rule "
                     f"({report['decision']['rule']}).")
    else:
        c = report["comparisons"][key(dose["lambda"])][str(dose["step"])]
        lines.append(f"**Decision{provisional}: the dose is λ = {dose['lambda']:g} at step {dose['step']}**: "
                     f"held-in `{report['heldin']}` KL, λ − λ=0, {_fmt(c['kl_difference'])} nats over "
                     f"{c['seeds']} seeds ({c['relative_reduction']:.0%} of λ=0's {c['control_kl']:.4f}); "
                     f"original action accuracy {_fmt(c['accuracy_difference'], 1)} points.")
    lines += ["", *effects(report)]
    trajectory = ", ".join(f"step {st}: {_mean(report['heldin_kl'][key(0.0)][str(st)]):.4f}"
                           for st in steps)
    lines += ["", f"λ = 0's held-in KL on the calibration items (mean over seeds), {trajectory}.", ""]
    if dose is None:
        lines.append("As pre-registered, Stage B (the transfer comparison at the dose) does not run: Stage A "
                     "found no dose.")
    elif provisional:
        lines.append("Stage B (the transfer comparison at the dose) waits for the remaining seeds: the "
                     "pre-registration runs it at a dose found over all of them.")
    else:
        lines.append("As pre-registered, Stage B (the transfer comparison) runs at this dose, with its own "
                     "pre-registration.")
    return lines


def _interval(c: Mapping[str, Any] | None, digits: int) -> str:
    return f"[{c['low']:+.{digits}f}, {c['high']:+.{digits}f}]" if c else "n/a"


def _both(c: Mapping[str, Any], metric: str, digits: int) -> str:
    """A difference with its t interval over seeds and its seed × item bootstrap interval."""
    t = c["kl_difference" if metric == "kl" else "accuracy_difference"]
    two = (c.get("two_way") or {}).get(metric)
    both = f"{t['mean']:+.{digits}f} [t {t['low']:+.{digits}f}, {t['high']:+.{digits}f}"
    return both + (f"; seed × item {two['low']:+.{digits}f}, {two['high']:+.{digits}f}]" if two else "]")


def effects(report: Mapping[str, Any]) -> list[str]:
    """Each λ at the last step read, in words that carry their intervals: whether the KL reduction and the
    accuracy change are resolved (both intervals on one side of 0), and what the design could detect."""
    step = str(report["steps"][-1])
    out = [f"At step {step}, λ − λ=0, 95% intervals (t over seeds; the seed × item bootstrap, added after "
           f"the run):"]
    reach = []
    for lam in report["lambdas"]:
        c = report["comparisons"].get(key(lam), {}).get(step)
        if lam == 0 or not c:
            continue
        acc_t, acc_two = c["accuracy_difference"], (c.get("two_way") or {}).get("action_acc_ref")
        highs = [acc_t["high"], *([acc_two["high"]] if acc_two else [])]
        lows = [acc_t["low"], *([acc_two["low"]] if acc_two else [])]
        if max(highs) < 0:
            verdict = "costs accuracy (both intervals below 0)"
        elif min(lows) > 0:
            verdict = "raises accuracy (both intervals above 0)"
        elif min(highs) < 0:
            upper = acc_two["high"] if acc_two else float("nan")
            verdict = (f"a cost that only one interval resolves: {acc_t['high']:+.1f} and {upper:+.1f} "
                       f"are the "
                       f"upper ends (t, seed × item)")
        else:
            verdict = (f"its accuracy change is not resolved: the intervals reach from "
                       f"{min(lows):+.1f} to {max(highs):+.1f} points, so neither a cost nor its absence is "
                       f"shown")
        out.append(f"- λ = {lam:g}: held-in KL {_both(c, 'kl', 4)} nats ({-c['relative_reduction']:+.0%}); "
                   f"original action accuracy {_both(c, 'action_acc_ref', 1)} points: {verdict}.")
        reach.append(f"{c['detectable']['accuracy']:.1f} points at λ = {lam:g}")
    n = max((c["seeds"] for c in report["comparisons"].get(key(report["lambdas"][-1]), {}).values() if c),
            default=0)
    out.append(f"- With {n} seeds, the smallest accuracy difference this design detects at 80% power (paired "
               f"t, from each comparison's per-seed SD) is {', '.join(reach)}: the rule's −2-point margin "
               f"on a "
               f"mean is far inside what it can resolve.")
    return out


def render(report: Mapping[str, Any]) -> str:
    """cpu_dose.md: the result paragraph and the tables."""
    lambdas, steps = report["lambdas"], report["steps"]
    lines = ["# Dose study, Stage A (CPU): does CIPR's rescoring term take hold, at which λ and step?", "",
             "Pre-registration: [cpu_dose_preregistration.md](cpu_dose_preregistration.md) (committed before "
             "the run). Every number below is recomputed from `cpu_dose_records.jsonl.gz` and "
             "`cpu_dose_trace.jsonl.gz` by `cipr-study report study=cpu_dose`.", "", "## Result", ""]
    lines += result_paragraph(report)
    lines += ["", "## Held-in KL and original accuracy: λ − λ=0 at the same step (paired over seeds)", "",
              "| λ | step | KL difference (nats) [t] | seed × item | relative | "
              "accuracy difference (points) [t] | seed × item | detectable accuracy (80%) | qualifies |",
              "|---|---|---|---|---|---|---|---|---|"]
    for lam in lambdas:
        if lam == 0:
            continue
        for st in steps:
            c = report["comparisons"][key(lam)][str(st)]
            if c:
                two = c.get("two_way") or {}
                lines.append(f"| {lam:g} | {st} | {_fmt(c['kl_difference'])} | "
                             f"{_interval(two.get('kl'), 4)} | {-c['relative_reduction']:+.0%} | "
                             f"{_fmt(c['accuracy_difference'], 1)} | "
                             f"{_interval(two.get('action_acc_ref'), 1)} | "
                             f"{c['detectable']['accuracy']:.1f} | {'yes' if c['qualifies'] else 'no'} |")
    lines += ["", THREADS]
    lines += ["", "## Means over seeds", "", "| λ | step | held-in KL | original action acc. (%) |",
              "|---|---|---|---|"]
    for lam in lambdas:
        for st in steps:
            lines.append(f"| {lam:g} | {st} | {_mean(report['heldin_kl'][key(lam)][str(st)]):.4f} | "
                         f"{_mean(report['accuracy'][key(lam)][str(st)]):.1f} |")
    lines += ["", "## Training-time traces: the term on each step's own pairs", "",
              "| λ | term before the update (mean over steps) | after − before (mean over steps) |",
              "|---|---|---|"]
    for lam in lambdas:
        t = report["traces"][key(lam)]
        lines.append(f"| {lam:g} | {_mean(t['before']):.4f} | {_fmt(t['change_t'])} |")
    lines += ["", "![held-in KL and accuracy by step](cpu_dose.png)", "",
              "![the term before and after each update](cpu_dose_trace.png)", ""]
    if report.get("wall_s"):
        lines.append(f"Work time: {report['wall_s']:.0f} s over {len(report['timings'])} points (training, "
                     "traces and reading; the shared warm start is inside the first point's training time).")
    return "\n".join(lines) + "\n"


def plot(report: Mapping[str, Any], traces: Sequence[Mapping[str, Any]], out: Path) -> None:
    """cpu_dose.png (KL and accuracy by step, one line per λ, seeds as dots) and cpu_dose_trace.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lambdas, steps = report["lambdas"], report["steps"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for lam in lambdas:
        for ax, what in zip(axes, ("heldin_kl", "accuracy"), strict=True):
            means = [_mean(report[what][key(lam)][str(s)]) for s in steps]
            line, = ax.plot(steps, means, marker="o", label=f"λ = {lam:g}")
            for s in steps:
                ax.scatter([s] * len(report[what][key(lam)][str(s)]), report[what][key(lam)][str(s)], s=8,
                           alpha=0.4, color=line.get_color())
    axes[0].set_ylabel(f"held-in {report['heldin']} KL (nats)")
    axes[1].set_ylabel("original action accuracy (%)")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.set_xticks(steps)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "cpu_dose.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for lam in lambdas:
        rows = [t for t in traces if float(t["lambda"]) == lam and t.get("before") is not None]
        xs = sorted({int(t["step"]) for t in rows})
        before = [np.mean([t["before"] for t in rows if int(t["step"]) == x]) for x in xs]
        after = [np.mean([t["after"] for t in rows if int(t["step"]) == x and t.get("after") is not None])
                 for x in xs]
        line, = ax.plot(xs, before, label=f"λ = {lam:g}: before the update")
        ax.plot(xs, after, linestyle="--", color=line.get_color(), label=f"λ = {lam:g}: after")
    ax.set_xlabel("training step")
    ax.set_ylabel("term on the step's own pairs\n(nats, mean over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "cpu_dose_trace.png", dpi=120)
    plt.close(fig)


def write_report(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Write cpu_dose.json, .md, the two plots and the compressed inputs into `out`; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = analyze(records, traces, meta)
    write_jsonl_gz(out / RECORDS, sorted(records, key=lambda r: (float(r["lambda"]), int(r["seed"]),
                                                                 int(r["step"]), r["id"])))
    write_jsonl_gz(out / TRACES, sorted(traces, key=lambda r: (float(r["lambda"]), int(r["seed"]),
                                                               int(r["step"]))))
    write_json_atomic(out / "cpu_dose.json", {**report, "meta": dict(meta)})
    write_text_atomic(out / "cpu_dose.md", render(report))
    plot(report, traces, out)
    return report


def recompute(report_dir: Path, name: str = "cpu_dose") -> dict[str, Any]:
    """Every number again from `report_dir`'s records and traces and the meta its JSON recorded."""
    meta = read_json(report_dir / "cpu_dose.json")["meta"]
    return write_report(read_jsonl_gz(report_dir / RECORDS), read_jsonl_gz(report_dir / TRACES), meta,
                        report_dir)


def study_report(records: Sequence[Mapping[str, Any]], traces: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The report of a dose run by the study engine (configs/study/cpu_dose.yaml): its records and traces in
    this analysis' shape (λ from the arm's label, the traced term's before/after) and its design."""
    spec = meta["spec"]
    lambdas = [float(spec["labels"][a]["lambda"]) for a in spec["arms"]]
    term = spec["trace_term"]
    traces = [{"point": t["point"], "lambda": t["lambda"], "seed": t["seed"], "step": t["step"],
               "before": t.get(f"trace/{term}/before"), "after": t.get(f"trace/{term}/after"),
               "loss": t.get("loss"), "action_nll": t.get("action_nll"), "token_loss": t.get("token_loss")}
              for t in traces]
    design = {"lambdas": lambdas, "seeds": list(spec["seeds"]), "steps": list(spec["read_at"]),
              "items": list(meta["items"]), "eval_seed": spec["items"]["seed"],
              "heldin": spec["items"]["perturbation"],
              "perturbation_seed": spec["items"]["perturbation_seed"],
              "sweep": spec["base"][0].split("=", 1)[1], "train": {}}
    timings = {label: {k: v for k, v in t.items() if k in ("train_s", "eval_s", "reads")}
               for label, t in meta["timings"].items()}
    return write_report(records, traces, {"design": design, "timings": timings, "wall_s": meta["wall_s"]},
                        out)
