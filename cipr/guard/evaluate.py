"""The guard's drift evaluation (the study's protocol) on BFCL: clean run, drifted run, guarded run.

For every item: the model answers the undrifted item (`clean`) and the drifted one (`drift`, the
`drift_mild` or `drift_medium` perturbation of `cipr.perturb`); then each guard policy processes
the drifted reply against a contract snapshot of the drifted interface (the deployment's
authorized contract: what it serves is what it authorized) and its final calls are scored
(`guard`). Undrifted and drifted generations are made once and shared by all policies, so the
policies differ only by what the guard does. Metrics: `cipr.guard.metrics.summarize`.

    cipr-guard eval --model DIR --format toolrl --setting mild --policies none,naive_retry,tool_list,repair \\
        --sample study200 --out runs/guard_mild

Choices the spec leaves open:
- `none` is no guard at all: its "after" is the drifted result itself (a validate-only gate is
  `Guard(policy="none")`, which blocks invalid calls but cannot make an item correct).
- A reply is scored strictly, as the evaluation runner does: a reply the call format reports as
  malformed is wrong even if a call could be read out of it. The guard reads such replies
  leniently (any valid call it can find is executable), so it can fix a malformed reply without a
  model call; that counts as a guard fix.
- Every BFCL item needs a call, so the guard runs with `require_call=True` (a text answer gets the
  missing-name path). Java and JavaScript items pass values as source literals in strings, so
  their type checks are off (`ValidatorConfig(check_types=False)`); enums are checked everywhere.
- The study sample: 50 items from each of simple_python, multiple, live_simple and live_multiple,
  drawn with `random.Random(seed)` per partition and kept in load order (`study_sample`).
- Token overhead counts prompt and completion tokens on both sides (the guard's calls, and the
  drifted call), as reported by the backend.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cipr.errors import DataError
from cipr.guard.audit import AuditLog
from cipr.guard.backend import Backend, Usage
from cipr.guard.contract import ContractSnapshot
from cipr.guard.guard import POLICIES, Guard, GuardConfig
from cipr.guard.metrics import ItemOutcome, summarize
from cipr.guard.parse import parse_reply
from cipr.guard.validator import ValidatorConfig
from cipr.interface import Call, Example

STUDY_PARTITIONS = ("simple_python", "multiple", "live_simple", "live_multiple")
SETTINGS = {"mild": "drift_mild", "medium": "drift_medium"}

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
            raise DataError(f"partition {part!r} has {len(pool)} items, fewer than the {per_partition} to sample",
                            field="partition")
        chosen = sorted(random.Random(f"{seed}:{part}").sample(pool, per_partition))
        out.extend(examples[i] for i in chosen)
    return out


@dataclass(frozen=True)
class GuardEvalConfig:
    """One drift evaluation: `setting` mild|medium, the policies compared, seeds and budgets."""

    setting: str = "mild"
    policies: tuple[str, ...] = POLICIES
    seed: int = 0
    max_new_tokens: int = 512
    budget: int = 512
    candidate_retry: bool = True
    cards: bool = True

    def __post_init__(self) -> None:
        if self.setting not in SETTINGS:
            raise ValueError(f"unknown drift setting {self.setting!r}; expected one of {', '.join(SETTINGS)}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ValueError(f"unknown guard policies {bad}; expected some of {', '.join(POLICIES)}")


@dataclass
class GuardEvalResult:
    """Per policy: the item outcomes and their summary; `rows` are the per-item records written out."""

    outcomes: dict[str, list[ItemOutcome]] = field(default_factory=dict)
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)


def _generate(backend: Backend, examples: Sequence[Example], max_tokens: int) -> list[tuple[str, Usage]]:
    requests = [(list(e.messages), e.interface.to_openai()) for e in examples]
    batch = getattr(backend, "generate_batch", None)
    if callable(batch):
        return list(batch(requests, max_tokens=max_tokens))
    return [backend.generate(m, tools=t, max_tokens=max_tokens) for m, t in requests]


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


def evaluate_guard(examples: Sequence[Example], backend: Backend, config: GuardEvalConfig | None = None, *,
                   call_format: Any = None, scorer: Scorer = bfcl_correct, out_dir: str | Path | None = None,
                   progress: Callable[[str], None] | None = None) -> GuardEvalResult:
    """Run the drift evaluation; with `out_dir`, write results.jsonl, audit.jsonl and summary.json there."""
    cfg = config or GuardEvalConfig()
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "audit.jsonl"):
            (out / name).unlink(missing_ok=True)
    audit = AuditLog(out / "audit.jsonl" if out is not None else None)
    shifted = [drifted(e, cfg.setting, cfg.seed) for e in examples]
    say = progress or (lambda _msg: None)
    say(f"generating {len(examples)} undrifted turns")
    clean = _generate(backend, examples, cfg.max_new_tokens)
    say(f"generating {len(examples)} drifted turns ({SETTINGS[cfg.setting]})")
    drift = _generate(backend, shifted, cfg.max_new_tokens)
    result = GuardEvalResult({p: [] for p in cfg.policies})
    for k, (ex, dex) in enumerate(zip(examples, shifted, strict=True)):
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
            raise DataError(f"the drifted interface has an invalid schema: {e}", item=ex.id, field="interface") from e
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
            result.outcomes[policy].append(ItemOutcome(ex.id, drift=drift_ok, guard=ok, status=status,
                                                       triggered=triggered, guard_tokens=tokens,
                                                       drift_tokens=drift_usage.total, added_latency_s=latency,
                                                       clean=clean_ok))
            row["policies"][policy] = {"correct": ok, "status": status, "triggered": triggered,
                                       "guard_tokens": tokens, "latency_s": latency, "calls": calls}
        result.rows.append(row)
        if out is not None:
            with (out / "results.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        say(f"item {k + 1}/{len(examples)} {ex.id}")
    result.summaries = {p: summarize(items) for p, items in result.outcomes.items()}
    if out is not None:
        summary = {"setting": cfg.setting, "perturbation": SETTINGS[cfg.setting], "seed": cfg.seed,
                   "n": len(examples), "budget": cfg.budget, "policies": result.summaries}
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return result
