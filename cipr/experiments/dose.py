"""The dose study, Stage A: at which λ_rescore and how many steps does CIPR's rescoring term take hold?

Pre-registered in docs/results/cpu_dose_preregistration.md (design, predictions, analysis, decision rule); the
report is docs/results/cpu_dose.md. Points (`configs/train/sweep/cpu_dose.yaml`): supervised CIPR
(`algo=cipr_sft`) at each λ in `lambdas` (λ = 0 computes and logs the term without training on it: it trains
exactly like multi-interface) with each seed in `seeds`, all from one shared warm start; a seed draws its own
training rows and perturbed copies, the same for every λ (paired). Each point trains `max(steps)` steps with a
checkpoint every 10, records each step's term on its own pairs before and after the update (`logging.trace`),
and is read at the checkpoints in `steps` on the calibration items:

    OUT/
      warm_start/                      the shared SFT warm start (trained by the first point)
      points/<arm>_s<seed>/            the point's cipr-train run folder (checkpoints deleted once read)
      records/<arm>_s<seed>.jsonl      one record per (checkpoint, item): held-in KL, accuracies
      records/<arm>_s<seed>.trace.jsonl  one line per optimizer step: the term before / after the update
      records/<arm>_s<seed>.json       the point's timings (written last: marks it done)
    REPORT/cpu_dose.json, .md, .png, cpu_dose_trace.png, cpu_dose_records.jsonl.gz, cpu_dose_trace.jsonl.gz

Calibration items (`calibration_items`): single-call synthetic items with three tools from the test stream of
`eval_seed` (a stream no run has read), each called (tool, template) pair and every listed tool seen in
training (held-in), minus every item equal to a training-pool item, to any item an earlier run read (the first
500 test items of seeds 0-3) or to any of the transfer experiment's 200 items. Each is read under canonical
names against its copy under `heldin` (`relabel_function`: fresh `function_XX` ids, the relabeling the term
trains on): KL(unperturbed ‖ relabeled) at every decision of the teacher-forced reference and the action
accuracy on the unperturbed side. `cipr.experiments.dose_analysis` computes every number of the report.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cipr.core.config import override_text
from cipr.core.errors import ConfigError
from cipr.core.io import read_json, read_jsonl, write_json_atomic, write_text_atomic
from cipr.experiments.points import Point, drop_weights, point_done
from cipr.tools.interface import Example
from cipr.train.config import compose_train

log = logging.getLogger(__name__)

TRANSFER_EVAL_SEED = 20261206
"""The transfer experiment's evaluation stream: its items are excluded from the calibration items."""


@dataclass
class DoseConfig:
    """The study's plan (module docstring); the defaults are the pre-registered design.

    - `out_dir`: run folders, per-point records, traces and timings.
    - `report_dir`: where the report's files go.
    - `sweep`: the cipr-train sweep config every point composes (`+sweep=<sweep>`).
    - `lambdas`: the λ_rescore values (0 first: the control every other λ is paired with).
    - `seeds`: the design's seeds, the same for every λ.
    - `run_lambdas` / `run_seeds`: what this invocation trains and reads (null: all), for pieces of the run.
    - `steps`: the checkpoints read (each a multiple of the sweep's save_steps; the largest is trained).
    - `items`: calibration items.
    - `eval_seed`: the synthetic test stream's seed of the calibration items.
    - `perturbation_seed`: the seed of their relabeled copies.
    - `heldin`: the type read (the held-in relabeling).
    - `batch_size`: sequences per forward pass of the action reader.
    - `threads`: torch threads of the whole process, training and reading (null: torch's default, one a
      core, which oversubscribes the cores when two processes run side by side).
    - `keep_weights`: keep each point's checkpoints after they are read.
    - `report`: write the report at the end.
    - `train`: more cipr-train overrides for every point (`train.model=tiny` for a quick run).
    """

    out_dir: str = "runs/cpu_dose"
    report_dir: str = "docs/results"
    sweep: str = "cpu_dose"
    lambdas: tuple[float, ...] = (0.0, 1.0, 3.0, 10.0)
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    run_lambdas: tuple[float, ...] | None = None
    run_seeds: tuple[int, ...] | None = None
    steps: tuple[int, ...] = (10, 20, 40)
    items: int = 64
    eval_seed: int = 20261208
    perturbation_seed: int = 0
    heldin: str = "relabel_function"
    batch_size: int = 8
    threads: int | None = 1
    keep_weights: bool = False
    report: bool = True
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lambdas or self.lambdas[0] != 0 or len(set(self.lambdas)) != len(self.lambdas):
            raise ConfigError(f"lambdas={list(self.lambdas)}: give distinct values, 0 first (the control)")
        if any(v < 0 for v in self.lambdas):
            raise ConfigError("lambdas must be >= 0")
        for key, given, design in (("run_lambdas", self.run_lambdas, self.lambdas),
                                   ("run_seeds", self.run_seeds, self.seeds)):
            if given is not None and not set(given) <= set(design):
                raise ConfigError(f"{key} {sorted(set(given) - set(design))} are not in the design")
        if not self.steps or sorted(self.steps) != list(self.steps) or min(self.steps) < 1:
            raise ConfigError(f"steps={list(self.steps)}: give ascending positive step counts")
        if self.eval_seed == TRANSFER_EVAL_SEED:
            raise ConfigError(f"eval_seed={self.eval_seed} is the transfer experiment's stream; choose "
                              f"another")
        for key in ("items", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be >= 1")


def arm(lam: float) -> str:
    """The arm name of λ (`lambda0`, `lambda1`, `lambda2.5`)."""
    return f"lambda{lam:g}"


def point_overrides(config: DoseConfig, point: Point, lam: float) -> list[str]:
    """The cipr-train overrides of one point."""
    out = Path(config.out_dir)
    return [f"+sweep={config.sweep}", "algo=cipr_sft", f"algo.terms.rescore.weight={lam}",
            f"trainer.seed={point.seed}", f"perturb.seed={point.seed}",
            f"trainer.max_steps={max(config.steps)}", f"trainer.run_dir={out / 'points' / point.label}",
            f"trainer.warm_start.shared_dir={out / 'warm_start'}",
            *(f"{k}={override_text(v)}" for k, v in config.train.items())]


def calibration_items(data: Any, n: int, eval_seed: int) -> list[Example]:
    """`n` held-in calibration items for training data options `data` (module docstring): the near split of
    `cipr.experiments.transfer.transfer_items` drawn from `eval_seed`, less the transfer experiment's
    items."""
    from cipr.experiments.transfer import _key, transfer_items

    transfer = transfer_items(data, 100, TRANSFER_EVAL_SEED)
    used = {_key(e) for split in transfer.values() for e in split}
    out: list[Example] = []
    size = n
    while len(out) < n:
        size *= 2
        out = [e for e in transfer_items(data, size, eval_seed)["near"] if _key(e) not in used][:n]
    return out


def build_pairs(config: DoseConfig, items: Sequence[Example]) -> list[tuple[str, Any]]:
    """("near", `ConsistencyPair`) of every item under the held-in type."""
    from cipr.eval.benchmarks import BuildReport, build_items
    from cipr.eval.consistency_metric import build_pairs as pairs_of

    report = BuildReport()
    built = build_items(list(items), [(config.heldin, config.heldin)], ["canonical"],
                        config.perturbation_seed, report)
    pairs, skipped = pairs_of(list(items), built, config.perturbation_seed)
    if skipped or report.skipped or len(pairs) != len(items):
        raise ConfigError(f"calibration items whose {config.heldin} copy could not be built: "
                          f"{skipped or report.reasons}")
    return [("near", p) for p in pairs]


def train_point(config: DoseConfig, point: Point, lam: float) -> Path:
    """Train one point (resuming a killed one); its run folder."""
    from cipr.train.run import run

    cfg = compose_train(point_overrides(config, point, lam))
    steps = {s for s in config.steps}
    if any(s % cfg.trainer.save_steps for s in steps) or cfg.trainer.save_total_limit is not None:
        raise ConfigError(f"the sweep must keep a checkpoint at every read step {sorted(steps)}: "
                          f"trainer.save_steps={cfg.trainer.save_steps} must divide each and "
                          f"trainer.save_total_limit must be null")
    run_dir = run(cfg)
    gc.collect()
    return run_dir


def read_traces(run_dir: Path, point: Point, lam: float) -> list[dict[str, Any]]:
    """One line per optimizer step of the point's supervised stage: the term before and after the update,
    and the step's loss."""
    out = []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if r.get("stage") == "supervised" and r.get("kind") == "step":
            out.append({"point": point.label, "lambda": lam, "seed": point.seed, "step": r["step"],
                        "before": r.get("trace/rescore/before"), "after": r.get("trace/rescore/after"),
                        "loss": r.get("loss"), "action_nll": r.get("action/nll"),
                        "token_loss": r.get("token_loss")})
    return out


def run_dose(config: DoseConfig) -> dict[str, Any] | None:
    """Train and read every point of the pieces asked for that is not done yet, then (with `report`) write
    the report from every finished point; returns the report (None without one)."""
    import torch
    from tqdm import tqdm

    from cipr.experiments.transfer import evaluate_point
    from cipr.formats import get_format

    if config.threads:
        torch.set_num_threads(config.threads)  # before the first point trains, not only when it is read
    out = Path(config.out_dir)
    base = compose_train(point_overrides(config, Point(arm(0.0), config.seeds[0]), 0.0))
    items = calibration_items(base.data, config.items, config.eval_seed)
    pairs = build_pairs(config, items)
    fmt = get_format(base.model.call_format)
    lambdas = config.lambdas if config.run_lambdas is None else config.run_lambdas
    seeds = config.seeds if config.run_seeds is None else config.run_seeds
    todo = [(Point(arm(lam), s), lam) for s in seeds for lam in lambdas
            if not point_done(out, Point(arm(lam), s), len(pairs) * len(config.steps))]
    log.info("dose: %d calibration items, %d checkpoints a point; %d points to run", len(items),
             len(config.steps), len(todo))
    with tqdm(total=len(todo), desc="dose points", unit="point") as bar:
        for point, lam in todo:
            started = time.time()
            run_dir = train_point(config, point, lam)
            trained = time.time()
            records = []
            for step in config.steps:
                weights = run_dir / "supervised" / f"checkpoint-{step}"
                records += evaluate_point(point, weights, pairs, fmt, threads=config.threads,
                                          batch_size=config.batch_size, extra={"lambda": lam, "step": step})
            timing = {"train_s": trained - started, "eval_s": time.time() - trained, "reads": len(records)}
            _write_point(out, point, records, read_traces(run_dir, point, lam), timing)
            if not config.keep_weights:
                drop_weights(run_dir)
            bar.set_postfix_str(f"{point.label}: train {timing['train_s']:.0f} s, "
                                f"read {timing['eval_s']:.0f} s")
            bar.update()
    if not config.report:
        return None
    from cipr.experiments.dose_analysis import write_report

    records = [r for p in sorted((out / "records").glob("*_s*.jsonl")) if not p.name.endswith(".trace.jsonl")
               for r in read_jsonl(p)]
    traces = [r for p in sorted((out / "records").glob("*.trace.jsonl")) for r in read_jsonl(p)]
    timings = {p.stem: read_json(p) for p in sorted((out / "records").glob("*.json"))}
    meta = {"design": _design(config, items), "timings": timings,
            "wall_s": math.fsum(t["train_s"] + t["eval_s"] for t in timings.values())}
    return write_report(records, traces, meta, Path(config.report_dir))


def _design(config: DoseConfig, items: Sequence[Example]) -> dict[str, Any]:
    return {"lambdas": list(config.lambdas), "seeds": list(config.seeds), "steps": list(config.steps),
            "items": [e.id for e in items], "eval_seed": config.eval_seed, "heldin": config.heldin,
            "perturbation_seed": config.perturbation_seed, "sweep": config.sweep, "train": dict(config.train)}


def _write_point(out: Path, point: Point, records: Sequence[Mapping[str, Any]],
                 traces: Sequence[Mapping[str, Any]], timing: Mapping[str, Any]) -> None:
    folder = out / "records"
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in ((f"{point.label}.jsonl", records), (f"{point.label}.trace.jsonl", traces)):
        write_text_atomic(folder / name, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    write_json_atomic(folder / f"{point.label}.json", dict(timing))  # last: marks the point done
