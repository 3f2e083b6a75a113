"""How tests start several CPU processes the way `accelerate launch` starts cipr-train's workers."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE_CONFIG = ROOT / "configs/accelerate/ddp.yaml"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous or a server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(*script_and_args: str, processes: int = 2, port: int | None = None,
                      extra: tuple[str, ...] = ()) -> list[str]:
    """The command line that runs `script_and_args` on `processes` processes through `accelerate launch` (the
    project's DDP accelerate config, a fresh rendezvous port unless `port`, then `extra` launch flags)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
            *extra, "--num_processes", str(processes), "--main_process_port", str(port or free_port()),
            *script_and_args]
