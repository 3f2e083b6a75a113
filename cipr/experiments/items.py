"""A study's calibration items: synthetic single-call items the training never saw, held in or held out.

Items come from the synthetic generator's test stream of a seed no study has read, with the training data's
options, minus every item equal (query and reference call) to a training-pool item or to one of the first
`AVOID_ITEMS` test items of seeds `AVOID_SEEDS` (what earlier runs evaluated), in two splits:
- `near` (held in): the called (tool, query template) pair is one the training data uses, and every listed
  tool is one training lists;
- `hard` (held out): the called tool, or its query template, is held out of all training (`data.exclude`;
  `heldout_exclude` draws the transfer experiment's).
Each item is read under canonical names against its copies under the spec's perturbation types
(`cipr.eval.consistency_metric`).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from typing import Any

from cipr.core.errors import ConfigError
from cipr.experiments.spec import StudySpec
from cipr.tools.interface import Example

SPLITS = ("near", "hard")
AVOID_SEEDS = (0, 1, 2, 3)
AVOID_ITEMS = 500
HELDOUT_DOMAINS = 8


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


def item_key(example: Example) -> tuple[str, str]:
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
    seen = {item_key(e) for e in pool}
    for s in AVOID_SEEDS:
        earlier = SyntheticConfig(n=AVOID_ITEMS, seed=s, **options).generate(split="test")
        seen |= {item_key(e) for e in earlier}
    trained = {(t, k) for e in pool for t, k in e.meta["templates"]}
    listed = {n for e in pool for n in e.interface.names}
    out: dict[str, list[Example]] = {s: [] for s in SPLITS}
    n = 4 * items_per_split
    while min(len(v) for v in out.values()) < items_per_split:
        out = {s: [] for s in SPLITS}
        for e in generate_synthetic(n, eval_seed, tools=tuple(data.tools), split="test", **options):
            if item_key(e) in seen or len(e.reference) != 1:
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


def draw_items(spec: StudySpec, data: Any) -> dict[str, list[Example]]:
    """The spec's calibration items (`ItemsSpec`) for training data options `data`, by split: the first `n`
    items of each split of the test stream `seed`, less every item of the excluded streams (both splits)."""
    items = spec.items
    used = {item_key(e) for stream in items.exclude
            for split in transfer_items(data, stream["n"], stream["seed"]).values() for e in split}
    out: dict[str, list[Example]] = {s: [] for s in items.split}
    size = items.n
    while min(len(v) for v in out.values()) < items.n:
        size *= 2
        drawn = transfer_items(data, size, items.seed)
        out = {s: [e for e in drawn[s] if item_key(e) not in used][:items.n] for s in items.split}
    return out


def build_pairs(spec: StudySpec, items: dict[str, list[Example]]) -> list[tuple[str, Any]]:
    """(split, `ConsistencyPair`) of every item under every type it is read with (`ItemsSpec`)."""
    from cipr.eval.benchmarks import BuildReport, build_items
    from cipr.eval.consistency_metric import build_pairs as pairs_of

    spec_items = spec.items
    out: list[tuple[str, Any]] = []
    for split, examples in items.items():
        for k, example in enumerate(examples):
            types = [spec_items.perturbation, *spec_items.also,
                     *(spec_items.secondary if k < spec_items.secondary_items else [])]
            report = BuildReport()
            built = build_items([example], [(t, t) for t in types], ["canonical"],
                                spec_items.perturbation_seed, report)
            pairs, skipped = pairs_of([example], built, spec_items.perturbation_seed)
            if skipped or report.skipped or len(pairs) != len(types):
                raise ConfigError(f"calibration item {example.id}: a perturbed copy could not be built: "
                                  f"{skipped or report.reasons}")
            out += [(split, p) for p in pairs]
    return out
