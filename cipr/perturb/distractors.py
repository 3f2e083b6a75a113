"""Held-out perturbations that add tools next to each called tool (paper Table 5, "typos & distractors").

- `similar_name`: per called tool, an unrelated tool (`pool.pick_unrelated`) renamed to resemble it
  (`naming.resembling_name`), keeping its own description and parameters.
- `same_name_description`: per called tool, a second declaration with the *same name* and parameters whose
  description is that of an unrelated pool tool, so the duplicate claims to do something else.
- `same_name_parameters`: a same-name declaration with the same description and corrupted parameters
  (`corrupt_parameters`): every argument renamed by a typo and retyped (string <-> integer, others to string;
  enums, items and nested properties dropped), required flags kept, `additionalProperties: false`, so no
  correct call validates. A tool without arguments gets one required unrelated argument.

Added tools go to a random position (seeded), so neither the first nor the last slot identifies the correct
tool. References are unchanged; with canonical names they keep pointing at the declaration they were built
for. The BFCL scorer accepts a call if any declaration of the name permits it, so under original names the
correct call stays correct.
"""

from __future__ import annotations

import random
from typing import Any

from cipr.perturb.draft import Draft, Entry
from cipr.perturb.naming import resembling_name, typo, unique
from cipr.perturb.pool import pick_unrelated
from cipr.perturb.vocabulary import vocabulary
from cipr.tools.interface import Tool

_TYPE_SWAP = {"string": "integer", "integer": "string", "number": "string", "boolean": "string",
              "array": "string", "object": "string", None: "integer"}
_DROP_WHEN_RETYPED = ("enum", "items", "properties", "additionalProperties", "default", "x-bfcl-type",
                      "required", "format", "minimum", "maximum")


def _called_tools(draft: Draft) -> list[Entry]:
    return [draft.entries[i] for i in draft.called()]


def _insert_random(draft: Draft, entry: Entry, rng: random.Random) -> None:
    draft.insert(rng.randrange(len(draft.entries) + 1), entry)


def add_similar_name_distractors(draft: Draft, rng: random.Random) -> None:
    """One look-alike unrelated tool per called tool."""
    used: set[str] = set()
    for e in _called_tools(draft):
        taken = draft.names()
        base = pick_unrelated(e.tool, rng, avoid_names=taken, exclude=used)
        used.add(base.name)
        name = resembling_name(e.tool.name, rng, taken)
        _insert_random(draft, Entry(Tool(name, base.description, base.parameters), (), e.tool.name,
                                    "distractor", {}), rng)
        draft.notes.append(f"distractor {name} ({base.name}) resembles {e.tool.name}")


def corrupt_parameters(tool: Tool, rng: random.Random) -> Tool:
    """`tool`'s parameters renamed by typos and retyped, so that no correct call validates."""
    props = tool.properties
    if not props:
        name, schema = rng.choice(vocabulary().unrelated_arguments)
        return Tool(tool.name, tool.description, {"type": "object", "properties": {name: dict(schema)},
                                                  "required": [name], "additionalProperties": False})
    taken = set(props)
    new_props: dict[str, Any] = {}
    amap: dict[str, str] = {}
    for k, v in props.items():
        nk = unique(typo(k, rng), k, taken | set(new_props))
        amap[k] = nk
        schema = {key: val for key, val in dict(v).items() if key not in _DROP_WHEN_RETYPED}
        old_type = v.get("type") if isinstance(v.get("type"), str) else None
        schema["type"] = _TYPE_SWAP.get(old_type, "integer")
        new_props[nk] = schema
    params = {key: val for key, val in tool.parameters.items() if key not in ("properties", "required")}
    params["properties"] = new_props
    params["required"] = [amap[r] for r in tool.required if r in amap]
    params["additionalProperties"] = False
    return Tool(tool.name, tool.description, params)


def add_same_name_duplicates(draft: Draft, rng: random.Random, corrupt: str) -> None:
    """A same-name declaration per called tool, its `corrupt` part ("description" or "parameters") broken."""
    if corrupt not in ("description", "parameters"):
        raise ValueError(f"corrupt must be description or parameters, got {corrupt!r}")
    used: set[str] = set()
    for e in _called_tools(draft):
        if corrupt == "description":
            base = pick_unrelated(e.tool, rng, exclude=used)
            used.add(base.name)
            dup = Tool(e.tool.name, base.description, e.tool.parameters)
        else:
            dup = corrupt_parameters(e.tool, rng)
        _insert_random(draft, Entry(dup, (), e.tool.name, "duplicate", {}), rng)
        draft.notes.append(f"same-name duplicate of {e.tool.name} with corrupted {corrupt}")
