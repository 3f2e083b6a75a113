"""A trajectory under other action names: canonical ids, synonyms, swaps (the rescoring term's fresh names
are `cipr.method.relabel`'s, on the rendered trajectory).

Every renaming goes through `cipr.tools.canonical.apply_name_map`, so calls, the interface and free text
(messages and descriptions) change together. Free text is rewritten with `rewrite` (default "all":
every whole-word occurrence), because trajectory text names its actions in plain words
(AgentInstruct's instruction says "search[keywords]"); with "identifiers" the plain-word name
`search` would survive in the student's text and leak the original name.

Tool i keeps its position under every renaming, so the equivalence class of an action is its tool's
position (`classes = range(n)` on every side), whatever name it carries: under swapped names the
search action is the one named `click`, and choosing it is agreement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from cipr.tools.canonical import NameMap, RewriteText, apply_name_map, canonicalize
from cipr.tools.interface import Example, Interface

Naming = Literal["original", "canonical", "synonyms", "swapped"]

SYNONYMS: dict[str, str] = {"search": "find", "click": "press"}
SWAPPED: dict[str, str] = {"search": "click", "click": "search"}


def rename_example(example: Example, mapping: Mapping[str, str],
                   rewrite: RewriteText = "all") -> tuple[Example, NameMap]:
    """`example` with tool `old` renamed `mapping[old]` everywhere (argument names and unmapped tools
    kept); ValueError when new names collide."""
    new = [mapping.get(t.name, t.name) for t in example.interface]
    if len(set(new)) != len(new):
        raise ValueError(f"renaming {dict(mapping)} gives duplicate tool names {new} in example {example.id}")
    tools = tuple(t.with_(name=n) for t, n in zip(example.interface, new, strict=True))
    nmap = NameMap(tuple((n, t.name) for n, t in zip(new, example.interface, strict=True)),
                   {n: {a: a for a in t.properties} for n, t in zip(new, example.interface, strict=True)})
    return apply_name_map(example, Interface(tools), nmap, rewrite), nmap


def named(example: Example, naming: Naming, *, rewrite: RewriteText = "all",
          renames: Mapping[str, Mapping[str, str]] | None = None) -> tuple[Example, NameMap]:
    """`example` (original names) under `naming`; `renames` overrides the synonym/swap tables by naming."""
    if naming == "original":
        return rename_example(example, {}, rewrite)
    if naming == "canonical":
        return canonicalize(example, rewrite)
    table = dict((renames or {}).get(naming) or (SYNONYMS if naming == "synonyms" else SWAPPED))
    missing = [t for t in example.interface.names if t not in table]
    if missing:
        raise ValueError(f"the {naming} renaming has no new name for {missing} (example {example.id}); give "
                         f"one in the renames table")
    return rename_example(example, table, rewrite)


def rename_pairs(nmap: NameMap, source: Interface) -> list[tuple[str, str]]:
    """(old, new) for every tool and argument name `nmap` changes (`source`: the old interface): the
    spans the token alignment treats as names."""
    pairs: list[tuple[str, str]] = []
    for (new, old), tool in zip(nmap.tools, source, strict=True):
        if new != old:
            pairs.append((old, new))
        for new_arg, old_arg in nmap.arguments.get(new, {}).items():
            if new_arg != old_arg and old_arg in tool.properties:
                pairs.append((old_arg, new_arg))
    return sorted(set(pairs))
