"""A seeded procedural generator of tool-calling Examples over a catalog of realistic tools.

It feeds the CPU demo job (SFT warm start, then GRPO on a 135M model) and tests, so every query states the
values its reference calls need: string and number arguments appear verbatim (lists as comma-separated items),
and enum or boolean arguments a template implies are fixed by its wording ("Dim the kitchen lights to 40
percent" -> action "dim"). The tool to call follows from the request; distractors share the domain about half
the time, so the choice is not trivial, but templates of same-domain tools ask for different things.

Catalog: `synthetic_catalog.yaml`, shipped in this package and checked when first read (`catalog`): 56 tools
over 15 domains, each with a real description, a JSON Schema (types, required, enums, bounds, patterns), query
templates and a phrase for what it does (used when a request cannot be served); then the value tables and the
small talk.

Kinds of examples:
- `single`: one call.
- `parallel`: two or three calls in one turn, the same tool with different values or different tools (possibly
  of different domains); the query joins the requests.
- `no_call` (with a `response`): small talk that needs no tool, or a request whose tool (and its whole domain)
  is absent from the interface, answered by saying so.

Determinism: example i of seed s uses `random.Random(f"cipr-synthetic:{s}:{i}")` (hashed with SHA-512,
independent of PYTHONHASHSEED), so the output is a function of (n, seed, options), and `generate_synthetic(n,
s)` is a prefix of `generate_synthetic(m, s)` for m > n. Kinds are drawn with the given fractions, so counts
per kind vary around them.
"""

from __future__ import annotations

import datetime as _dt
import json
import random
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_checked_yaml
from cipr.tools.interface import Call, Example, Interface, Message, Tool

CATALOG_FILE = "synthetic_catalog.yaml"
"""The catalog, a resource of this package (`cipr.data`)."""


@dataclass(frozen=True)
class Intent:
    """A query template: `{param}` placeholders are filled with sampled values; `fixed` arguments are
    implied by the wording. The call passes exactly the placeholders plus `fixed`."""

    template: str
    fixed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(f for _, f, _, _ in string.Formatter().parse(self.template) if f)


@dataclass(frozen=True)
class CatalogTool:
    """A catalog entry: the Tool, its domain, its query templates, and what it does (for refusals)."""

    tool: Tool
    domain: str
    intents: tuple[Intent, ...]
    capability: str


@dataclass(frozen=True)
class _Catalog:
    """The catalog file, checked: its tools in file order and its value tables (see the file's comments)."""

    tools: tuple[CatalogTool, ...]
    pools: Mapping[str, Sequence[Any]]
    list_pools: Mapping[str, tuple[Sequence[Any], int, int]]
    unit_pairs: tuple[tuple[str, str], ...]
    songs: Mapping[str, str]
    chitchat: tuple[tuple[str, str], ...]
    joiners: tuple[str, ...]


_TEXT = {"type": "string", "minLength": 1}
_VALUES = {"type": "array", "minItems": 1, "items": {"type": ["string", "number"]}}


def _table(required: Mapping[str, Any], optional: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": list(required),
            "properties": {**required, **(optional or {})}}


_TOOL = _table({"name": _TEXT, "description": _TEXT, "capability": _TEXT,
                "parameters": {"$ref": "https://json-schema.org/draft/2020-12/schema"},  # a valid JSON Schema
                "intents": {"type": "array", "minItems": 1, "items": {"oneOf": [
                    _TEXT, _table({"template": _TEXT, "fixed": {"type": "object"}})]}}})
_SHAPE = _table({
    "domains": {"type": "object", "additionalProperties": {"type": "array", "minItems": 1, "items": _TOOL}},
    "pools": {"type": "object", "additionalProperties": _VALUES},
    "list_pools": {"type": "object", "additionalProperties": _table(
        {"items": _VALUES, "min": {"type": "integer", "minimum": 1}, "max": {"type": "integer"}})},
    "unit_pairs": {"type": "array", "minItems": 1,
                   "items": {"type": "array", "items": _TEXT, "minItems": 2, "maxItems": 2}},
    "songs": {"type": "object", "minProperties": 1, "additionalProperties": _TEXT},
    "chitchat": {"type": "array", "minItems": 1, "items": _table({"user": _TEXT, "answer": _TEXT})},
    "joiners": {"type": "array", "minItems": 1, "items": _TEXT},
}, {"lists": {"type": "object"}})  # `lists`: value lists the file shares by YAML anchor
"""The catalog file's layout, as a JSON Schema."""


@lru_cache(maxsize=1)
def _load() -> _Catalog:
    """The packaged catalog, read and checked once."""
    return _read(resources.files("cipr.data").joinpath(CATALOG_FILE))


def _read(source: Traversable) -> _Catalog:
    """Read and check a catalog file; DataError names the file, the entry and the field."""
    where = str(source)
    raw = read_checked_yaml(source, _SHAPE)
    tools = tuple(_catalog_tool(domain, entry, where) for domain, entries in raw["domains"].items()
                  for entry in entries)
    twice = sorted(n for n, k in Counter(c.tool.name for c in tools).items() if k > 1)
    if twice:
        raise DataError(f"tool names declared twice: {', '.join(twice)}", file=where, item="domains")
    arguments = {(c.tool.name, a) for c in tools for a in c.tool.properties}
    for table in ("pools", "list_pools"):
        for key, value in raw[table].items():
            name, _, arg = key.rpartition(".")
            if not any(a == arg and name in ("", n) for n, a in arguments):
                raise DataError(f"{arg!r} is not an argument of {f'tool {name!r}' if name else 'any tool'}",
                                file=where, item=f"{table}.{key}")
            if table == "list_pools" and not value["min"] <= value["max"] <= len(value["items"]):
                raise DataError("needs min <= max <= the number of items", file=where, item=f"{table}.{key}")
    lists = {k: (v["items"], v["min"], v["max"]) for k, v in raw["list_pools"].items()}
    return _Catalog(tools, raw["pools"], lists, tuple((a, b) for a, b in raw["unit_pairs"]), raw["songs"],
                    tuple((c["user"], c["answer"]) for c in raw["chitchat"]), tuple(raw["joiners"]))


def _catalog_tool(domain: str, entry: Mapping[str, Any], where: str) -> CatalogTool:
    """One catalog entry, checked: its intents' calls pass every required argument and only declared ones."""
    item = f"tool {entry['name']!r}"
    tool = Tool.from_openai(entry, where=where, item=item)
    if not set(tool.required) <= set(tool.properties):
        raise DataError("names an undeclared argument", file=where, item=item, field="parameters.required")
    intents = tuple(Intent(i) if isinstance(i, str) else Intent(i["template"], i["fixed"])
                    for i in entry["intents"])
    for k, intent in enumerate(intents):
        try:
            given = set(intent.slots) | set(intent.fixed)
        except ValueError as e:
            raise DataError(f"bad template: {e}", file=where, item=item, field=f"intents.{k}") from None
        unknown, missing = given - set(tool.properties), set(tool.required) - given
        if unknown or missing:
            raise DataError(f"fills undeclared arguments {sorted(unknown)}" if unknown else
                            f"leaves out required arguments {sorted(missing)}", file=where, item=item,
                            field=f"intents.{k}")
    return CatalogTool(tool, domain, intents, entry["capability"])


def __getattr__(name: str) -> Any:
    if name == "CHITCHAT":  # the no-call small talk, (user message, answer) pairs, read with the catalog
        return _load().chitchat
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# Value samplers
# ---------------------------------------------------------------------------------------------

_DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
_TIME_PATTERN = r"^\d{2}:\d{2}$"
_DATE_BASE = _dt.date(2025, 1, 1)


def _date(rng: random.Random) -> str:
    return (_DATE_BASE + _dt.timedelta(days=rng.randrange(365))).isoformat()


def _after(d: str, rng: random.Random, lo: int, hi: int) -> str:
    return (_dt.date.fromisoformat(d) + _dt.timedelta(days=rng.randint(lo, hi))).isoformat()


def _time(rng: random.Random) -> str:
    return f"{rng.randint(7, 20):02d}:{rng.choice((0, 15, 30, 45)):02d}"


_LATER = {"return_date": ("departure_date", "pickup_date"), "check_out": ("check_in",),
          "end_date": ("start_date",)}


def _sample(tool: CatalogTool, param: str, filled: Mapping[str, Any], rng: random.Random) -> Any:
    """A realistic value for one argument (dates ordered, unit pairs compatible, song/artist matched)."""
    schema = tool.tool.properties[param]
    name = tool.tool.name
    tables = _load()
    if param in _LATER:
        for first in _LATER[param]:
            if first in filled:
                return _after(filled[first], rng, 1, 14)
    if name == "convert_units":
        if param == "from_unit":
            return rng.choice(tables.unit_pairs)[0]
        if param == "to_unit":
            return rng.choice([b for a, b in tables.unit_pairs if a == filled["from_unit"]])
    if name == "play_song":
        if param == "title":
            return rng.choice(list(tables.songs))
        if param == "artist":
            return tables.songs[filled["title"]]
    if name == "delete_event":
        return "evt_" + "".join(rng.choice("0123456789abcdef") for _ in range(6))
    if name in ("add_to_cart", "get_product_reviews") and param == "product_id":
        return f"SKU-{rng.randint(10000, 99999)}"
    if name == "track_order":
        return f"ORD-{rng.randint(100000, 999999)}"
    if name == "send_sms" and param == "phone_number":
        return f"+1-{rng.randint(201, 989)}-555-{rng.randint(100, 9999):04d}"
    if param in tables.list_pools:
        pool, lo, hi = tables.list_pools[param]
        return rng.sample(list(pool), rng.randint(lo, hi))
    pool = tables.pools.get(f"{name}.{param}", tables.pools.get(param))
    if pool is not None:
        return rng.choice(list(pool))
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if schema.get("pattern") == _DATE_PATTERN:
        return _date(rng)
    if schema.get("pattern") == _TIME_PATTERN:
        return _time(rng)
    raise KeyError(f"no value sampler for {name}.{param}")


def _text(value: Any) -> str:
    """How a value is written in a query: lists as comma-separated items, everything else as str()."""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def fill(tool: CatalogTool, intent: Intent, rng: random.Random, *, tries: int = 20) -> tuple[str, Call]:
    """A query for one intent and its reference call. String values within one call are distinct."""
    for _ in range(tries):
        args: dict[str, Any] = {}
        for param in tool.tool.properties:  # declared order, so dependent values see their anchors
            if param in intent.slots:
                args[param] = _sample(tool, param, args, rng)
        strings = [v for v in args.values() if isinstance(v, str)]
        if len(set(strings)) == len(strings):
            break
    query = intent.template.format(**{k: _text(v) for k, v in args.items()})
    return query, Call(tool.tool.name, {**args, **intent.fixed})


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------

def catalog() -> tuple[CatalogTool, ...]:
    """The tool catalog (56 tools over 15 domains), in the catalog file's order."""
    return _load().tools


def catalog_interface() -> Interface:
    """Every catalog tool as one Interface."""
    return Interface(tuple(c.tool for c in catalog()))


def _lower_first(text: str) -> str:
    return text if text.startswith(("I ", "I'")) else text[:1].lower() + text[1:]


@dataclass(frozen=True)
class SyntheticConfig:
    """Options of the generator (see `generate_synthetic`)."""

    n: int = 200
    seed: int = 0
    tools_per_example: tuple[int, int] = (2, 5)
    parallel_fraction: float = 0.25
    no_call_fraction: float = 0.15
    same_domain_distractors: float = 0.5
    tools: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        lo_hi = tuple(self.tools_per_example)
        if len(lo_hi) != 2 or not 1 <= lo_hi[0] <= lo_hi[1]:
            raise ValueError(f"tools_per_example must be [lo, hi] with 1 <= lo <= hi, got {list(lo_hi)}")
        fractions = (self.parallel_fraction, self.no_call_fraction, self.same_domain_distractors)
        if (min(fractions) < 0 or self.parallel_fraction + self.no_call_fraction > 1
                or self.same_domain_distractors > 1):
            raise ValueError(f"parallel_fraction={self.parallel_fraction}, "
                             f"no_call_fraction={self.no_call_fraction} and "
                             f"same_domain_distractors={self.same_domain_distractors} must lie in [0, 1], "
                             f"with parallel_fraction + no_call_fraction <= 1")
        restricted_catalog(self.tools, lo_hi[1], self.exclude)

    def generate(self, split: str = "train") -> list[Example]:
        return generate_synthetic(self.n, self.seed, tools_per_example=self.tools_per_example,
                                  parallel_fraction=self.parallel_fraction,
                                  no_call_fraction=self.no_call_fraction,
                                  same_domain_distractors=self.same_domain_distractors, tools=self.tools,
                                  exclude=self.exclude, split=split)


def restricted_catalog(tools: Sequence[str], size: int = 1, exclude: Sequence[str] = ()
                       ) -> tuple[CatalogTool, ...]:
    """The catalog's tools named in `tools` (empty: the whole catalog), less those `exclude` holds back, in
    catalog order: a narrower task family.

    `exclude` entries are a tool name (never called nor listed) or `tool#k` (that tool's k-th query template,
    from 0, never used; the tool stays). ValueError for an unknown name or template, a tool left without a
    template, or fewer tools than an interface's `size`.
    """
    cat = catalog()
    known = {c.tool.name: c for c in cat}
    unknown = sorted({t for t in [*tools, *(e.partition("#")[0] for e in exclude)]} - set(known))
    if unknown:
        raise ValueError(f"tools: {', '.join(unknown)} not in the synthetic catalog; valid names: "
                         f"{', '.join(sorted(known))}")
    dropped = {e for e in exclude if "#" not in e}
    templates: dict[str, set[int]] = {}
    for entry in (e for e in exclude if "#" in e):
        name, _, k = entry.partition("#")
        if not k.isdigit() or int(k) >= len(known[name].intents):
            raise ValueError(f"exclude: {entry!r} names no template of {name} (it has "
                             f"{len(known[name].intents)}, counted from 0)")
        templates.setdefault(name, set()).add(int(k))
    chosen = []
    for c in cat:
        if (tools and c.tool.name not in set(tools)) or c.tool.name in dropped:
            continue
        if c.tool.name in templates:
            kept = tuple(i for k, i in enumerate(c.intents) if k not in templates[c.tool.name])
            if not kept:
                raise ValueError(f"exclude: every template of {c.tool.name} is held back; exclude the tool")
            c = CatalogTool(c.tool, c.domain, kept, c.capability)
        chosen.append(c)
    if len(chosen) < size:
        raise ValueError(f"tools: {len(chosen)} tools cannot fill interfaces of up to {size} tools")
    return tuple(chosen)


def template_index(tool: str, template: str) -> int:
    """The position of `template` among `tool`'s query templates in the catalog (what `tool#k` counts)."""
    return [i.template for i in next(c for c in catalog() if c.tool.name == tool).intents].index(template)


def _interface(rng: random.Random, needed: Sequence[CatalogTool], size: int, excluded_domains: set[str],
               same_domain: float, cat: Sequence[CatalogTool]) -> Interface:
    chosen = list(needed)
    names = {c.tool.name for c in chosen}
    pool = [c for c in cat if c.tool.name not in names and c.domain not in excluded_domains]
    domains = {c.domain for c in needed}
    while len(chosen) < size and pool:
        near = [c for c in pool if c.domain in domains]
        pick = rng.choice(near if near and rng.random() < same_domain else pool)
        chosen.append(pick)
        pool.remove(pick)
    rng.shuffle(chosen)
    return Interface(tuple(c.tool for c in chosen))


def _one(i: int, seed: int, lo: int, hi: int, parallel_fraction: float, no_call_fraction: float,
         same_domain: float, only: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
         split: str = "train") -> Example:
    stream = "cipr-synthetic" if split == "train" else f"cipr-synthetic-{split}"
    rng = random.Random(f"{stream}:{seed}:{i}")
    cat = restricted_catalog(only, 1, exclude)
    r = rng.random()
    kind = ("no_call" if r < no_call_fraction else "parallel" if r < no_call_fraction + parallel_fraction
            else "single")
    size = rng.randint(lo, hi)
    meta: dict[str, Any] = {"kind": kind}
    response = None
    calls: list[Call] = []
    if kind == "no_call":
        if rng.random() < 0.5:
            query, response = rng.choice(_load().chitchat)
            interface = _interface(rng, [], size, set(), same_domain, cat)
            meta["reason"] = "no_tool_needed"
        else:
            asked = rng.choice(cat)
            query, _ = fill(asked, rng.choice(asked.intents), rng)
            response = f"Sorry, I can't {asked.capability} with the tools available to me."
            interface = _interface(rng, [], size, {asked.domain}, same_domain, cat)
            meta.update(reason="tool_unavailable", unavailable_tool=asked.tool.name, domain=asked.domain)
    else:
        count = 1 if kind == "single" else rng.choice((2, 2, 2, 3))
        if kind == "parallel" and rng.random() < 0.5:
            tools = [rng.choice(cat)] * count
        else:
            tools = rng.sample(list(cat), count)
        queries: list[str] = []
        templates: list[list[Any]] = []
        for tool in tools:
            for _ in range(20):  # repeated calls of one tool ask for different things
                intent = rng.choice(tool.intents)
                query, call = fill(tool, intent, rng)
                if call not in calls:
                    break
            templates.append([tool.tool.name, template_index(tool.tool.name, intent.template)])
            queries.append(query if not queries else rng.choice(_load().joiners) + _lower_first(query))
            calls.append(call)
        query = " ".join(queries)
        needed = list({t.tool.name: t for t in tools}.values())
        interface = _interface(rng, needed, max(size, len(needed)), set(), same_domain, cat)
        meta.update(domains=sorted({t.domain for t in needed}), templates=templates)
    prefix = "synthetic" if split == "train" else f"synthetic-{split}"
    return Example(id=f"{prefix}-{seed}-{i:05d}", messages=(Message("user", query),), interface=interface,
                   reference=tuple(calls), response=response, source="synthetic", partition=kind, meta=meta)


def generate_synthetic(n: int, seed: int = 0, *, tools_per_example: tuple[int, int] = (2, 5),
                       parallel_fraction: float = 0.25, no_call_fraction: float = 0.15,
                       same_domain_distractors: float = 0.5, tools: Sequence[str] = (),
                       exclude: Sequence[str] = (), split: str = "train") -> list[Example]:
    """`n` synthetic Examples, deterministic in (n, seed, options, split).

    - `split`: "train" (`cipr-train data=synthetic`) or "test" (`benchmark=synthetic`). The test split draws
      from its own random stream and drops every item whose query and reference calls equal one of the first
      `TRAIN_GUARD` training items of the same seed (the template space is small: about a quarter of a
      separate stream's items repeat a training item, the chit-chat no-call items among them), so no test item
      was trained on for any `data.n` up to that bound. Test ids are `synthetic-test-<seed>-<stream index>`.
    - `tools_per_example`: inclusive range of the interface size (raised to what a parallel example needs).
    - `parallel_fraction`, `no_call_fraction`: probabilities of the parallel and no-call kinds; the rest are
      single calls.
    - `same_domain_distractors`: probability that each distractor comes from the needed tools' domains (harder
      negatives) rather than the whole catalog.
    - `tools`, `exclude`: `restricted_catalog`; e.g. training data for a test split whose (tool, template)
      pairs were never trained on. `meta["templates"]` records each call's (tool, k).
    """
    lo, hi = tools_per_example
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= lo <= hi <= len(catalog()):
        raise ValueError(f"tools_per_example must satisfy 1 <= lo <= hi <= {len(catalog())}, "
                         f"got {tools_per_example}")
    restricted_catalog(tools, hi, exclude)
    fractions = (parallel_fraction, no_call_fraction, same_domain_distractors)
    if min(fractions) < 0 or parallel_fraction + no_call_fraction > 1 or same_domain_distractors > 1:
        raise ValueError("fractions must be in [0, 1] and parallel_fraction + no_call_fraction <= 1")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    options = (lo, hi, parallel_fraction, no_call_fraction, same_domain_distractors, tuple(tools),
               tuple(exclude))
    if split == "train":
        return [_one(i, seed, *options) for i in range(n)]
    trained = {_item_key(_one(i, seed, *options)) for i in range(TRAIN_GUARD)}
    out: list[Example] = []
    i = 0
    while len(out) < n:
        example = _one(i, seed, *options, split)
        if _item_key(example) not in trained:
            out.append(example)
        i += 1
    return out


TRAIN_GUARD = 5000


def _item_key(example: Example) -> tuple[str, str]:
    """What makes two synthetic items the same task: the query and the reference calls."""
    calls = json.dumps([c.to_dict() for c in example.reference], sort_keys=True)
    return str(example.messages[0].content), calls


def synthetic_stats(n: int = 200, seed: int = 0, **options: Any) -> dict[str, Any]:
    """Catalog size per domain and, for `generate_synthetic(n, seed, **options)`, counts per kind."""
    exs = generate_synthetic(n, seed, **options)
    sizes = [len(e.interface) for e in exs]
    return {
        "catalog_tools": len(catalog()),
        "catalog_domains": dict(sorted(Counter(c.domain for c in catalog()).items())),
        "templates": sum(len(c.intents) for c in catalog()),
        "examples": len(exs),
        "kinds": dict(sorted(Counter(e.partition for e in exs).items())),
        "calls": sum(len(e.reference) for e in exs),
        "tools_per_example": {"min": min(sizes, default=0), "max": max(sizes, default=0),
                              "mean": round(sum(sizes) / len(sizes), 3) if sizes else 0.0},
        "seed": seed,
    }

