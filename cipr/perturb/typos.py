"""Held-out perturbation: typos in the query (paper Table 5, "typos"; RobustBench-TC realistic typos).

Keyboard noise on the last user message: a fraction `rate` of the eligible words (Latin letters, accented ones
included, at least `min_word_length`, standing alone: not part of an identifier, path, e-mail or number) get
one typo each (adjacent swap, dropped, doubled or neighbouring-key letter), at least `min_typos`. A word's
first letter is kept, as in most human typos. Scripts without Latin words get none.

Choice the paper leaves open: words of any reference argument value (accepted values, nested ones included)
are protected, so the query still states every value the reference needs; a typo in "San Francisco" would turn
a robustness test into an impossible item. An item with no eligible word is left unchanged and says so in
`meta["perturbation"]["notes"]`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cipr.perturb.draft import Draft
from cipr.perturb.naming import typo

_LETTERS = "A-Za-z\u00c0-\u024f\u1e00-\u1eff"  # Latin, Latin-1 and Latin Extended letters
_WORD = re.compile(rf"(?<![\w.\-/@'])[{_LETTERS}]+(?![\w\-/@]|'\w|\.\w)")
_VALUE_WORD = re.compile(rf"[{_LETTERS}]+")


@dataclass(frozen=True)
class TypoConfig:
    """How much noise: the fraction of eligible words hit, a floor, and the shortest eligible word."""

    rate: float = 0.15
    min_typos: int = 1
    min_word_length: int = 4

    def __post_init__(self) -> None:
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {self.rate}")


def _value_words(values: Iterable[Any], out: set[str]) -> None:
    for v in values:
        if isinstance(v, str):
            out.update(w.lower() for w in _VALUE_WORD.findall(v))
        elif isinstance(v, dict):
            _value_words(v.keys(), out)
            _value_words(v.values(), out)
        elif isinstance(v, (list, tuple)):
            _value_words(v, out)


def protected_words(draft: Draft) -> set[str]:
    """Lower-case words the typos must not touch: the words of every reference value."""
    out: set[str] = set()
    for c in draft.all_calls():
        _value_words(c.arguments.values(), out)
        if c.accepted:
            _value_words(c.accepted.values(), out)
    return out


def add_typos(text: str, rng: random.Random, protected: set[str], config: TypoConfig = TypoConfig()
              ) -> tuple[str, int]:
    """`text` with typos in a fraction of its eligible words, and how many words were changed."""
    spans = [m.span() for m in _WORD.finditer(text)
             if len(m.group()) >= config.min_word_length and m.group().lower() not in protected]
    if not spans:
        return text, 0
    k = min(len(spans), max(config.min_typos, round(config.rate * len(spans))))
    chosen = sorted(rng.sample(range(len(spans)), k))
    pieces: list[str] = []
    last = 0
    for idx in chosen:
        a, b = spans[idx]
        pieces.append(text[last:a])
        pieces.append(typo(text[a:b], rng))
        last = b
    pieces.append(text[last:])
    return "".join(pieces), k


def apply_typos(draft: Draft, rng: random.Random, config: TypoConfig = TypoConfig()) -> None:
    """Put typos into the draft's query (the last user message)."""
    text, k = add_typos(draft.query, rng, protected_words(draft), config)
    if k == 0:
        draft.notes.append("no eligible word in the query: unchanged")
        return
    draft.set_query(text)
    draft.notes.append(f"{k} typo(s) in the query")
