"""The guard's drift evaluation (the study's protocol) on BFCL: clean run, drifted run, guarded run.

For every item: the model answers the undrifted item (`clean`) and the drifted one (`drift`,
`drift_mild` or `drift_medium` of `cipr.perturb`); then each guard policy processes the drifted reply
against a snapshot of the drifted interface (what the deployment serves is what it authorized) and its
final calls are scored (`guard`). The generations are shared by all policies, so they differ only by
what the guard does. Metrics: `cipr.guard.metrics.summarize`.

    cipr-eval model=DIR format=toolrl guard.enabled=true guard.setting=mild \\
        guard.policies=[none,naive_retry,tool_list,repair] guard.sample=study200 out_dir=runs/guard_mild

Choices the guide and study (docs/references.md) leave open:
- `none` is no guard at all: its "after" is the drifted result itself (a validate-only gate is
  `Guard(policy="none")`, which blocks invalid calls but cannot make an item correct).
- A reply is scored strictly, as the evaluation runner does: one the call format reports as malformed
  is wrong even if a call could be read out of it. The guard reads such replies leniently, so fixing
  one without a model call counts as a guard fix.
- Every BFCL item needs a call, so the guard runs with `require_call=True` (a text answer gets the
  missing-name path). Java and JavaScript items pass values as source literals in strings, so
  their type checks are off (`ValidatorConfig(check_types=False)`); enums are checked everywhere.
- The study sample: 50 items from each of simple_python, multiple, live_simple and live_multiple,
  drawn with `random.Random(seed)` per partition and kept in load order (`study_sample`).
- Token overhead counts prompt and completion tokens on both sides (the guard's calls, and the
  drifted call), as reported by the backend.

Output folder (`out_dir`): results.jsonl (one row per item, every policy in it), audit.jsonl (one
record per item and guarded policy, `item_id` "ID|policy"), summary.json and run.json (the
configuration). A rerun into the same folder resumes: files are only appended to, items with a row
are skipped, an item's audit records are written together just before its row and never twice; only
a last line torn by a crash is cut off. The summary covers every requested item. A folder holding
another configuration or kind of run, unreadable files, or rows for items this run does not ask for
(another sample, shard or limit) is refused untouched.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import ConfigError, DataError, UnsafeOutputError
from cipr.core.io import complete_lines, decode_text, iter_jsonl, read_json
from cipr.guard.audit import AuditLog
from cipr.guard.contract import ContractSnapshot
from cipr.guard.guard import POLICIES, Guard, GuardConfig
from cipr.guard.metrics import ItemOutcome, summarize
from cipr.guard.parse import parse_reply
from cipr.guard.validator import ValidatorConfig
from cipr.runtime.backends import Backend, GenRequest, Usage
from cipr.tools.interface import Call, Example

STUDY_PARTITIONS = ("simple_python", "multiple", "live_simple", "live_multiple")
SETTINGS = {"mild": "drift_mild", "medium": "drift_medium"}
RESULTS, AUDIT, SUMMARY, RUN_META = "results.jsonl", "audit.jsonl", "summary.json", "run.json"
RUN_KIND = "guard_eval"

Scorer = Callable[[Sequence[Call], Example], bool]


def bfcl_correct(calls: Sequence[Call], example: Example) -> bool:
    """BFCL AST matching (`cipr.scoring.bfcl.score_bfcl`, with the paper's any-declaration fix)."""
    from cipr.scoring.bfcl import score_bfcl

    return bool(score_bfcl(calls, example).correct)


def study_sample(examples: Sequence[Example], *, per_partition: int = 50,
                 partitions: Sequence[str] = STUDY_PARTITIONS, seed: int = 0) -> list[Example]:
    """The study's BFCL-200: `per_partition` items from each partition, seeded, in load order."""
    out: list[Example] = []
    for part in partitions:
        pool = [i for i, e in enumerate(examples) if e.partition == part]
        if len(pool) < per_partition:
            raise DataError(f"partition {part!r} has {len(pool)} items, fewer than the {per_partition} "
                            "to sample", field="partition")
        chosen = sorted(random.Random(f"{seed}:{part}").sample(pool, per_partition))
        out.extend(examples[i] for i in chosen)
    return out


@dataclass(frozen=True)
class GuardEvalConfig:
    """The drift evaluation's options: `cipr-eval guard.enabled=true guard.setting=...`.

    - `setting`: mild | medium drift (`drift_mild` / `drift_medium` of `cipr.perturb`).
    - `policies`: the guard policies compared; `none` always runs too (recoveries and harms need it).
    - `sample`: study200 (the study's 200 items, `study_sample`) | full (all 2,501 BFCL items).
    - `shard`: "K/N", every N-th item from K (one process per shard); None: all.
    - `budget`: new tokens of each guard model call; `candidate_retry`, `cards`:
      `cipr.guard.guard.GuardConfig`.
    - `enabled`: whether `cipr-eval` runs this evaluation instead of the accuracy one.
    The seed and the task turns' token bound are the evaluation's own (`seed`, `max_new_tokens` of cipr-eval).
    """

    enabled: bool = False
    setting: Literal["mild", "medium"] = "mild"
    policies: tuple[str, ...] = POLICIES
    sample: Literal["study200", "full"] = "study200"
    shard: str | None = None
    budget: int = 512
    candidate_retry: bool = True
    cards: bool = True

    def __post_init__(self) -> None:
        if self.setting not in SETTINGS:
            raise ConfigError(f"unknown drift setting {self.setting!r}; "
                              f"expected one of {', '.join(SETTINGS)}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ConfigError(f"unknown guard policies {bad}; expected some of {', '.join(POLICIES)}")
        if len(set(self.policies)) != len(self.policies):
            raise ConfigError(f"guard policies must name each policy once; got {list(self.policies)}")
        object.__setattr__(self, "policies", tuple(dict.fromkeys(("none", *self.policies))))
        if self.sample not in ("study200", "full"):
            raise ConfigError(f"guard sample {self.sample!r}: expected study200 or full")
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"budget must be a positive number of tokens, got {self.budget!r}")
        self.shard_slice()

    def shard_slice(self) -> tuple[int, int] | None:
        """(K, N) of `shard`, or None; a malformed shard raises ConfigError."""
        if self.shard is None:
            return None
        try:
            k, n = (int(x) for x in str(self.shard).split("/"))
        except ValueError:
            raise ConfigError(f"shard must be K/N with 0 <= K < N, got {self.shard!r}") from None
        if not 0 <= k < n:
            raise ConfigError(f"shard must be K/N with 0 <= K < N, got {self.shard!r}")
        return k, n

    def identity(self, call_format: Any = None, *, seed: int = 0,
                 max_new_tokens: int = 512) -> dict[str, Any]:
        """What run.json records, and what a resumed run must match."""
        return {"setting": self.setting, "perturbation": SETTINGS[self.setting],
                "policies": list(self.policies), "seed": seed, "max_new_tokens": max_new_tokens,
                "budget": self.budget, "candidate_retry": self.candidate_retry, "cards": self.cards,
                "call_format": getattr(call_format, "name", None) if call_format is not None else "json"}


def guard_examples(config: GuardEvalConfig, *, seed: int, data_root: str | Path | None = None,
                   partitions: Sequence[str] | None = None, limit: int | None = None) -> list[Example]:
    """The items: the sample (study200, or full BFCL's `partitions`), then the shard, then `limit`."""
    from cipr.data.bfcl import load_bfcl

    if config.sample == "study200":
        examples = study_sample(load_bfcl(data_root, partitions=STUDY_PARTITIONS), seed=seed)
    else:
        examples = load_bfcl(data_root, partitions=partitions)
    shard = config.shard_slice()
    if shard is not None:
        examples = examples[shard[0]::shard[1]]
    return examples[:limit] if limit is not None else examples


@dataclass
class GuardEvalResult:
    """Per policy: the item outcomes and their summary; `rows` are the per-item records written out."""

    outcomes: dict[str, list[ItemOutcome]] = field(default_factory=dict)
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)


def _generate(backend: Backend, examples: Sequence[Example], max_tokens: int) -> list[tuple[str, Usage]]:
    """(text, tokens) of one task turn per example, in one batch (a failed item: empty text, wrong)."""
    return [(g.text, g.usage)
            for g in backend.generate([GenRequest(e, max_new_tokens=max_tokens) for e in examples])]


def _strict_calls(text: str, call_format: Any) -> tuple[Call, ...] | None:
    """The calls of a reply, or None when the reply is malformed (scored wrong, as the runner does)."""
    if call_format is not None:
        result = call_format.parse(text)
        return tuple(result.calls) if result.ok else None
    parsed = parse_reply(text)
    return parsed.calls if parsed.error is None else None


def _score(text: str, example: Example, call_format: Any, scorer: Scorer) -> bool:
    calls = _strict_calls(text, call_format)
    return calls is not None and scorer(calls, example)


def drifted(example: Example, setting: str, seed: int) -> Example:
    from cipr.perturb.registry import apply_perturbation

    perturbed, _ = apply_perturbation(example, SETTINGS[setting], seed=seed, names="original")
    return perturbed


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _cut_torn_line(path: Path, say: Callable[[str], None]) -> None:
    """Cut a last line without a newline (torn by a crash during a write) off a file we append to."""
    data = path.read_bytes() if path.is_file() else b""
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        say(f"{path}: cutting a torn last line ({len(data) - cut} bytes) left by an interrupted run")
        with path.open("r+b") as f:
            f.truncate(cut)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a JSON-lines file we append to, ignoring a last line torn by a crash."""
    if not path.exists():
        return []
    if not path.is_file():
        raise UnsafeOutputError(f"{path} is not a file; use a new out folder")
    records = []
    try:
        for i, record in iter_jsonl(decode_text(complete_lines(path, cut=False), path), path):
            if not isinstance(record, dict):
                raise DataError(f"line {i} is not a record", file=str(path))
            records.append(record)
    except DataError as e:
        raise DataError(f"{e.reason}; the folder was not written by a guard evaluation, use a new out folder",
                        file=str(path)) from e
    return records


@dataclass
class _Folder:
    """What an output folder already holds: finished rows by item id, and the audit units written."""

    rows: dict[str, dict[str, Any]]
    audited: set[str]


def _open_folder(out: Path, meta: dict[str, Any], ids: Sequence[str], say: Callable[[str], None], *,
                 write: bool = True) -> _Folder:
    """Check that `out` is empty or holds this very evaluation; record run.json (`write=False`: change
    nothing, a check before an expensive model load)."""
    if out.exists() and not out.is_dir():
        raise UnsafeOutputError(f"out {str(out)!r} is a file, not a folder; pass a folder for the outputs")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise UnsafeOutputError(f"cannot create the out folder {str(out)!r}: a parent of it is a file")
    if not out.exists() and not write:
        return _Folder({}, set())
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise UnsafeOutputError(f"cannot create the out folder {str(out)!r}: a parent of it is a file") from e
    meta_path = out / RUN_META
    old: Any = None
    if meta_path.exists():
        try:
            old = read_json(meta_path)
        except (DataError, IsADirectoryError) as e:
            why = e.reason if isinstance(e, DataError) else "a folder"
            raise UnsafeOutputError(f"{meta_path} is not a run description we wrote ({why}); use a new out "
                                    "folder") from e
        if not isinstance(old, dict) or old.get("kind") != RUN_KIND:
            raise UnsafeOutputError(f"{out} holds another kind of run ({RUN_META} is not a guard "
                                    "evaluation's); use a new out folder")
    rows = _read_lines(out / RESULTS)
    audit = _read_lines(out / AUDIT)
    if old is None and (rows or audit):
        raise UnsafeOutputError(f"{out} holds {RESULTS} or {AUDIT} but no {RUN_META}: not a guard evaluation "
                                "this run can resume; use a new out folder")
    if old is not None and (rows or audit) and old.get("config") != meta:
        had = old.get("config") if isinstance(old.get("config"), dict) else {}
        detail = "; ".join(f"{k}: {had.get(k)!r} there, {v!r} now" for k, v in meta.items()
                           if had.get(k) != v)
        raise ConfigError(f"{out} holds a guard evaluation with another configuration "
                          f"({detail or 'unreadable'}); use a new out folder, "
                          "or the same options to resume it")
    done: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row.get("id"), str) or not isinstance(row.get("policies"), dict) \
                or sorted(row["policies"]) != sorted(meta["policies"]):
            raise DataError(f"line {i + 1} is not a result row of this evaluation; use a new out folder",
                            file=str(out / RESULTS))
        done[row["id"]] = row
    extra = [i for i in done if i not in set(ids)]
    if extra:
        raise ConfigError(f"{out} holds results for {len(extra)} item(s) this run does not ask for (e.g. "
                          f"{extra[0]!r}: another sample, shard or limit); use a new out folder or the same "
                          "options")
    if write:  # every check passed: this folder is ours
        for name in (RESULTS, AUDIT):
            _cut_torn_line(out / name, say)
        if old is None or old.get("config") != meta:
            _write_atomic(meta_path, json.dumps({"kind": RUN_KIND, "config": meta}, indent=2) + "\n")
    return _Folder(done, {str(r.get("item_id")) for r in audit})


def _append(path: Path, lines: Sequence[str]) -> None:
    if lines:
        with path.open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())


def _outcome(policy: str, row: Mapping[str, Any]) -> ItemOutcome:
    """An item's outcome under `policy`, read back from its results row."""
    p = row["policies"][policy]
    return ItemOutcome(row["id"], drift=row["drift_correct"], guard=p["correct"], status=p["status"],
                       triggered=p["triggered"], guard_tokens=p["guard_tokens"],
                       drift_tokens=row["drift_tokens"], added_latency_s=p["latency_s"],
                       clean=row["clean_correct"])


def check_out_dir(out_dir: str | Path, examples: Sequence[Example], config: GuardEvalConfig, *,
                  call_format: Any = None, identity: Mapping[str, Any] | None = None, seed: int = 0,
                  max_new_tokens: int = 512) -> int:
    """Raise what `evaluate_guard` would refuse about `out_dir`, changing nothing; return the items done."""
    meta = {**config.identity(call_format, seed=seed, max_new_tokens=max_new_tokens), **dict(identity or {})}
    return len(_open_folder(Path(out_dir), meta, [e.id for e in examples], lambda _m: None, write=False).rows)


def evaluate_guard(examples: Sequence[Example], backend: Backend, config: GuardEvalConfig | None = None, *,
                   call_format: Any = None, scorer: Scorer = bfcl_correct, out_dir: str | Path | None = None,
                   progress: Callable[[str], None] | None = None,
                   identity: Mapping[str, Any] | None = None, seed: int = 0,
                   max_new_tokens: int = 512) -> GuardEvalResult:
    """Run the drift evaluation, writing and resuming `out_dir` (module docstring). `identity`: more that
    run.json must match on a resume (e.g. the model); `seed` drifts the items; `max_new_tokens` bounds
    the undrifted and drifted task turns."""
    cfg = config or GuardEvalConfig()
    say = progress or (lambda _msg: None)
    out = Path(out_dir) if out_dir is not None else None
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise DataError("the examples repeat an item id; each item can be evaluated once", field="id")
    meta = {**cfg.identity(call_format, seed=seed, max_new_tokens=max_new_tokens), **dict(identity or {})}
    folder = _open_folder(out, meta, ids, say) if out is not None else _Folder({}, set())
    if folder.rows:
        say(f"resuming: {sum(i in folder.rows for i in ids)} of {len(ids)} items already done in {out}")
    todo = [e for e in examples if e.id not in folder.rows]
    shifted = [drifted(e, cfg.setting, seed) for e in todo]
    say(f"generating {len(todo)} undrifted turns")
    clean = _generate(backend, todo, max_new_tokens)
    say(f"generating {len(todo)} drifted turns ({SETTINGS[cfg.setting]})")
    drift = _generate(backend, shifted, max_new_tokens)
    new_rows: dict[str, dict[str, Any]] = {}
    for k, (ex, dex) in enumerate(zip(todo, shifted, strict=True)):
        audit = AuditLog()
        (clean_text, _), (drift_text, drift_usage) = clean[k], drift[k]
        clean_ok = _score(clean_text, ex, call_format, scorer)
        drift_ok = _score(drift_text, dex, call_format, scorer)
        row: dict[str, Any] = {"id": ex.id, "partition": ex.partition, "setting": cfg.setting,
                               "clean_correct": clean_ok, "drift_correct": drift_ok, "drift_text": drift_text,
                               "drift_tokens": drift_usage.total, "policies": {}}
        language = str(ex.meta.get("language", "python")) if hasattr(ex.meta, "get") else "python"
        try:
            snapshot = ContractSnapshot.from_tools(dex.interface, where=f"<{SETTINGS[cfg.setting]}>")
        except DataError as e:
            raise DataError(f"the drifted interface has an invalid schema: {e}", item=ex.id,
                            field="interface") from e
        for policy in cfg.policies:
            if policy == "none":
                ok, status, triggered, tokens, latency, calls = drift_ok, "none", False, 0, 0.0, None
            else:
                guard = Guard(snapshot, backend, call_format=call_format, audit=audit, config=GuardConfig(
                    policy=policy, budget=cfg.budget, candidate_retry=cfg.candidate_retry, cards=cfg.cards,
                    require_call=True, validator=ValidatorConfig(check_types=language == "python")))
                outcome = guard.process(list(dex.messages), drift_text, visible=dex.interface,
                                        item_id=f"{ex.id}|{policy}", proposal_usage=drift_usage)
                ok = scorer(outcome.calls, dex)
                status, triggered = outcome.status, outcome.triggered
                tokens, latency = outcome.usage.total, outcome.record.latency_s
                calls = [c.to_dict() for c in outcome.calls]
            row["policies"][policy] = {"correct": ok, "status": status, "triggered": triggered,
                                       "guard_tokens": tokens, "latency_s": latency, "calls": calls}
        new_rows[ex.id] = row
        if out is not None:
            _append(out / AUDIT, [json.dumps(r.to_json(), ensure_ascii=False, default=str)
                                  for r in audit.records if r.item_id not in folder.audited])
            _append(out / RESULTS, [json.dumps(row, ensure_ascii=False, default=str)])
        say(f"item {k + 1}/{len(todo)} {ex.id}")
    result = GuardEvalResult({p: [] for p in cfg.policies})
    for ex in examples:
        row = new_rows.get(ex.id) or folder.rows[ex.id]
        result.rows.append(row)
        for policy in cfg.policies:
            result.outcomes[policy].append(_outcome(policy, row))
    result.summaries = {p: summarize(items) for p, items in result.outcomes.items()}
    if out is not None:
        summary = {"setting": cfg.setting, "perturbation": SETTINGS[cfg.setting], "seed": seed,
                   "n": len(examples), "resumed": len(examples) - len(todo), "budget": cfg.budget,
                   "policies": result.summaries}
        _write_atomic(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return result
