"""Run τ²-bench tasks with τ²-bench's own orchestrator, user simulator and evaluator (Python >= 3.12).

This file is executed by the τ² environment's interpreter (`.venv-tau2/bin/python harness.py SPEC`),
never imported by cipr: it uses only the standard library and the `tau2` package. SPEC is a JSON file:

    {"domain": "airline", "split": "base", "task_ids": ["0", "1"], "trial": 0, "seed": 300,
     "max_steps": 100, "max_errors": 10, "evaluation": "all",
     "agent": {"model": "openai/embedded", "args": {"api_base": "http://127.0.0.1:8000/canonical/v1", ...}},
     "user": {"model": ..., "args": {...}},  "judge": {...} or null, "user_guidelines": DIR,
     "out": "tau2_records.jsonl", "sims": "sims/canonical/airline", "names": "canonical",
     "tools_out": "tools_airline.json" or null}

For each task: build the orchestrator as τ² does (`build_text_orchestrator`, agent `llm_agent`, user
`user_simulator`), run and evaluate it (`run_simulation`), append one flushed JSON line to `out` and
save the full simulation under `sims`. Configured from outside:
- the models: `agent.model` / `user.model` are litellm model names (`openai/<name>` for any
  OpenAI-compatible endpoint) with `args` passed to litellm (`api_base`, `api_key`, `temperature`,
  `num_retries`); with `tag_task`, the agent's requests carry `cipr_task: "<domain>/<task id>"` in
  their body (for the scripted agent of `cipr.tau2.gold`; litellm drops OpenAI's own `user` field);
- the NL-assertion judge (τ² reads it from module constants, set here from `judge`); without a
  judge, a task whose reward needs it is skipped with that reason, never scored without it;
- the user simulator's guidelines (`simulation_guidelines.md` and `simulation_guidelines_tools.md`,
  which τ² reads from `$TAU2_DATA_DIR/tau2/user_simulator`): from `user_guidelines` when given.
τ²'s solo mode is refused by its airline and retail environments; a run without a user model points
the user simulator at a scripted endpoint (`cipr.tau2.gold`). A simulation that raises is recorded
with the error, reward 0 and termination reason `infrastructure_error`; `error_code` is `judge_error`
when the NL-assertion judge raised (τ² `json.loads` its reply, so a non-JSON judge ends it there).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ERROR_CODES = ("undeclared_tool", "guard_blocked", "context_length_exceeded", "backend_unavailable")


def _quiet() -> None:
    from loguru import logger

    logger.remove()
    # litellm has no price for our models
    logger.add(sys.stderr, level=os.environ.get("CIPR_TAU2_LOG_LEVEL", "WARNING"),
               filter=lambda record: "isn't mapped yet" not in record["message"])


def needs_judge(task: Any) -> bool:
    crit = task.evaluation_criteria
    return bool(crit and "NL_ASSERTION" in [str(getattr(b, "value", b)) for b in crit.reward_basis]
                and crit.nl_assertions)


def skip_reason(task: Any, spec: dict[str, Any]) -> str | None:
    if spec.get("judge") is None and needs_judge(task):
        return "its reward needs the NL-assertion judge and no judge endpoint is configured"
    return None


def error_code(message: str) -> str:
    for code in ERROR_CODES:
        if code in message:
            return code
    return "error"


def agent_args(spec: dict[str, Any], task_id: str) -> dict[str, Any]:
    args = dict(spec["agent"].get("args", {}))
    if spec.get("tag_task"):
        args["extra_body"] = {**args.get("extra_body", {}), "cipr_task": f"{spec['domain']}/{task_id}"}
    return args


def run_task(task: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Run and evaluate one task; a JSON-safe record."""
    from tau2.data_model.simulation import TextRunConfig
    from tau2.runner import build_text_orchestrator, run_simulation

    user = spec["user"]
    config = TextRunConfig(domain=spec["domain"], agent="llm_agent", user="user_simulator",
                           llm_agent=spec["agent"]["model"],
                           llm_args_agent=agent_args(spec, task.id),
                           llm_user=user["model"], llm_args_user=user.get("args", {}),
                           max_steps=spec.get("max_steps", 100), max_errors=spec.get("max_errors", 10),
                           seed=spec.get("seed", 300))
    rec: dict[str, Any] = {"domain": spec["domain"], "task_id": task.id, "trial": spec.get("trial", 0),
                           "names": spec.get("names"), "split": spec.get("split")}
    start = time.perf_counter()
    try:
        orch = build_text_orchestrator(config, task, seed=spec.get("seed", 300) + spec.get("trial", 0))
        from tau2.evaluator.evaluator import EvaluationType

        sim = run_simulation(orch, evaluation_type=EvaluationType(spec.get("evaluation", "all")))
    except Exception as e:  # noqa: BLE001 - one failed simulation is recorded, the others still run
        message, trace = f"{type(e).__name__}: {e}", traceback.format_exc()
        code = "judge_error" if "evaluator_nl_assertions" in trace else error_code(message)
        rec.update(reward=0.0, termination_reason="infrastructure_error", error=message[:2000],
                   error_code=code, traceback=trace[-4000:],
                   duration_s=time.perf_counter() - start)
        return rec
    info = sim.reward_info
    rec.update(reward=float(info.reward) if info else 0.0,
               termination_reason=str(getattr(sim.termination_reason, "value", sim.termination_reason)),
               error=None, error_code=None, duration_s=time.perf_counter() - start,
               n_messages=len(sim.messages), n_tool_calls=sum(len(m.tool_calls or []) for m in sim.messages
                                                              if getattr(m, "tool_calls", None)),
               reward_info=json.loads(info.model_dump_json()) if info else None,
               simulation_id=sim.id)
    sims = spec.get("sims")
    if sims:
        Path(sims).mkdir(parents=True, exist_ok=True)
        (Path(sims) / f"{task.id}_trial{rec['trial']}.json").write_text(sim.model_dump_json(indent=1))
    return rec


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    _quiet()
    from tau2.runner import build_environment, get_tasks

    if spec.get("judge"):
        import tau2.evaluator.evaluator_nl_assertions as nl

        nl.DEFAULT_LLM_NL_ASSERTIONS = spec["judge"]["model"]
        nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = dict(spec["judge"].get("args", {}))
    if spec.get("user_guidelines"):
        import tau2.user.user_simulator as us

        folder = Path(spec["user_guidelines"])
        us.GLOBAL_USER_SIM_GUIDELINES_PATH = folder / "simulation_guidelines.md"
        us.GLOBAL_USER_SIM_GUIDELINES_PATH_TOOLS = folder / "simulation_guidelines_tools.md"
    if spec.get("tools_out"):
        env = build_environment(spec["domain"])
        Path(spec["tools_out"]).write_text(json.dumps([t.openai_schema for t in env.get_tools()], indent=1))
    tasks = get_tasks(spec["domain"], task_split_name=spec.get("split") or None,
                      task_ids=spec.get("task_ids") or None)
    with open(spec["out"], "a", encoding="utf-8") as f:
        for task in tasks:
            reason = skip_reason(task, spec)
            if reason:
                rec = {"domain": spec["domain"], "task_id": task.id, "trial": spec.get("trial", 0),
                       "names": spec.get("names"), "split": spec.get("split"), "skipped": reason}
            else:
                rec = run_task(task, spec)
            f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
            print(f"tau2 {spec['domain']}/{task.id} trial {rec['trial']}: "
                  + (f"skipped ({rec['skipped']})" if "skipped" in rec else
                     f"reward {rec['reward']} ({rec['termination_reason']}, {rec['duration_s']:.1f} s)"),
                  flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python harness.py SPEC.json", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
