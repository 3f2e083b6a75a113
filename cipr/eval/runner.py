"""The evaluation loop: item × perturbation × order → generate → parse → translate back → score →
classify → one line of results.jsonl.

Crash safety: records are flushed as each chunk (`chunk_size` items) is scored, so a crash loses at
most the chunk in flight. A rerun reads the keys present (`id`, `names`, `perturbation`, `order`) and
evaluates only the rest; a torn last line is cut off before appending.

Robustness: parsing never raises (call-format contract); a backend failure is recorded with class
`backend_error`; a scorer that raises on some output is recorded with error `scorer_error` and the
exception text (counted in the summary, never dropped) rather than ending the run.

Choices: a response the call format reports as malformed (`ParseResult.ok` False) is incorrect even
if some calls could be read out of it (`strict_parse`, as BFCL counts a decode failure as wrong). A
canonical id the adapter cannot translate back makes the response incorrect (`undeclared_tool`): the
adapter reports it, it never guesses a declared tool.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from tqdm import tqdm

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import complete_lines, decode_text, parse_json
from cipr.eval.report import RESULTS
from cipr.eval.taxonomy import TaxonomyConfig, classify
from cipr.formats.base import CallFormat, ParseResult
from cipr.runtime.backends import Backend, Generation, GenRequest
from cipr.tools.canonical import NameMap
from cipr.tools.interface import Call, Example

log = logging.getLogger(__name__)

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Verdict:
    """A scorer's answer: correct or not, and if not, the scorer's error class and message."""

    correct: bool
    error: str | None = None
    detail: str = ""


class Scorer(Protocol):
    """Scores one response: `calls` are translated back to `target`'s names; `shown` is what the model
    saw; `text` and `parse` are the raw output and its parse (RoTBench reads the text itself)."""

    def __call__(self, *, calls: Sequence[Call], target: Example, shown: Example, text: str,
                 parse: ParseResult) -> Verdict: ...


@dataclass(frozen=True)
class ItemKey:
    """What names an evaluation record: item, partition, names, perturbation (and its group), tool order;
    `key` is its record's key in results.jsonl."""

    id: str
    partition: str
    names: str
    perturbation: str
    group: str
    order: str

    @property
    def key(self) -> Key:
        return (self.id, self.names, self.perturbation, self.order)


@dataclass(frozen=True)
class EvalItem(ItemKey):
    """One unit of evaluation.

    - `shown`: the example as the model sees it (canonical ids under the adapter);
    - `target`: the example the response is scored against, in executable names (the perturbed
      interface with its own names, and its rewritten reference);
    - `name_map`: shown names → target names (the adapter's map), None when the model sees `target`'s
      names directly;
    - `familiar`: the unperturbed reference calls written in the shown namespace (replay backend).
    """

    shown: Example
    target: Example
    name_map: NameMap | None = None
    familiar: tuple[Call, ...] = ()


@dataclass
class RunnerConfig:
    """`chunk_size` items per backend call (and per flush); `strict_parse` see the module docstring."""

    chunk_size: int = 32
    strict_parse: bool = True
    progress: bool = True
    taxonomy: TaxonomyConfig = field(default_factory=TaxonomyConfig)


@dataclass
class RunStats:
    total: int = 0
    skipped: int = 0
    evaluated: int = 0
    correct: int = 0
    torn_lines: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def append_record(f: TextIO, rec: dict[str, Any], stats: RunStats) -> None:
    """Write one results.jsonl record as a flushed line and count it in `stats` (items and episodes alike)."""
    f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
    f.flush()
    stats.evaluated += 1
    stats.correct += rec["correct"]
    if rec["error"]:
        stats.errors[rec["error"]] = stats.errors.get(rec["error"], 0) + 1


def record_key(rec: dict[str, Any]) -> Key:
    return (rec["id"], rec["names"], rec["perturbation"], rec["order"])


def existing_keys(path: Path) -> tuple[set[Key], int]:
    """Keys already in results.jsonl, after cutting off a torn last line (returns how many were cut)."""
    if not path.exists():
        return set(), 0
    size = path.stat().st_size
    data = complete_lines(path, cut=True)
    return _keys(data, path), int(len(data) < size)


def recorded_keys(path: Path) -> set[Key]:
    """Keys of the complete lines of results.jsonl, read only (a torn last line is ignored, not cut)."""
    if not path.is_file():
        return set()
    return _keys(complete_lines(path, cut=False), path)


def _keys(data: bytes, path: Path) -> set[Key]:
    keys: set[Key] = set()
    for i, line in enumerate(decode_text(data, path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            keys.add(record_key(parse_json(line, path, line=i)))
        except DataError as e:
            raise DataError(f"line {i} is not a result record: {e.reason}", file=str(path),
                            field="results") from e
        except (KeyError, TypeError) as e:
            raise DataError(f"line {i} is not a result record: {e}", file=str(path), field="results") from e
    return keys


def check_same_selection(items: Sequence[EvalItem], out_dir: str | Path) -> None:
    """Refuse a rerun that would mix runs: results in `out_dir` for units this run does not select (a
    rerun may continue or extend a run; one selecting less would report the older run's units too)."""
    path = Path(out_dir) / RESULTS
    foreign = recorded_keys(path) - {it.key for it in items}
    if foreign:
        example = sorted(foreign)[0]
        raise ConfigError(f"{path} already holds {len(foreign)} results this run does not select (e.g. item "
                          f"{example[0]!r}, names {example[1]}, perturbation {example[2]}): it was written "
                          f"by a larger or different run. Rerun with the same or a larger selection "
                          f"(limit, partitions, perturbations, names), or use a new out_dir")


def translate(calls: Sequence[Call], name_map: NameMap | None) -> tuple[tuple[Call, ...], tuple[str, ...]]:
    """Calls in target names, and the names the adapter could not translate (undeclared ids)."""
    if name_map is None:
        return tuple(calls), ()
    out, errors = name_map.translate_each(calls)
    return out, tuple(e.name for e in errors)


def evaluate_one(item: EvalItem, gen: Generation, fmt: CallFormat, scorer: Scorer,
                 config: RunnerConfig | None = None) -> dict[str, Any]:
    """The results.jsonl record of one generation."""
    config = config or RunnerConfig()
    parse = gen.parsed if gen.parsed is not None else fmt.parse(gen.text)
    translated, undeclared = translate(parse.calls, item.name_map)
    detail = ""
    if gen.error is not None:
        correct, error, detail = False, "backend_error", gen.error
    elif not parse.ok and config.strict_parse:
        correct, error, detail = False, "parse_failure", parse.error or ""
    elif undeclared:
        correct, error = False, "undeclared_tool"
        detail = f"not declared by the interface: {', '.join(undeclared)}"
    else:
        try:
            v = scorer(calls=translated, target=item.target, shown=item.shown, text=gen.text, parse=parse)
            correct, error, detail = v.correct, v.error, v.detail
        except Exception as e:  # noqa: BLE001 - recorded and counted, never ends the run
            correct, error, detail = False, "scorer_error", f"{type(e).__name__}: {e}"
    taxonomy = classify(interface=item.target.interface, reference=item.target.reference, calls=translated,
                        correct=correct,
                        parse_ok=(parse.ok or not config.strict_parse) and error != "parse_failure",
                        undeclared=undeclared, backend_error=gen.error is not None, config=config.taxonomy)
    return {
        "id": item.id, "partition": item.partition, "names": item.names, "perturbation": item.perturbation,
        "group": item.group, "order": item.order,
        "raw": gen.text,
        "parse_ok": parse.ok, "parse_error": parse.error,
        "calls": [c.to_dict() for c in parse.calls],
        "translated": [c.to_dict() for c in translated],
        "undeclared": list(undeclared),
        "reference": [c.to_dict() for c in item.target.reference],
        "correct": bool(correct), "error": error, "detail": detail[:1000], "taxonomy": taxonomy,
        "attempts": gen.attempts,
    }


def _chunks(seq: Sequence[EvalItem], n: int) -> Iterable[Sequence[EvalItem]]:
    for i in range(0, len(seq), max(1, n)):
        yield seq[i:i + n]


def run_items(items: Sequence[EvalItem], backend: Backend, fmt: CallFormat, scorer: Scorer,
              out_dir: str | Path, config: RunnerConfig | None = None,
              on_chunk: Callable[[int], None] | None = None) -> RunStats:
    """Evaluate every item not yet in `out_dir/results.jsonl`, appending one flushed line per item;
    `on_chunk(i)` runs after chunk i is written (progress; tests simulate a crash with it). Items whose
    type runs them itself (`run_items`: a multi-turn benchmark's episodes, `cipr.eval.episodes.EpisodeItem`,
    scored by their environment) go there."""
    own = getattr(type(items[0]), "run_items", None) if items else None
    if own is not None:
        return own(items, backend, fmt, out_dir, config)
    config = config or RunnerConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS
    seen: set[Key] = set()
    for it in items:
        if it.key in seen:
            raise DataError(f"item key {it.key} occurs twice in the evaluation set", item=it.id, field="id")
        seen.add(it.key)
    done, torn = existing_keys(path)
    pending = [it for it in items if it.key not in done]
    stats = RunStats(total=len(items), skipped=len(items) - len(pending), torn_lines=torn)
    if stats.skipped:
        log.info("resuming: %d of %d records already in %s", stats.skipped, len(items), path)
    with path.open("a", encoding="utf-8") as f, tqdm(total=len(pending), desc=f"eval {out.name}", unit="item",
                                                     disable=not config.progress) as bar:
        for n_chunk, chunk in enumerate(_chunks(pending, config.chunk_size)):
            gens = backend.generate([GenRequest(it.shown, familiar=it.familiar) for it in chunk])
            if len(gens) != len(chunk):
                raise RuntimeError(f"backend {backend.name} returned {len(gens)} outputs "
                                   f"for {len(chunk)} items")
            for it, gen in zip(chunk, gens, strict=True):
                append_record(f, evaluate_one(it, gen, fmt, scorer, config), stats)
            os.fsync(f.fileno())
            bar.update(len(chunk))
            if on_chunk is not None:
                on_chunk(n_chunk)
    return stats
