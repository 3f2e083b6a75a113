"""τ²-bench simulation records → our results.jsonl, run.json, summary.json and report.md.

One record per (task, trial, names): `id` `<domain>/<task id>`, `partition` the domain, `names` the
arm, `perturbation` and `group` `original` (τ² changes no interface), `order` `trial<k>` (trials
average per task as tool orders do), `correct` τ²'s success (reward 1). Failure classes: `correct`,
`undeclared_tool` (the agent called a tool the request does not declare: the service's 502),
`backend_error` (any other simulation that raised), `other` (evaluated, reward below 1; termination
reason and reward breakdown kept). Tasks τ² cannot run in this mode are not results; their reasons go
to run.json. The summary is `cipr.eval.report`'s, so `cipr-eval-compare` reads τ² runs like any
other; report.md gets a τ² section with wall time per task.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_jsonl
from cipr.eval.report import REPORT, RESULTS, RUN_META, fmt, table, write_report

RECORDS = "tau2_records.jsonl"
SUCCESS = 1.0 - 1e-6


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The harness's records (a torn last line, left by a killed run, is cut off the file first)."""
    return read_jsonl(path, torn="cut")


def record_key(rec: Mapping[str, Any]) -> tuple[str, str, str, int]:
    return (rec["names"], rec["domain"], str(rec["task_id"]), int(rec.get("trial", 0)))


def taxonomy(rec: Mapping[str, Any]) -> tuple[bool, str, str | None]:
    """(correct, failure class, error) of one simulation record."""
    if rec.get("error"):
        code = "undeclared_tool" if rec.get("error_code") == "undeclared_tool" else "backend_error"
        return False, code, code
    if float(rec.get("reward") or 0.0) >= SUCCESS:
        return True, "correct", None
    return False, "other", None


def to_result(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Our results.jsonl record of one τ² simulation."""
    correct, cls, error = taxonomy(rec)
    detail = rec.get("error") or f"termination {rec.get('termination_reason')}, reward {rec.get('reward')}"
    return {"id": f"{rec['domain']}/{rec['task_id']}", "partition": rec["domain"], "names": rec["names"],
            "perturbation": "original", "group": "original", "order": f"trial{int(rec.get('trial', 0))}",
            "correct": correct, "error": error, "detail": str(detail)[:1000], "taxonomy": cls,
            "reward": rec.get("reward"), "termination_reason": rec.get("termination_reason"),
            "duration_s": rec.get("duration_s"), "n_messages": rec.get("n_messages"),
            "n_tool_calls": rec.get("n_tool_calls"), "split": rec.get("split"),
            "reward_breakdown": (rec.get("reward_info") or {}).get("reward_breakdown")}


def skipped(records: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """reason -> task keys (`names:domain/id`) the harness skipped."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if "skipped" in r:
            out[r["skipped"]].append(f"{r['names']}:{r['domain']}/{r['task_id']}")
    return dict(out)


def timing(results: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per `names/domain`: tasks run, pass count, mean and total wall seconds per simulation."""
    acc: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        acc[f"{r['names']}/{r['partition']}"].append(r)
    out = {}
    for k, rs in sorted(acc.items()):
        secs = [float(r["duration_s"] or 0.0) for r in rs]
        out[k] = {"n": len(rs), "passed": sum(r["correct"] for r in rs),
                  "mean_s": math.fsum(secs) / len(secs), "total_s": math.fsum(secs),
                  "classes": dict(Counter(r["taxonomy"] for r in rs))}
    return out


def tau2_section(summary: Mapping[str, Any], times: Mapping[str, Mapping[str, Any]],
                 skips: Mapping[str, list[str]]) -> str:
    """The τ² part of report.md: pass rate per arm and domain, the paired gap, wall time per task."""
    rows = []
    for names, e in summary["names"].items():
        parts = e["partitions"]
        for domain, p in parts.items():
            t = times.get(f"{names}/{domain}", {})
            rows.append([names, domain, str(p["n_items"]), fmt(p["types"].get("original")),
                         f"{t.get('mean_s', 0):.1f}",
                         ", ".join(f"{k} {v}" for k, v in t.get("classes", {}).items())])
        rows.append([names, "**all**", str(sum(p["n_items"] for p in parts.values())),
                     fmt(e["types"].get("original", {}).get("accuracy")), "", ""])
    out = ["", "## τ²-bench pass rate (reward 1), 95% Wilson intervals", "",
           table(["Tool names", "Domain", "tasks", "pass rate (%)", "s / task", "classes"], rows)]
    gap = (summary.get("canonical_minus_original") or {}).get("types", {}).get("original")
    if gap:
        out += ["", f"Paired gap canonical − original over {gap['n']} tasks both arms ran: "
                    f"{fmt(gap, signed=True)} points ({gap['unpaired']} unpaired)."]
    for reason, keys in skips.items():
        out += ["", f"Skipped ({len(keys)}): {reason}."]
    return "\n".join(out) + "\n"


def convert(out_dir: str | Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    """Write results.jsonl, run.json, summary.json, report.md from `out_dir/tau2_records.jsonl`."""
    out = Path(out_dir)
    records = read_records(out / RECORDS)
    results = [to_result(r) for r in records if "skipped" not in r]
    if not results:
        raise DataError("no τ² simulation ran (all skipped or none requested)", file=str(out / RECORDS))
    tmp = out / (RESULTS + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results))
    tmp.replace(out / RESULTS)
    skips = skipped(records)
    run_meta = {**meta, "benchmark": "tau2", "perturbations": ["original"],
                "groups": {"original": "original"},
                "names": sorted({r["names"] for r in results}, key=["original", "canonical"].index),
                "tau2_skipped": {reason: len(keys) for reason, keys in skips.items()},
                "report": {"original": "original", "group_mode": "item_mean", "mean_groups": None}}
    (out / RUN_META).write_text(json.dumps(run_meta, indent=2) + "\n")
    summary = write_report(out)
    times = timing(results)
    summary["tau2"] = {"timing": times, "skipped": skips}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    with (out / REPORT).open("a", encoding="utf-8") as f:
        f.write(tau2_section(summary, times, skips))
    return summary
