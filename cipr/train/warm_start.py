"""A warm start shared by many runs: one SFT stage in its own folder, trained once, loaded by every run.

A comparison of algorithms (e.g. `configs/train/sweep/ladder.yaml`) must start every algorithm from
the same weights without training the SFT once per point. With `trainer.warm_start.shared_dir=DIR` the
warm start stage (checkpoints, `final/`, `stage.json`, `metrics.jsonl`) lives in DIR:

- The first run to reach it takes an exclusive lock (`DIR/.lock`, `fcntl.flock`) and trains it (or
  resumes it from its latest complete checkpoint); runs that start meanwhile wait on the lock, then
  find it finished and load `DIR/final`. A killed trainer releases the lock, and the next run resumes.
- What the warm start learns must not depend on which run trains it: its prompts come from
  `warm_start.names` (`original`, `canonical`, `masked`, or `mixed`: every example under original
  and under canonical names; never perturbed copies) and its data order from `warm_start.seed`.
  `DIR/identity.json` records model, data, call format and warm-start settings; a run whose settings
  differ is refused before any work.
- With several processes (accelerate), the shared stage must already be finished (train it with one
  process first, e.g. the first point of the sweep): ranks of one run cannot wait on a lock together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError
from cipr.core.io import read_json
from cipr.train.data import PromptSet, build_prompts

log = logging.getLogger("cipr.train")

IDENTITY = "identity.json"
LOCK = ".lock"
NAMINGS = ("original", "canonical", "masked", "mixed")


def identity(cfg: Any) -> dict[str, Any]:
    """What determines a shared warm start's weights (compared on every use)."""
    ws = dataclasses.asdict(cfg.trainer.warm_start)
    ws.pop("shared_dir")
    ws.pop("eval_examples")
    ws["seed"] = warm_start_seed(cfg)
    model = dataclasses.asdict(cfg.model)
    data = dataclasses.asdict(cfg.data)
    names = {"rewrite_text": cfg.perturb.rewrite_text, "mask_length": cfg.perturb.mask_length}  # no copies
    return {"model": model, "data": data, "names": names, "warm_start": ws,
            "precision": cfg.trainer.precision, "max_grad_norm": cfg.trainer.max_grad_norm,
            "weight_decay": cfg.trainer.weight_decay, "optim": cfg.trainer.optim}


def warm_start_seed(cfg: Any) -> int:
    ws = cfg.trainer.warm_start
    return cfg.trainer.seed if ws.seed is None else ws.seed


def stage_dir(cfg: Any, run_dir: Path) -> Path:
    """Where the warm start stage of `cfg` lives: the shared folder, else `run_dir/warm_start`."""
    shared = cfg.trainer.warm_start.shared_dir
    return Path(shared).expanduser() if shared else run_dir / "warm_start"


def validate_shared(cfg: Any) -> None:
    """Checks before any work: the naming, and the shared folder's identity when it has one."""
    ws = cfg.trainer.warm_start
    if ws.names is not None and ws.names not in NAMINGS:
        raise ConfigError(f"trainer.warm_start.names={ws.names!r}; choose one of {', '.join(NAMINGS)} "
                          f"(or null: the algorithm's own prompts)")
    if not ws.shared_dir:
        return
    if ws.names is None:
        raise ConfigError("trainer.warm_start.shared_dir needs trainer.warm_start.names (original, "
                          "canonical, masked or mixed): a warm start shared by several algorithms cannot use "
                          "one of their namings")
    path = Path(ws.shared_dir).expanduser() / IDENTITY
    if path.is_file():
        old = _flat(read_json(path))
        new = _flat(json.loads(json.dumps(identity(cfg), default=str)))
        differing = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        if differing:
            raise ConfigError(f"the shared warm start {ws.shared_dir} was trained with other settings "
                              f"({', '.join(differing[:8])}); use another trainer.warm_start.shared_dir")


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_identity(cfg: Any) -> None:
    folder = Path(cfg.trainer.warm_start.shared_dir).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / IDENTITY).is_file():
        (folder / IDENTITY).write_text(json.dumps(identity(cfg), indent=2, default=str))


@contextlib.contextmanager
def claim(cfg: Any) -> Iterator[None]:
    """Hold the shared folder's lock (no-op without a shared folder); waits while another run trains it."""
    shared = cfg.trainer.warm_start.shared_dir
    if not shared:
        yield
        return
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"the shared warm start {shared} is not finished and this run has several "
                          f"processes: train it first with one process "
                          f"(the same command with launcher.num_processes=1)")
    folder = Path(shared).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for the shared warm start in %s (another run is training it)", folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            write_identity(cfg)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _interleave(sets: Sequence[PromptSet]) -> PromptSet:
    train = [r for rows in zip(*(s.records for s in sets), strict=False) for r in rows]
    evals = [r for rows in zip(*(s.eval_records for s in sets), strict=False) for r in rows]
    skipped = sets[0].skipped.copy()
    for s in sets[1:]:
        skipped.update(s.skipped)
    return PromptSet([dataclasses.replace(r, row=i) for i, r in enumerate(train)],
                     [dataclasses.replace(r, row=i) for i, r in enumerate(evals)], 1, skipped)


def warm_start_prompts(cfg: Any, examples: Sequence[Any], fmt: Any, tokenizer: Any,
                       default: PromptSet) -> PromptSet:
    """The warm start's SFT rows: `default` (the algorithm's prompts) unless `warm_start.names` is set."""
    names = cfg.trainer.warm_start.names
    if names is None:
        return default
    namings = ("original", "canonical") if names == "mixed" else (names,)
    return _interleave([build_prompts(examples, cfg.data,
                                      dataclasses.replace(cfg.perturb, names=n, paired=False), fmt=fmt,
                                      tokenizer=tokenizer) for n in namings])
