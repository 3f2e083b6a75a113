"""Evaluation items: an example under one perturbation, tool order and naming, ready for the runner.

With `names="canonical"` the adapter is applied as at deployment: the perturbed interface is
canonicalized (`cipr.tools.canonical.canonicalize`), the model sees canonical ids, and its calls are
translated back and scored against the perturbed example. The adapter knows nothing of the
perturbation (no correspondence), as in deployment.

RoTBench is the exception the paper makes (Appendix F): canonicalizing a shipped corrupted file would
give a corrupted name the same id as its clean version and undo the corruption, so its canonical
items are built by the perturbation module (canonicalize the clean record, re-apply the level's
corruption to the ids) and scored in the names the model saw (`name_map=None`).
"""

from __future__ import annotations

from cipr.eval.runner import EvalItem
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Example

NAMES = ("original", "canonical")


def make_item(original: Example, perturbed: Example, *, names: str, perturbation: str, group: str,
              order: str = "original") -> EvalItem:
    """An EvalItem for `perturbed` (a perturbation of `original`, in executable names) under `names`.

    `familiar` holds the unperturbed reference calls written in the namespace the model sees: under
    canonical names the familiar tool name goes through the same map as the interface, so it lands on
    whatever tool now carries that name (the costlier equivalent, after a cost perturbation).
    """
    if names == "original":
        return EvalItem(original.id, original.partition, names, perturbation, group, order, perturbed,
                        perturbed, None, tuple(original.reference))
    if names != "canonical":
        raise ValueError(f"names must be one of {NAMES}, got {names!r}")
    shown, nmap = canonicalize(perturbed)
    familiar = tuple(nmap.rename(c) for c in original.reference)
    return EvalItem(original.id, original.partition, names, perturbation, group, order, shown, perturbed,
                    nmap, familiar)


def make_shown_item(original: Example, shown: Example, *, names: str, perturbation: str, group: str,
                    order: str = "original", familiar: tuple = ()) -> EvalItem:
    """An item scored in the names the model sees (RoTBench's canonical construction)."""
    return EvalItem(original.id, original.partition, names, perturbation, group, order, shown, shown, None,
                    tuple(familiar))
