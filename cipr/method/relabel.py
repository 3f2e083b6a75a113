"""Relabeling for the rescoring consistency KL: (x, y) -> (x̃, ỹ) with fresh neutral tool names.

Every declared tool gets a new neutral name, substituted (simultaneously, as whole identifiers) in
the prompt text and throughout the response, so the response's reasoning stays valid and each
decision of ỹ sits at the same place in the order of decisions as in y (character offsets may
shift when the new names are longer or shorter). The decisions of ỹ are recomputed with the call
format and checked to correspond one-to-one to those of y; a mismatch raises.

Choices:
- Schemes: "function" (shuffled `function_XX` numbers drawn from 1..pool, so canonical-looking ids
  land on other tools: the model cannot tie an id to a position), "tool" (`tool_XX`, a different
  prefix), "random" (`fn_` + 6 random letters and digits). Seeded; every tool's new name differs
  from its old one, and no new name occurs in the texts except as a renamed tool.
- Only tool names are rewritten; argument ids stay (the consistency KL concerns actions only).
  Replacement is whole-word on every occurrence (`cipr.tools.canonical.rewrite_text` mode "all"), so a
  plain-word name such as WebShop's `search` is renamed in the prompt's prose as well.
- Tools keep their order, and class i is the i-th tool on both sides (`classes`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cipr.formats.base import CallFormat, Decision
from cipr.perturb.config import RelabelConfig
from cipr.perturb.renaming import fresh_names as _fresh_names
from cipr.tools.canonical import rewrite_text


@dataclass(frozen=True)
class Relabeled:
    """The relabeled pair and its correspondence.

    `tools` are the new names in the original declaration order, `mapping` old -> new name,
    `classes[i] = i` the equivalence class of the i-th tool on both sides, `decisions` those of the
    original response and `relabeled_decisions` the corresponding ones of the relabeled response.
    """

    prompt: str
    response: str
    tools: tuple[str, ...]
    mapping: Mapping[str, str]
    classes: tuple[int, ...]
    decisions: tuple[Decision, ...]
    relabeled_decisions: tuple[Decision, ...]


def _words(texts: Sequence[str]) -> set[str]:
    return {w for t in texts for w in re.findall(r"\w+", t)}


def fresh_names(tools: Sequence[str], config: RelabelConfig, rng: random.Random,
                avoid: set[str]) -> list[str]:
    """One new name per tool under `config.scheme` (`cipr.perturb.renaming.fresh_names`)."""
    return _fresh_names(tools, config.scheme, rng, avoid, width=config.width, pool=config.pool)


def relabel(prompt: str, response: str, tools: Sequence[str], fmt: CallFormat,
            config: RelabelConfig | None = None, *, seed: int | None = None) -> Relabeled:
    """(x̃, ỹ) from (x, y): fresh neutral names for `tools` throughout both texts, decisions checked. `seed`
    overrides `config.seed` (e.g. per example). ValueError when the tools repeat a name or the relabeled
    decisions do not correspond one-to-one to the original's."""
    config = config or RelabelConfig()
    if len(set(tools)) != len(tools):
        raise ValueError(f"tool names repeat "
                         f"({', '.join(sorted(t for t in set(tools) if list(tools).count(t) > 1))}): "
                         f"relabeling needs one name per tool")
    rng = random.Random((config.seed or 0) if seed is None else seed)
    avoid = _words([prompt, response]) - set(tools)
    names = fresh_names(tools, config, rng, avoid)
    mapping = dict(zip(tools, names, strict=True))
    new_prompt = rewrite_text(prompt, mapping, "all")
    new_response = rewrite_text(response, mapping, "all")
    old, new = fmt.decisions(response), fmt.decisions(new_response)
    if len(old) != len(new):
        raise ValueError(f"relabeling changed the decisions: {len(old)} in the response, {len(new)} after")
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        expected = mapping.get(a.taken, a.taken) if a.taken is not None else None
        if (a.opener, a.name_suffix, expected) != (b.opener, b.name_suffix, b.taken):
            raise ValueError(f"decision {i} does not correspond after relabeling: {a} vs {b}")
    return Relabeled(prompt=new_prompt, response=new_response, tools=tuple(names), mapping=mapping,
                     classes=tuple(range(len(tools))), decisions=tuple(old), relabeled_decisions=tuple(new))
