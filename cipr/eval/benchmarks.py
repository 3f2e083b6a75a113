"""From a benchmark name to evaluation items: load the examples, resolve the perturbation list, build
every item × perturbation × tool order × names, and pick the scorer.

Perturbation tokens (`perturbations=`): a type name (`cipr-data list-perturbations`), a group of the
paper's Table 1 (`typos_distractors`, `cost_latency_explicit`, `cost_latency_implicit`,
`in_distribution`) or `drift`, `held_out` (every held-out type), `original`, and `default` (the
benchmark's list). RoTBench's types are its five levels (`clean`, `slight`, `medium`, `heavy`,
`union`, group `clean` or `corrupted`).

Tool orders: the cost and latency types are run in both orders (`original`, `costly_first`) under
canonical names, where canonical ids follow the tool order, and in the original order only under
original names (paper, Appendix C). `in_distribution` is defined on canonical names only (Table 1:
n/a with original names): with original names it is not built, and run.json says so.

An item a perturbation cannot apply to is skipped with its reason, counted per type in run.json
and the summary.

Multi-turn benchmarks (`bfcl_multi_turn`, `toyshop`): one item per task × perturbation × order × names,
an episode in the environment (`cipr.eval.episodes`); tasks from `benchmark.task_split`, `limit` taken
round-robin over BFCL's categories (`partitions`). Types whose perturbed calls the environment cannot run
(`cipr.eval.episodes.NOT_EXECUTABLE`) and `in_distribution` (the training perturbation) are not built,
and run.json says so.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.eval.config import MULTI_TURN, EvalConfig
from cipr.eval.items import make_item, make_shown_item
from cipr.eval.runner import EvalItem, Scorer
from cipr.eval.scorers import SCORERS
from cipr.tools.interface import Example

log = logging.getLogger(__name__)

ORIGINAL = "original"
ROTBENCH_LEVELS = ("clean", "slight", "medium", "heavy", "union")


@dataclass
class BuildReport:
    """What was built and what was not: skipped (type -> count, first reasons), not applicable."""

    skipped: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    not_applicable: list[str] = field(default_factory=list)

    def skip(self, pert: str, item: str, reason: str) -> None:
        self.skipped[pert] = self.skipped.get(pert, 0) + 1
        if len(self.reasons[pert]) < 5:
            self.reasons[pert].append(f"{item}: {reason}"[:300])

    def to_json(self) -> dict[str, Any]:
        return {"skipped": dict(self.skipped), "skip_reasons": dict(self.reasons),
                "not_applicable": list(self.not_applicable)}


def _round_robin(groups: Sequence[Sequence[Example]], limit: int | None) -> list[Example]:
    if limit is None:
        return [e for g in groups for e in g]
    out: list[Example] = []
    for row in zip_longest(*groups):
        out.extend(e for e in row if e is not None)
        if len(out) >= limit:
            break
    return out[:limit]


def load_examples(cfg: EvalConfig) -> list[Example]:
    """The benchmark's examples (BFCL, ToolRL test, synthetic, messages), `limit` taken round-robin over
    partitions (messages: its files, or its splits)."""
    name = cfg.benchmark.name
    if name == "bfcl":
        from cipr.data.bfcl import load_bfcl

        exs = load_bfcl(cfg.data_root, cfg.partitions)
    elif name == "toolrl_test":
        from cipr.data.paths import data_root
        from cipr.data.toolrl import load_toolrl

        path = Path(cfg.benchmark.path) if cfg.benchmark.path else \
            data_root(cfg.data_root) / "toolrl" / "rlla_4k" / "test.parquet"
        exs = load_toolrl(path)
    elif name == "messages":
        from cipr.core.errors import DataError
        from cipr.data.messages import BadRow, checked_path
        from cipr.data.row_formats import load_rows

        path = checked_path(cfg.benchmark.path, "benchmark=messages", "benchmark.path")
        try:
            exs = load_rows(path, cfg.benchmark.data_format).examples
        except BadRow as e:  # an evaluation skips no item: its denominator is the file
            raise DataError(f"{e.plain}; an evaluation reads every row, so fix or remove this one",
                            file=e.file, item=e.item, field=e.field) from None
    elif name == "bfcl_irrelevance":
        from cipr.data.bfcl import load_bfcl_irrelevance

        exs = load_bfcl_irrelevance(cfg.data_root, cfg.partitions)
    elif name == "synthetic":
        from cipr.data.synthetic import SyntheticConfig

        b = cfg.benchmark
        try:
            options = SyntheticConfig(n=b.n, seed=cfg.seed, tools_per_example=tuple(b.tools_per_example),  # type: ignore[arg-type]
                                      parallel_fraction=b.parallel_fraction,
                                      no_call_fraction=b.no_call_fraction,
                                      same_domain_distractors=b.same_domain_distractors, tools=tuple(b.tools))
        except ValueError as e:
            raise ConfigError(f"benchmark.{e}") from None
        exs = options.generate(split="test")  # never the training stream
    elif name in MULTI_TURN:
        raise ConfigError(f"benchmark={name} runs episodes, not examples: its consistency metric is "
                          "cipr.eval.episodes.run_episode_consistency")
    else:
        raise ValueError(f"load_examples does not load {name!r} (RoTBench is loaded per level)")
    by_part: dict[str, list[Example]] = defaultdict(list)
    for e in exs:
        by_part[e.partition].append(e)
    return _round_robin(list(by_part.values()), cfg.limit)


def registry_types() -> list[tuple[str, str]]:
    """(type, group) of every registered perturbation."""
    from cipr.perturb import list_perturbations

    return [(n, g) for n, g, _ in list_perturbations()]


def resolve_perturbations(tokens: Sequence[str] | None, cfg: EvalConfig) -> list[tuple[str, str]]:
    """(type, group) pairs, in order, without repeats, for the given tokens (see the module docstring)."""
    tokens = list(tokens or ["default"])
    if "default" in tokens:
        i = tokens.index("default")
        tokens[i:i + 1] = list(cfg.benchmark.perturbations)
    if cfg.benchmark.name == "rotbench":
        known = {lvl: ("clean" if lvl == "clean" else "corrupted") for lvl in ROTBENCH_LEVELS}
        groups = {"corrupted": [lvl for lvl in ROTBENCH_LEVELS if lvl != "clean"], "held_out":
                  [lvl for lvl in ROTBENCH_LEVELS if lvl != "clean"], "original": ["clean"]}
    else:
        from cipr.perturb import HELD_OUT

        known = {ORIGINAL: ORIGINAL, **dict(registry_types())}
        groups = defaultdict(list)
        for n, g in known.items():
            groups[g].append(n)
        groups["held_out"] = list(HELD_OUT)
    out: dict[str, str] = {}
    for tok in tokens:
        if tok in known and tok not in groups:
            out.setdefault(tok, known[tok])
        elif tok in groups:
            for n in groups[tok]:
                out.setdefault(n, known[n])
        else:
            raise ConfigError(f"unknown perturbation or group {tok!r} for benchmark {cfg.benchmark.name}; "
                             f"types: {', '.join(known)}; groups: {', '.join(sorted(groups))}")
    return list(out.items())


def build_items(examples: Sequence[Example], perts: Sequence[tuple[str, str]], names_list: Sequence[str],
                seed: int, report: BuildReport) -> list[EvalItem]:
    """Items for non-RoTBench benchmarks: the perturbation is built once under original names and shared
    by both namings; canonical items go through the adapter (`cipr.eval.items.make_item`)."""
    from cipr.perturb import apply_perturbation
    from cipr.perturb.registry import AFTER_ADAPTER, ORDERED_TYPES

    items: list[EvalItem] = []
    if "in_distribution" in dict(perts) and "original" in names_list:
        report.not_applicable.append("in_distribution under original names (defined on canonical names)")
    for ex in examples:
        for pert, group in perts:
            if pert == ORIGINAL:
                items += [make_item(ex, ex, names=n, perturbation=pert, group=group) for n in names_list]
                continue
            if pert == "in_distribution":
                if "canonical" in names_list:
                    try:
                        shown, _ = apply_perturbation(ex, pert, seed=seed, names="canonical")
                    except (DataError, ValueError, KeyError) as e:
                        report.skip(pert, ex.id, str(e))
                        continue
                    items.append(make_shown_item(ex, shown, names="canonical", perturbation=pert,
                                                 group=group))
                continue
            if pert in AFTER_ADAPTER:  # renamed after canonicalization: the adapter would undo it
                for n in names_list:
                    try:
                        shown, _ = apply_perturbation(ex, pert, seed=seed, names=n)
                    except (DataError, ValueError, KeyError) as e:
                        report.skip(f"{pert}/{n}", ex.id, str(e))
                        continue
                    items.append(make_shown_item(ex, shown, names=n, perturbation=pert, group=group))
                continue
            orders = ("original", "costly_first") if pert in ORDERED_TYPES else ("original",)
            for order in orders:
                try:
                    perturbed, _ = apply_perturbation(ex, pert, seed=seed, names="original", order=order)
                except (DataError, ValueError, KeyError) as e:
                    report.skip(pert if order == "original" else f"{pert}/{order}", ex.id, str(e))
                    continue
                for n in names_list:
                    if order != "original" and n == "original":
                        continue
                    items.append(make_item(ex, perturbed, names=n, perturbation=pert, group=group,
                                           order=order))
    return items


def build_rotbench_items(cfg: EvalConfig, levels: Sequence[tuple[str, str]], names_list: Sequence[str],
                         report: BuildReport) -> list[EvalItem]:
    """RoTBench items per level (`limit`: first N records of each): the shipped file under original
    names; under canonical names Appendix F's construction (`cipr.perturb.rotbench.reapply_level`),
    which keeps queries and order, so the two namings pair item by item."""
    from cipr.data.rotbench import load_rotbench
    from cipr.perturb.rotbench import pair_with_clean, reapply_level

    items: list[EvalItem] = []
    clean = load_rotbench(cfg.data_root, cfg.benchmark.split, "clean")
    for level, group in levels:
        pairs = pair_with_clean(clean, load_rotbench(cfg.data_root, cfg.benchmark.split, level))
        if cfg.limit is not None:
            pairs = pairs[:cfg.limit]
        for c, ex in pairs:
            for n in names_list:
                if n == "original":
                    items.append(make_item(ex, ex, names=n, perturbation=level, group=group))
                    continue
                try:
                    shown, _ = reapply_level(c, ex, seed=cfg.seed)
                except DataError as e:
                    report.skip(f"{level}/canonical", ex.id, str(e))
                    continue
                items.append(make_shown_item(ex, shown, names=n, perturbation=level, group=group))
    return items


def episode_env(cfg: EvalConfig) -> tuple[str, dict[str, Any]]:
    """The environment name and options of a multi-turn benchmark (BFCL's categories from `partitions`)."""
    b = cfg.benchmark
    options = dict(b.env)
    if b.name == "bfcl_multi_turn":
        from cipr.envs.bfcl_multi_turn import CATEGORIES

        if cfg.partitions is not None:
            cats = [p.removeprefix("multi_turn_") for p in cfg.partitions]
            bad = [p for p, c in zip(cfg.partitions, cats, strict=True) if c not in CATEGORIES]
            if bad:
                raise ConfigError(f"partitions={bad}: benchmark=bfcl_multi_turn has the categories "
                                  f"{', '.join('multi_turn_' + c for c in CATEGORIES)}")
            options["categories"] = cats
        if cfg.data_root is not None:
            options.setdefault("data_root", cfg.data_root)
    return b.name, options


def _task_ids(env: Any, split: str) -> list[str]:
    if split != "all":
        return env.tasks(split)
    both = set(env.tasks("train")) | set(env.tasks("heldout"))
    order = list(env.items) if env.name == "bfcl_multi_turn" else [f"toyshop_{k}" for k in range(env.n_tasks)]
    return [t for t in order if t in both]


def build_episode_items(cfg: EvalConfig, perts: Sequence[tuple[str, str]], report: BuildReport) -> list[Any]:
    """The episodes of a multi-turn benchmark (module docstring)."""
    from cipr.envs.registry import make_env
    from cipr.eval.episodes import NOT_EXECUTABLE, EpisodeItem, make_view, reference_script
    from cipr.perturb.registry import ORDERED_TYPES

    name, options = episode_env(cfg)
    try:
        env: Any = make_env(name, **options)
    except ValueError as e:
        raise ConfigError(f"benchmark.env: {e}") from None
    ids = _task_ids(env, cfg.benchmark.task_split)
    partition = (lambda t: env.items[t].category) if name == "bfcl_multi_turn" else (lambda t: name)
    by_part: dict[str, list[str]] = defaultdict(list)
    for t in ids:
        by_part[partition(t)].append(t)
    if cfg.limit is not None:
        ids = [t for row in zip_longest(*by_part.values()) for t in row if t is not None][:cfg.limit]
    for pert in dict(perts):
        if pert in NOT_EXECUTABLE:
            report.not_applicable.append(f"{pert} (its perturbed calls cannot be run by the environment)")
        elif pert == "in_distribution":
            report.not_applicable.append("in_distribution (the training perturbation) for episodes")
    items: list[Any] = []
    for tid in ids:
        first = env.reset(tid)
        declared, script = env.declared, reference_script(env, tid)
        for pert, group in perts:
            if pert in NOT_EXECUTABLE or pert == "in_distribution":
                continue
            for order in ("original", "costly_first") if pert in ORDERED_TYPES else ("original",):
                for n in cfg.names_list:
                    if order != "original" and n == "original":
                        continue
                    try:
                        view = make_view(declared, first, script, tid, perturbation=pert, names=n,
                                         seed=cfg.seed, order=order)
                    except (DataError, ValueError, KeyError) as e:
                        report.skip(pert if order == "original" else f"{pert}/{order}", f"{tid}/{n}", str(e))
                        continue
                    items.append(EpisodeItem(tid, partition(tid), n, pert, group, order, name, options, view))
    close = getattr(env, "close", None)
    if close is not None:
        close()
    return items


def build(cfg: EvalConfig) -> tuple[list[EvalItem], list[tuple[str, str]], BuildReport]:
    """Every item of the run, the (type, group) list, and the build report."""
    perts = resolve_perturbations(cfg.perturbations, cfg)
    report = BuildReport()
    if cfg.benchmark.name in MULTI_TURN:
        return build_episode_items(cfg, perts, report), perts, report
    if cfg.benchmark.name == "rotbench":
        return build_rotbench_items(cfg, perts, cfg.names_list, report), perts, report
    return build_items(load_examples(cfg), perts, cfg.names_list, cfg.seed, report), perts, report


def _environment_scores(**_: Any) -> Any:
    raise RuntimeError("a multi-turn benchmark is scored by its environment (cipr.eval.episodes), "
                       "not per response")


def scorer_for(cfg: EvalConfig) -> Scorer:
    """The benchmark's scorer (multi-turn benchmarks: a placeholder; their environment scores episodes)."""
    if cfg.benchmark.name in MULTI_TURN or cfg.benchmark.scorer == "environment":
        return _environment_scores
    if cfg.benchmark.scorer not in SCORERS:
        raise ConfigError(f"unknown scorer {cfg.benchmark.scorer!r}; choose one of {', '.join(SCORERS)}")
    return SCORERS[cfg.benchmark.scorer]
