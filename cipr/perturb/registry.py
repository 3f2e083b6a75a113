"""Every perturbation type by name: its group, a one-line description, and the function applying it.

`PERTURBATIONS[name] = (group, description, function)`, where `function(example, *, seed, names, order) ->
(Example, Correspondence)`. Groups are those of the paper's Table 1 (`typos_distractors`,
`cost_latency_explicit`, `cost_latency_implicit`, `in_distribution`), plus `drift` (the repair study's types,
not in Table 1), `renaming` (`renaming.py`) and `shown` (`shown.py`). RoTBench's level re-application pairs
two files and lives in `cipr.perturb.rotbench`.

Every function draws from `random.Random` seeded with (seed, item id, type name), so a type is a pure function
of (item, seed); `names="canonical"` canonicalizes after the interface is built; `order` ("original" or
"costly_first") applies to the cost and latency types only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from cipr.core.errors import ConfigError
from cipr.perturb import cost_latency, distractors, drift, renaming, shown, typos
from cipr.perturb.correspondence import Correspondence
from cipr.perturb.draft import Draft, rng_for
from cipr.perturb.training import (
    VARIANTS,
    TrainingPerturbationConfig,
    TwinWordings,
    in_distribution,
    perturb_for_training,
)
from cipr.tools.interface import Example

GROUPS = ("typos_distractors", "cost_latency_explicit", "cost_latency_implicit", "in_distribution", "drift",
          "renaming", "shown")
Apply = Callable[..., tuple[Example, Correspondence]]
Builder = Callable[[Draft, random.Random, str], None]


def _held_out(name: str, build: Builder) -> Apply:
    def apply(example: Example, *, seed: int, names: str = "original",
              order: str = "original") -> tuple[Example, Correspondence]:
        draft = Draft(example)
        build(draft, rng_for(seed, example.id, name), order)
        meta: dict[str, Any] = {"seed": seed}
        if name.startswith(("cost_", "latency_")):
            meta["order"] = order
        return draft.finish(names=names, perturbation=name, meta=meta)  # type: ignore[arg-type]

    apply.__name__ = name
    apply.__doc__ = f"Apply the `{name}` perturbation."
    return apply


def _no_order(fn: Callable[[Draft, random.Random], None]) -> Builder:
    return lambda d, r, _order: fn(d, r)


def _in_distribution(example: Example, *, seed: int, names: str = "canonical",
                     order: str = "original") -> tuple[Example, Correspondence]:
    if names != "canonical":
        raise ValueError("in_distribution is the training perturbation, defined on canonical names: "
                         "use names='canonical' (the paper reports n/a for original names)")
    return in_distribution(example, seed=seed)


PERTURBATIONS: dict[str, tuple[str, str, Apply]] = {
    "typos": ("typos_distractors", "keyboard typos in the query, reference values protected",
              _held_out("typos", _no_order(typos.apply_typos))),
    "distractor_similar_name": (
        "typos_distractors", "an unrelated tool renamed to resemble each called tool",
        _held_out("distractor_similar_name", _no_order(distractors.add_similar_name_distractors))),
    "same_name_description": (
        "typos_distractors", "a same-name duplicate of each called tool with a corrupted description",
        _held_out("same_name_description",
                  lambda d, r, _o: distractors.add_same_name_duplicates(d, r, "description"))),
    "same_name_parameters": (
        "typos_distractors", "a same-name duplicate of each called tool with corrupted parameters",
        _held_out("same_name_parameters",
                  lambda d, r, _o: distractors.add_same_name_duplicates(d, r, "parameters"))),
}

_STYLE_TEXT = {"tag": "as a tag", "nl": "in natural language", "abbrev": "as a tag, correct tool abbreviated"}
_VERSION_TEXT = {"explicit": "query asks for the {better} tool",
                 "implicit": "query asks to describe the tools first"}
for _version in cost_latency.VERSIONS:
    for _kind in cost_latency.KINDS:
        for _style in cost_latency.STYLES:
            _spec = cost_latency.CostLatencySpec(_kind, _style, _version)
            _worse = "costlier" if _kind == "cost" else "slower"
            _better = "cheaper" if _kind == "cost" else "faster"
            PERTURBATIONS[_spec.name] = (
                f"cost_latency_{_version}",
                f"renamed correct tool + {_worse} equivalent keeping its name, {_kind} stated "
                f"{_STYLE_TEXT[_style]}; {_VERSION_TEXT[_version].format(better=_better)}",
                _held_out(_spec.name, lambda d, r, o, s=_spec: cost_latency.apply_cost_latency(d, r, s, o)))

PERTURBATIONS["in_distribution"] = (
    "in_distribution", "the training perturbation: degraded twins, fresh ids, shuffled tools and arguments",
    _in_distribution)

_DRIFT: dict[str, tuple[str, Callable[[Draft, random.Random], None]]] = {
    "drift_stale_examples": ("each called tool's description shows an example with a stale field name",
                             drift.stale_examples),
    "drift_renamed_parameters": ("one passed argument of each called tool renamed",
                                 drift.renamed_parameters),
    "drift_distractors": ("a sibling tool with an overlapping description per called tool",
                          drift.distractors),
    "drift_type_narrowing": ("a passed argument narrowed: number -> integer or free string -> enum",
                             drift.narrow_type),
    "drift_enum_replacement": ("the enum values of a passed argument respelled, reference rewritten",
                               drift.replace_enum_values),
    "drift_refactor": ("a called tool split in two on a boolean/enum argument, else merged with another",
                       drift.refactor),
    "drift_mild": ("2 stale-field examples, 2 renamed parameters, 1 overlapping distractor",
                   lambda d, r: drift.composite(d, r, drift.MILD)),
    "drift_medium": ("3 stale-field examples, 3 renamed parameters, 3 overlapping distractors",
                     lambda d, r: drift.composite(d, r, drift.MEDIUM)),
}
for _name, (_desc, _fn) in _DRIFT.items():
    PERTURBATIONS[_name] = ("drift", _desc, _held_out(_name, _no_order(_fn)))

PERTURBATIONS["relabel_function"] = (
    "in_distribution",
    "every tool renamed to a fresh function_XX id, the rescoring term's relabeling (after the adapter)",
    lambda ex, *, seed, names="canonical", order="original": renaming.rename_all(
        ex, seed=seed, names=names, scheme="function", perturbation="relabel_function"))
PERTURBATIONS["relabel_random"] = (
    "renaming",
    "every tool renamed to fn_ + 6 random characters, a name shape never trained on (after the adapter)",
    lambda ex, *, seed, names="original", order="original": renaming.rename_all(
        ex, seed=seed, names=names, scheme="random", perturbation="relabel_random"))

_SHOWN_TEXT = {"lookalike_shown": "an unrelated tool named like each called tool's shown name "
                                  "(after the adapter)",
               "paraphrase": "every tool description reworded (after the adapter)",
               "reorder": "the tools in a new order, names kept (after the adapter)"}
for _name, _text in _SHOWN_TEXT.items():
    PERTURBATIONS[_name] = ("shown", _text, lambda ex, *, seed, names="original", order="original", n=_name:
                            shown.after_adapter(ex, seed=seed, names=names, perturbation=n,
                                                build=shown.BUILDERS[n]))

ORDERED_TYPES = tuple(n for n in PERTURBATIONS if n.startswith(("cost_", "latency_")))
HELD_OUT = tuple(n for n, (group, _, _) in PERTURBATIONS.items() if group != "in_distribution")
AFTER_ADAPTER = ("relabel_function", "relabel_random", *_SHOWN_TEXT)
"""Types applied to the interface the model sees (under canonical names, after canonicalization)."""


def register_perturbation(name: str, group: str, description: str, fn: Apply) -> Apply:
    """Add a held-out perturbation type from your own code (docs/extending.md): `fn(example, *, seed, names,
    order) -> (Example, Correspondence)`, a pure function of (example, seed) that applies `names`
    ("original" or "canonical") as the built-in types do (`cipr.perturb.draft.Draft.finish`). `group` is an
    existing group or a new one; a type outside `GROUPS` runs when asked for by name or by its group (never
    inside the `held_out` default). ValueError for a name already taken or a function that is not callable."""
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"perturbation name {name!r}: use letters, digits and underscores")
    if name in PERTURBATIONS or name == "original":
        raise ValueError(f"perturbation {name!r} is already registered")
    if not callable(fn):
        raise ValueError(f"perturbation {name!r}: {fn!r} is not callable")
    PERTURBATIONS[name] = (group, description, fn)
    return fn


def list_perturbations() -> list[tuple[str, str, str]]:
    """(name, group, one-line description) of every perturbation type, in registry order."""
    return [(name, group, desc) for name, (group, desc, _) in PERTURBATIONS.items()]


def apply_perturbation(example: Example, name: str, *, seed: int, names: str = "original",
                       order: str = "original") -> tuple[Example, Correspondence]:
    """Apply perturbation `name` (`names`, `order`: module docstring): the Example and Correspondence."""
    if name not in PERTURBATIONS:
        raise KeyError(f"unknown perturbation {name!r}; `cipr-data list-perturbations` lists them")
    if names not in ("original", "canonical"):
        raise ValueError(f"names must be 'original' or 'canonical', got {names!r}")
    if order not in cost_latency.ORDERS:
        raise ValueError(f"order must be one of {', '.join(cost_latency.ORDERS)}, got {order!r}")
    if order != "original" and name not in ORDERED_TYPES:
        raise ValueError(f"order {order!r} applies only to the cost and latency types, not {name!r}")
    return PERTURBATIONS[name][2](example, seed=seed, names=names, order=order)


def check_preset(preset: str) -> None:
    """ConfigError unless `preset` is a built-in preset (`VARIANTS`) or a registered perturbation type."""
    if preset in VARIANTS:
        return
    if preset not in PERTURBATIONS:
        raise ConfigError(f"perturb.preset={preset!r} is neither a preset of the training perturbation "
                          f"({', '.join(VARIANTS)}) nor a registered perturbation type (register yours with "
                          f"cipr.perturb.register_perturbation in a module named by plugins=[...])")


def training_copy(example: Example, preset: str, *, seed: int, twin_wordings: TwinWordings = "default"
                  ) -> tuple[Example, Correspondence]:
    """The perturbed copy of a canonical training example under `perturb.preset`: the training perturbation
    with that preset's options (`perturb_for_training`), or the registered perturbation type of that name
    (`cipr.perturb.register_perturbation`), applied to the canonical example with its names as given
    (`names="original"`: the copy's names are the ones the type writes). Its Correspondence names the
    canonical tools (None for a tool the type added)."""
    if preset in VARIANTS:
        config = TrainingPerturbationConfig.preset(preset, twin_wordings)
        return perturb_for_training(example, config, seed=seed)
    check_preset(preset)
    return PERTURBATIONS[preset][2](example, seed=seed, names="original", order="original")
