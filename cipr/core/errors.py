"""The project's error vocabulary and the one policy every command applies to it.

Every error a user can cause by what they typed or pointed us at derives from `CiprError`:
`DataError` (a file, item or field is wrong; `MissingInputError` when it does not exist),
`ConfigError` (an option cannot run), `UnsafeOutputError` (an output path would overwrite or delete
something we did not create). `cli_errors` turns any of
them, and the standard library's errors for missing or unreadable files, into one line on stderr and
exit status 2; `--debug` on a command, or `CIPR_DEBUG=1`, shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

EXIT_INPUT = 2


class CiprError(Exception):
    """Base of every error caused by the user's input or configuration (never by a bug of ours)."""


class DataError(CiprError, ValueError):
    """Bad input data: says which file, which item and which field is wrong, and why."""

    def __init__(self, message: str, *, file: str | None = None, item: str | None = None,
                 field: str | None = None) -> None:
        self.file, self.item, self.field, self.reason = file, item, field, message
        where = ", ".join(f"{k} {v!r}" for k, v in (("file", file), ("item", item), ("field", field)) if v)
        super().__init__(f"{where}: {message}" if where else message)


class MissingInputError(DataError, FileNotFoundError):
    """An input file or folder that does not exist: says which, and how to get it."""


class ConfigError(CiprError, ValueError):
    """A configuration that cannot run: says which key is wrong and what to change."""


class Preempted(RuntimeError):
    """A preemption signal stopped the run after a saved checkpoint; rerun the same command to resume."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stopped before applying it."""


class UnsafeOutputError(CiprError, ValueError):
    """An output path that would overwrite or delete an input, a parent of one, or a folder not ours."""


def debug_enabled(argv: list[str] | None = None) -> bool:
    """Whether tracebacks are wanted: `--debug` among the arguments, or CIPR_DEBUG set to a true value."""
    args = sys.argv[1:] if argv is None else argv
    return "--debug" in args or os.environ.get("CIPR_DEBUG", "").lower() in ("1", "true", "yes")


USER_ERRORS = (CiprError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
               PermissionError)


def user_message(e: BaseException) -> str | None:
    """The one-line message of an error the user caused (`USER_ERRORS`), or None for anything else (a bug)."""
    if not isinstance(e, USER_ERRORS):
        return None
    if isinstance(e, CiprError) or getattr(e, "filename", None) is None:
        return " ".join(str(e).split("\n"))
    return f"{e.strerror or type(e).__name__}: {e.filename}"


def report(program: str, e: BaseException) -> None:
    """Print `program: message` for a user error on stderr (one line)."""
    print(f"{program}: {user_message(e)} (CIPR_DEBUG=1 shows the traceback)", file=sys.stderr)


def pop_debug_flag(argv: list[str] | None = None) -> list[str]:
    """Remove `--debug` from `argv` (default: sys.argv, in place), setting CIPR_DEBUG=1 when it was there:
    Hydra commands would read it as an unknown option, and the variable reaches any process the command
    starts."""
    args = sys.argv if argv is None else argv
    if "--debug" in args:
        args[:] = [a for a in args if a != "--debug"]
        os.environ["CIPR_DEBUG"] = "1"
    return args


@contextlib.contextmanager
def cli_errors(program: str, debug: bool | None = None) -> Iterator[None]:
    """Run a command's body: a `CiprError` or an unreadable file becomes `program: message` and exit 2;
    anything else is a bug and keeps its traceback. With `debug`, nothing is caught."""
    if debug if debug is not None else debug_enabled():
        yield
        return
    try:
        yield
    except USER_ERRORS as e:
        report(program, e)
        raise SystemExit(EXIT_INPUT) from None
