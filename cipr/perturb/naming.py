"""Identifier helpers shared by the perturbations: splitting names into words, character typos,
abbreviations, look-alike names, drifted argument names (their word lists: `cipr.perturb.vocabulary`).

Every function that invents a name takes the set of names already taken and never returns one of
them, so a perturbation cannot create an accidental duplicate.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Collection

from cipr.perturb.vocabulary import vocabulary

_TOKEN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+|[^A-Za-z\d]+")


def words(name: str) -> list[str]:
    """The tokens of an identifier, separators included: `getWeather_v2` -> [get, Weather, _, v, 2]."""
    return _TOKEN.findall(name)


def is_word(token: str) -> bool:
    return token[:1].isalpha()


def abbreviate_word(word: str) -> str:
    """A common abbreviation, else the first letter plus the next consonants, at most four letters."""
    lower = word.lower()
    abbreviations = vocabulary().abbreviations
    if lower in abbreviations:
        short = abbreviations[lower]
    elif len(word) <= 4:
        return word
    else:
        short = lower[0] + "".join(ch for ch in lower[1:] if ch not in "aeiou")
        short = short[:4] if len(short) >= 2 else lower[:4]
    return short.capitalize() if word[:1].isupper() else short


def abbreviate(name: str, taken: Collection[str] = ()) -> str:
    """An abbreviated tool name (`calculate_triangle_area` -> `calc_trng_area`), distinct from `name`
    and from `taken`. Names made only of short words fall back to vowel dropping, then a suffix."""
    toks = words(name)
    out = "".join(abbreviate_word(t) if is_word(t) else t for t in toks)
    if out == name or out in taken:
        out = "".join(t[0] + re.sub(r"[aeiouAEIOU]", "", t[1:]) if is_word(t) and len(t) > 2 else t
                      for t in toks)
    return unique(out, name, taken)


def unique(candidate: str, original: str, taken: Collection[str]) -> str:
    """`candidate`, or candidate + _2, _3, ... until it differs from `original` and `taken`."""
    out, k = candidate, 2
    while out == original or out in taken:
        out = f"{candidate}_{k}"
        k += 1
    return out


def typo(word: str, rng: random.Random, *, keep_first: bool = True) -> str:
    """One character-level typo: swap two adjacent letters, drop, double, or hit a neighbouring key.
    The result always differs from `word` (words of one letter get a doubled letter)."""
    start = 1 if keep_first and len(word) > 2 else 0
    neighbours = vocabulary().keyboard_neighbours
    for _ in range(8):
        op = rng.choice(("swap", "drop", "double", "neighbour"))
        i = rng.randrange(start, len(word))
        if op == "swap" and i + 1 < len(word):
            out = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        elif op == "drop" and len(word) > 3:
            out = word[:i] + word[i + 1:]
        elif op == "double":
            out = word[:i] + word[i] + word[i:]
        elif op == "neighbour" and word[i].lower() in neighbours:
            ch = rng.choice(neighbours[word[i].lower()])
            out = word[:i] + (ch.upper() if word[i].isupper() else ch) + word[i + 1:]
        else:
            continue
        if out != word:
            return out
    return word + word[-1]


def resembling_name(name: str, rng: random.Random, taken: Collection[str]) -> str:
    """A name that resembles `name` (a look-alike a careless reader confuses with it): a character typo
    in one word, two words swapped, a word pluralized or abbreviated, or a short suffix."""
    toks = words(name)
    word_pos = [i for i, t in enumerate(toks) if is_word(t)]

    def typo_one() -> str:
        i = rng.choice(word_pos)
        return "".join(typo(t, rng) if k == i else t for k, t in enumerate(toks))

    def swap_words() -> str:
        i, j = sorted(rng.sample(word_pos, 2))
        t = list(toks)
        wi, wj = t[i], t[j]
        t[i] = wj.capitalize() if wi[:1].isupper() else wj.lower()
        t[j] = wi.capitalize() if wj[:1].isupper() else wi.lower()
        return "".join(t)

    def plural() -> str:
        i = word_pos[-1]
        t = list(toks)
        t[i] = t[i][:-1] if t[i].endswith("s") and len(t[i]) > 3 else t[i] + "s"
        return "".join(t)

    def abbrev() -> str:
        i = max(word_pos, key=lambda k: len(toks[k]))
        return "".join(abbreviate_word(t) if k == i else t for k, t in enumerate(toks))

    def suffix() -> str:
        sep = "_" if "_" in name or not any(ch.isupper() for ch in name[1:]) else ""
        s = rng.choice(("v2", "tool", "api", "helper", "util", "service"))
        return name + sep + (s.capitalize() if not sep else s)

    ops: list[Callable[[], str]] = [typo_one, plural, abbrev, suffix] if word_pos else [suffix]
    if len(word_pos) >= 2:
        ops.append(swap_words)
    rng.shuffle(ops)
    for op in ops:
        out = op()
        if out != name and out not in taken:
            return out
    return unique(name + "_v2", name, taken)


def camel_to_snake(name: str) -> str:
    return "_".join(t.lower() for t in words(name) if is_word(t) or t.isdigit())


def snake_to_camel(name: str) -> str:
    parts = [t for t in words(name) if is_word(t) or t.isdigit()]
    return parts[0].lower() + "".join(p.capitalize() for p in parts[1:]) if parts else name


def drifted_name(name: str, rng: random.Random, taken: Collection[str]) -> str:
    """A plausible older or newer name for an argument: a synonym, the other case convention
    (snake_case <-> camelCase), or an added or dropped qualifier (`_name`, `_id`, `_value`)."""
    candidates: list[str] = []
    lower = name.lower()
    synonyms = vocabulary().argument_synonyms
    if lower in synonyms:
        candidates.append(synonyms[lower])
    if "_" in name:
        candidates.append(snake_to_camel(name))
    elif any(ch.isupper() for ch in name[1:]):
        candidates.append(camel_to_snake(name))
    toks = [t for t in words(name) if is_word(t)]
    if len(toks) >= 2:
        candidates.append("_".join(t.lower() for t in toks[1:]) if rng.random() < 0.5
                          else "_".join(t.lower() for t in toks[:-1]))
    for q in ("name", "id", "value", "str"):
        if not lower.endswith(q):
            candidates.append(f"{name}_{q}" if "_" in name or name.islower() else name + q.capitalize())
            break
    candidates.append(f"{name}_input" if "_" in name or name.islower() else name + "Input")
    rng.shuffle(candidates)
    candidates.sort(key=lambda c: 0 if c.lower() != lower else 1)
    for c in candidates:
        if c and c != name and c not in taken:
            return c
    return unique(name + "_v1", name, taken)


def slug(value: object, max_len: int = 24) -> str:
    """A lower-case identifier fragment for a value (`"Light Blue"` -> `light_blue`)."""
    s = re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_")
    return (s[:max_len].rstrip("_") or "value")
