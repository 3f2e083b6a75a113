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
from cipr.eval.config import EvalConfig
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
        from cipr.data.messages import checked_path, load_messages

        exs = load_messages(checked_path(cfg.benchmark.path, "benchmark=messages", "benchmark.path")).examples
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


def build(cfg: EvalConfig) -> tuple[list[EvalItem], list[tuple[str, str]], BuildReport]:
    """Every item of the run, the (type, group) list, and the build report."""
    perts = resolve_perturbations(cfg.perturbations, cfg)
    report = BuildReport()
    if cfg.benchmark.name == "rotbench":
        return build_rotbench_items(cfg, perts, cfg.names_list, report), perts, report
    return build_items(load_examples(cfg), perts, cfg.names_list, cfg.seed, report), perts, report


def scorer_for(cfg: EvalConfig) -> Scorer:
    if cfg.benchmark.scorer not in SCORERS:
        raise ConfigError(f"unknown scorer {cfg.benchmark.scorer!r}; choose one of {', '.join(SCORERS)}")
    return SCORERS[cfg.benchmark.scorer]
