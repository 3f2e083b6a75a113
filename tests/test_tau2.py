"""τ²-bench through cipr-serve: conversion into our results format, the scripted gold-replay agent, and
the served model end to end (the last two need the τ² environment of `scripts/setup_tau2.sh`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cipr.core.errors import ConfigError, MissingInputError
from cipr.eval.compare import compare_runs
from cipr.eval.report import RESULTS, read_results
from cipr.serve.conversation import canonical_request
from cipr.tau2.convert import RECORDS, convert, read_records, to_result
from cipr.tau2.gold import GoldReplayBackend
from cipr.tau2.run import ROOT, Tau2Config, run_tau2, user_guidelines

VENV = Path(os.environ.get("CIPR_TAU2_VENV", ROOT / ".venv-tau2"))
needs_venv = pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                reason=f"no τ² environment at {VENV}: run scripts/setup_tau2.sh")


def record(names: str, domain: str, task: str, reward: float, **extra: Any) -> dict[str, Any]:
    return {"names": names, "domain": domain, "task_id": task, "trial": 0, "split": "base", "reward": reward,
            "termination_reason": "user_stop", "error": None, "error_code": None, "duration_s": 2.0,
            "n_messages": 6, "n_tool_calls": 2, **extra}


def test_records_become_our_results_with_a_paired_gap(tmp_path):
    recs = [record("original", "airline", "1", 1.0), record("canonical", "airline", "1", 1.0),
            record("original", "airline", "2", 0.0), record("canonical", "airline", "2", 1.0),
            record("original", "retail", "5", 1.0),
            record("canonical", "retail", "5", 0.0, error="APIError: undeclared_tool function_09",
                   error_code="undeclared_tool", termination_reason="infrastructure_error"),
            {"names": "original", "domain": "retail", "task_id": "7", "trial": 0, "skipped": "needs a judge"}]
    (tmp_path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"torn')
    summary = convert(tmp_path, {"model": "m"})
    results, torn = read_results(tmp_path / RESULTS)
    assert torn == 0 and len(results) == 6
    assert {r["taxonomy"] for r in results} == {"correct", "other", "undeclared_tool"}
    orig = summary["names"]["original"]["types"]["original"]["accuracy"]
    can = summary["names"]["canonical"]["types"]["original"]["accuracy"]
    assert (orig["value"], orig["n"]) == pytest.approx((200 / 3, 3)) and \
        can["value"] == pytest.approx(200 / 3)
    assert 0 < orig["low"] < orig["value"] < orig["high"] < 100
    gap = summary["canonical_minus_original"]["types"]["original"]
    assert gap["value"] == pytest.approx(0.0) and gap["n"] == 3
    assert summary["names"]["original"]["partitions"]["airline"]["n_items"] == 2
    assert summary["tau2"]["skipped"] == {"needs a judge": ["original:retail/7"]}
    assert "τ²-bench pass rate" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "run.json").read_text())["benchmark"] == "tau2"
    assert compare_runs(tmp_path, tmp_path)["names"]["canonical"]["types"]["original"]["value"] == 0.0


def test_trials_average_per_task():
    r0, r1 = record("original", "airline", "1", 1.0), {**record("original", "airline", "1", 0.0), "trial": 1}
    assert [to_result(r)["order"] for r in (r0, r1)] == ["trial0", "trial1"]


def test_torn_record_line_is_cut_before_a_resume(tmp_path):
    path = tmp_path / RECORDS
    path.write_text(json.dumps(record("original", "airline", "1", 1.0)) + "\n{\"names\": \"orig")
    assert len(read_records(path)) == 1 and path.read_text().endswith("\n")


def test_gold_agent_answers_in_the_namespace_it_is_shown(tmp_path, shared_data):
    tools = [{"type": "function", "function": {"name": "get_order_details", "description": "Get an order.",
                                               "parameters": {"type": "object", "properties": {
                                                   "order_id": {"type": "string"}}}}},
             {"type": "function",
              "function": {"name": "find_user_id_by_name_zip", "description": "Find a user.",
                           "parameters": {"type": "object", "properties": {
                               "first_name": {"type": "string"}, "last_name": {"type": "string"},
                               "zip": {"type": "string"}}}}}]
    (tmp_path / "tools_retail.json").write_text(json.dumps(tools))
    gold = GoldReplayBackend(shared_data, tmp_path)
    body = {"model": "gold", "cipr_task": "retail/0", "tools": tools,
            "messages": [{"role": "user", "content": "hi"}]}
    canonical, _ = canonical_request(body)
    call = gold.complete(canonical)["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "function_02"
    assert json.loads(call["arguments"]) == {"arg_01": "Yusuf", "arg_02": "Rossi", "arg_03": "19122"}
    user = gold.complete({"model": "u", "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "Hi! How can I help you today?"}]})
    assert "###STOP###" not in user["choices"][0]["message"]["content"]


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="domains"):
        Tau2Config(domains=["telecom"]).check()
    with pytest.raises(ConfigError, match="names"):
        Tau2Config(names=["both"]).check()
    with pytest.raises(MissingInputError, match="simulation_guidelines.md"):
        user_guidelines(Tau2Config(backend="embedded", user_guidelines=str(tmp_path)), tmp_path, tmp_path)


class RecordingGold(GoldReplayBackend):
    """The gold backend, noting the tool names of each agent request it answers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[tuple[str, ...]] = []

    def complete(self, body):
        if body.get("cipr_task"):
            self.seen.append(tuple(t["function"]["name"] for t in body.get("tools") or []))
        return super().complete(body)


def _gold_run(out: Path, shared_data: Path, **config: Any) -> tuple[dict[str, Any], RecordingGold]:
    cfg = Tau2Config(out_dir=str(out), backend="gold", judge="none", venv=str(VENV), **config)
    backend = RecordingGold(shared_data, out)
    return run_tau2(cfg, backend=backend), backend


@needs_venv
@pytest.mark.integration
def test_gold_replay_through_the_adapter_passes_in_tau2s_evaluator(tmp_path, shared_data):
    """Two airline and two retail tasks, both arms: τ²'s evaluator replays the translated calls on a fresh
    database and compares it with the gold one, so every task passes only if names went through."""
    tasks = ["airline/1", "airline/3", "retail/0", "retail/1"]
    summary, backend = _gold_run(tmp_path, shared_data, tasks=tasks)
    for names in ("original", "canonical"):
        acc = summary["names"][names]["types"]["original"]["accuracy"]
        assert (acc["value"], acc["n"]) == (100.0, 4), names
    assert summary["canonical_minus_original"]["types"]["original"]["value"] == 0.0
    canonical_turns = [s for s in backend.seen if s and s[0].startswith("function_")]
    original_turns = [s for s in backend.seen if s and not s[0].startswith("function_")]
    assert canonical_turns and original_turns
    assert all(all(n.startswith("function_") for n in s) for s in canonical_turns)
    results, _ = read_results(tmp_path / RESULTS)
    assert {r["id"] for r in results} == set(tasks) and all(r["n_tool_calls"] >= 1 for r in results)
    before = len(read_records(tmp_path / RECORDS))
    _gold_run(tmp_path, shared_data, tasks=tasks)  # a rerun resumes: nothing left to simulate
    assert len(read_records(tmp_path / RECORDS)) == before


class Recording:
    """A chat backend wrapper that notes each request's tool names (empty for the user simulator and
    judge)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.seen: list[tuple[str, ...]] = []
        self.bodies: list[dict[str, Any]] = []

    def models(self) -> list[str]:
        return self.inner.models()

    def complete(self, body):
        self.seen.append(tuple(t["function"]["name"] for t in body.get("tools") or []))
        self.bodies.append(dict(body))
        return self.inner.complete(body)


EMBEDDED_TASKS = os.environ.get("CIPR_TAU2_TASKS", "retail/0").split(",")
"""The bounded end-to-end run: one retail task (the vLLM tier runs airline task 0 the same way, and the gold
replay covers both domains). `CIPR_TAU2_TASKS=airline/0,airline/1,retail/0,retail/1` runs the 2+2-task
version."""


def guidelines_dir(shared_data: Path) -> str:
    folder = os.environ.get("CIPR_TAU2_USER_GUIDELINES") or str(shared_data / "tau2" / "user_simulator")
    assert (Path(folder) / "simulation_guidelines.md").is_file(), \
        (f"no τ² user-simulator guidelines in {folder}: the shared data holds them "
         "(set CIPR_TAU2_USER_GUIDELINES)")
    return folder


def check_end_to_end(out: Path, backend: Recording, tasks: list[str], domain_tool: dict[str, str]) -> None:
    """Every part of a served-model run ran: the agent's requests reached the model under both names (through
    the adapter for the canonical arm), the user simulator spoke, τ²'s evaluator scored every episode, and the
    records landed in our results format."""
    recs = read_records(out / RECORDS)
    assert len(recs) == 2 * len(tasks), recs
    for r in recs:
        assert "skipped" not in r and r["error"] is None, r
        assert r["reward_info"] is not None and "reward" in r["reward_info"], r  # τ²'s evaluator's verdict
    agent = [s for s in backend.seen if s]
    canonical = [s for s in agent if all(n.startswith("function_") for n in s)]
    original = [s for s in agent if s not in canonical]
    assert len(canonical) >= len(tasks) and len(original) >= len(tasks), agent
    for domain, tool in domain_tool.items():
        if any(t.startswith(domain) for t in tasks):
            assert any(tool in s for s in original), f"no original-names request declared {tool}"
    assert all(not any(n.startswith("function_") for n in s) for s in original)
    for names in ("original", "canonical"):
        for task in tasks:
            domain, _, task_id = task.partition("/")
            sim = json.loads((out / "sims" / names / domain / f"{task_id}_trial0.json").read_text())
            spoken = [m for m in sim["messages"] if m["role"] == "user" and (m.get("content") or "").strip()]
            assert spoken, f"the user simulator never spoke in {names} {task}"
    results, _ = read_results(out / RESULTS)
    assert len(results) == 2 * len(tasks) and {r["names"] for r in results} == {"original", "canonical"}
    assert all(r["taxonomy"] in ("correct", "other", "undeclared_tool", "backend_error") for r in results)
    summary = json.loads((out / "summary.json").read_text())
    for names in ("original", "canonical"):
        assert summary["names"][names]["types"]["original"]["accuracy"]["n"] == len(tasks)
    assert "canonical_minus_original" in summary
    print("τ² per-task seconds:", {f"{r['names']}:{r['domain']}/{r['task_id']}": round(r["duration_s"], 1)
                                   for r in recs})


@needs_venv
@pytest.mark.integration
def test_served_model_as_agent_and_user_end_to_end(tmp_path, shared_data):
    """One retail task (CIPR_TAU2_TASKS for more), both arms, with the embedded SmolLM2 served
    in process as agent and user simulator: two turns each (`max_steps=2`: the user speaks, the agent answers)
    and 32 new tokens a turn, so the run stays within minutes on 2 cores. Scores are zero (an episode cut at
    max_steps is scored 0 by τ²'s evaluator): the point is that every part runs and lands in our format."""
    from cipr.serve.command import ServeCommand, build_backend

    backend = Recording(build_backend(ServeCommand(backend="embedded", max_new_tokens=32, threads=2)))
    cfg = Tau2Config(out_dir=str(tmp_path), backend="embedded", tasks=EMBEDDED_TASKS, max_steps=2,
                     max_new_tokens=32, threads=2, judge="none", venv=str(VENV),
                     user_guidelines=guidelines_dir(shared_data))
    run_tau2(cfg, backend=backend)
    check_end_to_end(tmp_path, backend, EMBEDDED_TASKS,
                     {"airline": "book_reservation", "retail": "get_order_details"})


@needs_venv
@pytest.mark.integration
def test_nl_judge_runs_on_a_retail_task_that_needs_it(tmp_path, shared_data):
    """Retail task 2's reward needs τ²'s NL-assertion judge. The gold agent and scripted user replay it (an
    episode that ends normally, so τ²'s evaluator reaches the judge), and the judge is the embedded model
    behind a second in-process cipr-serve. Without a judge the task is listed as skipped with the reason. The
    135M judge rarely answers in the JSON τ² parses, so the record holds either its verdicts or
    `judge_error`."""
    from cipr.serve import ChatService, ServeConfig, start, stop
    from cipr.serve.command import ServeCommand, build_backend

    summary, _ = _gold_run(tmp_path / "no_judge", shared_data, tasks=["retail/0", "retail/2"],
                           names=["original"])
    (skipped,) = [r for r in read_records(tmp_path / "no_judge" / RECORDS) if "skipped" in r]
    assert skipped["task_id"] == "2" and "NL-assertion judge" in skipped["skipped"]
    assert list(summary["tau2"]["skipped"].values()) == [["original:retail/2"]]

    judge = Recording(build_backend(ServeCommand(backend="embedded", max_new_tokens=64, threads=2)))
    server, thread = start(ChatService(judge, ServeConfig()))
    try:
        cfg = Tau2Config(out_dir=str(tmp_path / "judged"), backend="gold", venv=str(VENV), tasks=["retail/2"],
                         names=["original"], judge=f"{server.url}/original/v1", judge_model="embedded")
        run_tau2(cfg, backend=RecordingGold(shared_data, tmp_path / "judged"))
    finally:
        stop(server, thread)
    (rec,) = read_records(tmp_path / "judged" / RECORDS)
    assert "skipped" not in rec, rec
    asked = [b for b in judge.bodies if "expectedOutcomes" in str(b["messages"])]
    assert len(asked) == 1 and not judge.seen[0], "the judge endpoint was not asked exactly once"
    if rec["error"] is None:
        assert rec["reward_info"]["nl_assertions"], rec
    else:
        assert rec["error_code"] == "judge_error", rec
