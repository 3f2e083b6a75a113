"""One trainer stage, run the same way for every algorithm (warm start, sft, grpo, supervised, distill).

A stage lives in its own folder (`checkpoint-<step>/`, `latest.json`, `final/`, `stage.json`). Running
it: build its Trainer afresh (the previous stage's accelerator forgotten) with the metrics and
preemption callbacks (a signal saves at the next step boundary; requeued under Slurm), check that
the accelerator runs the strategy and processes asked for (`cipr.train.strategy.check_strategy`: a
silent downgrade stops here), resume from the checkpoint `trainer.resume` names (`auto`: the latest
complete one), drop the metric lines written after that step so metrics.jsonl reads as one run,
train, and on a preemption signal stop with `Preempted` once the step is saved. Finishing it: save
`final/` and mark the stage done (main process), so a rerun skips it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cipr.core.errors import Preempted
from cipr.core.io import read_json
from cipr.train.checkpoint import mark_stage_done, resolve_resume
from cipr.train.metrics import MetricsCallback, MetricsWriter
from cipr.train.strategy import check_strategy, reset_accelerator_state

log = logging.getLogger("cipr.train")


def run_stage(cfg: Any, stage: str, stage_dir: Path, writer: MetricsWriter,
              build: Callable[[list[Any]], Any]) -> tuple[int, Any]:
    """Run one stage of `cfg` in `stage_dir`, `build(callbacks)` making its Trainer; (step, trainer)."""
    from cipr.ops.preemption import PreemptionCallback, PreemptionConfig

    reset_accelerator_state()
    preemption = PreemptionCallback(PreemptionConfig(requeue=bool(os.environ.get("SLURM_JOB_ID"))))
    trainer = build([MetricsCallback(writer, stage, cfg.logging.print_metrics), preemption])
    check_strategy(trainer.accelerator, cfg.distributed.strategy)
    checkpoint = resolve_resume(cfg.trainer.resume, stage_dir)
    if checkpoint is not None:
        step = read_json(Path(checkpoint) / "trainer_state.json")["global_step"]
        log.info("resuming %s from %s (step %d)", stage, checkpoint, step)
    else:
        step = 0
    if writer.enabled:
        writer.truncate_after(stage, step)
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        preemption.flag.restore()
    if preemption.flag.set:
        raise Preempted(f"{preemption.flag.received} received: {stage} saved at step "
                        f"{trainer.state.global_step} in {stage_dir}; run the same command again "
                        f"(trainer.resume=auto) to continue")
    finish_stage(trainer, stage_dir, trainer.state.global_step)
    return trainer.state.global_step, trainer


def finish_stage(trainer: Any, stage_dir: Path, steps: int) -> Path:
    """Save `final/` and mark the stage done (the main process writes the marker); returns `final/`.

    `final/` always holds whole tensors (the next stage, cipr-export and cipr-eval read it): under FSDP
    with `SHARDED_STATE_DICT` transformers' `save_model` writes nothing, so the full state is gathered."""
    final = stage_dir / "final"
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if getattr(trainer, "is_fsdp_enabled", False) and "FULL_STATE_DICT" not in str(plugin.state_dict_type):
        state_dict = trainer.accelerator.get_state_dict(trainer.model)  # every rank takes part in the gather
        if trainer.args.should_save:
            trainer._save(str(final), state_dict=state_dict)
        trainer.accelerator.wait_for_everyone()
    else:
        trainer.save_model(str(final))
    if trainer.args.should_save:
        mark_stage_done(stage_dir, {"steps": steps, "final": "final", "time": time.time()})
    return final
