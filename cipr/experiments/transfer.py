"""The transfer experiment: does CIPR's consistency term carry over to perturbations never trained on?

Pre-registered in docs/results/cpu_transfer_preregistration.md (design, predictions, analysis, decision rule);
the report is docs/results/cpu_transfer.md. Two arms (`configs/train/sweep/cpu_transfer.yaml`): supervised
multi-interface training and CIPR (the same plus λ_rescore · the rescoring KL), each trained from one shared
warm start with every seed, a seed drawing its own 20 training rows and its own perturbed copies. Every point
is trained and evaluated in this one process, with one model in memory at a time and no export:

    OUT/
      warm_start/                      the shared SFT warm start (trained by the first point)
      points/<arm>_s<seed>/            the point's cipr-train run folder (its weights deleted once evaluated)
      records/<arm>_s<seed>.jsonl      one record per (item, perturbation type), once the point is done
      records/<arm>_s<seed>.json       the point's timings
    REPORT/cpu_transfer.json, .md, .png and cpu_transfer_records.jsonl.gz (every record: the report's input)

Evaluation items (`transfer_items`) are synthetic single-call items with three tools from the test stream of a
seed no run has used (`eval_seed`), minus every item equal to a training-pool item or to the first 500 test
items of seeds 0-3 (what earlier runs evaluated), in two splits of `items_per_split` items each:
- `near`: the called (tool, query template) pair is one the training data uses, and every listed tool is one
  training lists;
- `hard`: the called tool, or its query template, is held out of all training (`data.exclude`).
Each item is read under canonical names (the arms' deployment) against its copy under every type in `types`
(`cipr.eval.consistency_metric`: the action distribution at each decision of the teacher-forced reference
response, KL(unperturbed ‖ perturbed), action accuracy on both sides); `primary` and `heldin` on every item,
the other types on the first `secondary_items` items of each split. A record holds the point, arm, seed,
split, item, type and the metrics; `cipr.experiments.transfer_analysis` computes every number of the report.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import random
import time
from collections import defaultdict
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

SPLITS = ("near", "hard")
AVOID_SEEDS = (0, 1, 2, 3)
AVOID_ITEMS = 500
HELDOUT_DOMAINS = 8


@dataclass
class TransferConfig:
    """The experiment's plan (module docstring); the defaults are the pre-registered design.

    - `out_dir`: run folders, per-point records and timings.
    - `report_dir`: where the report's files go.
    - `sweep`: the cipr-train sweep config every point composes (`+sweep=<sweep>`).
    - `arms`: `multi_interface` and/or `cipr`.
    - `rescore_weight`: CIPR's λ_rescore.
    - `seeds`: the design's seeds (one point per arm and seed).
    - `run_seeds`: the seeds this invocation trains and evaluates (null: all), for pieces of the run.
    - `items_per_split`: evaluation items in each of the near and hard splits.
    - `eval_seed`: the synthetic test stream's seed of the evaluation items.
    - `perturbation_seed`: the seed of their perturbed copies.
    - `types`: the perturbation types read.
    - `primary`: the primary endpoint's type.
    - `heldin`: the held-in type (the positive control).
    - `secondary_items`: items per split read under the types other than `primary` and `heldin`.
    - `batch_size`: sequences per forward pass of the action reader.
    - `threads`: torch threads (null: torch's default).
    - `keep_weights`: keep each point's checkpoints after its evaluation.
    - `report`: write the report at the end.
    - `train`: more cipr-train overrides for every point (`train.model=tiny` for a quick run).
    """

    out_dir: str = "runs/cpu_transfer"
    report_dir: str = "docs/results"
    sweep: str = "cpu_transfer"
    arms: tuple[str, ...] = ("multi_interface", "cipr")
    rescore_weight: float = 1.0
    seeds: tuple[int, ...] = tuple(range(12))
    run_seeds: tuple[int, ...] | None = None
    items_per_split: int = 100
    eval_seed: int = 20261206
    perturbation_seed: int = 0
    types: tuple[str, ...] = ("relabel_random", "relabel_function", "lookalike_shown", "paraphrase",
                              "reorder")
    primary: str = "relabel_random"
    heldin: str = "relabel_function"
    secondary_items: int = 20
    batch_size: int = 8
    threads: int | None = None
    keep_weights: bool = False
    report: bool = True
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.arms) - {"multi_interface", "cipr"})
        if unknown or not self.arms:
            raise ConfigError(f"arms: {unknown or 'none'}; choose from multi_interface, cipr")
        if self.primary not in self.types or self.heldin not in self.types:
            raise ConfigError(f"primary={self.primary!r} and heldin={self.heldin!r} must be among types")
        if self.run_seeds is not None and not set(self.run_seeds) <= set(self.seeds):
            raise ConfigError(f"run_seeds {sorted(set(self.run_seeds) - set(self.seeds))} are not in seeds")
        for key in ("items_per_split", "secondary_items", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be >= 1")


def heldout_exclude(seed: str = "cipr-transfer-heldout") -> list[str]:
    """The held-out split's `data.exclude`: one tool from each of `HELDOUT_DOMAINS` domains, then one query
    template of every other tool with two or more, all drawn with `random.Random(seed)` in catalog order."""
    from cipr.data.synthetic import catalog

    rng = random.Random(seed)
    by_domain: dict[str, list[Any]] = defaultdict(list)
    for c in catalog():
        by_domain[c.domain].append(c)
    domains = sorted(rng.sample(sorted(by_domain), HELDOUT_DOMAINS))
    tools = [rng.choice(by_domain[d]).tool.name for d in domains]
    templates = [f"{c.tool.name}#{rng.randrange(len(c.intents))}" for c in catalog()
                 if c.tool.name not in tools and len(c.intents) > 1]
    return tools + templates


def point_overrides(config: TransferConfig, point: Point) -> list[str]:
    """The cipr-train overrides of one point."""
    algo = (["algo=multi_interface"] if point.arm == "multi_interface" else
            ["algo=cipr_sft", f"algo.rescore_weight={config.rescore_weight}"])
    out = Path(config.out_dir)
    return [f"+sweep={config.sweep}", *algo, f"trainer.seed={point.seed}",
            f"perturb.seed={point.seed}", f"trainer.run_dir={out / 'points' / point.label}",
            f"trainer.warm_start.shared_dir={out / 'warm_start'}",
            *(f"{k}={override_text(v)}" for k, v in config.train.items())]


def _key(example: Example) -> tuple[str, str]:
    calls = json.dumps([c.to_dict() for c in example.reference], sort_keys=True)
    return example.messages[0].content, calls


def transfer_items(data: Any, items_per_split: int, eval_seed: int) -> dict[str, list[Example]]:
    """The near and hard evaluation items for training data options `data` (a `DataConfig`; see the module
    docstring)."""
    from cipr.data.synthetic import SyntheticConfig, generate_synthetic

    options = {"tools_per_example": tuple(data.tools_per_example), "no_call_fraction": data.no_call_fraction,
               "parallel_fraction": data.parallel_fraction,
               "same_domain_distractors": data.same_domain_distractors}
    pool = generate_synthetic(data.n, data.seed, tools=tuple(data.tools), exclude=tuple(data.exclude),
                              **options)
    seen = {_key(e) for e in pool}
    for s in AVOID_SEEDS:
        seen |= {_key(e) for e in SyntheticConfig(n=AVOID_ITEMS, seed=s, **options).generate(split="test")}
    trained = {(t, k) for e in pool for t, k in e.meta["templates"]}
    listed = {n for e in pool for n in e.interface.names}
    out: dict[str, list[Example]] = {s: [] for s in SPLITS}
    n = 4 * items_per_split
    while min(len(v) for v in out.values()) < items_per_split:
        out = {s: [] for s in SPLITS}
        for e in generate_synthetic(n, eval_seed, tools=tuple(data.tools), split="test", **options):
            if _key(e) in seen or len(e.reference) != 1:
                continue
            (called,) = [tuple(t) for t in e.meta["templates"]]
            if called not in trained:
                split = "hard"
            elif set(e.interface.names) <= listed:
                split = "near"
            else:
                continue
            if len(out[split]) < items_per_split:
                out[split].append(e)
        n *= 2
    return out


def build_pairs(config: TransferConfig, items: Mapping[str, Sequence[Example]]) -> list[tuple[str, Any]]:
    """(split, `ConsistencyPair`) for every item and type the design reads (module docstring)."""
    from cipr.eval.benchmarks import BuildReport, build_items
    from cipr.eval.consistency_metric import build_pairs as pairs_of

    out: list[tuple[str, Any]] = []
    for split, examples in items.items():
        for k, ex in enumerate(examples):
            always = (config.primary, config.heldin)
            types = [t for t in config.types if t in always or k < config.secondary_items]
            report = BuildReport()
            built = build_items([ex], [(t, t) for t in types], ["canonical"], config.perturbation_seed,
                                report)
            pairs, skipped = pairs_of([ex], built, config.perturbation_seed)
            if skipped or report.skipped:
                raise ConfigError(f"item {ex.id}: a perturbation could not be built: "
                                  f"{skipped or report.reasons}")
            out += [(split, p) for p in pairs]
    return out


def train_point(config: TransferConfig, point: Point) -> Path:
    """Train one point (resuming a killed one) and return the folder of its final weights."""
    from cipr.train.run import result_stage, run

    cfg = compose_train(point_overrides(config, point))
    run_dir = run(cfg)
    gc.collect()
    return run_dir / result_stage(cfg) / "final"


def evaluate_point(point: Point, weights: Path, pairs: Sequence[tuple[str, Any]], fmt: Any, *,
                   threads: int | None, batch_size: int, extra: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """The point's records: every (split, pair) read with the weights in `weights` (the reader batched over
    items, `batch_size` sequences a forward, `threads` torch threads); `extra` is added to every record."""
    import torch
    from tqdm import tqdm

    from cipr.eval.consistency_metric import ConsistencyConfig, measure
    from cipr.runtime.model import load_inference_model

    model, tokenizer = load_inference_model(str(weights), device="cpu", dtype="float32",
                                            threads=threads, attn_implementation="sdpa")
    by_item: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for split, pair in pairs:
        by_item[pair.item.id].append((split, pair))
    records: list[dict[str, Any]] = []
    chunk = max(1, batch_size // 2)
    ids = list(by_item)
    with torch.inference_mode(), tqdm(total=len(ids), desc=f"read {point.label}", unit="item") as bar:
        for start in range(0, len(ids), chunk):
            group = [sp for i in ids[start:start + chunk] for sp in by_item[i]]
            split_of = {p.item.id: s for s, p in group}
            for rec in measure(model, tokenizer, fmt, [p for _, p in group],
                               ConsistencyConfig(batch_size=batch_size)):
                records.append({"point": point.label, "arm": point.arm, "seed": point.seed,
                                "split": split_of[rec["id"]], **(extra or {}), **rec})
            bar.update(len(ids[start:start + chunk]))
    del model
    gc.collect()
    return records


def run_transfer(config: TransferConfig) -> dict[str, Any] | None:
    """Train and evaluate every point of `run_seeds` not done yet, then (with `report`) write the report from
    every finished point; returns the report (None without one)."""
    from tqdm import tqdm

    from cipr.formats import get_format

    out = Path(config.out_dir)
    base = compose_train(point_overrides(config, Point(config.arms[0], config.seeds[0])))
    if config.sweep == "cpu_transfer" and list(base.data.exclude) != heldout_exclude():
        raise ConfigError("configs/train/sweep/cpu_transfer.yaml's data.exclude is not the draw of "
                          "heldout_exclude()")
    items = transfer_items(base.data, config.items_per_split, config.eval_seed)
    pairs = build_pairs(config, items)
    fmt = get_format(base.model.call_format)
    seeds = config.seeds if config.run_seeds is None else config.run_seeds
    todo = [Point(a, s) for s in seeds for a in config.arms if not point_done(out, Point(a, s), len(pairs))]
    log.info("transfer: %d items (%s), %d reads a point; %d points to run", sum(map(len, items.values())),
             ", ".join(f"{s} {len(v)}" for s, v in items.items()), len(pairs), len(todo))
    with tqdm(total=len(todo), desc="transfer points", unit="point") as bar:
        for point in todo:
            started = time.time()
            weights = train_point(config, point)
            trained = time.time()
            records = evaluate_point(point, weights, pairs, fmt, threads=config.threads,
                                     batch_size=config.batch_size)
            timing = {"train_s": trained - started, "eval_s": time.time() - trained, "reads": len(records)}
            _write_point(out, point, records, timing)
            if not config.keep_weights:
                drop_weights(out / "points" / point.label)
            bar.set_postfix_str(f"{point.label}: train {timing['train_s']:.0f} s, "
                                f"read {timing['eval_s']:.0f} s")
            bar.update()
    if not config.report:
        return None
    from cipr.experiments.transfer_analysis import write_report

    records = [r for p in sorted((out / "records").glob("*.jsonl")) for r in read_jsonl(p)]
    timings = {p.stem: read_json(p) for p in sorted((out / "records").glob("*.json"))}
    meta = {"design": _design(config, items), "timings": timings,
            "wall_s": math.fsum(t["train_s"] + t["eval_s"] for t in timings.values())}
    return write_report(records, meta, Path(config.report_dir))


def _design(config: TransferConfig, items: Mapping[str, Sequence[Example]]) -> dict[str, Any]:
    return {"arms": list(config.arms), "seeds": list(config.seeds), "rescore_weight": config.rescore_weight,
            "types": list(config.types), "primary": config.primary, "heldin": config.heldin,
            "items": {s: [e.id for e in v] for s, v in items.items()},
            "secondary_items": config.secondary_items, "eval_seed": config.eval_seed,
            "perturbation_seed": config.perturbation_seed, "sweep": config.sweep,
            "train": dict(config.train)}


def _write_point(out: Path, point: Point, records: Sequence[Mapping[str, Any]],
                 timing: Mapping[str, Any]) -> None:
    folder = out / "records"
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / f"{point.label}.jsonl",
                      "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    write_json_atomic(folder / f"{point.label}.json", dict(timing))  # last: marks the point done
