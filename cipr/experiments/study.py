"""The study engine: every point of a spec (`cipr.experiments.spec`) trained as a plain cipr-train run, read
on the spec's calibration items at its checkpoints, evaluated by cipr-eval, and recorded item by item.

    OUT/warm_start/                  the shared warm start (the first point trains it; others wait on a lock)
    OUT/points/<arm>_s<seed>/        the point's run folder (checkpoints deleted once read)
    OUT/evals/<arm>_s<seed>/<name>/  the point's cipr-eval runs (`evaluations`)
    OUT/records/<arm>_s<seed>.jsonl, .trace.jsonl, .json
                                     per-item records, one line per optimizer step (every traced term before
                                     and after the update), and the point's timings, threads and code commit
                                     (written last: marks the point done)

Point (arm A, seed s): `cipr-train BASE... A's overrides... trainer.seed=s perturb.seed=s
trainer.max_steps=max(read_at) trainer.save_total_limit=null trainer.run_dir=OUT/points/A_s<s>
trainer.warm_start.shared_dir=OUT/warm_start`
(+ `logging.trace=true` with a `trace_term`): seed s draws its own rows and copies, the same in every arm. A
rerun skips finished points and resumes a killed one; `run_arms` / `run_seeds` split the work between
processes. Torch's threads are set once for the whole process, before the first point trains.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cipr.core.config import override_text, to_dict
from cipr.core.errors import ConfigError
from cipr.core.io import read_json, read_jsonl, write_json_atomic, write_text_atomic
from cipr.experiments.items import build_pairs, draw_items
from cipr.experiments.spec import StudyOptions
from cipr.train.config import compose_train

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Point:
    """Arm `arm` (its name) with seed `seed`."""

    arm: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.arm}_s{self.seed}"


def drop_weights(run_dir: Path) -> None:
    """Delete a point's checkpoints and final weights, keeping its config, metrics and summary."""
    for stage in run_dir.iterdir() if run_dir.is_dir() else ():
        if stage.is_dir():
            for folder in [*stage.glob("checkpoint-*"), stage / "final"]:
                shutil.rmtree(folder, ignore_errors=True)


def point_overrides(options: StudyOptions, point: Point) -> list[str]:
    """The cipr-train overrides of one point (module docstring)."""
    spec, out = options.study, Path(options.out)
    trace = ["logging.trace=true"] if spec.trace_term else []
    steps = ([f"trainer.max_steps={max(spec.read_at)}", "trainer.save_total_limit=null"] if spec.read_at
             else [])  # every read step's checkpoint is kept until read
    return [*spec.base, *spec.arms[point.arm], f"trainer.seed={point.seed}", f"perturb.seed={point.seed}",
            *trace, *steps,
            f"trainer.run_dir={out / 'points' / point.label}",
            f"trainer.warm_start.shared_dir={out / 'warm_start'}",
            *(f"{k}={override_text(v)}" for k, v in options.train.items())]


def read_point(weights: Path, pairs: Sequence[tuple[str, Any]], fmt: Any, *, batch_size: int, label: str
               ) -> list[dict[str, Any]]:
    """Every (split, pair) read with the weights in `weights` (the action reader batched over items): one
    record per item and type, the consistency metric's fields plus `split`, `item`, `kl`, `correct` (0/1)
    and `p_ref`."""
    import torch
    from tqdm import tqdm

    from cipr.eval.consistency_metric import ConsistencyConfig, measure
    from cipr.runtime.model import load_inference_model

    model, tokenizer = load_inference_model(str(weights), device="cpu", dtype="float32",
                                            threads=torch.get_num_threads(), attn_implementation="sdpa")
    records: list[dict[str, Any]] = []
    chunk = max(1, batch_size // 2)
    with torch.inference_mode(), tqdm(total=len(pairs), desc=f"read {label}", unit="pair") as bar:
        for start in range(0, len(pairs), chunk):
            group = pairs[start:start + chunk]
            split_of = {p.item.id: s for s, p in group}
            for rec in measure(model, tokenizer, fmt, [p for _, p in group],
                               ConsistencyConfig(batch_size=batch_size)):
                if "skipped" in rec:
                    raise RuntimeError(f"item {rec['id']} could not be read: {rec['skipped']}")
                records.append({**rec, "split": split_of[rec["id"]], "item": rec["id"],
                                "correct": rec["correct_ref"], "p_ref": rec["p_target_ref"]})
            bar.update(len(group))
    del model
    gc.collect()
    return records


def read_traces(run_dir: Path, stage: str) -> list[dict[str, Any]]:
    """One line per optimizer step of the point's `stage`: every `trace/*` value and the step's losses."""
    out = []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if r.get("stage") == stage and r.get("kind") == "step":
            out.append({"step": r["step"], "loss": r.get("loss"), "token_loss": r.get("token_loss"),
                        "action_nll": r.get("action/nll"),
                        **{k: v for k, v in r.items() if k.startswith("trace/")}})
    return out


def code_commit() -> str | None:
    """The git commit of the package's checkout (None outside a checkout): which code trained a point."""
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=False)
    except OSError:
        return None
    return done.stdout.strip() or None


def evaluate_point(options: StudyOptions, point: Point, run_dir: Path, tags: Mapping[str, Any]
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The spec's `evaluations` of a trained point: its final weights exported, then one cipr-eval run per
    evaluation (its overrides formatted with the arm's labels, e.g. `names=[{names}]`) into
    OUT/evals/<point>/<name> (resumable); the records of each (`results.jsonl` rows as `kind: result`,
    `consistency.jsonl` rows as `kind: consistency`, tagged with the point, its labels where the row has no
    field of that name, and `evaluation`) and each run's
    meta (what a named analysis needs to score them)."""
    from cipr.eval.config import compose_eval_config
    from cipr.eval.consistency_metric import read_records
    from cipr.eval.evaluate import evaluate
    from cipr.eval.report import RESULTS, RUN_META, read_results
    from cipr.runtime.export import ExportConfig, export

    spec, out = options.study, Path(options.out)
    model_dir = export(run_dir, out / "exports" / point.label, ExportConfig(overwrite=True))
    labels = spec.labels.get(point.arm, {})
    threads = [f"threads={spec.threads}"] if spec.threads else []
    records: list[dict[str, Any]] = []
    metas: dict[str, Any] = {}
    for name, overrides in spec.evaluations.items():
        folder = out / "evals" / point.label / name
        given = [*(o.format(**labels) for o in overrides),
                 *(f"{k}={override_text(v)}" for k, v in options.eval.items())]
        evaluate(compose_eval_config([*threads, *given, f"model={model_dir}", f"out_dir={folder}",
                                      "progress=false"]))
        metas[name] = read_json(folder / RUN_META)
        records += [{**tags, **r, "evaluation": name, "kind": "result"}
                    for r in read_results(folder / RESULTS)[0]]
        if (folder / "consistency.jsonl").is_file():
            records += [{**tags, **r, "evaluation": name, "kind": "consistency"}
                        for r in read_records(folder)]
    if not options.keep_weights:
        shutil.rmtree(model_dir, ignore_errors=True)
    return records, metas


def point_done(out: Path, point: Point, reads: int) -> bool:
    """Whether the point's timing file (written last) records `reads` reads."""
    path = out / "records" / f"{point.label}.json"
    return path.is_file() and read_json(path).get("reads") == reads


def run_study(options: StudyOptions) -> dict[str, Any] | None:
    """Train and read every point of the pieces asked for that is not done yet, then (with `report`) write
    the report from every finished point; returns the report (None without one)."""
    import torch
    from tqdm import tqdm

    from cipr.formats import get_format
    from cipr.train.run import result_stage, run

    spec = options.study
    if spec.threads:
        torch.set_num_threads(spec.threads)  # the whole process: training from its first step, and reading
    for folder in reversed(spec.pythonpath):
        path = str(Path(folder).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    out = Path(options.out)
    first = Point(spec.control, spec.seeds[0])
    base = compose_train(point_overrides(options, first))
    items = draw_items(spec, base.data) if spec.items else {}
    pairs = build_pairs(spec, items) if spec.items else []
    fmt = get_format(base.model.call_format)
    arms = [a for a in spec.arms if options.run_arms is None or a in options.run_arms]
    seeds = spec.seeds if options.run_seeds is None else options.run_seeds
    reads = len(pairs) * len(spec.read_at)
    todo = [Point(a, s) for s in seeds for a in arms if not point_done(out, Point(a, s), reads)]
    for point in todo:  # every point's config is checked before the first one trains
        cfg = compose_train(point_overrides(options, point))
        if any(s % cfg.trainer.save_steps for s in spec.read_at):
            raise ConfigError(f"point {point.label}: a checkpoint must be kept at every read step "
                              f"{spec.read_at}: trainer.save_steps={cfg.trainer.save_steps} must divide each")
    log.info("study %s: %s calibration items, %d reads a checkpoint, read at steps %s; %d points to run "
             "(%d threads)", spec.name, ", ".join(f"{len(v)} {s}" for s, v in items.items()), len(pairs),
             spec.read_at, len(todo), torch.get_num_threads())
    commit = code_commit()
    with tqdm(total=len(todo), desc=f"{spec.name} points", unit="point") as bar:
        for point in todo:
            started = time.time()
            cfg = compose_train(point_overrides(options, point))
            run_dir = run(cfg)
            gc.collect()
            threads = torch.get_num_threads()
            trained = time.time()
            stage = result_stage(cfg)
            records = []
            tags = {"point": point.label, "arm": point.arm, "seed": point.seed,
                    **spec.labels.get(point.arm, {})}
            for step in spec.read_at:
                for r in read_point(run_dir / stage / f"checkpoint-{step}", pairs, fmt,
                                    batch_size=options.batch_size, label=f"{point.label}@{step}"):
                    records.append({**r, **tags, "step": step})
            traces = [{**tags, **t} for t in read_traces(run_dir, stage)]
            reads = len(records)
            evaluated, metas = evaluate_point(options, point, run_dir, tags) if spec.evaluations else ([], {})
            timing = {"train_s": trained - started, "eval_s": time.time() - trained, "reads": reads,
                      "threads": threads, "commit": commit, "evaluations": metas}
            records += evaluated
            _write_point(out, point, records, traces, timing)
            if not options.keep_weights:
                drop_weights(run_dir)
            bar.set_postfix_str(f"{point.label}: train {timing['train_s']:.0f} s, "
                                f"read {timing['eval_s']:.0f} s")
            bar.update()
    if not options.report:
        return None
    records, traces, timings = collect(out)
    meta = {"spec": to_dict(spec), "items": [e.id for v in items.values() for e in v],
            "items_by_split": {s: [e.id for e in v] for s, v in items.items()}, "timings": timings,
            "wall_s": math.fsum(t["train_s"] + t["eval_s"] for t in timings.values())}
    if spec.analysis:
        return importlib.import_module(spec.analysis).study_report(records, traces, meta,
                                                                   Path(options.report_dir))
    from cipr.experiments.study_report import write_report

    return write_report(records, traces, meta, Path(options.report_dir))


def collect(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Every finished point's records, traces and timings under `out/records`."""
    folder = out / "records"
    timings = {p.stem: read_json(p) for p in sorted(folder.glob("*.json"))}
    records, traces = [], []
    for label in timings:
        records += read_jsonl(folder / f"{label}.jsonl")
        traces += read_jsonl(folder / f"{label}.trace.jsonl")
    return records, traces, timings


def _write_point(out: Path, point: Point, records: Sequence[Mapping[str, Any]],
                 traces: Sequence[Mapping[str, Any]], timing: Mapping[str, Any]) -> None:
    folder = out / "records"
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in ((f"{point.label}.jsonl", records), (f"{point.label}.trace.jsonl", traces)):
        write_text_atomic(folder / name, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    write_json_atomic(folder / f"{point.label}.json", dict(timing))  # last: marks the point done

