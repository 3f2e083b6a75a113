"""Correspondence: which tool of a perturbed interface stands for which tool of the source interface.

Every perturbation returns one with the perturbed Example. For each written tool (position in the perturbed
interface):
- `sources`: the source tools it is equivalent to: `()` for an added tool (training twin, distractor,
  same-name duplicate, costlier/slower equivalent), one name for an ordinary equivalent, two only for a tool
  `drift_refactor` merged from two.
- `twin_of`: the source tool an added tool copies or imitates, else None; metadata for error taxonomies (an
  added tool is never an equivalent).
- `role`: how the tool came about (`equivalent`, `twin`, `costlier`, `duplicate`, `distractor`, `split`,
  `merged`).
- `arguments`: written argument name -> source argument name (equivalents only; added arguments, such as a
  merged tool's `operation`, are absent).

Source names are those of the interface the perturbation was applied to (original names for the held-out
perturbations; usually canonical ids for the training one).

The action reader indexes actions by equivalence: `action_key(name)` gives the source name for an equivalent
and a key of its own (`+<written name>`) for an added tool, so probability moved onto an added tool counts as
disagreement. `to_json()` is the CLI export form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cipr.tools.interface import Call

ADDED_PREFIX = "+"


@dataclass(frozen=True)
class Correspondence:
    """Per written tool (in interface order): its sources, twin, role and argument map."""

    names: tuple[str, ...]
    sources: tuple[tuple[str, ...], ...]
    twin_of: tuple[str | None, ...]
    roles: tuple[str, ...]
    arguments: tuple[Mapping[str, str], ...]
    source_names: tuple[str, ...] = ()
    perturbation: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        n = len(self.names)
        if not (len(self.sources) == len(self.twin_of) == len(self.roles) == len(self.arguments) == n):
            raise ValueError("Correspondence fields must all have one entry per written tool")

    def __len__(self) -> int:
        return len(self.names)

    def equivalent(self, i: int) -> str | None:
        """The source tool the i-th written tool is equivalent to (the first, for a merged tool)."""
        s = self.sources[i]
        return s[0] if s else None

    def is_added(self, i: int) -> bool:
        return not self.sources[i]

    def written_for(self, source: str) -> tuple[int, ...]:
        """Positions of the written tools equivalent to `source` (two after a split, else one or none)."""
        return tuple(i for i, s in enumerate(self.sources) if source in s)

    def action_key(self, written_name: str) -> str:
        """Equivalence key of a written name: its source name, or `+name` for an added tool. A call to a name
        declared twice (same-name duplicate) is the equivalent's action, since it is accepted when any
        declaration permits it."""
        added = None
        for i, n in enumerate(self.names):
            if n == written_name:
                if self.sources[i]:
                    return self.sources[i][0]
                added = ADDED_PREFIX + n
        if added is None:
            raise KeyError(f"{written_name!r} is not a written tool name")
        return added

    def is_bijection(self) -> bool:
        """True when every source tool has exactly one written equivalent and every written tool at
        most one source (added tools map to nothing). False after a split or merge. A source that
        declares a name twice (RoTBench's `drivers`) needs two written equivalents of that name."""
        if any(len(s) > 1 for s in self.sources):
            return False
        return Counter(s[0] for s in self.sources if s) == Counter(self.source_names)

    def translate_back(self, call: Call) -> Call:
        """A call under written names to the source interface (the equivalent's first source; arguments
        through the argument map). KeyError for a name with no equivalent (an added tool or unknown)."""
        for i, n in enumerate(self.names):
            if n == call.name and self.sources[i]:
                amap = self.arguments[i]
                return Call(self.sources[i][0], {amap.get(k, k): v for k, v in call.arguments.items()})
        raise KeyError(f"{call.name!r} has no equivalent in the source interface")

    def to_json(self) -> dict[str, Any]:
        """Export form: written tool name -> source tool name, a list for a merged tool, None if added; a name
        declared twice maps to its equivalent's source (`action_key`)."""
        out: dict[str, Any] = {}
        for n, s in zip(self.names, self.sources, strict=True):
            value: Any = None if not s else (s[0] if len(s) == 1 else list(s))
            if n not in out or out[n] is None:
                out[n] = value
        return out

    def to_records(self) -> list[dict[str, Any]]:
        """Full per-position form (keeps duplicated names apart)."""
        return [{"name": n, "sources": list(s), "twin_of": t, "role": r, "arguments": dict(a)}
                for n, s, t, r, a in zip(self.names, self.sources, self.twin_of, self.roles, self.arguments,
                                         strict=True)]

    def compose(self, back: Mapping[str, str], arg_back: Mapping[str, Mapping[str, str]]) -> Correspondence:
        """Re-express sources through a map of source names to earlier names (e.g. a canonicalization's
        `NameMap.backward` and `NameMap.arguments`), so `sources` name the earlier interface's tools."""
        sources = tuple(tuple(back.get(s, s) for s in ss) for ss in self.sources)
        twin = tuple(back.get(t, t) if t is not None else None for t in self.twin_of)
        args = []
        for ss, amap in zip(self.sources, self.arguments, strict=True):
            inner = arg_back.get(ss[0], {}) if ss else {}
            args.append({w: inner.get(a, a) for w, a in amap.items()})
        return Correspondence(self.names, sources, twin, self.roles, tuple(args),
                              tuple(back.get(s, s) for s in self.source_names), self.perturbation, self.notes)
