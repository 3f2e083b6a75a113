"""Where the benchmark data lives: `$CIPR_DATA_ROOT`, else `../shared/data` beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

from cipr.core.errors import MissingInputError

_REPO = Path(__file__).resolve().parents[2]


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The data root: the argument, `$CIPR_DATA_ROOT`, or `<repo>/../shared/data` (the project's copy)."""
    if root is not None:
        return Path(root)
    env = os.environ.get("CIPR_DATA_ROOT")
    if env:
        return Path(env)
    return _REPO.parent / "shared" / "data"


def require_dir(path: Path, what: str) -> Path:
    """`path` if it is a directory; else a MissingInputError that says how to get the data."""
    if not path.is_dir():
        raise MissingInputError(
            f"{what} not found at {path}. Point at the data root with data_root=DIR (cipr-data, cipr-eval) "
            f"or set CIPR_DATA_ROOT; for BFCL, `cipr-data fetch data_root=DIR`.")
    return path
