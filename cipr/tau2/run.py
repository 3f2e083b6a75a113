"""τ²-bench airline and retail with the agent behind cipr-serve, original names against the adapter.

`run_tau2(config)` starts cipr-serve in this process (or uses `serve=URL`), then per trial, arm and
domain runs τ²'s harness in the τ² environment (`cipr/tau2/harness.py` under `.venv-tau2/bin/python`,
from `scripts/setup_tau2.sh`): the agent calls `<serve>/<names>/v1`, the user simulator and judge any
OpenAI-compatible endpoint (default: the served model via `/original/v1`). Records are appended per
simulation, so a rerun runs only what is missing; each run ends by converting all records
(`cipr.tau2.convert`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError, MissingInputError
from cipr.core.io import read_json
from cipr.tau2.convert import RECORDS, convert, read_records, record_key

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().with_name("harness.py")
DOMAINS = ("airline", "retail")


@dataclass
class Tau2Config:
    """Options of a τ² run (all settable as `key=value` on `cipr-tau2`). The agent is `serve` (a running
    cipr-serve) or, when it is null, cipr-serve started here with `backend`, `guard`, `call_format`,
    `tokenizer`, ...; the user simulator and the NL-assertion judge are any OpenAI-compatible endpoint.
    `user_guidelines` holds τ²'s simulation_guidelines.md and simulation_guidelines_tools.md (upstream
    data/tau2/user_simulator/); backend=gold's scripted user never reads them."""

    out_dir: str = "evals/tau2"
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    split: str = "base"  # τ²'s split: base (all 50 airline / 114 retail tasks), train, test
    tasks: list[str] | None = None  # `domain/id` keys (null: every task of the split)
    limit: int | None = None  # the first n tasks per domain
    trials: int = 1  # per task
    names: list[str] = field(default_factory=lambda: ["original", "canonical"])  # the arms
    serve: str | None = None  # root URL of a running cipr-serve (null: start one here)
    backend: str = "embedded"  # embedded | gold (scripted agent and user) | a model folder | a URL (vLLM)
    model_name: str | None = None  # the model name sent (null: the first one the service lists)
    guard: str = "off"  # cipr-serve's guard policy
    guard_budget: int = 512  # new tokens of each guard model call
    call_format: str = "hermes"  # how the served model writes tool calls
    tokenizer: str | None = None  # with a URL backend: render prompts with this tokenizer, parse calls here
    max_new_tokens: int = 256  # per agent turn
    threads: int | None = None  # torch CPU threads of an in-process model
    temperature: float = 0.0
    num_retries: int = 0  # litellm's retries (0: a local greedy model repeats its answer)
    user_url: str | None = None  # the user simulator's endpoint (null: the served model, original names)
    user_model: str | None = None  # the user simulator's model name
    judge: str = "user"  # the NL-assertion judge: user (the same endpoint) | none (skip its tasks) | a URL
    judge_model: str | None = None  # the judge's model name
    max_steps: int = 100  # per simulation
    max_errors: int = 10  # per simulation
    seed: int = 300
    evaluation: str = "all"  # τ²'s EvaluationType value
    user_guidelines: str | None = None  # τ²'s user-simulator guidelines folder (null: under data_root)
    venv: str | None = None  # the τ² environment (null: .venv-tau2)
    data_root: str | None = None  # the folder holding tau2/domains
    timeout_s: float | None = None  # per harness process (its finished simulations are kept; rerun to go on)

    def check(self) -> None:
        bad = [d for d in self.domains if d not in DOMAINS]
        if bad:
            raise ConfigError(f"domains={bad}: expected a subset of {list(DOMAINS)}")
        bad = [n for n in self.names if n not in ("original", "canonical")]
        if bad or not self.names:
            raise ConfigError(f"names={self.names}: expected a non-empty subset of [original, canonical]")
        if self.trials < 1:
            raise ConfigError(f"trials={self.trials}: must be at least 1")


def tau2_python(config: Tau2Config) -> Path:
    venv = Path(config.venv) if config.venv else ROOT / ".venv-tau2"
    python = venv / "bin" / "python"
    if not python.exists():
        raise MissingInputError(f"no τ² environment at {venv}: create it with `scripts/setup_tau2.sh {venv}`",
                                file=str(python))
    return python


def tau2_data(config: Tau2Config) -> Path:
    from cipr.data.paths import data_root

    root = data_root(config.data_root)
    if not (root / "tau2" / "domains").is_dir():
        raise MissingInputError("no τ² data (tau2/domains) under the data root; set data_root= or "
                                "CIPR_DATA_ROOT", file=str(root / "tau2"))
    return root


GUIDELINES = ("simulation_guidelines.md", "simulation_guidelines_tools.md")
PLACEHOLDER = ("Placeholder guidelines of the scripted user of cipr.tau2.gold, which answers from a script "
               "and never reads its system prompt.\n")


def user_guidelines(config: Tau2Config, root: Path, out_dir: Path) -> Path:
    """The folder of the user simulator's guidelines (see Tau2Config); raises if a file is missing."""
    if config.user_guidelines is None and config.backend == "gold" and config.serve is None:
        folder = out_dir / "scripted_user_guidelines"
        folder.mkdir(parents=True, exist_ok=True)
        for name in GUIDELINES:
            (folder / name).write_text(PLACEHOLDER)
        return folder
    folder = Path(config.user_guidelines) if config.user_guidelines else root / "tau2" / "user_simulator"
    for name in GUIDELINES:
        if not (folder / name).is_file():
            raise MissingInputError(
                f"τ²'s user simulator reads {name} (upstream tau2-bench data/tau2/user_simulator/{name}), "
                f"which is not in {folder}: add that folder beside tau2/domains or pass user_guidelines=DIR",
                file=str(folder / name))
    return folder


def task_ids(config: Tau2Config, root: Path, domain: str) -> list[str]:
    """The task ids of a domain's split, filtered by `tasks` and cut to `limit`."""
    split_file = root / "tau2" / "domains" / domain / "split_tasks.json"
    splits = read_json(split_file)
    if config.split not in splits:
        raise ConfigError(f"split={config.split!r}: {domain} has splits {sorted(splits)}")
    ids = [str(i) for i in splits[config.split]]
    if config.tasks is not None:
        wanted = {t.partition("/")[2] for t in config.tasks if t.partition("/")[0] == domain}
        ids = [i for i in ids if i in wanted]
    return ids[: config.limit] if config.limit is not None else ids


@contextmanager
def served(config: Tau2Config, out_dir: Path, root: Path, backend: Any = None) -> Iterator[tuple[str, str]]:
    """(root URL of cipr-serve, model name): the configured one, or one started in this process (on
    `backend` when given, a `cipr.serve` chat backend object, else the one `config.backend` names)."""
    if config.serve is not None:
        import httpx

        url = config.serve.rstrip("/")
        name = config.model_name or httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        yield url, name
        return
    from cipr.serve import ChatService, ServeConfig, start, stop

    if backend is not None:
        pass
    elif config.backend == "gold":
        from cipr.tau2.gold import GoldReplayBackend

        backend = GoldReplayBackend(root, out_dir)
    else:
        from cipr.serve.command import ServeCommand, build_backend

        backend = build_backend(ServeCommand(backend=config.backend, model_name=config.model_name,
                                             call_format=config.call_format,
                                             max_new_tokens=config.max_new_tokens, threads=config.threads,
                                             tokenizer=config.tokenizer))
    service = ChatService(backend, ServeConfig(guard=config.guard, guard_budget=config.guard_budget,
                                               audit=str(out_dir / "audit.jsonl")
                                               if config.guard != "off" else None))
    server, thread = start(service)
    try:
        yield server.url, config.model_name or backend.models()[0]
    finally:
        stop(server, thread)


def _llm(model: str, url: str, config: Tau2Config) -> dict[str, Any]:
    return {"model": f"openai/{model}",
            "args": {"api_base": url, "api_key": os.environ.get("OPENAI_API_KEY", "none"),
                     "temperature": config.temperature, "num_retries": config.num_retries}}


def spec_for(config: Tau2Config, out_dir: Path, url: str, model: str, names: str, domain: str, trial: int,
             ids: list[str], guidelines: Path) -> dict[str, Any]:
    """The harness spec of one (trial, names, domain) batch."""
    user = _llm(config.user_model or model, config.user_url or f"{url}/original/v1", config)
    judge = None
    if config.judge == "user":
        judge = user
    elif config.judge not in ("user", "none"):
        judge = _llm(config.judge_model or model, config.judge, config)
    return {"domain": domain, "split": config.split, "task_ids": ids, "trial": trial, "seed": config.seed,
            "max_steps": config.max_steps, "max_errors": config.max_errors,
            "evaluation": config.evaluation, "names": names,
            "agent": _llm(model, f"{url}/{names}/v1", config), "user": user, "judge": judge,
            "out": str(out_dir / RECORDS), "sims": str(out_dir / "sims" / names / domain),
            "tools_out": str(out_dir / f"tools_{domain}.json"), "user_guidelines": str(guidelines),
            "tag_task": config.backend == "gold" and config.serve is None}


def run_tau2(config: Tau2Config, backend: Any = None) -> dict[str, Any]:
    """Run what is missing in `config.out_dir`, then convert all records; returns the summary. `backend`:
    a chat backend for the in-process cipr-serve (`config.backend` still names it in run.json)."""
    config.check()
    python, root = tau2_python(config), tau2_data(config)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    guidelines = user_guidelines(config, root, out_dir)
    done = {record_key(r) for r in read_records(out_dir / RECORDS)}
    env = {**os.environ, "TAU2_DATA_DIR": str(root), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with served(config, out_dir, root, backend) as (url, model):
        for trial in range(config.trials):
            for domain in config.domains:
                for names in config.names:
                    ids = [i for i in task_ids(config, root, domain) if (names, domain, i, trial) not in done]
                    if not ids:
                        continue
                    spec = spec_for(config, out_dir, url, model, names, domain, trial, ids, guidelines)
                    spec_path = out_dir / f"spec_{names}_{domain}_trial{trial}.json"
                    spec_path.write_text(json.dumps(spec, indent=1))
                    log.info("τ² %s names, %s, trial %d: %d tasks", names, domain, trial, len(ids))
                    try:
                        subprocess.run([str(python), str(HARNESS), str(spec_path)], env=env, check=True,
                                       timeout=config.timeout_s)
                    except subprocess.TimeoutExpired:
                        log.warning("τ² harness passed timeout_s=%s; rerun the command to continue",
                                    config.timeout_s)
                    except subprocess.CalledProcessError as e:
                        raise RuntimeError(f"the τ² harness failed (exit {e.returncode}) on {spec_path}; its "
                                           "output is above") from e
    meta = {"model": model, "backend": config.backend if config.serve is None else config.serve,
            "config": {k: v for k, v in asdict(config).items() if k not in ("out_dir",)},
            "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    return convert(out_dir, meta)
