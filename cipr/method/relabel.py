"""Relabeling for the rescoring consistency KL: (x, y) -> (x̃, ỹ) with fresh neutral tool names, one rule for
every engine (GRPO single- and multi-turn, the supervised regime, distillation).

Every declared tool gets a new neutral name, substituted (simultaneously, as whole identifiers) in the prompt
and throughout the response, so the response's reasoning stays valid and each decision of ỹ sits at the same
place in the order of decisions as in y (character offsets may shift when the new names are longer or
shorter). The response is a sequence of turns (`spans`; a single-turn response is one span): each turn's
decisions are recomputed by the call format on its new text, shifted to the new response and checked to
correspond one to one to the old ones (a mismatch raises). Text between turns (observations, user turns,
end tokens) is context: renamed, never searched for decisions.

Choices:
- Schemes (`perturb.relabel.scheme`): "function" (shuffled `function_XX` numbers drawn from 1..pool, so
  canonical-looking ids land on other tools: the model cannot tie an id to a position), "tool" (`tool_XX`),
  "random" (`fn_` + 6 random letters and digits). Every new name differs from the tool's old one, and none is
  a word of the prompt or the response.
- Only tool names are rewritten; argument ids stay (the consistency KL concerns actions only). Replacement
  is whole-word on every occurrence (`cipr.tools.canonical.rewrite_text` mode "all"), so a plain-word name
  such as WebShop's `search` is renamed in the prompt's prose as well.
- Tools keep their order: class i is the i-th tool on both sides.
- The seed (`Relabeling.seed_for`, `relabel_seed`): one hash of (run seed, optimizer step, example id,
  response index), the run seed resolved once (`Relabeling.of`: `perturb.relabel.seed`, else `trainer.seed`).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cipr.formats.base import CallFormat, Decision
from cipr.perturb.config import RelabelConfig
from cipr.perturb.renaming import fresh_names
from cipr.tools.canonical import rewrite_text


def relabel_seed(seed: int, step: int, example_id: str, response: int = 0) -> int:
    """The seed of one relabeling (x̃, ỹ), the same rule in every engine: a 63-bit integer from SHA-256 of
    (run seed, optimizer step, example id, response index among the example's responses in the step).

    The example id (not a row or batch position) keys it, so a pair draws the same names whatever batch or
    process it lands in, a resumed run redraws what the uninterrupted run drew, and two engines relabel the
    same example at the same step alike; the step changes the names every step (a term that memorized one
    relabeling would not generalize); `response` tells GRPO's G responses to one prompt apart (0 for the
    single target of the supervised regime and distillation)."""
    text = f"{seed}\x1f{step}\x1f{example_id}\x1f{response}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class Relabeling:
    """A run's relabeling: how names are drawn (`config`) and the run seed every draw starts from."""

    config: RelabelConfig
    seed: int

    @classmethod
    def of(cls, config: RelabelConfig | None, run_seed: int) -> Relabeling:
        """The one rule for the run seed: `config.seed`, else the run's own (`trainer.seed`)."""
        config = config or RelabelConfig()
        return cls(config, run_seed if config.seed is None else config.seed)

    def seed_for(self, step: int, example_id: str, response: int = 0) -> int:
        """The seed of one relabeling (`relabel_seed`)."""
        return relabel_seed(self.seed, step, example_id, response)


@dataclass(frozen=True)
class Relabeled:
    """(x̃, ỹ) and its correspondence: the new `tools` in declaration order, `mapping` old -> new name, and
    the `decisions` of the new response (offsets in it), one per decision of the old one."""

    prompt: str
    response: str
    tools: tuple[str, ...]
    mapping: Mapping[str, str]
    decisions: tuple[Decision, ...]


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def relabel(prompt: str, response: str, tools: Sequence[str], fmt: CallFormat,
            config: RelabelConfig | None = None, *, seed: int,
            spans: Sequence[tuple[int, int]] | None = None) -> Relabeled:
    """(x̃, ỹ) from (x, y): fresh names for `tools` throughout both texts, each turn's decisions recomputed and
    checked (module docstring). `spans`: each turn's (start, end) characters in `response`, ascending and
    disjoint (None: the whole response is one turn); `config`: the scheme (None: the default). ValueError when
    the tools repeat a name, a span is out of order, or a turn's decisions do not correspond after
    relabeling."""
    config = config or RelabelConfig()
    if len(set(tools)) != len(tools):
        raise ValueError(f"tool names repeat "
                         f"({', '.join(sorted(t for t in set(tools) if list(tools).count(t) > 1))}): "
                         f"relabeling needs one name per tool")
    avoid = (_words(prompt) | _words(response)) - set(tools)
    names = fresh_names(tools, config.scheme, random.Random(seed), avoid, width=config.width,
                        pool=config.pool)
    mapping = dict(zip(tools, names, strict=True))
    pieces: list[str] = []
    decisions: list[Decision] = []
    cursor = length = 0
    for t, (start, end) in enumerate(((0, len(response)),) if spans is None else spans):
        if start < cursor or end < start or end > len(response):
            raise ValueError(f"turn {t} span ({start}, {end}) is not ascending inside the response")
        context = rewrite_text(response[cursor:start], mapping, "all")
        turn = response[start:end]
        new_turn = rewrite_text(turn, mapping, "all")
        old, new = fmt.decisions(turn), fmt.decisions(new_turn)
        if len(old) != len(new):
            raise ValueError(f"relabeling changed turn {t}'s decisions: {len(old)} before, {len(new)} after")
        offset = length + len(context)
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            expected = mapping.get(a.taken, a.taken) if a.taken is not None else None
            if (a.opener, a.name_suffix, expected) != (b.opener, b.name_suffix, b.taken):
                raise ValueError(f"turn {t} decision {i} does not correspond after relabeling: {a} vs {b}")
            decisions.append(Decision(b.start + offset, b.opener, b.name_suffix, b.taken))
        pieces += [context, new_turn]
        length += len(context) + len(new_turn)
        cursor = end
    pieces.append(rewrite_text(response[cursor:], mapping, "all"))
    return Relabeled(rewrite_text(prompt, mapping, "all"), "".join(pieces), tuple(names), mapping,
                     tuple(decisions))
