"""Choosing from the built-in pool of unrelated tools.

Distractors ("an unrelated tool renamed to resemble a called tool"), corrupted duplicates and the
merge fallback of the multi-tool refactor draw from the unrelated tools; schema twins draw the
argument that replaces a needed one from the unrelated arguments (both in `cipr.perturb.vocabulary`).
A fixed, hand-written pool keeps every perturbation a pure function of (item, seed);
`pick_unrelated` chooses the pool tool whose words overlap least with the tool it must not resemble
in meaning.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from functools import lru_cache

from cipr.perturb.vocabulary import vocabulary
from cipr.tools.interface import Tool

_STOP = frozenset("a an the of to for and or in on by with from is are be this that it its as at into "
                  "given specified based using provided returns return get set".split())


def content_words(text: str) -> set[str]:
    """Lower-case content words of a text or identifier (identifiers are split into their words)."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return {w for w in re.findall(r"[a-z]{3,}", spaced.lower()) if w not in _STOP}


def pick_unrelated(reference: Tool, rng: random.Random, *, avoid_names: Collection[str] = (),
                   exclude: Collection[str] = ()) -> Tool:
    """A pool tool unrelated to `reference`: among those sharing no content word with its name and
    description (else the least overlapping), one chosen at random; pool names in `avoid_names`
    (already declared) and `exclude` (already used) are skipped."""
    ref = content_words(reference.name) | content_words(reference.description)
    pool = vocabulary().unrelated_tools
    cands = [k for k, t in enumerate(pool) if t.name not in avoid_names and t.name not in exclude]
    if not cands:
        cands = list(range(len(pool)))
    pool_words = _pool_words()
    scored = [(len(ref & pool_words[k]), k) for k in cands]
    best = min(s for s, _ in scored)
    return pool[rng.choice([k for s, k in scored if s == best])]


@lru_cache(maxsize=1)
def _pool_words() -> tuple[set[str], ...]:
    return tuple(content_words(t.name) | content_words(t.description) for t in vocabulary().unrelated_tools)
