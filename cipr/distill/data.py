"""Trajectory data for self-distillation (`data=trajectories`): load or generate, trim, split, build items.

Sources (`data.source`):
- `trajectories`: `data.path` names a trajectory file (AgentInstruct or JSON tool-call conversations,
  see `cipr.data.trajectories.load_trajectories`); without a path, `n` ToyShop expert trajectories are
  generated with `seed` (`cipr.data.trajectories.toyshop_trajectories`), so the CPU run needs no data.
- `messages` (`cipr-train algo=distill data=messages data.path=FILE_OR_DIR`): your own `messages` +
  `tools` rows, as for the other algorithms (`cipr.data.messages.load_messages`, `unit="conversation"`):
  each row one trajectory through its last assistant turn. `data.on_bad_row=skip` counts malformed rows
  (`bad row: <reason>`) instead of stopping. Calls are rendered with the model's call format.

Choices (the paper does not say how AgentLM's trajectories were cut for distillation):
- `max_observation_chars`: user turns (instruction page, observations) longer than this keep their
  first characters and end with " ...", to bound sequence length on CPU; the teacher and the student
  see the same trimmed text. `None` keeps them whole.
- `max_turns`: only the first k assistant turns (and the turns before them) are kept; `None` keeps all.
- Held-out trajectories (`eval_examples`, drawn with the data seed) are used only by the evaluation.
- A trajectory that cannot be used (no assistant turn, a chat template that rewrites earlier turns,
  renderings whose decisions differ) is not dropped silently: the reasons are counted in `skipped`,
  logged and written to the run's summary.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import ConfigError
from cipr.data.row_formats import check_messages_options
from cipr.distill.alignment import AlignmentError
from cipr.distill.batch import DistillItem, build_item
from cipr.distill.conversation import UnusableTrajectory
from cipr.formats.base import CallFormat
from cipr.tools.interface import Example, Message

log = logging.getLogger(__name__)

TRIM_MARK = " ..."


@dataclass
class TrajectoryDataConfig:
    """Where trajectories come from and how they are trimmed and split (module docstring)."""

    source: Literal["trajectories", "messages"] = "trajectories"
    path: str | None = None
    on_bad_row: Literal["raise", "skip"] = "raise"
    format: Literal["auto", "messages", "xlam", "hermes_fc", "glaive"] = "auto"
    n: int = 64
    seed: int = 0
    eval_examples: int = 8
    max_observation_chars: int | None = 400
    max_turns: int | None = None
    call_format: str | None = "webshop"


def trajectory_section(section: Mapping[str, Any]) -> dict[str, Any]:
    """The `data` section of a composed config as `TrajectoryDataConfig` reads it (ConfigError for a source
    other than trajectories or messages). `data=trajectories` passes unchanged; for `data=messages` the
    call format defaults to the model's and observations are kept whole unless set (its prompt options
    are `cipr.train.config`'s to drop or refuse).
    """
    source = section.get("source", "trajectories")
    if source not in ("trajectories", "messages"):
        raise ConfigError(f"algo=distill trains on agent trajectories, but data={source} was chosen: give "
                          f"data=trajectories (ToyShop or a trajectory file) or data=messages "
                          f"data.path=FILE_OR_DIR")
    if source == "messages":
        return {"call_format": None, "max_observation_chars": None, **section}
    return dict(section)


def check_data(cfg: TrajectoryDataConfig) -> Path | None:
    """Checks that need no data in memory; returns the trajectory file (None: generate ToyShop ones)."""
    if cfg.n < 0 or cfg.eval_examples < 0:
        raise ConfigError("data.n and data.eval_examples must be >= 0")
    if cfg.max_observation_chars is not None and cfg.max_observation_chars < 1:
        raise ConfigError("data.max_observation_chars must be >= 1 (or null to keep observations whole)")
    if cfg.max_turns is not None and cfg.max_turns < 1:
        raise ConfigError("data.max_turns must be >= 1 (or null to keep every turn)")
    check_messages_options(cfg.source, on_bad_row=cfg.on_bad_row, format=cfg.format)
    if cfg.source == "messages":
        from cipr.data.messages import checked_path

        return checked_path(cfg.path, "algo=distill with data.source=messages", "data.path")
    if cfg.path is None:
        if cfg.n <= cfg.eval_examples:
            raise ConfigError(f"data.n={cfg.n} must exceed data.eval_examples={cfg.eval_examples} (ToyShop "
                              f"trajectories are generated: n in all, eval_examples of them held out)")
        return None
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise ConfigError(f"data.path={cfg.path} does not exist; write a toy set with `cipr-data "
                          f"trajectories n=64 out={cfg.path}` or leave data.path null to generate ToyShop "
                          f"trajectories")
    return path


def trim(example: Example, max_observation_chars: int | None, max_turns: int | None) -> tuple[Example, int]:
    """`example` with long user turns cut and turns past the `max_turns`-th assistant turn dropped, and
    how many user turns were cut."""
    out: list[Message] = []
    cut = 0
    turns = 0
    for m in example.messages:
        if max_turns is not None and turns >= max_turns:
            break
        if m.role == "user" and max_observation_chars is not None and len(m.content) > max_observation_chars:
            m = Message(m.role, m.content[:max_observation_chars].rstrip() + TRIM_MARK, m.calls, m.name)
            cut += 1
        if m.role == "assistant":
            turns += 1
        out.append(m)
    return example.with_(messages=tuple(out)), cut


def load_split(cfg: TrajectoryDataConfig) -> tuple[list[Example], list[Example], dict[str, int]]:
    """(training trajectories, held-out trajectories, counts) after trimming, in source order."""
    path = check_data(cfg)
    skipped: dict[str, int] = {}
    if cfg.source == "messages":
        from cipr.data.row_formats import load_rows

        assert path is not None
        data = load_rows(path, cfg.format, on_bad_row=cfg.on_bad_row, unit="conversation")
        examples = data.examples[:cfg.n] if cfg.n else data.examples
        skipped = {f"bad row: {k}": n for k, n in sorted(data.skipped.items())}
    elif path is None:
        from cipr.data.trajectories import toyshop_trajectories

        examples = toyshop_trajectories(cfg.n, seed=cfg.seed)
    else:
        from cipr.data.trajectories import load_trajectories

        examples = load_trajectories(path, call_format=cfg.call_format or "webshop")
        examples = examples[:cfg.n] if cfg.n else examples
    if len(examples) <= cfg.eval_examples:
        raise ConfigError(f"{len(examples)} trajectories but data.eval_examples={cfg.eval_examples}: nothing "
                          f"left to train on")
    order = list(range(len(examples)))
    random.Random(f"{cfg.seed}\x1fheld-out").shuffle(order)
    held = set(order[:cfg.eval_examples])
    trimmed = [trim(e, cfg.max_observation_chars, cfg.max_turns) for e in examples]
    counts = {"trajectories": len(examples), "held_out": len(held),
              "observations_cut": sum(c for _, c in trimmed), **skipped}
    train = [e for i, (e, _) in enumerate(trimmed) if i not in held]
    evals = [e for i, (e, _) in enumerate(trimmed) if i in held]
    return train, evals, counts


@dataclass
class ItemSet:
    """Built items and the trajectories that could not be used, counted by reason."""

    items: list[DistillItem]
    skipped: Counter = field(default_factory=Counter)


def build_items(examples: Sequence[Example], fmt: CallFormat, tokenizer: Any, *,
                rewrite: str = "all") -> ItemSet:
    """A `DistillItem` per usable trajectory; the others are counted in `skipped` (and logged)."""
    out = ItemSet([])
    for e in examples:
        try:
            out.items.append(build_item(e, fmt, tokenizer, rewrite=rewrite))  # type: ignore[arg-type]
        except UnusableTrajectory as err:
            out.skipped[err.reason] += 1
            log.warning("skipping trajectory %s: %s", e.id, err)
        except AlignmentError as err:
            out.skipped["texts differ beyond the renames"] += 1
            log.warning("skipping trajectory %s: %s", e.id, err)
        except ValueError as err:
            out.skipped["the call format cannot render it"] += 1
            log.warning("skipping trajectory %s: %s", e.id, err)
    return out
