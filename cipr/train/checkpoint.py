"""Checkpoints: HF Trainer step folders, a tracker written after a save completes, and resume.

The HF `Trainer` gives `checkpoint-<step>/` folders (model or LoRA adapter, optimizer, scheduler, RNG,
trainer state) and restores them on resume, skipping the current epoch's done batches. Added here:
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
- Frozen parameters are not written (`_save`): with `model.freeze_bottom_layers` a step folder and a
  stage's `final/` hold the trainable tensors only, plus `cipr_frozen.json` naming the frozen ones
  (`cipr.core.checkpoints`). Training never changes them and every stage starts from the base the run
  config names, so they are re-read from it: a resume loads the base (or the warm start's `final/`,
  rebuilt by `load_trained`) and puts the checkpoint's tensors over it (`_load_from_checkpoint`, which
  checks that together they are the whole model); `cipr-export` rebuilds a full folder the same way.
  A PEFT model saves its adapter only.
- Retention: the Trainer keeps `save_total_limit` step folders per stage. A finished warm start is
  never resumed (the next stage loads its `final/`), so its step folders and tracker are removed once
  `stage.json` is on disk (`drop_step_checkpoints`): only the running or last stage keeps optimizer
  state, and an explicit `trainer.resume=<checkpoint>` of the last stage can still continue it exactly.
  Its earlier step folders keep their optimizer state too: `latest_complete` falls back to them when the
  tracked one is damaged, and a resume without it would not be exact.
- `NonFiniteLossError`: a NaN or infinite loss stops training before the backward pass, so the
  optimizer never applies it and the last tracked checkpoint stays the last good one.
- A resume from the checkpoint of the stage's last step trains nothing (`_run_epoch`): the Trainer
  checks `max_steps` only after a step, so resuming at `global_step == max_steps` (a stop or a kill
  after the last step's save, before `final/` and `stage.json`) would otherwise train one step more.
  The stage then finishes from that checkpoint's weights, as the uninterrupted run did.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cipr.core.checkpoints import (  # noqa: F401 - the reading side, used here and by callers
    EXTRA_STATE,
    FROZEN,
    STAGE_DONE,
    TRACKER,
    apply_trainable,
    checkpoint_problem,
    checkpoint_step,
    frozen_omitted,
    has_checkpoints,
    latest_complete,
)
from cipr.core.config import ConfigError
from cipr.core.errors import DataError, NonFiniteLossError
from cipr.core.io import read_json
from cipr.core.io import write_json_atomic as _write_json

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON so that readers see either the old file or the complete new one (`cipr.core.io`)."""
    _write_json(path, payload)


def write_tracker(stage_dir: Path, step: int, folder: Path) -> None:
    write_json_atomic(Path(stage_dir) / TRACKER, {"step": int(step), "checkpoint": Path(folder).name})


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
        data = read_json(path)
    except DataError as e:
        raise DataError(f"{e.reason}: delete it to finish the stage again from its latest checkpoint",
                        file=str(path)) from e
    if not isinstance(data, dict):
        raise DataError("expected a JSON object: delete it to finish the stage again from its latest "
                        "checkpoint", file=str(path))
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
        raise ConfigError(f"trainer.resume={mode!r} is not a checkpoint folder (no trainer_state.json); "
                          f"use auto, never, or a checkpoint-<step> folder")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ConfigError(f"trainer.resume={mode!r}: the checkpoint {problem}; give another "
                          f"checkpoint-<step> folder, or trainer.resume=auto")
    return str(path)


def frozen_parameter_names(model: Any) -> set[str]:
    """State-dict names of the parameters that do not train, tied aliases included (none for PEFT)."""
    if hasattr(model, "peft_config"):
        return set()
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def load_trained(model_cfg: Any, weights: str | Path | None = None) -> tuple[Any, Any]:
    """`cipr.runtime.model.load_model`, also for a weights folder holding the trainable tensors only.

    Such a folder (`cipr_frozen.json`) is put over the base model `model_cfg` names, which holds the
    frozen tensors it left out; any other folder is loaded as `load_model` does.
    """
    from cipr.runtime.model import load_model

    if weights is None or frozen_omitted(weights) is None:
        return load_model(model_cfg, weights=weights)
    model, tokenizer = load_model(model_cfg)
    apply_trainable(model, weights)
    return model, tokenizer


def check_finite(loss: torch.Tensor, step: int, parts: dict[str, float] | None = None) -> None:
    """Raise NonFiniteLossError (with the loss parts) when `loss` is NaN or infinite."""
    value = float(loss.detach().float().sum())
    if math.isfinite(value):
        return
    detail = ", ".join(f"{k}={v:.4g}" for k, v in (parts or {}).items())
    raise NonFiniteLossError(
        f"the loss is {value} at optimizer step {step + 1}{f' ({detail})' if detail else ''}; training "
        f"stopped before applying it, and the last tracked checkpoint is intact. Lower the learning rate or "
        f"the consistency weights, or check the data of this step.")


_INDEXED_CPU = False


def restore_indexed_cpu_locations() -> None:
    """Let `torch.load(map_location="cpu:N")` restore tensors (once per process).

    accelerate gives each CPU process the device `cpu:<local rank>`, and transformers loads a resumed
    optimizer state with `map_location=args.device`; torch's deserializers know only "cpu" ("don't know
    how to restore data location"), so this registers the missing one (`register_package`)."""
    global _INDEXED_CPU
    if _INDEXED_CPU:
        return
    import torch

    torch.serialization.register_package(
        30, lambda obj: None, lambda obj, location: obj if location.startswith("cpu:") else None)
    _INDEXED_CPU = True


class CheckpointMixin:
    """Mixed into the SFT and GRPO trainers: tracked saves, extra state (`extra_state()` /
    `load_extra_state(state)`, overridable), the non-finite loss guard, no step past `max_steps` on a
    resume, and the stage folder's model card naming `cipr_base_model` (set by cipr/train/run.py)."""

    cipr_base_model: str | None = None  # the model the run started from (cipr.runtime.export.base_model_name)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, **kwargs: Any) -> None:
        """The stage folder's README.md (`cipr.runtime.export.stage_model_card`), naming the run's base model
        where TRL's card reads the model config's path (a local folder or the embedded GGUF: `None`).
        TRL's `_save_checkpoint` calls it with the stage folder's name; the main process writes it."""
        if not self.is_world_process_zero():  # type: ignore[attr-defined]
            return
        from cipr.core.io import write_text_atomic
        from cipr.runtime.export import stage_model_card

        folder = Path(self.args.output_dir)  # type: ignore[attr-defined]
        trainer = getattr(self, "_name", None) or type(self).__name__
        card = stage_model_card(model_name or folder.name, self.cipr_base_model, trainer)
        write_text_atomic(folder / "README.md", card)

    def extra_state(self) -> dict[str, Any]:
        sampler = getattr(self, "_cipr_sampler", None)
        return {"sampler": sampler.state_dict() if sampler is not None else None}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        saved = state.get("sampler")
        sampler = getattr(self, "_cipr_sampler", None)
        if (saved and sampler is not None
                and (saved["seed"], saved["num_rows"]) != (sampler.seed, sampler.num_rows)):
            raise ConfigError(f"the checkpoint was written with data seed {saved['seed']} over "
                              f"{saved['num_rows']} rows, this run has seed {sampler.seed} over "
                              f"{sampler.num_rows}: resume with the same data config, or start a new run_dir")

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)  # type: ignore[misc]
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = Path(self._get_output_dir(trial=trial))  # type: ignore[attr-defined]
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"  # type: ignore[attr-defined]
        if self.args.should_save:  # type: ignore[attr-defined]
            import torch

            torch.save(self.extra_state(), folder / EXTRA_STATE)
            write_tracker(run_dir, self.state.global_step, folder)  # type: ignore[attr-defined]

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        """The Trainer's save (step folders and `final/`), less the frozen parameters (module docstring).

        `cipr_frozen.json` is written before the weights and removed when a save holds everything, so a
        folder never pairs full weights with a stale list. An empty `state_dict` is DeepSpeed's
        placeholder before it writes its own files, and is passed on as is.
        """
        folder = Path(output_dir if output_dir is not None else self.args.output_dir)  # type: ignore[attr-defined]
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)  # type: ignore[attr-defined]
        frozen = frozen_parameter_names(model)
        if frozen and (state_dict is None or len(state_dict) > 0):
            if state_dict is None:
                state_dict = model.state_dict()
            state_dict = {k: v for k, v in state_dict.items() if k not in frozen}
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(folder / FROZEN, {
                "omitted": sorted(frozen),
                "why": "frozen parameters (model.freeze_bottom_layers): training does not change them; "
                       "they are re-read from the base model the run config names (cipr.core.checkpoints)"})
        else:
            (folder / FROZEN).unlink(missing_ok=True)
        super()._save(str(folder), state_dict=state_dict)  # type: ignore[misc]

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Resume the weights; one without its frozen tensors goes over the model as loaded (the base)."""
        if model is None and frozen_omitted(resume_from_checkpoint) is not None:
            log.info("loading the trainable tensors of %s over the base model", resume_from_checkpoint)
            apply_trainable(self.model, resume_from_checkpoint)  # type: ignore[attr-defined]
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        """One pass over the data, or none once `max_steps` is reached (module docstring): the Trainer's
        loop checks the limit only after a step, so a resume at the last step would train one more."""
        state = self.state  # type: ignore[attr-defined]
        if 0 < state.max_steps <= state.global_step:
            log.info("step %d of %d was trained before this resume: nothing left to train", state.global_step,
                     state.max_steps)
            self.control.should_training_stop = True  # type: ignore[attr-defined]
            return None
        return super()._run_epoch(*args, **kwargs)  # type: ignore[misc]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        restore_indexed_cpu_locations()
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        if checkpoint is not None and (Path(checkpoint) / EXTRA_STATE).is_file():
            import torch

            self.load_extra_state(torch.load(Path(checkpoint) / EXTRA_STATE, weights_only=False))
