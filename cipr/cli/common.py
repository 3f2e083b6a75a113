"""What every command does before its own work: stay offline unless the user opted in, log at INFO."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def begin() -> None:
    """HF_HUB_OFFLINE=1 unless downloads were allowed (`cipr.runtime.hub`), and INFO logging to stderr."""
    from cipr.runtime.hub import stay_offline

    stay_offline()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def key_value_argv(argv: Sequence[str] | None, doc: str | None) -> list[str] | None:
    """The arguments of a `key=value` command (`cipr-serve`, `cipr-tau2`) after `begin()`; None once
    `doc` has been printed for -h, --help or help."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in args):
        print(doc)
        return None
    begin()
    return args
