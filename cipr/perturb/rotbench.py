"""RoTBench levels under canonical names (paper Appendix F): canonicalize the clean record, then corrupt.

Canonicalizing a shipped noisy file would give a corrupted name the canonical id of its clean version and undo
the corruption. Instead, each item of a level file takes the clean record of the same query, canonical ids by
position (`function_01`, `arg_01`, ...), and the corruption the shipped file applied to the original names
re-applied to those ids, derived position by position (RoTBench's levels keep each tool, description and
parameter schema at its position and corrupt only names):

- tool names: unchanged; a *permutation* of the clean names (heavy, union) -> the same permutation of the ids;
  a *reversed* name (medium) -> the reversed id; an *edited* name (slight; at the union level told apart from
  a random string by `classify`) -> as many random single-character edits per character (Levenshtein distance
  / length, at least one) applied to the id, seeded by (seed, item, position); a *random string* (medium) ->
  the same random string.
- parameter names, per tool: the same four cases against the clean parameter names, plus heavy's *added*
  mandatory parameter with a random name (added with its schema and required flag).
- gold answers, earlier-turn calls, tool-message names and `meta["finish_tool"]`/`["ask_tool"]` are rewritten
  position by position to the new names, so the gold values stay where they are; user turns stay as shipped.
- tool names that descriptions mention ("the value returned in get_sites") become the clean tool's canonical
  id, as canonicalizing the clean record writes them (the shipped levels corrupt only the names themselves).

Re-applying a level to the clean record itself gives plain canonicalization; no level introduces a duplicated
id. A shipped record that does not line up with its clean record (tool count or descriptions differ) raises
DataError naming the item.
"""

from __future__ import annotations

import difflib
import random
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError
from cipr.perturb.correspondence import Correspondence
from cipr.perturb.draft import rename_schema_args
from cipr.tools.canonical import canonical_arg_id, canonical_tool_id, rewrite_tool_text
from cipr.tools.interface import Call, Example, Interface, Message, Tool

EDIT_SIMILARITY = 0.5


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


# The single-name corruptions each level's definition allows (Ye et al., 2024): slight edits
# characters, medium reverses names or draws random strings; union draws from the other levels.
LEVEL_KINDS = {"slight": ("edited",), "medium": ("reversed", "random"),
               "heavy": ("reversed", "random", "edited"), "union": ("reversed", "random", "edited")}


def classify(clean: str, shipped: str, level: str = "union") -> str:
    """How a single name was corrupted: same, reversed, edited or random.

    Reversal is exact; an edit and a random string are told apart by similarity (ratio >=
    EDIT_SIMILARITY), unless the level allows only one of the two (slight: edited; medium: random),
    since a short name and its edit can look unrelated and a random string can look like an edit."""
    if shipped == clean:
        return "same"
    if shipped == clean[::-1]:
        return "reversed"
    allowed = LEVEL_KINDS.get(level, LEVEL_KINDS["union"])
    if "edited" not in allowed:
        return "random"
    if "random" not in allowed:
        return "edited"
    ratio = difflib.SequenceMatcher(None, clean, shipped, autojunk=False).ratio()
    return "edited" if ratio >= EDIT_SIMILARITY else "random"


def _is_permutation(clean: Sequence[str], shipped: Sequence[str]) -> bool:
    return list(clean) != list(shipped) and sorted(clean) == sorted(shipped)


def _permutation(clean: Sequence[str], shipped: Sequence[str]) -> list[int]:
    """pi with shipped[k] == clean[pi[k]]: a name left in place keeps its position; a duplicated name
    that moved takes the first unused position of that name."""
    out: list[int | None] = [k if shipped[k] == clean[k] else None for k in range(len(shipped))]
    used = {k for k in out if k is not None}
    for k, name in enumerate(shipped):
        if out[k] is None:
            j = next(j for j, c in enumerate(clean) if c == name and j not in used)
            used.add(j)
            out[k] = j
    return [j for j in out if j is not None]


def edit_like(target: str, clean: str, shipped: str, rng: random.Random) -> str:
    """`target` with as many random character edits per character as turned `clean` into `shipped`."""
    rate = levenshtein(clean, shipped) / max(1, len(clean))
    k = max(1, round(rate * len(target)))
    out = target
    for _ in range(k):
        op = rng.choice(("insert", "omit", "substitute"))
        i = rng.randrange(len(out) + (op == "insert")) if out else 0
        ch = rng.choice(string.ascii_letters)
        if op == "insert" or not out:
            out = out[:i] + ch + out[i:]
        elif op == "omit" and len(out) > 1:
            out = out[:i] + out[i + 1:]
        else:
            out = out[:i] + ch + out[i + 1:]
    return out if out != target else target + rng.choice(string.ascii_letters)


def _corrupt_names(clean: Sequence[str], shipped: Sequence[str], ids: Sequence[str], rng: random.Random,
                   taken: set[str], level: str) -> tuple[list[str], list[str]]:
    """New names for `ids` following how `shipped` corrupts `clean`, and the kind per position."""
    if _is_permutation(clean, shipped):
        pi = _permutation(clean, shipped)
        return [ids[j] for j in pi], ["permuted" if pi[k] != k else "same" for k in range(len(pi))]
    out, kinds = [], []
    for c, s, cid in zip(clean, shipped, ids, strict=True):
        kind = classify(c, s, level)
        new = {"same": cid, "reversed": cid[::-1], "random": s}.get(kind) or edit_like(cid, c, s, rng)
        while new in taken and kind != "same":
            new = edit_like(new, c, s, rng)
        taken.add(new)
        out.append(new)
        kinds.append(kind)
    return out, kinds


def align_parameters(clean: Tool, shipped: Tool, *,
                     where: str = "") -> tuple[list[tuple[int, int]], list[str], list[str]]:
    """Which shipped parameter sits in which clean parameter's slot: (pairs of (clean index, shipped index),
    shipped names added, clean names dropped).

    Slots are positional when both have the same schemas in the same order (every level keeps schemas in
    place); otherwise each shipped parameter takes the first unused clean one with an equal schema: the
    shipped files sometimes lose a parameter whose corrupted name collides with another, and heavy adds one
    with a random name. A shipped parameter with no matching schema is an added one; at most one may be.
    """
    cvals, svals = list(clean.properties.values()), list(shipped.properties.values())
    cnames, snames = list(clean.properties), list(shipped.properties)
    if cvals == svals:
        return [(j, j) for j in range(len(cvals))], [], []
    if svals[:len(cvals)] == cvals and len(svals) == len(cvals) + 1:
        return [(j, j) for j in range(len(cvals))], [snames[-1]], []
    used: set[int] = set()
    pairs: list[tuple[int, int]] = []
    added: list[str] = []
    for k, sv in enumerate(svals):
        j = next((j for j, cv in enumerate(cvals) if j not in used and cv == sv), None)
        if j is None:
            added.append(snames[k])
        else:
            used.add(j)
            pairs.append((j, k))
    if len(added) > 1:
        raise DataError(f"parameters {added} match no clean parameter", item=where, field="parameters")
    return pairs, added, [cnames[j] for j in range(len(cnames)) if j not in used]


def reapply_level(clean: Example, shipped: Example, *, seed: int = 0) -> tuple[Example, Correspondence]:
    """The shipped level record's corruption re-applied to the canonical ids of its clean record.

    Returns the Example (shipped queries and gold values, new names) and the Correspondence from
    its tools to the clean record's original tools (position i is clean tool i)."""
    where = shipped.id
    ct, st = list(clean.interface), list(shipped.interface)
    if len(ct) != len(st) or any(a.description != b.description for a, b in zip(ct, st, strict=True)):
        raise DataError(f"does not line up with its clean record {clean.id} (tool count or descriptions "
                        f"differ)", item=where, field="interface")
    rng = random.Random(f"{seed}\x1f{shipped.id}\x1frotbench")
    n = len(ct)
    ids = [canonical_tool_id(i, n) for i in range(n)]
    level = str(shipped.meta.get("level", "union"))
    names, tool_kinds = _corrupt_names([t.name for t in ct], [t.name for t in st], ids, rng, set(), level)
    canonical_names: dict[str, str] = {}  # clean name -> canonical id, for the names descriptions mention
    for t, cid in zip(ct, ids, strict=True):
        canonical_names.setdefault(t.name, cid)
    tools: list[Tool] = []
    arg_maps: list[dict[str, str]] = []   # shipped arg -> new arg, per position
    corr_args: list[dict[str, str]] = []  # new arg -> clean arg, per position
    notes = [f"tool names: {sorted(set(tool_kinds) - {'same'}) or ['same']}"]
    for i, (c, s) in enumerate(zip(ct, st, strict=True)):
        cids = [canonical_arg_id(j, len(c.properties)) for j in range(len(c.properties))]
        pairs, added, dropped = align_parameters(c, s, where=f"{where} tool {i}")
        cp = [list(c.properties)[j] for j, _ in pairs]
        sp = [list(s.properties)[k] for _, k in pairs]
        new_args, kinds = _corrupt_names(cp, sp, [cids[j] for j, _ in pairs], rng, set(added), level)
        amap = dict(zip(sp, new_args, strict=True))
        amap.update({a: a for a in added})
        arg_maps.append(amap)
        corr_args.append({new: cp[k] for k, new in enumerate(new_args)})
        tools.append(rewrite_tool_text(Tool(names[i], s.description, rename_schema_args(s.parameters, amap)),
                                       canonical_names))
        changed = sorted(set(kinds) - {"same"})
        if added or dropped or changed:
            notes.append(f"tool {i} parameters: {changed}" + (" + added" if added else "")
                         + (f" - dropped {dropped}" if dropped else ""))
    first: dict[str, int] = {}
    for i, t in enumerate(st):
        first.setdefault(t.name, i)

    def call(cl: Call) -> Call:
        i = first.get(cl.name)
        if i is None:
            return cl
        return Call(names[i], {arg_maps[i].get(k, k): v for k, v in cl.arguments.items()})

    def msg(m: Message) -> Message:
        name = names[first[m.name]] if m.name is not None and m.name in first else m.name
        return Message(m.role, m.content, tuple(call(c) for c in m.calls), name)

    meta: dict[str, Any] = dict(shipped.meta)
    # RoTBench's scorer finds finish / ask_to_user by position: the last and second-to-last tools
    for key, pos in (("finish_tool", n - 1), ("ask_tool", n - 2)):
        if meta.get(key) is not None and 0 <= pos and st[pos].name == meta[key]:
            meta[key] = names[pos]
        elif meta.get(key) in first:
            meta[key] = names[first[meta[key]]]
    meta["perturbation"] = {"name": f"rotbench_{shipped.meta.get('level', 'level')}_canonical",
                            "names": "canonical", "clean_id": clean.id, "seed": seed, "notes": notes}
    example = shipped.with_(messages=tuple(msg(m) for m in shipped.messages),
                            interface=Interface(tuple(tools)),
                            reference=tuple(call(c) for c in shipped.reference),
                            alternatives=tuple(tuple(call(c) for c in alt) for alt in shipped.alternatives),
                            meta=meta)
    corr = Correspondence(names=tuple(names), sources=tuple((t.name,) for t in ct), twin_of=(None,) * n,
                          roles=("equivalent",) * n, arguments=tuple(corr_args),
                          source_names=tuple(t.name for t in ct),
                          perturbation=meta["perturbation"]["name"], notes=tuple(notes))
    return example, corr


def shipped_correspondence(clean: Example, shipped: Example) -> Correspondence:
    """The correspondence of a shipped level record to its clean record (position i is clean tool i)."""
    ct, st = list(clean.interface), list(shipped.interface)
    if len(ct) != len(st):
        raise DataError(f"does not line up with its clean record {clean.id}", item=shipped.id,
                        field="interface")
    args = []
    for c, s in zip(ct, st, strict=True):
        cp, sp = list(c.properties), list(s.properties)
        args.append(dict(zip(sp, cp, strict=False)))
    return Correspondence(names=tuple(t.name for t in st), sources=tuple((t.name,) for t in ct),
                          twin_of=(None,) * len(st), roles=("equivalent",) * len(st), arguments=tuple(args),
                          source_names=tuple(t.name for t in ct),
                          perturbation=f"rotbench_{shipped.meta.get('level', 'level')}")


def pair_with_clean(clean: Sequence[Example], shipped: Sequence[Example]) -> list[tuple[Example, Example]]:
    """(clean record, shipped record) for every shipped record: a level file repeats the clean file's
    items in order (twice for slight, medium and heavy); checked by the original query id."""
    if not clean or len(shipped) % len(clean):
        raise DataError(f"{len(shipped)} level records do not repeat {len(clean)} clean records")
    out = []
    for k, s in enumerate(shipped):
        c = clean[k % len(clean)]
        if _original_id(c) != _original_id(s):
            raise DataError(f"pairs with clean record {c.id}, whose query differs", item=s.id, field="id")
        out.append((c, s))
    return out


def _original_id(e: Example) -> Any:
    meta: Mapping[str, Any] = e.meta
    return meta.get("original_id", e.query)


def canonical_level(root: str | Path | None = None, split: str = "First_Turn", level: str = "heavy", *,
                    seed: int = 0) -> list[tuple[Example, Correspondence]]:
    """Every record of a RoTBench level with its corruption re-applied to canonical ids, in file order
    (so it pairs item by item with `load_rotbench(root, split, level)` under original names)."""
    from cipr.data.rotbench import load_rotbench

    clean = load_rotbench(root, split, "clean")
    shipped = load_rotbench(root, split, level)
    return [reapply_level(c, s, seed=seed) for c, s in pair_with_clean(clean, shipped)]
