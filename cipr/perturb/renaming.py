"""Renaming types: every tool gets a fresh name and nothing else changes.

- `relabel_function`: fresh `function_XX` ids (shuffled numbers from 1..99), the relabeling of CIPR's
  rescoring term (`cipr.method.relabel`), so under canonical names it is the held-in copy that term
  compares the canonical interface with (group `in_distribution`).
- `relabel_random`: names of `fn_` and six random letters and digits, a shape no training interface
  has (group `renaming`, held out).

Unlike the other held-out types these apply to the interface as the model sees it: under canonical names the
example is canonicalized first and the fresh names replace the canonical ids, bypassing the adapter (which
would map any renaming back to the same ids, making the type a no-op). Tool names are replaced as whole
identifiers in the messages and in the tools' and arguments' descriptions too; argument names, the rest of the
text and the tool order stay. The Correspondence maps each new name to the original tool it renames, and its
arguments to the original argument names, as every other type's does (under canonical names through the
canonicalization's map: canonical tool i is original tool i).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from typing import Literal

from cipr.perturb.correspondence import Correspondence
from cipr.perturb.draft import Draft
from cipr.perturb.shown import after_adapter
from cipr.tools.interface import Example

Scheme = Literal["function", "tool", "random"]


def fresh_names(tools: Sequence[str], scheme: Scheme, rng: random.Random, avoid: set[str], *, width: int = 2,
                pool: int = 99) -> list[str]:
    """One new name per tool: distinct, never the tool's own name, none in `avoid`.

    Schemes: `function` / `tool` (`function_XX` / `tool_XX`, XX drawn without replacement from
    1..`pool` and written with `width` digits), `random` (`fn_` + 6 random lowercase letters and digits).
    """
    n = len(tools)
    for _ in range(100):
        if scheme in ("function", "tool"):
            prefix = "function_" if scheme == "function" else "tool_"
            numbers = [k for k in range(1, pool + 1) if f"{prefix}{k:0{width}d}" not in avoid]
            if len(numbers) < n:
                raise ValueError(f"the {scheme!r} scheme has {len(numbers)} free names for {n} tools: raise "
                                 f"the pool (now {pool})")
            names = [f"{prefix}{k:0{width}d}" for k in rng.sample(numbers, n)]
        elif scheme == "random":
            alphabet = string.ascii_lowercase + string.digits
            names = ["fn_" + "".join(rng.choice(alphabet) for _ in range(6)) for _ in range(n)]
            if len(set(names)) < n or set(names) & avoid:
                continue
        else:
            raise ValueError(f"unknown relabeling scheme {scheme!r} (function, tool, random)")
        if all(new != old for new, old in zip(names, tools, strict=True)):
            return names
    raise ValueError(f"could not draw {n} fresh names under scheme {scheme!r} that differ from the old ones")


def _words(example: Example) -> set[str]:
    texts = [m.content for m in example.messages] + [t.description for t in example.interface]
    return {w for t in texts for w in re.findall(r"\w+", t)}


def rename_all(example: Example, *, seed: int, names: str, scheme: Scheme, perturbation: str
               ) -> tuple[Example, Correspondence]:
    """`example` under `names` (canonicalized first for `canonical`), every tool renamed under `scheme`."""
    def build(draft: Draft, rng: random.Random) -> None:
        old = [e.tool.name for e in draft.entries]
        if len(set(old)) != len(old):
            raise ValueError("tool names repeat: renaming needs one name per tool")
        new = fresh_names(old, scheme, rng, _words(draft.example) - set(old))
        for entry, name in zip(draft.entries, new, strict=True):
            entry.tool = entry.tool.with_(name=name)
        draft.rename_in_text(dict(zip(old, new, strict=True)))

    return after_adapter(example, seed=seed, names=names, perturbation=perturbation, build=build)
