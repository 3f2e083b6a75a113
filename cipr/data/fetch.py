"""Fetch BFCL v4 from the pinned `bfcl-eval` wheel on the package index, for users without our copy.

`fetch_bfcl(dest)` runs `python -m pip download --no-deps bfcl-eval==2026.3.23` into a temporary
directory (pip honours the user's index configuration: PIP_INDEX_URL, pip.conf), checks the wheel's
SHA-256 against the pinned hash, and extracts only the members under `bfcl_eval/data/` into
`<dest>/bfcl_v4/` (the layout of ../shared/data/bfcl_v4: `BFCL_v4_*.json`, `possible_answer/`, ...).
The data is written to a temporary sibling folder and renamed into place, so an interrupted fetch
never leaves a half-written `bfcl_v4/`; an existing `bfcl_v4/` is replaced only with `overwrite=True`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from cipr.core.errors import CiprError
from cipr.core.io import make_temp_dir

BFCL_EVAL_VERSION = "2026.3.23"
BFCL_EVAL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
DATA_PREFIX = "bfcl_eval/data/"


class FetchError(CiprError, RuntimeError):
    """The download failed, the wheel is not the pinned one, or it does not hold the data."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_wheel(workdir: Path, *, version: str = BFCL_EVAL_VERSION, timeout: float = 600.0) -> Path:
    """Download the bfcl-eval wheel (no dependencies) into `workdir`; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--no-input", "-d", str(workdir), f"bfcl-eval=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise FetchError(f"`pip download` of bfcl-eval=={version} failed (exit {proc.returncode}); is the "
                         f"package index reachable?\n{tail}")
    wheels = sorted(workdir.glob("bfcl_eval-*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"expected one bfcl_eval wheel in {workdir}, found {[w.name for w in wheels]}")
    return wheels[0]


def verify_wheel(wheel: Path, sha256: str = BFCL_EVAL_SHA256) -> None:
    """Raise FetchError unless the wheel's SHA-256 is the pinned one."""
    got = sha256_file(wheel)
    if got != sha256:
        raise FetchError(f"SHA-256 mismatch for {wheel.name}: got {got}, expected {sha256}. The file is not "
                         f"the pinned bfcl-eval {BFCL_EVAL_VERSION} wheel; refusing to use it.")


def extract_data(wheel: Path, target: Path) -> int:
    """Extract the members under `bfcl_eval/data/` into `target` (created); returns the number of files."""
    n = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(DATA_PREFIX) or info.is_dir():
                continue
            rel = PurePosixPath(info.filename[len(DATA_PREFIX):])
            if rel.is_absolute() or ".." in rel.parts:
                raise FetchError(f"unsafe path in wheel: {info.filename}")
            out = target.joinpath(*rel.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            n += 1
    if n == 0:
        raise FetchError(f"{wheel.name} holds no files under {DATA_PREFIX}")
    return n


def fetch_bfcl(dest: str | Path, *, overwrite: bool = False, wheel: str | Path | None = None,
               sha256: str = BFCL_EVAL_SHA256) -> Path:
    """Write BFCL v4 to `<dest>/bfcl_v4/` from the pinned bfcl-eval wheel (`wheel`: a downloaded one, verified
    all the same); returns that folder. FetchError on a failed download, a hash mismatch, or an existing
    `bfcl_v4/` without `overwrite`."""
    dest = Path(dest)
    target = dest / "bfcl_v4"
    if target.exists() and not overwrite:
        raise FetchError(f"{target} already exists: remove it first, or choose another data_root")
    if dest.exists() and not dest.is_dir():
        raise FetchError(f"data_root={dest} is a file, not a folder")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cipr-bfcl-") as tmp:
        tmpdir = Path(tmp)
        whl = Path(wheel) if wheel is not None else download_wheel(tmpdir)
        verify_wheel(whl, sha256)
        staging = make_temp_dir(dest, ".bfcl_v4-")
        try:
            extract_data(whl, staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target
