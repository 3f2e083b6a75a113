"""The run folder every runner shares: who writes it, what it records, and resuming without mixing runs.

A training run (`cipr/train/run.py`, self-distillation included) and an evaluation run
(`cipr/eval/evaluate.py`, `cipr/eval/runner.py`) each write into one folder and
continue it when the same command is rerun. The same four rules hold for all of them:

- only the main process of a distributed launch writes the folder (`is_main_process`);
- the folder records the configuration that started it (`write_config`: config.json and
  config.yaml), and a rerun whose configuration differs in what decides the results is refused
  once the folder holds progress, rather than mixed into it (`check_config`, `changed_keys`);
- an append-only record file loses only its last line to a kill: the torn tail is cut (or ignored
  when reading only) before anything is appended (`cipr.core.io.complete_lines`, `read_jsonl`);
- a resumed stage drops the metric lines written after the checkpoint it resumes from, so the
  metrics read as one run (`truncate_metrics`).

A training run also keeps its wall time over every invocation that did work (`wall_time.json`,
`read_wall_time` / `write_wall_time`): a stopped and resumed run's summary gives the total beside the
last invocation's own time. An invocation ended by SIGKILL never gets to add its time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import read_json, read_text, write_text_atomic

CONFIG_JSON = "config.json"
CONFIG_YAML = "config.yaml"
STAGES_JSON = "stages.json"
WALL_TIME_JSON = "wall_time.json"


def is_main_process() -> bool:
    """Rank 0 of a distributed launch, or a single process (RANK unset); only it writes the run folder."""
    return int(os.environ.get("RANK", "0")) == 0


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], sections: Sequence[str] | None = None, *,
                 recorded_only: bool = False) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between a recorded config `old` and `new`: (old value, new value).

    With `sections`, the keys of those sub-mappings are compared (a key missing on one side reads as
    None, also inside nested mappings: a field added since with a null default is no change); without, the
    top-level keys. `recorded_only` compares only the keys both sides hold (a field added since that run
    started, or a record `new` does not decide, is not a change).
    """
    pairs = ([(f"{s}.", old.get(s) or {}, new.get(s) or {}) for s in sections] if sections
             else [("", old, new)])
    changed: dict[str, tuple[Any, Any]] = {}
    for prefix, a, b in pairs:
        keys = [k for k in b if k in a] if recorded_only else sorted(set(a) | set(b))
        for k in keys:
            if not _same(a.get(k), b.get(k)):
                changed[f"{prefix}{k}"] = (a.get(k), b.get(k))
    return changed


def _same(a: Any, b: Any) -> bool:
    """Equal, a key missing from one of two mappings reading as None."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return all(_same(a.get(k), b.get(k)) for k in set(a) | set(b))
    return a == b


def check_config(run_dir: Path, config: Mapping[str, Any], sections: Sequence[str],
                 started: Callable[[], bool], *, option: str = "trainer.run_dir") -> None:
    """Refuse `run_dir` when its config.json differs from `config` in `sections` and `started()` says
    it holds progress (a checkpoint or a finished stage); `option` names the setting to change."""
    previous = run_dir / CONFIG_JSON
    if not previous.is_file():
        return
    differing = list(changed_keys(read_json(previous), config, sections))
    if differing and started():
        raise ConfigError(f"{run_dir} holds a run started with a different config "
                          f"({', '.join(differing[:8])}); resuming it would mix two runs. Choose another "
                          f"{option} or delete that folder.")


def write_config(run_dir: Path, config: Mapping[str, Any]) -> None:
    """Record the resolved configuration as config.json (read back by `check_config`) and config.yaml."""
    import yaml

    write_text_atomic(run_dir / CONFIG_JSON, json.dumps(config, indent=2))
    write_text_atomic(run_dir / CONFIG_YAML, yaml.safe_dump(dict(config), sort_keys=False))


def write_stages(run_dir: Path, stages: Sequence[str]) -> None:
    """Record the stages a training run trains, in order (`stages.json`); the last one's final/ is its
    result. Written by the trainer, read by everything below or beside it that needs a run's result
    (`read_result_stage`), so no other layer repeats the trainer's stage names."""
    write_text_atomic(run_dir / STAGES_JSON, json.dumps({"stages": list(stages), "result": stages[-1]}))


def read_result_stage(run_dir: Path) -> str:
    """The stage whose final/ is `run_dir`'s result, as its trainer recorded it (DataError naming the file
    when the folder predates the record: give the stage explicitly)."""
    path = run_dir / STAGES_JSON
    if not path.is_file():
        raise DataError(f"no {STAGES_JSON}: a run folder written before stages were recorded; name the stage "
                        f"(stage=grpo, supervised, sft or distill)", file=str(run_dir))
    result = read_json(path).get("result")
    if not isinstance(result, str) or not result:
        raise DataError("no result stage recorded", file=str(path), field="result")
    return result


def prepare(run_dir: Path, config: Mapping[str, Any], sections: Sequence[str],
            started: Callable[[], bool]) -> bool:
    """On the main process: create `run_dir`, refuse a different run in it, record `config`. Returns whether
    this process is the main one (which writes metrics and summaries)."""
    main = is_main_process()
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        check_config(run_dir, config, sections, started)
        write_config(run_dir, config)
    return main


def truncate_metrics(paths: Sequence[Path], stage: str, step: int, stages: Sequence[str]) -> int:
    """Drop, from each JSON-lines file in `paths`, the lines of `stage` after `step`, its end line (it
    is being resumed), every line of a stage after it in `stages`, and a torn line; how many."""
    order = {s: i for i, s in enumerate(stages)}
    dropped = 0
    for path in paths:
        if not path.is_file():
            continue
        kept = []
        for line in read_text(path).splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                dropped += 1
                continue
            rs = rec.get("stage")
            later = rs in order and order[rs] > order[stage]
            past = rs == stage and (rec.get("step", 0) > step or rec.get("kind") == "stage_end")
            if later or past:
                dropped += 1
            else:
                kept.append(line)
        write_text_atomic(path, "".join(k + "\n" for k in kept))
    return dropped


def read_wall_time(run_dir: Path) -> tuple[float, int]:
    """(seconds, invocations) the earlier invocations of the run in `run_dir` recorded (0, 0 for a new run);
    DataError naming the file when it is malformed (delete it to restart the count)."""
    path = run_dir / WALL_TIME_JSON
    if not path.is_file():
        return 0.0, 0
    data = read_json(path)
    seconds = data.get("seconds") if isinstance(data, dict) else None
    invocations = data.get("invocations") if isinstance(data, dict) else None
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0 \
            or not isinstance(invocations, int) or isinstance(invocations, bool) or invocations < 0:
        raise DataError("expected {\"seconds\": <number >= 0>, \"invocations\": <int >= 0>}; delete the file "
                        "to restart the count", file=str(path))
    return float(seconds), invocations


def write_wall_time(run_dir: Path, earlier: tuple[float, int], seconds: float) -> tuple[float, int]:
    """Record `seconds` of one more invocation over `earlier` (`read_wall_time` at its start, so a malformed
    file stops the run before any work); returns the new (seconds, invocations)."""
    total = (earlier[0] + seconds, earlier[1] + 1)
    write_text_atomic(run_dir / WALL_TIME_JSON,
                      json.dumps({"seconds": total[0], "invocations": total[1]}, indent=2) + "\n")
    return total
