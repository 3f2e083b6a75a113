"""Held-out perturbations of the interface as the model sees it (after the adapter), besides renaming.

Under canonical names the adapter renames every tool to `function_NN` by position, so a perturbation applied
before it can vanish (a look-alike of an original name becomes one more `function_NN`). These types are
applied after canonicalization, to the names and text the model reads, and never in training:

- `lookalike_shown`: per called tool, an unrelated tool (`pool.pick_unrelated`) named like the called tool's
  shown name (`naming.resembling_name`: `function_02` -> `functon_02`, ...), at a random position; an added
  tool, so mass on it is disagreement.
- `paraphrase`: every tool description reworded (`paraphrase`), names, schemas and query unchanged.
- `reorder`: the tools in a new order (no tool keeps its position; one tool is refused), names and text
  unchanged. Unlike the training perturbation's reordering, the names stay with their tools, so only positions
  move.

The Correspondence maps each tool to the original tool it stands for, as for every other type.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable

from cipr.perturb.correspondence import Correspondence
from cipr.perturb.draft import Draft, Entry, rng_for
from cipr.perturb.naming import resembling_name
from cipr.perturb.pool import pick_unrelated
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Example, Tool

SYNONYMS: dict[str, tuple[str, ...]] = {
    "get": ("retrieve", "fetch", "obtain"), "retrieve": ("get", "fetch"), "fetch": ("get", "retrieve"),
    "find": ("look up", "search for", "locate"), "search": ("look up", "query"),
    "list": ("enumerate", "show"),
    "create": ("make", "add", "set up"), "send": ("deliver", "dispatch"), "convert": ("translate", "change"),
    "calculate": ("compute", "work out"), "compute": ("calculate", "work out"), "book": ("reserve",),
    "delete": ("remove", "erase"), "update": ("modify", "change"), "check": ("verify", "inspect"),
    "current": ("present", "latest"), "number": ("count", "amount"), "city": ("town",),
    "information": ("details", "info"), "details": ("information", "particulars"), "given": ("specified",),
    "returns": ("gives back", "yields"), "daily": ("per-day",), "next": ("coming", "upcoming"),
    "optional": ("not required",), "specific": ("particular",), "user": ("person",), "new": ("fresh",),
    "recent": ("latest",), "show": ("display",), "play": ("start",), "set": ("configure",),
}
OPENINGS = ("{}", "This tool will {}", "Use this to {}", "Tool that can {}")


def _match_case(word: str, like: str) -> str:
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def paraphrase(text: str, rng: random.Random) -> str:
    """`text` reworded: each word with an entry in `SYNONYMS` replaced by one of its synonyms, and one of
    `OPENINGS` put before it (its first letter lowered after an opening)."""
    def swap(m: re.Match[str]) -> str:
        word = m.group(0)
        options = SYNONYMS.get(word.lower())
        return _match_case(rng.choice(options), word) if options else word

    out = re.sub(r"[A-Za-z]+", swap, text)
    opening = rng.choice(OPENINGS)
    if opening != "{}" and out:
        out = opening.format(out[:1].lower() + out[1:])
    return out


def _lookalikes(draft: Draft, rng: random.Random) -> None:
    used: set[str] = set()
    for called in [draft.entries[i].tool for i in draft.called()]:
        base = pick_unrelated(called, rng, avoid_names=draft.names(), exclude=used)
        used.add(base.name)
        name = resembling_name(called.name, rng, draft.names())
        draft.insert(rng.randrange(len(draft.entries) + 1),
                     Entry(Tool(name, base.description, base.parameters), (), called.name, "distractor", {}))
        draft.notes.append(f"look-alike {name} ({base.name}) of {called.name}")


def _paraphrased(draft: Draft, rng: random.Random) -> None:
    for e in draft.entries:
        e.tool = e.tool.with_(description=paraphrase(e.tool.description, rng))


def _reordered(draft: Draft, rng: random.Random) -> None:
    n = len(draft.entries)
    if n < 2:
        raise ValueError("one tool: nothing to reorder")
    order = list(range(n))
    while any(k == old for k, old in enumerate(order)):
        rng.shuffle(order)
    draft.reorder(order)


BUILDERS: dict[str, Callable[[Draft, random.Random], None]] = {
    "lookalike_shown": _lookalikes, "paraphrase": _paraphrased, "reorder": _reordered}


def after_adapter(example: Example, *, seed: int, names: str, perturbation: str,
                  build: Callable[[Draft, random.Random], None]) -> tuple[Example, Correspondence]:
    """`build` applied to `example` as the model sees it under `names` (canonicalized first for `canonical`,
    bypassing the adapter), with a Correspondence to the original tools."""
    if names not in ("original", "canonical"):
        raise ValueError(f"names must be 'original' or 'canonical', got {names!r}")
    base, nmap = canonicalize(example) if names == "canonical" else (example, None)
    draft = Draft(base)
    build(draft, rng_for(seed, example.id, perturbation))
    out, corr = draft.finish(names="original", perturbation=perturbation, meta={"seed": seed, "names": names})
    if nmap is None:
        return out, corr
    back = nmap.backward
    arguments = tuple({w: nmap.arguments.get(src[0], {}).get(a, a) for w, a in corr.arguments[i].items()}
                      if src else {} for i, src in enumerate(corr.sources))
    return out, dataclasses.replace(corr, sources=tuple(tuple(back[s] for s in src) for src in corr.sources),
                                    twin_of=tuple(back.get(t, t) if t else None for t in corr.twin_of),
                                    arguments=arguments, source_names=example.interface.names)
