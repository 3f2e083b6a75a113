"""The training perturbation of paper §3.2: twin expansion, relabeling, reordering.

Applied to the canonical example (`cipr.tools.canonical.canonicalize` first); the Correspondence names the
canonical tools it was given. Steps, in the paper's order:
1. Twin expansion: every tool gets a degraded twin, either a *description twin* (a wording from
   `DEGRADED_WORDINGS` before or after the original text: deprecated, unmaintained, less accurate or slower,
   never costlier; see below) or a *schema twin* (one argument the task needs, the one a reference call passes
   for a called tool, else a required one, else any, replaced by one of `cipr.perturb.vocabulary`'s unrelated
   arguments). A tool without arguments gets a description twin. Originals, their descriptions and the query
   are unchanged.
2. Relabeling: every tool of the expanded list gets a fresh neutral id (a canonical id mentioned in the
   messages or a description becomes its equivalent's new id). `relabel="random"` (default) draws distinct
   numbers from 1..`id_space`, so an id says nothing about position or the old id; `"positional"` numbers them
   by new position.
3. Reordering: tools are shuffled, and so are each tool's arguments; argument ids are then renumbered by their
   new position (`arg_01`, ...), so they do not reveal the old order.

Ablation variants (paper Table 2 / Table 9) via `TrainingPerturbationConfig.preset`:
- `full`: all of the above.
- `reorder_only`: no twins; relabel and reorder.
- `twins_only`: twins, each placed right after its original; relabel; no reordering.
- `single_near_duplicate`: one degraded twin of one called tool (a random tool when nothing is called), placed
  right after it; relabel; no reordering, which reproduces the position cue the paper reports for this
  ablation (the correct tool always comes first).

Twin wordings. The paper (§3.2, §4.2) keeps cost and latency as the held-out cues least like training, never
rewards preferring a cheaper or faster tool in training, and gives deprecated or slower tools as examples of
twins. So the default pool (`twin_wordings="default"`) states no cost, price or amount, names no unit of time,
and shares no four-word span with any held-out cost or latency template (`cost_latency.annotate` in every
style, and the query requests); a test checks this against the templates and the twins generated for every
BFCL item. `COST_WORDINGS` enter the pool only under the ablation switch `twin_wordings="with_cost"`, which
the perturbation metadata and the run's summary.json name.

Choices the paper leaves open: the wording pool, the twin-kind probability (`schema_twin_prob`, 0.5), whether
argument ids are renumbered (yes), and the id space (99, or n when there are more tools).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from cipr.perturb.correspondence import Correspondence
from cipr.perturb.draft import Draft, Entry, arg_ids, rename_schema_args, rng_for
from cipr.perturb.vocabulary import vocabulary
from cipr.tools.canonical import canonical_tool_id, canonicalize
from cipr.tools.interface import Example, Tool

DEGRADED_WORDINGS: tuple[str, ...] = (
    "Deprecated: this version will be removed soon and may return outdated results.",
    "Legacy endpoint kept only for backward compatibility; prefer the maintained version.",
    "No longer maintained: known bugs in this version will not be fixed.",
    "This version is unmaintained and may fail on inputs the current one handles.",
    "This version is less accurate and may return approximate results.",
    "This version is known to return lower-quality results.",
    "This version is slower than the current one.",
    "This version takes noticeably longer to finish than the maintained one.",
)
"""Default twin wordings: deprecated, unmaintained, less accurate, slower (two each); no cost cue."""

COST_WORDINGS: tuple[str, ...] = (
    "This version is more expensive to call than the current one.",
    "Each call to this version costs more than the standard one.",
)
"""Cost wordings, added to the pool only by the ablation switch `twin_wordings="with_cost"`."""

TwinWordings = Literal["default", "with_cost"]
TWIN_WORDINGS: tuple[str, ...] = ("default", "with_cost")

Variant = Literal["full", "reorder_only", "twins_only", "single_near_duplicate"]
VARIANTS: tuple[str, ...] = ("full", "reorder_only", "twins_only", "single_near_duplicate")


@dataclass(frozen=True)
class TrainingPerturbationConfig:
    """Options of the training perturbation (see the module docstring)."""

    twins: Literal["all", "single", "none"] = "all"
    reorder_tools: bool = True
    reorder_arguments: bool = True
    relabel: Literal["random", "positional"] = "random"
    schema_twin_prob: float = 0.5
    wordings: tuple[str, ...] = DEGRADED_WORDINGS
    twin_wordings: TwinWordings = "default"
    id_space: int = 99

    def __post_init__(self) -> None:
        if self.twins not in ("all", "single", "none"):
            raise ValueError(f"twins must be all, single or none, got {self.twins!r}")
        if self.relabel not in ("random", "positional"):
            raise ValueError(f"relabel must be random or positional, got {self.relabel!r}")
        if not 0.0 <= self.schema_twin_prob <= 1.0:
            raise ValueError(f"schema_twin_prob must be in [0, 1], got {self.schema_twin_prob}")
        if not self.wordings:
            raise ValueError("wordings must not be empty")
        if self.twin_wordings not in TWIN_WORDINGS:
            raise ValueError(f"twin_wordings must be default or with_cost, got {self.twin_wordings!r}")

    @property
    def wording_pool(self) -> tuple[str, ...]:
        """The wordings description twins draw from: `wordings`, plus `COST_WORDINGS` under `with_cost`."""
        return self.wordings + (COST_WORDINGS if self.twin_wordings == "with_cost" else ())

    @classmethod
    def preset(cls, variant: str, twin_wordings: TwinWordings = "default") -> TrainingPerturbationConfig:
        """The configuration of one ablation variant (full, reorder_only, twins_only, single_near_duplicate),
        with the default twin wordings or, for the cost ablation, `twin_wordings="with_cost"`."""
        if variant == "full":
            return cls(twin_wordings=twin_wordings)
        if variant == "reorder_only":
            return cls(twins="none", twin_wordings=twin_wordings)
        if variant == "twins_only":
            return cls(reorder_tools=False, reorder_arguments=False, twin_wordings=twin_wordings)
        if variant == "single_near_duplicate":
            return cls(twins="single", reorder_tools=False, reorder_arguments=False,
                       twin_wordings=twin_wordings)
        raise ValueError(f"unknown training variant {variant!r}; choose one of {', '.join(VARIANTS)}")


def degraded_twin(tool: Tool, needed: list[str], rng: random.Random,
                  config: TrainingPerturbationConfig) -> tuple[Tool, str]:
    """A degraded twin of `tool` and its kind ("description" or "schema").

    A schema twin keeps the argument's slot (its key and required flag) but gives it the type and
    description of an unrelated argument, so the relabeled twin looks like the original with one
    argument swapped for something the task cannot use.
    """
    props = tool.properties
    if props and rng.random() < config.schema_twin_prob:
        target = rng.choice(needed or list(tool.required) or list(props))
        _, schema = rng.choice(vocabulary().unrelated_arguments)
        new_props = {k: (dict(schema) if k == target else v) for k, v in props.items()}
        params = dict(tool.parameters)
        params["properties"] = new_props
        return Tool(tool.name, tool.description, params), "schema"
    wording = rng.choice(config.wording_pool)
    desc = tool.description.strip()
    text = f"{wording} {desc}" if rng.random() < 0.5 else f"{desc} {wording}"
    return Tool(tool.name, text.strip(), tool.parameters), "description"


def _add_twins(draft: Draft, rng: random.Random, config: TrainingPerturbationConfig) -> None:
    if config.twins == "none" or not draft.entries:
        return
    if config.twins == "single":
        called = draft.called()
        targets = [rng.choice(called)] if called else [rng.randrange(len(draft.entries))]
    else:
        targets = list(range(len(draft.entries)))
    for i in sorted(targets, reverse=True):
        e = draft.entries[i]
        needed = draft.used_arguments(i) or list(e.tool.required)
        twin, kind = degraded_twin(e.tool, needed, rng, config)
        draft.insert(i + 1, Entry(twin, (), e.sources[0] if e.sources else None, "twin", {}))
        draft.notes.append(f"{kind} twin of {e.tool.name}")


def _relabel_and_reorder(draft: Draft, rng: random.Random, config: TrainingPerturbationConfig) -> None:
    n = len(draft.entries)
    if config.reorder_tools and n > 1:
        order = list(range(n))
        rng.shuffle(order)
        draft.reorder(order)
    if config.relabel == "random":
        space = max(config.id_space, n)
        width = max(2, len(str(space)))
        ids = [f"function_{k:0{width}d}" for k in rng.sample(range(1, space + 1), n)]
    else:
        ids = [canonical_tool_id(i, n) for i in range(n)]
    text_map: dict[str, str] = {}
    for i, e in enumerate(draft.entries):
        props = list(e.tool.properties)
        if config.reorder_arguments and len(props) > 1:
            rng.shuffle(props)
        amap = dict(zip(props, arg_ids(len(props)), strict=True))
        params = dict(e.tool.parameters)
        params["properties"] = {a: e.tool.properties[a] for a in props}
        if "required" in params:
            params["required"] = [a for a in props if a in set(params["required"])]
        if e.role == "equivalent":
            text_map.setdefault(e.tool.name, ids[i])
        e.tool = Tool(ids[i], e.tool.description, rename_schema_args(params, amap))
        e.args = {amap[cur]: src for cur, src in e.args.items()}
        for c in draft.calls_on(i):
            c.arguments = {amap.get(k, k): v for k, v in c.arguments.items()}
            if c.accepted is not None:
                c.accepted = {amap.get(k, k): v for k, v in c.accepted.items()}
    draft.rename_in_text(text_map)


def perturb_for_training(example: Example, config: TrainingPerturbationConfig | None = None, *,
                         seed: int) -> tuple[Example, Correspondence]:
    """The perturbed copy of a (canonical) training example and its correspondence to the tools it was
    given. Deterministic in (seed, example.id)."""
    config = config or TrainingPerturbationConfig()
    rng = rng_for(seed, example.id, "training")
    draft = Draft(example)
    _add_twins(draft, rng, config)
    _relabel_and_reorder(draft, rng, config)
    return draft.finish(names="original", perturbation="in_distribution",
                        meta={"seed": seed, "variant": _variant_name(config), "names": "fresh_ids",
                              "twin_wordings": config.twin_wordings})


def in_distribution(example: Example, *, seed: int,
                    config: TrainingPerturbationConfig | None = None) -> tuple[Example, Correspondence]:
    """The training perturbation applied to an example under original names, as an evaluation type:
    canonicalize, perturb, and express the correspondence in the original names."""
    canon, nmap = canonicalize(example)
    perturbed, corr = perturb_for_training(canon, config, seed=seed)
    return perturbed, corr.compose(nmap.backward, nmap.arguments)


def _variant_name(config: TrainingPerturbationConfig) -> str:
    for v in VARIANTS:
        if TrainingPerturbationConfig.preset(v, config.twin_wordings) == config:
            return v
    return "custom"
