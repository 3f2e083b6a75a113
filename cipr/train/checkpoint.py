"""Checkpoints: HF Trainer step folders, a tracker written after a save completes, and resume.

What the HF `Trainer` already gives (used as is): `checkpoint-<step>/` folders with the model in
safetensors (or the LoRA adapter), `optimizer.pt`, `scheduler.pt`, `rng_state.pth` and
`trainer_state.json`; on resume it restores all of them and fast-forwards the dataloader past the
batches of the current epoch (`skip_first_batches`).

What is added here:
- `cipr_state.pt` in each step folder: the data-order state (the paired sampler's seed and epoch,
  see `sampler.py`) and, for GRPO, the trainer's micro-step counter and the buffered generation
  batch when a save falls inside a generation window (`steps_per_generation * num_iterations`
  larger than one optimizer step), so a resumed run reuses the same rollouts instead of drawing new.
- `latest.json` in the stage folder, written atomically (temp file + rename) only after everything
  above is on disk, so a folder left half-written by a kill is never resumed from.
- Integrity on resume (`latest_complete`): the tracked folder is checked before the Trainer loads it
  (`checkpoint_problem`: a parseable trainer_state.json, safetensors files as long as their header
  says, torch files with their zip directory intact). A damaged one (a truncated model.safetensors
  or optimizer.pt, a tracker that is not JSON or names a missing folder) is reported with its path,
  and the newest earlier complete checkpoint (one holding `cipr_state.pt`, written last) is used.
- `stage.json`, written when a stage (warm start or main) has finished and saved its final weights.
- Retention: the Trainer keeps `save_total_limit` step folders per stage. A finished warm start is
  never resumed (the next stage loads its `final/`), so its step folders and tracker are removed once
  `stage.json` is on disk (`drop_step_checkpoints`): only the running or last stage keeps optimizer
  state, and an explicit `trainer.resume=<checkpoint>` of the last stage can still continue it exactly.
- `NonFiniteLossError`: a NaN or infinite loss stops training before the backward pass, so the
  optimizer never applies it and the last tracked checkpoint stays the last good one.
"""

from __future__ import annotations

import json
import logging
import math
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cipr.config import ConfigError
from cipr.errors import DataError, NonFiniteLossError
from cipr.io import write_json_atomic as _write_json

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

TRACKER = "latest.json"
STAGE_DONE = "stage.json"
EXTRA_STATE = "cipr_state.pt"


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON so that readers see either the old file or the complete new one (`cipr.io`)."""
    _write_json(path, payload)


def write_tracker(stage_dir: Path, step: int, folder: Path) -> None:
    write_json_atomic(Path(stage_dir) / TRACKER, {"step": int(step), "checkpoint": Path(folder).name})


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 0 or length > size - 8:
            return f"is truncated ({size} bytes, no complete header)"
        try:
            header = json.loads(f.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "has a corrupt header"
    if 8 + length + end != size:
        return f"is truncated ({size} bytes where its header describes {8 + length + end})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            size = path.stat().st_size
            if any(i.header_offset + i.compress_size > size for i in z.infolist()):
                return "is truncated"
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"is truncated or corrupt ({e})"
    return None


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why `folder` cannot be resumed from, or None when its files are complete (module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        return "does not exist"
    state = folder / "trainer_state.json"
    try:
        step = json.loads(state.read_text())["global_step"]
        if not isinstance(step, int):
            raise TypeError(step)
    except FileNotFoundError:
        return "has no trainer_state.json"
    except (ValueError, KeyError, TypeError):
        return "has an unreadable trainer_state.json"
    for path in sorted(folder.iterdir()):
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
        elif path.suffix in (".pt", ".pth", ".bin"):
            problem = _torch_file_problem(path)
        else:
            continue
        if problem:
            return f"{path.name} {problem}"
    return None


def checkpoint_step(folder: Path) -> int | None:
    """N of a `checkpoint-N` folder name (None for any other name)."""
    m = re.fullmatch(r"checkpoint-(\d+)", folder.name)
    return int(m.group(1)) if m else None


def _read_tracker(tracker: Path) -> tuple[Path, int] | None:
    try:
        info = json.loads(tracker.read_text())
        return tracker.parent / str(info["checkpoint"]), int(info["step"])
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s is not a checkpoint tracker (%s: %s); looking for the newest complete checkpoint in %s",
                    tracker, type(e).__name__, e, tracker.parent)
        return None


def latest_complete(stage_dir: str | Path) -> Path | None:
    """The checkpoint to resume a stage from: the tracked one, or when it is damaged the newest earlier complete one.

    None when nothing was tracked (the stage starts over). Raises DataError naming the damaged
    checkpoint when no complete one is left.
    """
    stage_dir = Path(stage_dir)
    tracker = stage_dir / TRACKER
    if not tracker.is_file():
        return None
    tracked = _read_tracker(tracker)
    below = None
    if tracked is not None:
        folder, below = tracked
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        log.warning("checkpoint %s %s: it cannot be resumed from", folder, problem)
        damaged = f"{folder} {problem}"
    else:
        damaged = f"{tracker} is not a checkpoint tracker"
    candidates = sorted((p for p in stage_dir.glob("checkpoint-*") if checkpoint_step(p) is not None),
                        key=checkpoint_step, reverse=True)  # type: ignore[arg-type, return-value]
    for folder in candidates:
        step = checkpoint_step(folder)
        if below is not None and step >= below:  # type: ignore[operator]
            continue
        problem = checkpoint_problem(folder)
        if problem is None and (folder / EXTRA_STATE).is_file():
            log.warning("resuming from the previous complete checkpoint %s instead", folder)
            return folder
    raise DataError(f"{damaged}, and {stage_dir} holds no earlier complete checkpoint: delete {stage_dir} to start "
                    f"this stage over, or restore the checkpoint", file=str(stage_dir))


def has_checkpoints(stage_dir: str | Path) -> bool:
    """Whether a stage folder holds a tracker, any step folder or a finished stage (a run was started there)."""
    stage_dir = Path(stage_dir)
    return any((stage_dir / name).exists() for name in (TRACKER, STAGE_DONE)) or any(stage_dir.glob("checkpoint-*"))


def drop_step_checkpoints(stage_dir: str | Path) -> None:
    """Remove the tracker and step folders of a finished stage (its `stage.json` must be written)."""
    import shutil

    stage_dir = Path(stage_dir)
    if stage_done(stage_dir) is None:
        raise RuntimeError(f"{stage_dir} is not finished: its checkpoints are what a rerun resumes from")
    (stage_dir / TRACKER).unlink(missing_ok=True)
    for folder in stage_dir.glob("checkpoint-*"):
        if checkpoint_step(folder) is not None:
            shutil.rmtree(folder)


def stage_done(stage_dir: str | Path) -> dict[str, Any] | None:
    """The record a finished stage wrote (`stage.json`), or None while it is unfinished."""
    path = Path(stage_dir) / STAGE_DONE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise DataError(f"not valid JSON ({e}): delete it to finish the stage again from its latest checkpoint",
                        file=str(path)) from e
    if not isinstance(data, dict):
        raise DataError("expected a JSON object: delete it to finish the stage again from its latest checkpoint",
                        file=str(path))
    return data


def mark_stage_done(stage_dir: str | Path, payload: dict[str, Any]) -> None:
    write_json_atomic(Path(stage_dir) / STAGE_DONE, payload)


def resolve_resume(mode: str, stage_dir: str | Path) -> str | None:
    """The checkpoint to resume a stage from: `auto` (latest complete, or none), `never`, or a path."""
    stage_dir = Path(stage_dir)
    if mode == "auto":
        folder = latest_complete(stage_dir)
        return str(folder) if folder else None
    if mode == "never":
        if has_checkpoints(stage_dir):
            raise ConfigError(f"trainer.resume=never but {stage_dir} already holds checkpoints: choose a new "
                              f"trainer.run_dir, delete the old run, or use trainer.resume=auto")
        return None
    path = Path(mode)
    if not (path / "trainer_state.json").is_file():
        raise ConfigError(f"trainer.resume={mode!r} is not a checkpoint folder (no trainer_state.json); use auto, "
                          f"never, or a checkpoint-<step> folder")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ConfigError(f"trainer.resume={mode!r}: the checkpoint {problem}; give another checkpoint-<step> "
                          f"folder, or trainer.resume=auto")
    return str(path)


def check_finite(loss: torch.Tensor, step: int, parts: dict[str, float] | None = None) -> None:
    """Raise NonFiniteLossError (with the loss parts) when `loss` is NaN or infinite."""
    value = float(loss.detach().float().sum())
    if math.isfinite(value):
        return
    detail = ", ".join(f"{k}={v:.4g}" for k, v in (parts or {}).items())
    raise NonFiniteLossError(
        f"the loss is {value} at optimizer step {step + 1}{f' ({detail})' if detail else ''}; training stopped "
        f"before applying it, and the last tracked checkpoint is intact. Lower the learning rate or the "
        f"consistency weights, or check the data of this step.")


class CheckpointMixin:
    """Mixed into the SFT and GRPO trainers: tracked saves, extra state, and the non-finite loss guard.

    Subclasses may override `extra_state()` / `load_extra_state(state)`.
    """

    def extra_state(self) -> dict[str, Any]:
        sampler = getattr(self, "_cipr_sampler", None)
        return {"sampler": sampler.state_dict() if sampler is not None else None}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        saved = state.get("sampler")
        sampler = getattr(self, "_cipr_sampler", None)
        if saved and sampler is not None and (saved["seed"], saved["num_rows"]) != (sampler.seed, sampler.num_rows):
            raise ConfigError(f"the checkpoint was written with data seed {saved['seed']} over {saved['num_rows']} "
                              f"rows, this run has seed {sampler.seed} over {sampler.num_rows}: resume with the "
                              f"same data config, or start a new run_dir")

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)  # type: ignore[misc]
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = Path(self._get_output_dir(trial=trial))  # type: ignore[attr-defined]
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"  # type: ignore[attr-defined]
        if self.args.should_save:  # type: ignore[attr-defined]
            import torch

            torch.save(self.extra_state(), folder / EXTRA_STATE)
            write_tracker(run_dir, self.state.global_step, folder)  # type: ignore[attr-defined]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        if checkpoint is not None and (Path(checkpoint) / EXTRA_STATE).is_file():
            import torch

            self.load_extra_state(torch.load(Path(checkpoint) / EXTRA_STATE, weights_only=False))
