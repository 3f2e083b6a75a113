"""Which checkpoint of a run folder's stage is complete: the tracker, file integrity, resume candidates.

The reading side of `cipr.train.checkpoint` (which writes them through the HF Trainer), here so that
whatever reads a run folder (training's resume, `cipr-export`) shares one definition of complete: a
parseable trainer_state.json, safetensors files as long as their header says, torch files with their
zip directory intact, and `cipr_state.pt`, written last.

Frozen parameters (`model.freeze_bottom_layers`) are not written: training never changes them, and
the base model the run config names (which every stage and every resume loads first) holds them. A
weights folder written that way (a step checkpoint or a stage's `final/`) holds the trainable tensors
in `model.safetensors` and names the left-out ones in `cipr_frozen.json` (written before the weights);
`frozen_omitted` tells such a folder apart, and `apply_trainable` puts its tensors over a model loaded
from the base, checking that together they make up every tensor of the model. Such a folder is not a
model on its own (`from_pretrained` of it would initialize the missing tensors at random): training
(`cipr.train.checkpoint.load_trained`) and `cipr-export` rebuild the full model from base + folder.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_json

log = logging.getLogger(__name__)

TRACKER = "latest.json"
STAGE_DONE = "stage.json"
EXTRA_STATE = "cipr_state.pt"
FROZEN = "cipr_frozen.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 0 or length > size - 8:
            return f"is truncated ({size} bytes, no complete header)"
        try:
            header = json.loads(f.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                      default=0)
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
        step = read_json(state)["global_step"]
        if not isinstance(step, int):
            raise TypeError(step)
    except FileNotFoundError:
        return "has no trainer_state.json"
    except (ValueError, KeyError, TypeError):
        return "has an unreadable trainer_state.json"
    if (folder / FROZEN).exists():
        try:
            frozen_omitted(folder)
        except DataError as e:
            return f"{FROZEN} is unreadable ({e})"
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
        info = read_json(tracker)
        return tracker.parent / str(info["checkpoint"]), int(info["step"])
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s is not a checkpoint tracker (%s: %s); looking for the newest complete checkpoint "
                    "in %s", tracker, type(e).__name__, e, tracker.parent)
        return None


def latest_complete(stage_dir: str | Path) -> Path | None:
    """The checkpoint to resume a stage from: the tracked one, or when it is damaged the newest earlier
    complete one; None when nothing was tracked (the stage starts over), DataError naming the damaged one when
    none is left."""
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
    raise DataError(f"{damaged}, and {stage_dir} holds no earlier complete checkpoint: delete {stage_dir} to "
                    f"start this stage over, or restore the checkpoint", file=str(stage_dir))


def has_checkpoints(stage_dir: str | Path) -> bool:
    """Whether a stage folder holds a tracker, a step folder or a finished stage (a run started there)."""
    stage_dir = Path(stage_dir)
    return (any((stage_dir / name).exists() for name in (TRACKER, STAGE_DONE))
            or any(stage_dir.glob("checkpoint-*")))


def frozen_omitted(folder: str | Path) -> list[str] | None:
    """The frozen tensors a weights folder leaves out (re-read from the base model), or None when it holds
    all; DataError when `cipr_frozen.json` is not an object with an `omitted` list of names."""
    path = Path(folder) / FROZEN
    if not path.is_file():
        return None
    data = read_json(path)
    try:
        omitted = data["omitted"]
    except (KeyError, TypeError) as e:
        raise DataError(f"not a record of left-out frozen tensors ({type(e).__name__}: {e})",
                        file=str(path)) from e
    if not isinstance(omitted, list) or not all(isinstance(k, str) for k in omitted):
        raise DataError("`omitted` must be a list of tensor names", file=str(path), field="omitted")
    return omitted


def read_trainable(folder: str | Path) -> dict:
    """The tensors of a weights folder's safetensors file(s), on the CPU (name -> tensor)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / WEIGHTS).is_file():
        return load_file(folder / WEIGHTS, device="cpu")
    index = folder / WEIGHTS_INDEX
    if not index.is_file():
        raise DataError(f"holds neither {WEIGHTS} nor {WEIGHTS_INDEX}", file=str(folder))
    data = read_json(index)
    try:
        files = sorted(set(data["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"not a safetensors index ({e})", file=str(index)) from e
    tensors: dict = {}
    for name in files:
        tensors.update(load_file(folder / name, device="cpu"))
    return tensors


def zero3_partitioned(model: Any) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions `model`'s parameters (loaded under `zero.Init`: each rank holds a
    shard and the parameters look empty). DeepSpeed marks each such parameter with a `ds_id`."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first is not None and hasattr(first, "ds_id")


def _whole_parameters(model: Any) -> Any:
    """A context in which a ZeRO-3 partitioned model (`zero3_partitioned`) shows its whole parameters, and in
    which rank 0's changes are kept; a no-op for any other model. The whole model is gathered at once (on
    each rank, for the length of the load)."""
    import contextlib

    if not zero3_partitioned(model):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0)


def apply_trainable(model: Any, folder: str | Path) -> None:
    """Load the trainable tensors of `folder` (one with `cipr_frozen.json`) over `model`, which holds the
    base; with the names the folder lists as left out they must make up exactly the model's state dict, else
    (another model or `freeze_bottom_layers`) DataError says which differ."""
    omitted = frozen_omitted(folder)
    if omitted is None:
        raise DataError(f"holds full weights (no {FROZEN}): load it as a model folder", file=str(folder))
    tensors = read_trainable(folder)
    try:
        with _whole_parameters(model):
            result = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # a tensor of another shape
        raise DataError(f"its trainable tensors do not fit the base model loaded under them ({e}): load it "
                        f"with the model config of the run that wrote it", file=str(folder)) from e
    missing, unexpected = set(result.missing_keys), set(result.unexpected_keys)
    if unexpected or missing != set(omitted):
        detail = [f"{what}: {', '.join(sorted(keys)[:6])}{' ...' if len(keys) > 6 else ''}"
                  for what, keys in (("not in the model", unexpected),
                                     ("in neither the folder nor its frozen list", missing - set(omitted)),
                                     ("listed as frozen but saved or absent from the model",
                                      set(omitted) - missing)) if keys]
        raise DataError(f"its trainable tensors do not fit the base model loaded under them "
                        f"({'; '.join(detail)}): load it with the model config of the run that wrote it",
                        file=str(folder))
