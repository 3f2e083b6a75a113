"""Running cipr-train's processes under `accelerate launch` on one node, with stop requests passed on.

`cipr-train launcher.num_processes=N` re-runs itself as N processes (`cipr.cli.train`). Two things
need care there, and live here:

- Which launcher. Without a config file, `accelerate launch --num_processes N` only starts N processes
  when it sees several GPUs; on a CPU machine it silently starts one. `DEFAULT_ACCELERATE_CONFIG`
  (configs/accelerate/ddp.yaml: torch elastic, gloo on CPU, NCCL on GPUs) is used when none is given;
  DeepSpeed needs no accelerate config of its own, since `distributed=zero2|zero3` hands the DeepSpeed
  config to the Trainer; FSDP takes `launcher.accelerate_config=configs/accelerate/fsdp.yaml`.
- Stop requests. The process that re-runs itself is the one Slurm (or submitit) signals before a time
  limit, and its child is the launcher, which dies on SIGUSR1/SIGUSR2. `run_launcher` therefore turns
  SIGUSR1 and SIGUSR2 (submitit's time-limit signal) into the notice file the workers check at each
  step end (`cipr.ops.preemption`), and passes SIGTERM and SIGINT on to the launcher, which stops its
  workers; it then waits for the launcher and returns its exit status.

`run_entry` is what the training runner (`cipr.train.run`) runs behind `cipr-train`: parse the config,
re-launch or train, and map the outcome to an exit status.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cipr.core.config import CONFIG_ROOT
from cipr.ops import NOTICE_ENV

log = logging.getLogger(__name__)


DEFAULT_ACCELERATE_CONFIG = CONFIG_ROOT / "accelerate" / "ddp.yaml"
NOTICE_SIGNALS = ("SIGUSR1", "SIGUSR2")
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT")


def accelerate_command(num_processes: int, port: int, accelerate_config: str | None, argv: Sequence[str],
                       module: str = "cipr.cli.train") -> list[str]:
    """`python -m accelerate.commands.launch ... -m <module> <argv>`: `num_processes` on this node."""
    if num_processes < 1:
        from cipr.core.errors import ConfigError

        raise ConfigError(f"launcher.num_processes={num_processes}: must be >= 1")
    config = accelerate_config or str(DEFAULT_ACCELERATE_CONFIG)
    if not Path(config).is_file():
        from cipr.core.errors import MissingInputError

        raise MissingInputError(f"accelerate config {config} not found (launcher.accelerate_config)")
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(num_processes),
            "--main_process_port", str(port), "--config_file", config, "-m", module, *argv]


def run_launcher(cmd: Sequence[str], notice_file: str | None = None) -> int:
    """Run the launcher `cmd`, turning SIGUSR1/SIGUSR2 into the workers' notice file (module docstring)."""
    notice_file = notice_file or os.environ.get(NOTICE_ENV)
    owned = None
    if not notice_file:
        owned = tempfile.mkdtemp(prefix="cipr-launch-")
        notice_file = str(Path(owned) / "preempt")
    env = {**os.environ, NOTICE_ENV: notice_file}
    proc = subprocess.Popen(list(cmd), env=env)

    def notice(signum: int, frame: object) -> None:
        log.warning("%s: asking the workers to save at their next step boundary and stop",
                    signal.Signals(signum).name)
        Path(notice_file).touch()

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)

    previous = {}
    for name, handler in [*((n, notice) for n in NOTICE_SIGNALS), *((n, forward) for n in FORWARDED_SIGNALS)]:
        sig = getattr(signal, name)
        previous[sig] = signal.signal(sig, handler)
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if owned is not None:
            Path(notice_file).unlink(missing_ok=True)
            os.rmdir(owned)


def check_run_dir(path: str | Path, option: str = "trainer.run_dir") -> None:
    """Refuse a run folder that names a file (or lies under one) before anything starts."""
    from cipr.core.errors import ConfigError
    from cipr.core.io import file_in_the_way

    blocker = file_in_the_way(path)
    if blocker is not None:
        raise ConfigError(f"{option}={str(path)!r}: {blocker} is a file; give a folder for the run")


def leave_process_group() -> None:
    """End this process's part of a multi-process run cleanly: a gloo process group left to interpreter exit
    sometimes aborted a finished run ("terminate called without an active exception", exit status -6). A
    colocated vLLM engine destroys its own groups, and the default one, when it shuts down at exit (destroying
    the default group first made that shutdown fail with "Invalid process group specified"), so then it is
    left."""
    import torch.distributed as dist

    if "vllm" in sys.modules:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_entry(container: dict[str, Any], parse: Callable[[dict[str, Any]], Any], train: Callable[[Any], Any],
              artifacts: Callable[[Path], str], argv: Sequence[str] | None = None) -> int:
    """Parse a resolved config, re-launch it as `launcher.num_processes` processes or train it; the exit
    status.

    0 done (or preempted after a save: rerun to resume); 2 bad input, a configuration error (nothing started)
    or a missing or damaged input file, in one line naming it (`cipr.core.errors`); 3 non-finite loss (the
    last checkpoint is intact). `parse` raises ConfigError on bad input and gives a config with a `launcher`
    (num_processes, main_process_port, accelerate_config); `train` returns the run folder, named in the
    closing line with what `artifacts(run_folder)` says it holds. A run refused before its work leaves no
    folder behind (`discard_if_unused`).
    """
    from cipr.core.errors import (
        EXIT_INPUT,
        USER_ERRORS,
        ConfigError,
        NonFiniteLossError,
        Preempted,
        debug_enabled,
        user_message,
    )

    run_folder = (container.get("trainer") or {}).get("run_dir")
    try:
        config = parse(container)
        trainer = getattr(config, "trainer", None)
        if getattr(trainer, "run_dir", None):
            check_run_dir(trainer.run_dir)
        launcher = config.launcher
        if launcher.num_processes > 1 and "LOCAL_RANK" not in os.environ:
            cmd = accelerate_command(launcher.num_processes, launcher.main_process_port,
                                     launcher.accelerate_config, sys.argv[1:] if argv is None else argv)
            log.info("launching %d processes: %s", launcher.num_processes, " ".join(cmd))
            return run_launcher(cmd)
        run_dir = train(config)
        leave_process_group()
    except NonFiniteLossError as e:
        print(f"cipr-train: {e}", file=sys.stderr)
        return 3
    except Preempted as e:
        print(f"cipr-train: {e}", file=sys.stderr)
        return 0
    except USER_ERRORS as e:
        if debug_enabled():
            raise
        kind = "configuration error: " if isinstance(e, ConfigError) else ""
        print(f"cipr-train: {kind}{user_message(e)} (CIPR_DEBUG=1 shows the traceback)", file=sys.stderr)
        if run_folder and "LOCAL_RANK" not in os.environ:
            discard_if_unused(Path(run_folder))
        return EXIT_INPUT
    print(f"cipr-train: done; run folder {run_dir} ({artifacts(Path(run_dir))})")
    return 0


START_FILES = {".hydra", "train.log", "main.log", "cipr-train.log", "config.json", "config.yaml",
               "stages.json", "wall_time.json"}
"""What a run folder holds before any work: Hydra's files, the run's resolved config and stage list, and the
wall time of the invocation that was refused."""


def discard_if_unused(run_dir: Path) -> bool:
    """Remove `run_dir` when it holds nothing but what is written on start (`START_FILES`): a run refused
    before its work (a bad option, an unreadable data file) leaves no folder for the next run to step around
    or to be refused by as a different config. A folder with anything else (metrics, a stage's checkpoints,
    a file of the user's) is never touched. Returns whether it was removed."""
    import shutil

    if not run_dir.is_dir() or any(p.name not in START_FILES for p in run_dir.iterdir()):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True
