"""Held-out cost and latency perturbations (paper Appendix C, Table 5; RobustBench-TC CD/TD, _NT, _AB).

For every tool the task calls, the list holds the correct tool and an equivalent with the same description and
parameters but a higher stated cost (or latency). The equivalent keeps the original name and the correct tool
gets a new one, so the familiar name points to the costlier or slower tool and the original reference calls
are wrong by design. Styles:
- `tag`: a bracketed tag before the description, e.g. `[Cost: $0.002 per call]`;
- `nl`: a sentence after it, e.g. "Each call to this tool costs about $0.002.";
- `abbrev`: the tag, and the correct tool's new name abbreviates the original (`naming.abbreviate`).
For `tag` and `nl` the new name is the original plus a neutral suffix (`_alt`, `_b`, `_2`, `_x`, `_svc`) that
suggests neither a cheaper nor a costlier tool.

Versions: `explicit` appends to the query a request for the cheaper (faster) option, as in RobustBench-TC;
`implicit` (the paper's addition) asks to describe the available tools and their properties before acting,
stating no preference.

Orders: `original` puts the correct tool at the original tool's position and the costlier equivalent right
after it; `costly_first` swaps the two. With canonical names the paper averages the two orders; canonical ids
are assigned after the list is built (`Draft.finish`).

Values (seeded): cost low in {$0.001, $0.002, $0.005, $0.01} per call and high = low x {5, 10, 20}; latency
low in {80, 120, 200, 300} ms and high = low x {8, 12, 20}, written in seconds past 1 s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cipr.perturb.draft import Draft, Entry
from cipr.perturb.naming import abbreviate, unique
from cipr.tools.interface import Tool

KINDS = ("cost", "latency")
STYLES = ("tag", "nl", "abbrev")
VERSIONS = ("explicit", "implicit")
ORDERS = ("original", "costly_first")

NEUTRAL_SUFFIXES = ("_alt", "_b", "_2", "_x", "_svc")

EXPLICIT_REQUESTS = {
    "cost": ("Please use the most cost-effective option.", "Use the cheapest tool that can do this.",
             "Keep the cost of this as low as possible."),
    "latency": ("Please use the fastest option available.", "I need this quickly, so use the fastest tool.",
                "Prefer the tool with the lowest latency."),
}
IMPLICIT_REQUESTS = (
    "Before you act, describe the tools available to you and their properties.",
    "First, briefly describe each available tool and its properties, then proceed.",
    "Start by listing the tools you can use and what distinguishes them, then continue.",
)


@dataclass(frozen=True)
class CostLatencySpec:
    """One of the twelve cost/latency types: kind x style x version."""

    kind: str
    style: str
    version: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.style not in STYLES or self.version not in VERSIONS:
            raise ValueError(f"bad cost/latency spec {self}")

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.style}_{self.version}"


def _format_cost(usd: float) -> str:
    return f"${usd:.3f}".rstrip("0").rstrip(".") if usd < 0.1 else f"${usd:.2f}"


def _format_latency(ms: int) -> tuple[str, str]:
    """(tag form, natural-language form)."""
    if ms < 1000:
        return f"{ms} ms", f"{ms} milliseconds"
    s = f"{ms / 1000:.1f}".rstrip("0").rstrip(".")
    return f"{s} s", f"{s} seconds"


def annotate(description: str, spec: CostLatencySpec, value: float) -> str:
    """`description` with the stated cost (USD per call) or latency (ms) in the spec's style."""
    desc = description.strip()
    if spec.kind == "cost":
        amount = _format_cost(value)
        if spec.style == "nl":
            return f"{desc} Each call to this tool costs about {amount}.".strip()
        return f"[Cost: {amount} per call] {desc}".strip()
    tag, words = _format_latency(int(value))
    if spec.style == "nl":
        return f"{desc} This tool typically responds in about {words}.".strip()
    return f"[Latency: {tag}] {desc}".strip()


def draw_values(kind: str, rng: random.Random) -> tuple[float, float]:
    """(value of the correct tool, value of the costlier/slower equivalent)."""
    if kind == "cost":
        low = rng.choice((0.001, 0.002, 0.005, 0.01))
        return low, round(low * rng.choice((5, 10, 20)), 4)
    low_ms = rng.choice((80, 120, 200, 300))
    return low_ms, low_ms * rng.choice((8, 12, 20))


def new_name(name: str, spec: CostLatencySpec, rng: random.Random, taken: set[str]) -> str:
    if spec.style == "abbrev":
        return abbreviate(name, taken)
    return unique(name + rng.choice(NEUTRAL_SUFFIXES), name, taken)


def apply_cost_latency(draft: Draft, rng: random.Random, spec: CostLatencySpec,
                       order: str = "original") -> None:
    """Split every called tool into a renamed correct tool and a costlier equivalent keeping its name,
    then append the explicit or implicit request to the query."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    for e in [draft.entries[i] for i in draft.called()]:
        i = draft.position(e)
        low, high = draw_values(spec.kind, rng)
        original = e.tool
        taken = draft.names()
        correct = Tool(new_name(original.name, spec, rng, taken), annotate(original.description, spec, low),
                       original.parameters)
        costly = Tool(original.name, annotate(original.description, spec, high), original.parameters)
        e.tool = correct
        role = "costlier" if spec.kind == "cost" else "slower"
        draft.insert(i + 1 if order == "original" else i, Entry(costly, (), e.sources[0], role, {}))
        draft.notes.append(f"{original.name} -> {correct.name} ({low}); {role} equivalent keeps the name "
                           f"({high})")
    request = rng.choice(EXPLICIT_REQUESTS[spec.kind] if spec.version == "explicit" else IMPLICIT_REQUESTS)
    query = draft.query.rstrip()
    draft.set_query(f"{query} {request}" if query else request)
