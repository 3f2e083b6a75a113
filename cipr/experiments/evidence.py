"""The evidence experiment in one command: train every (arm, seed) point, evaluate it, report over seeds.

    SWEEP_DIR/                        the points of `configs/train/sweep/cpu_evidence.yaml`
      warm_start/                     the shared SFT warm start (trained by the first point)
      <algo>_rs<w>_ro<w>_s<seed>/     one run folder per point
      evidence/
        logs/<point>.log              each training's output
        exports/<point>/              the point's final weights as a transformers folder
        evals/<point>/consistency/    `cipr-eval generate=false consistency.enabled=true`, held-out items
        evals/<point>/generation/     `cipr-eval` generating on the original interface (full-call accuracy)
    OUT/cpu_evidence.json, cpu_evidence_tables.md, cpu_evidence.png

Per point: `cipr-train +sweep=<sweep> algo=<arm's algo> trainer.seed=<seed>` (a subprocess; resumes a
killed point, skips a finished one), the export, the two evaluations (skipped when `done.json`
matches); then the report over every finished point. Progress and time left print after every phase.

What is measured (every quantity on evaluation items never trained on: the synthetic test split drops
items equal to a training item generated with the same options):
- `original_accuracy`: action accuracy on the unperturbed interface: the most likely action at the
  reference decision is the reference tool (`action_acc_ref` of the consistency metric), under the
  names the arm is deployed with (baseline: original names; multi-interface and CIPR: canonical).
- `heldin_kl`: KL(unperturbed ‖ relabeled) at the reference decisions, the relabeled copy giving every
  tool a fresh `function_XX` id after the adapter (`relabel_function`): what CIPR's rescoring term
  compares, on new items. The positive control. `heldin_kl_unseen`: the same past the first `looked_at`.
- `heldout_kl` / `heldout_accuracy` per held-out type: KL and the perturbed side's action accuracy.
- `full_call_accuracy`: the runner's accuracy of generated calls (name and arguments) on the original
  interface, on the first `generation_limit` items.
Each is a mean over items per seed; arms are summarized by the mean over seeds with a Student-t 95%
interval, and CIPR − multi-interface by the paired (same seed: same data order) differences.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cipr.core.config import override_text
from cipr.core.errors import ConfigError, DataError
from cipr.core.io import read_json, write_json_atomic, write_text_atomic
from cipr.eval.consistency_metric import read_records
from cipr.eval.stats import mean_estimate
from cipr.experiments.study import Point

log = logging.getLogger(__name__)

EVIDENCE = "evidence"
DONE = "done.json"
WARM_START_WEIGHT = 8.0  # the shared warm start's cost in the units of `Arm.weight`, for the time estimate
PREDICTIONS = {
    "P0": "Positive control (CIPR at λ_rescore = 1). On the held-in relabeled copies (every tool of the "
          "canonical interface of a held-out item renamed to a fresh function_XX id, the copy CIPR's "
          "rescoring term compares with), CIPR's action KL at the reference decision ends lower than "
          "multi-interface's: the paired difference CIPR − multi-interface over seeds has a 95% t "
          "interval below 0.",
    "P1": "On the held-out types (relabel_random: names of a shape never trained on; typos; "
          "distractor_similar_name), CIPR's action KL and its action-accuracy drop (original − "
          "perturbed) are smaller than multi-interface's (paired interval below 0). Expected for "
          "relabel_random, which shares the relabeling's mechanism; no directional expectation for "
          "typos and distractors, which the term does not touch.",
    "P2": "Original accuracy is kept: CIPR's action accuracy on the unperturbed interface is not more "
          "than 5 points below multi-interface's (the paired interval's lower end above −5 points).",
}


@dataclass(frozen=True)
class Arm:
    """One method: its report label, the cipr-train overrides that make it, the names it is deployed with."""

    name: str
    overrides: tuple[str, ...]
    names: str
    weight: float  # relative cost of a point, for the time estimate before one has finished


ARMS = (Arm("baseline", ("algo=grpo",), "original", 1.0),
        Arm("multi_interface", ("algo=multi_interface",), "canonical", 2.0),
        Arm("cipr", ("algo=cipr_sft", "algo.rescore_weight=1.0"), "canonical", 3.0))


@dataclass
class EvidenceConfig:
    """The experiment's plan (module docstring); the defaults are the committed experiment's.

    - `sweep`: the cipr-train sweep config (`+sweep=<sweep>`) that holds model, data, warm start and steps.
    - `sweep_dir`: where that config puts the points (its `hydra.sweep.dir`).
    - `out_dir`: where the report goes.
    - `arms`, `seeds`: the points (each arm trained with each seed).
    - `lambdas`: more CIPR points, an arm `cipr_lambda<λ>` per λ_rescore value (a λ sweep beside the arms).
    - `types`: the perturbation types of the consistency evaluation.
    - `heldin`: the held-in type among them (the others are held out).
    - `limit`: evaluation items.
    - `generation_limit` / `max_new_tokens`: the items and new tokens of the full-call accuracy's generation.
    - `looked_at`: the first evaluation items, scored when λ was chosen (`scripts/positive_control.py`);
      `heldin_kl_unseen` is on the rest.
    - `benchmark`: cipr-eval's benchmark options (the training data's, so "never trained on" is checked).
    - `threads`: torch threads of the evaluations.
    - `train`: cipr-train overrides for every point (`train.model=tiny train.trainer.max_steps=1`).
    """

    sweep: str = "cpu_evidence"
    sweep_dir: str = "runs/cpu_evidence/smollm2-135m"
    out_dir: str = "docs/results"
    arms: tuple[Arm, ...] = ARMS
    lambdas: tuple[float, ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    types: tuple[str, ...] = ("relabel_function", "relabel_random", "typos", "distractor_similar_name")
    heldin: str = "relabel_function"
    limit: int = 48
    looked_at: int = 16
    generation_limit: int = 8
    max_new_tokens: int = 64
    benchmark: tuple[str, ...] = ("benchmark=synthetic", "benchmark.format=compact",
                                  "benchmark.tools_per_example=[3,3]", "benchmark.parallel_fraction=0",
                                  "benchmark.no_call_fraction=0", "benchmark.same_domain_distractors=0")
    threads: int | None = None
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("limit", "generation_limit", "threads"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be >= 1")

    @property
    def all_arms(self) -> tuple[Arm, ...]:
        """`arms`, then one CIPR arm per extra λ_rescore in `lambdas`."""
        return (*self.arms, *(Arm(f"cipr_lambda{lam:g}", ("algo=cipr_sft", f"algo.rescore_weight={lam}"),
                                  "canonical", 3.0) for lam in self.lambdas))

    def arm(self, name: str) -> Arm:
        """The arm named `name` among `all_arms`."""
        found = [a for a in self.all_arms if a.name == name]
        if not found:
            raise ConfigError(f"no arm named {name!r}; the arms are "
                              f"{', '.join(a.name for a in self.all_arms)}")
        return found[0]


def train_command(config: EvidenceConfig, point: Point) -> list[str]:
    """The cipr-train command of one point (a single run of the sweep config, not a multirun)."""
    return [sys.executable, "-m", "cipr.cli.train", f"+sweep={config.sweep}",
            *config.arm(point.arm).overrides,
            f"trainer.seed={point.seed}", *(f"{k}={override_text(v)}" for k, v in config.train.items())]


def run_dir_of(config: EvidenceConfig, point: Point) -> Path:
    """The point's run folder, found by what cipr-train wrote (its config.json names the seed and algo)."""
    sweep = Path(config.sweep_dir)
    candidates, arm = [], config.arm(point.arm)
    for cfg_path in sorted(sweep.glob("*/config.json")):
        cfg = read_json(cfg_path)
        if cfg.get("trainer", {}).get("seed") == point.seed and _matches(cfg.get("algo", {}), arm):
            candidates.append(cfg_path.parent)
    if len(candidates) != 1:
        raise DataError(f"{len(candidates)} run folders match point {point.label} (expected one)",
                        file=str(sweep))
    return candidates[0]


def _matches(algo: Mapping[str, Any], arm: Arm) -> bool:
    wanted = dict(o.split("=", 1) for o in arm.overrides)
    names = {"grpo": "grpo", "multi_interface": "multi_interface", "cipr_sft": "cipr"}
    if algo.get("name") != names.get(wanted.get("algo", ""), ""):
        return False
    return all(str(_algo_value(algo, k.removeprefix("algo."))) == v for k, v in wanted.items()
               if k.startswith("algo."))


def _algo_value(algo: Mapping[str, Any], key: str) -> Any:
    """`key` (dotted: `terms.rescore.weight`) in a run's resolved `algo` section; an alias weight
    (`rescore_weight`, written into its term when the run started, then null) is read from its term."""
    parts = key.split(".")
    if len(parts) == 1 and key.endswith("_weight") and algo.get(key) is None:
        parts = ["terms", key.removesuffix("_weight"), "weight"]
    value: Any = algo
    for part in parts:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


class Clock:
    """Elapsed time and an estimate of what is left, from the cost weights of finished and remaining work."""

    def __init__(self, total_weight: float) -> None:
        self.start = time.time()
        self.total = total_weight
        self.done = 0.0

    def advance(self, weight: float) -> str:
        self.done += weight
        elapsed = time.time() - self.start
        if not self.done:
            return f"{elapsed / 60:.1f} min elapsed (the time left is estimated once work has run)"
        left = max(elapsed / self.done * (self.total - self.done), 0.0)
        return f"{elapsed / 60:.1f} min elapsed, about {left / 60:.0f} min left"


def _eval_overrides(config: EvidenceConfig, model_dir: Path, out: Path, names: str) -> list[str]:
    out_list = [*config.benchmark, f"model={model_dir}", f"out_dir={out}", f"names=[{names}]",
                "progress=false"]
    if config.threads:
        out_list.append(f"threads={config.threads}")
    return out_list


def evaluate_point(config: EvidenceConfig, point: Point, run_dir: Path, work: Path) -> bool:
    """Export and evaluate one finished point unless done; True when something ran."""
    from cipr.eval.config import compose_eval_config
    from cipr.eval.evaluate import evaluate
    from cipr.runtime.export import ExportConfig, export, locate, read_manifest, same_export

    model_dir = work / "exports" / point.label
    source = locate(run_dir)
    if not (model_dir.is_dir() and same_export(model_dir, source)):
        export(run_dir, model_dir, ExportConfig())
    manifest = read_manifest(model_dir)
    ran = False
    jobs = {
        "consistency": ["generate=false", "consistency.enabled=true", f"limit={config.limit}",
                        f"perturbations=[{','.join(config.types)}]"],
        "generation": ["perturbations=[original]", f"limit={config.generation_limit}",
                       f"max_new_tokens={config.max_new_tokens}"],
    }
    for job, overrides in jobs.items():
        out = work / "evals" / point.label / job
        identity = {"source": manifest.source if manifest else str(model_dir), "overrides": overrides,
                    "benchmark": list(config.benchmark)}
        if (out / DONE).is_file() and read_json(out / DONE) == identity:
            continue
        names = config.arm(point.arm).names
        evaluate(compose_eval_config([*_eval_overrides(config, model_dir, out, names), *overrides]))
        write_json_atomic(out / DONE, identity)
        ran = True
    return ran


def _trained(config: EvidenceConfig, point: Point) -> bool:
    try:
        run_dir = run_dir_of(config, point)
    except DataError:
        return False
    from cipr.core.run_folder import STAGES_JSON, read_result_stage

    return (run_dir / STAGES_JSON).is_file() and \
        (run_dir / read_result_stage(run_dir) / "stage.json").is_file()


def _evaluated(work: Path, point: Point) -> bool:
    return all((work / "evals" / point.label / job / DONE).is_file() for job in ("consistency", "generation"))


def point_metrics(config: EvidenceConfig, work: Path, point: Point) -> dict[str, Any] | None:
    """One point's per-item means (None until both evaluations are done)."""
    folder = work / "evals" / point.label
    if not (folder / "consistency" / DONE).is_file() or not (folder / "generation" / DONE).is_file():
        return None
    records = [r for r in read_records(folder / "consistency") if "skipped" not in r]
    per_type: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    original: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for m in ("kl", "action_acc_pert"):
            if r.get(m) is not None:
                per_type[r["perturbation"]][m][r["id"]].append(float(r[m]))
        if r.get("action_acc_ref") is not None:
            original[r["id"]].append(float(r["action_acc_ref"]))

    def mean_over_items(values: Mapping[str, list[float]], skip: int = 0) -> float:
        items = [math.fsum(v) / len(v) for v in list(values.values())[skip:]]
        return math.fsum(items) / len(items) if items else float("nan")

    from cipr.eval.report import RESULTS, read_results

    generated, _ = read_results(folder / "generation" / RESULTS)
    scores = [float(r["correct"]) for r in generated if r["perturbation"] == "original"]
    full = math.fsum(scores) / len(scores) if scores else None
    return {
        "original_accuracy": mean_over_items(original),
        "kl": {t: mean_over_items(per_type[t]["kl"]) for t in config.types},
        "heldin_kl_unseen": mean_over_items(per_type[config.heldin]["kl"], skip=config.looked_at),
        "accuracy": {t: mean_over_items(per_type[t]["action_acc_pert"]) for t in config.types},
        "items": len(original),
        "full_call_accuracy": full,
    }


def _ci(values: Sequence[float]) -> dict[str, Any]:
    est = mean_estimate([v for v in values if v is not None and not math.isnan(v)], method="t")
    return {"mean": est.value, "low": est.low, "high": est.high, "n": est.n}


def build_report(config: EvidenceConfig, metrics: Mapping[str, Mapping[int, Mapping[str, Any]]],
                 predictions: Mapping[str, str]) -> dict[str, Any]:
    """cpu_evidence.json: per arm the per-seed values, their mean and 95% t interval; paired CIPR − MI."""
    heldout = [t for t in config.types if t != config.heldin]
    arms: dict[str, Any] = {}
    for arm, by_seed in metrics.items():
        seeds = sorted(by_seed)
        m = [by_seed[s] for s in seeds]
        arms[arm] = {
            "seeds": seeds,
            "original_accuracy": [x["original_accuracy"] for x in m],
            "heldin_kl": [x["kl"][config.heldin] for x in m],
            "heldin_kl_unseen": [x["heldin_kl_unseen"] for x in m],
            "heldout_kl": {t: [x["kl"][t] for x in m] for t in heldout},
            "heldout_accuracy": {t: [x["accuracy"][t] for x in m] for t in heldout},
            "heldin_accuracy": [x["accuracy"][config.heldin] for x in m],
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
                              "heldin_type": config.heldin, "heldout_types": heldout}
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


def run_evidence(config: EvidenceConfig, command: str, predictions: Mapping[str, str] = PREDICTIONS,
                 ) -> dict[str, Any]:
    """Train and evaluate every point (resuming), then write the report; returns it."""
    started = time.time()
    sweep = Path(config.sweep_dir)
    work = sweep / EVIDENCE
    (work / "logs").mkdir(parents=True, exist_ok=True)
    points = [Point(arm.name, seed) for arm in config.all_arms for seed in config.seeds]
    warm_pending = not (sweep / "warm_start" / "stage.json").is_file()  # trained inside the first point
    todo = {p.label: (not _trained(config, p), not _evaluated(work, p)) for p in points}  # to estimate
    clock = Clock(sum(config.arm(p.arm).weight * (t + e) for p in points for t, e in [todo[p.label]])
                  + WARM_START_WEIGHT * warm_pending)
    timings_path = work / "timings.json"
    timings: dict[str, float] = read_json(timings_path) if timings_path.is_file() else {}

    def record(key: str, seconds: float) -> None:  # a phase's first (working) run: the experiment's cost
        if key not in timings:
            timings[key] = round(seconds, 1)
            write_json_atomic(timings_path, timings)

    for k, point in enumerate(points, 1):
        log_path = work / "logs" / f"{point.label}.log"
        t0 = time.time()
        with log_path.open("a", encoding="utf-8") as f:
            f.write(f"\n$ {' '.join(train_command(config, point))}\n")
            f.flush()
            code = subprocess.call(train_command(config, point), stdout=f, stderr=subprocess.STDOUT)
        if code != 0:
            raise DataError(f"training of point {point.label} exited with status {code}; its output is in "
                            f"the log (rerun the same command to resume)", file=str(log_path))
        record(f"train/{point.label}", time.time() - t0)
        extra = WARM_START_WEIGHT if warm_pending and k == 1 else 0.0
        print(f"[evidence] {k}/{len(points)} {point.label}: trained ({time.time() - t0:.0f} s); "
              f"{clock.advance(config.arm(point.arm).weight * todo[point.label][0] + extra)}", flush=True)
        t0 = time.time()
        if evaluate_point(config, point, run_dir_of(config, point), work):
            record(f"eval/{point.label}", time.time() - t0)
        print(f"[evidence] {k}/{len(points)} {point.label}: evaluated ({time.time() - t0:.0f} s); "
              f"{clock.advance(config.arm(point.arm).weight * todo[point.label][1])}", flush=True)
    metrics: dict[str, dict[int, Any]] = defaultdict(dict)
    for point in points:
        m = point_metrics(config, work, point)
        if m is not None:
            metrics[point.arm][point.seed] = m
    report = build_report(config, metrics, predictions)
    report["command"] = command
    report["wall_s"] = round(math.fsum(timings.values()), 1)
    report["wall_s_parts"] = timings
    report["wall_s_this_invocation"] = round(time.time() - started, 1)
    report["plan"] = {"sweep": config.sweep, "seeds": list(config.seeds), "types": list(config.types),
                      "limit": config.limit, "generation_limit": config.generation_limit,
                      "arms": {a.name: list(a.overrides) for a in config.all_arms}}
    out = Path(config.out_dir)
    write_json_atomic(out / "cpu_evidence.json", report)
    write_text_atomic(out / "cpu_evidence_tables.md", render_tables(report))
    plot(report, out / "cpu_evidence.png")
    return report


def recompute(report_dir: Path) -> dict[str, Any]:
    """cpu_evidence_tables.md and cpu_evidence.png again from the committed cpu_evidence.json (its per-arm,
    per-seed metrics and paired comparisons): `cipr-study report study=cpu_evidence`."""
    report = read_json(report_dir / "cpu_evidence.json")
    write_text_atomic(report_dir / "cpu_evidence_tables.md", render_tables(report))
    plot(report, report_dir / "cpu_evidence.png")
    return report
