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
  above is on disk. `latest_complete` trusts only this tracker, so a folder left half-written by a
  kill is never resumed from.
- `stage.json`, written when a stage (warm start or main) has finished and saved its final weights.
- `NonFiniteLossError`: a NaN or infinite loss stops training before the backward pass, so the
  optimizer never applies it and the last tracked checkpoint stays the last good one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from cipr.train.config import ConfigError

TRACKER = "latest.json"
STAGE_DONE = "stage.json"
EXTRA_STATE = "cipr_state.pt"


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stopped before applying it."""


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON so that readers see either the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tracker(stage_dir: Path, step: int, folder: Path) -> None:
    write_json_atomic(Path(stage_dir) / TRACKER, {"step": int(step), "checkpoint": Path(folder).name})


def latest_complete(stage_dir: str | Path) -> Path | None:
    """The checkpoint folder the tracker names, if the tracker exists and the folder is there."""
    tracker = Path(stage_dir) / TRACKER
    if not tracker.is_file():
        return None
    info = json.loads(tracker.read_text())
    folder = Path(stage_dir) / info["checkpoint"]
    if not (folder / "trainer_state.json").is_file():
        raise RuntimeError(f"{tracker} names {folder}, which has no trainer_state.json: the checkpoint was "
                           f"removed after it was tracked. Delete {tracker} to start the stage over.")
    return folder


def stage_done(stage_dir: str | Path) -> dict[str, Any] | None:
    path = Path(stage_dir) / STAGE_DONE
    return json.loads(path.read_text()) if path.is_file() else None


def mark_stage_done(stage_dir: str | Path, payload: dict[str, Any]) -> None:
    write_json_atomic(Path(stage_dir) / STAGE_DONE, payload)


def resolve_resume(mode: str, stage_dir: str | Path) -> str | None:
    """The checkpoint to resume a stage from: `auto` (latest complete, or none), `never`, or a path."""
    stage_dir = Path(stage_dir)
    if mode == "auto":
        folder = latest_complete(stage_dir)
        return str(folder) if folder else None
    if mode == "never":
        if latest_complete(stage_dir) is not None:
            raise ConfigError(f"trainer.resume=never but {stage_dir} already holds checkpoints: choose a new "
                              f"trainer.run_dir, delete the old run, or use trainer.resume=auto")
        return None
    path = Path(mode)
    if not (path / "trainer_state.json").is_file():
        raise ConfigError(f"trainer.resume={mode!r} is not a checkpoint folder (no trainer_state.json); use auto, "
                          f"never, or a checkpoint-<step> folder")
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
            torch.save(self.extra_state(), folder / EXTRA_STATE)
            write_tracker(run_dir, self.state.global_step, folder)  # type: ignore[attr-defined]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        if checkpoint is not None and (Path(checkpoint) / EXTRA_STATE).is_file():
            self.load_extra_state(torch.load(Path(checkpoint) / EXTRA_STATE, weights_only=False))
