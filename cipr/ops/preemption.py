"""Preemption: a signal only sets a flag; the training loop saves at the next step boundary and stops.

How a stop is asked for:
- `#SBATCH --signal=B:USR1@<seconds>` makes Slurm signal the batch shell before the time limit.
  The shell (slurm/common.sh) does not kill anything: it creates the notice file named by
  `$CIPR_PREEMPT_FILE`, which every training process checks at each step end (one `stat`). A file
  rather than a forwarded signal, because under `accelerate launch` the shell's child is a launcher
  (torch elastic agent) whose default action on USR1 is to die and orphan its workers.
- SIGUSR1 sent to a training process directly (`scancel --signal=USR1 --full`, `kill -USR1`), or
  SIGUSR2, submitit's time-limit signal (Hydra sweeps with `launcher=slurm`; submitit's own handler
  would requeue and exit at once, mid-step).
- SIGTERM: what `scancel`, `scontrol requeue` and scheduler preemption send to every process of the
  job, `KillWait` seconds (30 by default) before SIGKILL.

What happens: the handler only records the signal, because saving inside a signal handler could
interrupt a half-finished optimizer step. `PreemptionCallback` (a transformers `TrainerCallback`)
reads the flag at each step end; with several processes it takes the maximum over all ranks (one
all-reduce of a scalar per step), so every rank stops after the same step; a rank stopping alone
would leave the others waiting in a collective. It then asks the Trainer to save and stop. When
training has ended (after an all-reduce that also acts as a barrier, so every rank has finished
writing its part of the checkpoint), rank 0 requeues the Slurm job, and the requeued job resumes
from that checkpoint (`trainer.resume=auto`). When the signal had a Python handler before training
took it over (submitit's USR2 handler, in a `launcher=slurm` sweep), that handler is called instead,
so submitit requeues the job through its own bookkeeping (`max_num_timeout`).

Requeue only on USR1, USR2 or the notice file: after SIGTERM, Slurm has already decided (a requeue or
a preemption requeues the job by itself; `scancel` means stop, and requeueing would undo it).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from transformers import TrainerCallback

from cipr.ops import NOTICE_ENV

log = logging.getLogger(__name__)

NOTICE = "notice file"
# What each reason asks for, as the integer all ranks agree on with an all-reduce (max).
NONE, STOP, STOP_AND_REQUEUE = 0, 1, 2
REQUEUE_REASONS = ("SIGUSR1", "SIGUSR2", NOTICE)


@dataclass
class PreemptionConfig:
    """Which signals mean "save and stop", the notice file, and whether to requeue the Slurm job afterwards.
    `notice_file`: None reads `$CIPR_PREEMPT_FILE` (set by slurm/common.sh); "" disables it."""

    signals: tuple[str, ...] = ("SIGUSR1", "SIGUSR2", "SIGTERM")
    requeue: bool = True
    notice_file: str | None = None


def severity(reason: str | None) -> int:
    """NONE, STOP or STOP_AND_REQUEUE for a stop reason (a signal name, the notice file, or None)."""
    if reason is None:
        return NONE
    return STOP_AND_REQUEUE if reason in REQUEUE_REASONS else STOP


class PreemptionFlag:
    """Set by the registered signals (or, when polled, by the notice file); read at step boundaries."""

    def __init__(self, signals: Iterable[str] = ("SIGUSR1", "SIGUSR2", "SIGTERM"),
                 notice_file: str | None = None) -> None:
        self.received: str | None = None
        self.notice_file = notice_file or None
        self._previous: dict[int, object] = {}
        for name in signals:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    @property
    def set(self) -> bool:
        return self.received is not None

    def poll(self) -> bool:
        """Whether a stop was asked for: a signal arrived, or the notice file exists now."""
        if self.received is None and self.notice_file and os.path.exists(self.notice_file):
            self.received = NOTICE
        return self.received is not None

    def previous(self, name: str | None) -> Callable[[int, object], object] | None:
        """The Python handler `name` had before this flag took it over (e.g. submitit's), if any."""
        handler = self._previous.get(getattr(signal, name)) if name and name.startswith("SIG") else None
        return handler if callable(handler) else None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def agree(value: int, device: object = None) -> int:
    """The maximum of `value` over all ranks (one all-reduce); `value` itself in a single process."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


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
    # said before the call: Slurm may end this job with SIGTERM before scontrol returns
    log.warning("requeueing Slurm job %s", job_id)
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.error("scontrol requeue %s failed: %s", job_id, e)
        return False
    if result.returncode != 0:
        log.error("scontrol requeue %s failed: %s", job_id, result.stderr.strip())
        return False
    log.warning("requeued Slurm job %s", job_id)
    return True


class PreemptionCallback(TrainerCallback):
    """Save at the step boundary after a stop request, stop on every rank, and (rank 0) requeue the job."""

    def __init__(self, config: PreemptionConfig | None = None) -> None:
        self.config = config or PreemptionConfig()
        notice = (self.config.notice_file if self.config.notice_file is not None
                  else os.environ.get(NOTICE_ENV))
        self.flag = PreemptionFlag(self.config.signals, notice)
        self.decision = NONE
        self.requeued = False

    def _agree(self, args) -> int:
        local = severity(self.flag.received if self.flag.poll() else None)
        decision = agree(local, getattr(args, "device", None))
        if decision and not self.flag.set:
            self.flag.received = "another process's stop request"
        self.decision = max(self.decision, decision)
        return decision

    def on_step_end(self, args, state, control, **kwargs):
        if self._agree(args):
            log.warning("stop requested (%s): saving at step %d and stopping", self.flag.received,
                        state.global_step)
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._agree(args)  # also a barrier: every rank has written its part of the last checkpoint
        reason = self.flag.received
        handler = self.flag.previous(reason)
        self.flag.restore()
        if self.decision == STOP_AND_REQUEUE and self.config.requeue and state.is_world_process_zero \
                and not self.requeued:
            self.requeued = True
            if handler is not None:  # submitit's: it requeues through its own bookkeeping, then exits
                log.warning("handing %s to the handler installed before training, now that the run is saved",
                            reason)
                handler(getattr(signal, reason), None)
            else:
                self.requeued = requeue_slurm_job()
        return control
