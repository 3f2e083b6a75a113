"""Preemption: a signal only sets a flag; the training loop saves at the next step boundary and stops.

Slurm sends the signal asked for with `#SBATCH --signal=B:USR1@<seconds>` (to the batch shell, which
forwards it to the job step) before the time limit, and `scontrol requeue` sends SIGTERM. The
handler does nothing but set a flag, because saving inside a signal handler could interrupt a
half-finished optimizer step. `PreemptionCallback` (a transformers `TrainerCallback`) checks the
flag at each step end, asks the Trainer to save and stop, and after the save (its checkpoint is
then complete and tracked) rank 0 requeues the Slurm job so the next allocation resumes from it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from transformers import TrainerCallback

log = logging.getLogger(__name__)


@dataclass
class PreemptionConfig:
    """Which signals mean "save and stop", and whether to requeue the Slurm job afterwards."""

    signals: tuple[str, ...] = ("SIGUSR1", "SIGTERM")
    requeue: bool = True


class PreemptionFlag:
    """Set by the registered signals; read by the training loop at step boundaries."""

    def __init__(self, signals: Iterable[str] = ("SIGUSR1", "SIGTERM")) -> None:
        self.received: str | None = None
        self._previous: dict[int, object] = {}
        for name in signals:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum).name

    @property
    def set(self) -> bool:
        return self.received is not None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def slurm_job_id() -> str | None:
    """The job id to requeue: the array job's own id where Slurm sets one."""
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_slurm_job(job_id: str | None = None) -> bool:
    """`scontrol requeue <job>`; False (and a log line) outside Slurm or when scontrol fails."""
    job_id = job_id or slurm_job_id()
    if not job_id:
        log.info("not running under Slurm: nothing to requeue")
        return False
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log.error("scontrol requeue %s failed: %s", job_id, result.stderr.strip())
        return False
    log.warning("requeued Slurm job %s", job_id)
    return True


class PreemptionCallback(TrainerCallback):
    """Save at the step boundary after a preemption signal, stop, and (rank 0) requeue the job."""

    def __init__(self, config: PreemptionConfig | None = None) -> None:
        self.config = config or PreemptionConfig()
        self.flag = PreemptionFlag(self.config.signals)
        self.saved_after_signal = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.flag.set:
            log.warning("received %s: saving at step %d and stopping", self.flag.received, state.global_step)
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.flag.set and not self.saved_after_signal:
            self.saved_after_signal = True
            if self.config.requeue and state.is_world_process_zero:
                requeue_slurm_job()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.flag.restore()
        return control
