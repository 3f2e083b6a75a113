"""Safe outputs (atomic writes, and the checks that keep a command off its own inputs), and the one
way every text input is read.

Every output file is written under a temporary name in its own folder and renamed over the target
(`atomic_write`), so a reader sees the old file or the complete new one, never a torn one; a failed
write leaves nothing behind. New files and folders get the permissions the user's umask gives
(`tempfile` alone would create them private). Before writing, a command checks its output path:
`check_output_file` refuses a folder, an existing file (unless `overwrite`), and any of the
command's inputs; `check_output_dir` refuses a source or a folder holding one, and with `overwrite`
replaces only a folder that carries this project's marker file (what the command itself wrote).

Every JSON, JSON-lines or text file the package reads goes through `read_text` (or `decode_text` for
bytes already read), `read_json`/`parse_json` and `read_jsonl`/`iter_jsonl`: text is decoded as strict
UTF-8, and bytes that are not UTF-8 or text that is not JSON become one DataError naming the file and
the byte offset, or the line and column. `read_jsonl` also says what becomes of a last line torn by a
killed writer (`complete_lines`). A parquet file's rows are read by `read_parquet_rows`, with the same
one DataError for a file that is not parquet. A YAML data file shipped in the package (the synthetic
catalog, the perturbations' vocabulary) is read and checked against its JSON Schema by `read_checked_yaml`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO, Any, Literal

from cipr.core.errors import DataError, MissingInputError, UnsafeOutputError

log = logging.getLogger(__name__)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain `open(path, "w")` would give a new file (0o666 less the umask)."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The mode `mkdir` would give a new folder (0o777 less the umask)."""
    return 0o777 & ~_umask()


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh folder in `parent` (for a folder that is renamed into place) with the umask's mode."""
    path = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    path.chmod(dir_mode())
    return path


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file next to `path`, synced and renamed over `path` on success, removed on an
    exception (`path` untouched). An existing file keeps its mode; a new one gets the umask's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.is_file() else file_mode())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically (`atomic_write`)."""
    with atomic_write(path) as f:
        f.write(text)


def write_json_atomic(path: str | Path, payload: Any, indent: int | None = 2) -> None:
    """Write `payload` as JSON (with a final newline) to `path` atomically."""
    write_text_atomic(path, json.dumps(payload, indent=indent, ensure_ascii=False, default=str) + "\n")


def _resolved(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def is_within(path: str | Path, folder: str | Path) -> bool:
    """Whether `path` is `folder` or lies inside it (after resolving links)."""
    path, folder = _resolved(path), _resolved(folder)
    return path == folder or folder in path.parents


def check_output_file(out: str | Path, *, inputs: Iterable[str | Path] = (), overwrite: bool = False,
                      option: str = "out") -> Path:
    """The resolved output file, or UnsafeOutputError when writing it would be unsafe (module docstring)."""
    path = _resolved(out)
    if path.is_dir():
        raise UnsafeOutputError(f"{option}={out} is a folder: give the name of the file to write")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UnsafeOutputError(f"{option}={out}: {parent} is a file, not a folder")
            break
    for source in inputs:
        if source is not None and Path(source).expanduser().exists() and is_within(path, source):
            raise UnsafeOutputError(f"{option}={out} is (inside) this command's input {source}: "
                                    f"write the output elsewhere")
    if path.exists() and not overwrite:
        raise UnsafeOutputError(f"{option}={out} already exists: choose another name, or give "
                                "overwrite=true to replace it")
    return path


def check_not_source(out: str | Path, *, sources: Iterable[str | Path] = (), option: str = "out_dir") -> Path:
    """The resolved output folder; UnsafeOutputError when it is a file, a source, or holds a source."""
    path = _resolved(out)
    if path.exists() and not path.is_dir():
        raise UnsafeOutputError(f"{option}={out} is a file, not a folder")
    for source in sources:
        if is_within(source, path):
            what = "is" if _resolved(source) == path else "holds"
            raise UnsafeOutputError(f"{option}={out} {what} the source {source}: writing there would destroy "
                                    f"it; choose another output folder")
    return path


def check_output_dir(out: str | Path, *, sources: Iterable[str | Path] = (), marker: str,
                     overwrite: bool = False, option: str = "out_dir") -> Path:
    """The resolved output folder, or UnsafeOutputError: a source or a folder holding one is never a target;
    an existing non-empty folder is refused unless `overwrite` is given and it carries `marker`."""
    path = check_not_source(out, sources=sources, option=option)
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise UnsafeOutputError(f"{option}={out} exists and is not empty: choose another, or give "
                                    "overwrite=true")
        if not (path / marker).is_file():
            raise UnsafeOutputError(f"{option}={out} holds no {marker}, so it was not written by this "
                                    "command; overwrite=true only replaces such folders: remove it yourself "
                                    "or choose another")
    return path


def file_in_the_way(path: str | Path) -> Path | None:
    """The file at `path` or at one of its parents, which keeps a folder from being created there."""
    path = Path(path).expanduser()
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def override_value(argv: Iterable[str], key: str) -> str | None:
    """The value of a Hydra override `key=value` (or `+key=` / `++key=`) in `argv`, the last one given."""
    value = None
    for arg in argv:
        name, sep, rest = arg.partition("=")
        if sep and name.lstrip("+") == key:
            value = rest
    return value


# ---------------------------------------------------------------- reading inputs


def decode_text(data: bytes, file: str | Path) -> str:
    """`data`, the bytes of `file`, as strict UTF-8 text; DataError naming the file and the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not a UTF-8 text file ({e.reason} at byte offset {e.start})", file=str(file)) from e


def read_text(path: str | Path) -> str:
    """The text of `path`, decoded as strict UTF-8 (`decode_text`); FileNotFoundError when missing."""
    return decode_text(Path(path).read_bytes(), path)


def parse_json(text: str, file: str | Path, *, line: int = 1) -> Any:
    """The JSON value in `text`, read from `file` starting on its line `line` (a JSON-lines row);
    DataError naming the file, the line and the column where it is not valid JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON ({e.msg}: line {line + e.lineno - 1} column {e.colno})",
                        file=str(file)) from e
    except RecursionError as e:
        raise DataError(f"nests too deeply to read (from line {line})", file=str(file)) from e


def read_json(path: str | Path) -> Any:
    """The JSON value in `path` (`read_text`, `parse_json`)."""
    return parse_json(read_text(path), path)


def iter_jsonl(text: str, file: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of `text`, a JSON-lines file (`parse_json` per line)."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield number, parse_json(line, file, line=number)


def complete_lines(path: str | Path, *, cut: bool) -> bytes:
    """The bytes of `path` up to its last newline: a line torn by a kill is cut from the file (`cut`)
    or only left out of what is returned (b"" when there is no file)."""
    path = Path(path)
    if not path.exists():
        return b""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        end = data.rfind(b"\n") + 1
        if cut:
            log.warning("%s: cutting a torn last line (%d bytes) left by an interrupted run", path,
                        len(data) - end)
            with path.open("r+b") as f:
                f.truncate(end)
        data = data[:end]
    return data


def read_jsonl(path: str | Path, *, torn: Literal["error", "skip", "cut"] = "error") -> list[Any]:
    """The values of the non-blank lines of `path`, a JSON-lines file (`iter_jsonl`).

    `torn`, for a last line without a newline (a writer killed mid-line): "error" reads it like any other,
    "skip" leaves it out, "cut" also cuts it off the file (one this run appends to). With "skip" or "cut" a
    missing file reads as empty; with "error" it raises FileNotFoundError.
    """
    data = Path(path).read_bytes() if torn == "error" else complete_lines(path, cut=torn == "cut")
    return [value for _, value in iter_jsonl(decode_text(data, path), path)]


def write_jsonl_gz(path: str | Path, rows: Iterable[Any]) -> None:
    """`rows` as gzip-compressed JSON lines (sorted keys, mtime 0: the same rows give the same bytes), written
    atomically: how experiments commit their per-item records."""
    import gzip

    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    with atomic_write(path, "wb", encoding=None) as f:
        f.write(gzip.compress(text.encode("utf-8"), mtime=0))


def read_jsonl_gz(path: str | Path) -> list[Any]:
    """The rows of a gzip-compressed JSON-lines file (DataError naming the file, and the line when one is
    not JSON)."""
    import gzip

    try:
        data = gzip.decompress(Path(path).read_bytes())
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError; a cut file, EOFError
        raise DataError(f"not a readable gzip file: {e}", file=str(path)) from None
    return [r for _, r in iter_jsonl(decode_text(data, path), path)]


def read_json_list(path: str | Path, what: str, expected: str = "a JSON list of items") -> list[Any]:
    """The JSON list in `path`, a benchmark file: MissingInputError naming `what` when there is no such
    file, DataError naming the file when it is not JSON or not a list (`expected` says what it should be)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{what} not found at {path}")
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected {expected}", file=str(path))
    return data


def read_parquet_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of the parquet file `path` as dicts (pyarrow); DataError naming the file when it is not
    readable parquet, FileNotFoundError when it does not exist."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise DataError(f"not a readable parquet file: {e}", file=str(path)) from e


def read_checked_yaml(source: Traversable | Path, schema: Mapping[str, Any]) -> Any:
    """A YAML file's data, checked against the JSON Schema `schema`; one DataError naming the file and, for
    data that does not fit, the entry's path (`domains.weather.0.name`)."""
    import yaml
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    where = str(source)
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when built with it (faster)
        raw = yaml.load(source.read_text(encoding="utf-8"), Loader=loader)
    except yaml.YAMLError as e:
        raise DataError(f"not valid YAML: {e}", file=where) from None
    error = best_match(Draft202012Validator(schema).iter_errors(raw))
    if error is not None:
        raise DataError(error.message, file=where, item=".".join(map(str, error.absolute_path)) or None)
    return raw
