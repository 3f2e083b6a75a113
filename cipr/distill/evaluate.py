"""Evaluation of self-distillation: offline agreement and KL under renamed actions, and live episodes.

Offline (no environment): on held-out trajectories, the action distribution of a model (teacher or
student) is read at every decision of the demonstration rendered under a naming:

- `original`: the names the teacher was trained with (`search`, `click`);
- `canonical`: neutral ids (`function_01`, ...), the interface the student is deployed with (for the
  teacher: the released model behind the canonicalization adapter);
- `synonyms`: `search`→`find`, `click`→`press` (paper §4.3), the model seeing the names directly;
- `swapped`: `search`↔`click`, each name suggesting the other action.

The reference is the teacher under the original names. Per model and naming the table reports the
action *agreement* (share of decisions whose most probable action, ∅ included, is the teacher's
original-name choice; actions by equivalence, so under swapped names the search action is the one
named `click`) and the *KL*(teacher original || model under the naming), averaged over a
trajectory's decisions and then over trajectories.

Live (`live_evaluate`): greedy episodes in an `Environment` (ToyShop here; `cipr.envs.webshop` where
WebShop is installed) under a naming. Each turn the conversation so far (kept under the original
names) is renamed, rendered, and the model's action is parsed and translated back to the original
name. A turn whose action cannot be parsed, or names an undeclared action, ends the episode with
reward 0 (counted by cause): never guessed into a declared action.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from cipr.core.errors import ConfigError
from cipr.distill.batch import action_query
from cipr.distill.conversation import Rendered, render_conversation
from cipr.distill.naming import SWAPPED, SYNONYMS, Naming, named
from cipr.envs.base import Environment
from cipr.formats.base import CallFormat
from cipr.method.actions import read_actions
from cipr.method.consistency import kl_rows, segment_mean
from cipr.runtime.generation import greedy_texts
from cipr.tools.canonical import RewriteText, UndeclaredToolError
from cipr.tools.interface import Example, Message

NAMINGS: tuple[str, ...] = ("original", "canonical", "synonyms", "swapped")


@dataclass
class EvalConfig:
    """What the evaluation reads and plays.

    - `namings`: the columns of the table (any of original, canonical, synonyms, swapped).
    - `renames`: the synonym and swap tables (old name -> new name).
    - `batch_size`: trajectories per forward of the action reader.
    - `live_tasks`: greedy episodes per model and naming in the environment (0: offline only);
      tasks `live_first_task`, ... (ToyShop trajectories for training use tasks 0..n-1).
    - `live_env`: "toyshop" (seeded with the data seed) or "webshop" (needs `web_agent_site`).
    - `dtype`: "bfloat16" evaluates bfloat16 copies of teacher and student (both alike, a fair
      comparison); "model" evaluates them as loaded.
    """

    namings: tuple[str, ...] = NAMINGS
    renames: dict[str, dict[str, str]] = field(default_factory=lambda: {"synonyms": dict(SYNONYMS),
                                                                         "swapped": dict(SWAPPED)})
    batch_size: int = 4
    live_tasks: int = 0
    live_first_task: int = 100_000
    live_max_steps: int = 8
    live_max_new_tokens: int = 64
    live_env: Literal["toyshop", "webshop"] = "toyshop"
    dtype: Literal["model", "bfloat16"] = "model"


def check_eval(cfg: EvalConfig) -> None:
    """Reject unknown namings and sizes that cannot work (ConfigError naming the option)."""
    bad = [n for n in cfg.namings if n not in NAMINGS]
    if bad or not cfg.namings:
        raise ConfigError(f"algo.eval.namings: unknown {bad or 'empty list'}; choose from "
                          f"{', '.join(NAMINGS)}")
    if cfg.batch_size < 1 or cfg.live_tasks < 0 or cfg.live_max_steps < 1 or cfg.live_max_new_tokens < 1:
        raise ConfigError("algo.eval: batch_size, live_max_steps and live_max_new_tokens must be >= 1, "
                          "live_tasks >= 0")


def check_namings(examples: Sequence[Example], cfg: EvalConfig) -> None:
    """Refuse, before training, a naming whose table has no new name for a held-out trajectory's tool
    (the synonym and swap tables are WebShop's, `search` and `click`): ConfigError giving both fixes."""
    for naming in cfg.namings:
        for e in examples:
            try:
                named(e, naming, renames=cfg.renames)  # type: ignore[arg-type]
            except ValueError as err:
                raise ConfigError(f"algo.eval.namings has {naming}: {err}; or evaluate under "
                                  f"algo.eval.namings=[original,canonical]") from None


@dataclass(frozen=True)
class Readings:
    """Action distributions at every decision of some trajectories: probs [D, A+1] (∅ last), segments [D]."""

    probs: torch.Tensor
    segments: torch.Tensor

    def to_json(self) -> dict[str, Any]:
        return {"probs": self.probs.tolist(), "segments": self.segments.tolist()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Readings:
        return cls(torch.tensor(data["probs"], dtype=torch.float32),
                   torch.tensor(data["segments"], dtype=torch.long))


def render_named(examples: Sequence[Example], fmt: CallFormat, tokenizer: Any, naming: str, *,
                 rewrite: RewriteText = "all", renames: Mapping[str, Mapping[str, str]] | None = None
                 ) -> list[Rendered]:
    """Each trajectory (original names) rendered under `naming`."""
    return [render_conversation(named(e, naming, rewrite=rewrite, renames=renames)[0], fmt, tokenizer)
            for e in examples]


@torch.no_grad()
def read_rendered(model: Any, tokenizer: Any, rendered: Sequence[Rendered], fmt: CallFormat, *,
                  batch_size: int = 4, context: Callable[[], Any] = contextlib.nullcontext) -> Readings:
    """Action distributions at every decision of `rendered`, `batch_size` trajectories per forward."""
    num_actions = max(len(r.tools) for r in rendered)
    probs: list[torch.Tensor] = []
    segments: list[int] = []
    with context():
        for lo in range(0, len(rendered), batch_size):
            chunk = rendered[lo:lo + batch_size]
            reading = read_actions(model, tokenizer, [action_query(r, fmt) for r in chunk], num_actions)
            probs.append(reading.probs.float().cpu())
            segments += [lo + b for b, r in enumerate(chunk) for _ in r.decisions]
    return Readings(torch.cat(probs), torch.tensor(segments, dtype=torch.long))


def compare(reference: Readings, other: Readings, *, eps: float = 1e-6) -> dict[str, float]:
    """Argmax agreement and KL(reference || other), mean per trajectory then over trajectories."""
    if reference.probs.shape != other.probs.shape or not torch.equal(reference.segments, other.segments):
        raise ValueError(f"the two readings cover different decisions: {tuple(reference.probs.shape)} vs "
                         f"{tuple(other.probs.shape)}")
    if reference.probs.shape[0] == 0:
        return {"agreement": float("nan"), "kl": float("nan"), "decisions": 0.0, "no_call": float("nan")}
    per = kl_rows(reference.probs, other.probs, eps=eps).clamp_min(0.0)  # rounding can dip below 0
    last = other.probs.shape[1] - 1
    return {"agreement": float((reference.probs.argmax(-1) == other.probs.argmax(-1)).float().mean()),
            "kl": float(segment_mean(per, reference.segments)[0].mean()), "decisions": float(per.numel()),
            "no_call": float((other.probs.argmax(-1) == last).float().mean())}


def offline_rows(readings: Mapping[str, Mapping[str, Readings]], reference: Readings
                 ) -> dict[str, dict[str, dict[str, float]]]:
    """{model: {naming: compare(reference, readings[model][naming])}}."""
    return {model: {naming: compare(reference, r) for naming, r in per.items()}
            for model, per in readings.items()}


def markdown_table(rows: Mapping[str, Mapping[str, Mapping[str, float]]],
                   live: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None) -> str:
    """The evaluation table: one row per model, agreement and KL per naming (and live reward if played)."""
    namings = list(dict.fromkeys(n for per in rows.values() for n in per))
    head = ["model"] + [f"{n} agree" for n in namings] + [f"{n} KL" for n in namings]
    if live:
        head += [f"{n} reward" for n in namings]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, per in rows.items():
        cells = [model] + [f"{per[n]['agreement']:.3f}" if n in per else "" for n in namings]
        cells += [f"{per[n]['kl']:.4f}" if n in per else "" for n in namings]
        if live:
            got = live.get(model, {})
            cells += [f"{got[n]['reward']:.3f}" if n in got else "" for n in namings]
        lines.append("| " + " | ".join(cells) + " |")
    decisions = next((int(v["decisions"]) for per in rows.values() for v in per.values()), 0)
    lines.append("")
    lines.append(f"Agreement: share of the {decisions} held-out decisions where the model's most probable "
                 f"action (∅ included) is the teacher's under the original names; KL(teacher original || "
                 f"model), mean per trajectory then over trajectories.")
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | Path, rows: Mapping[str, Any], live: Mapping[str, Any] | None,
                 extra: Mapping[str, Any] | None = None) -> tuple[Path, Path]:
    """Write `eval.json` and `table.md` into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"reference": "teacher under the original names", "offline": rows, "live": live or {},
               **(extra or {})}
    (out / "eval.json").write_text(json.dumps(payload, indent=2))
    (out / "table.md").write_text(markdown_table(rows, live))
    return out / "eval.json", out / "table.md"


Policy = Callable[[str, int], str]
"""A policy for live episodes: (prompt text, max new tokens) -> the reply text."""


def greedy_policy(model: Any, tokenizer: Any) -> Policy:
    """`model` decoding greedily (`cipr.runtime.generation.greedy_texts`)."""
    return lambda prompt, n: greedy_texts(model, tokenizer, [prompt], max_new_tokens=n)[0][1]


def live_episode(policy: Policy, tokenizer: Any, env: Environment, task_id: int, fmt: CallFormat,
                 naming: Naming, *, rewrite: RewriteText = "all",
                 renames: Mapping[str, Mapping[str, str]] | None = None, max_steps: int = 8,
                 max_new_tokens: int = 64, max_observation_chars: int | None = None) -> dict[str, Any]:
    """One greedy episode under `naming`: reward, steps, and why it ended."""
    def clip(text: str) -> str:
        if max_observation_chars is None or len(text) <= max_observation_chars:
            return text
        return text[:max_observation_chars].rstrip() + " ..."

    messages = [Message("user", clip(env.reset(task_id)))]
    for step in range(max_steps):
        example, nmap = named(Example(f"live_{task_id}", tuple(messages), env.interface), naming,
                              rewrite=rewrite, renames=renames)
        text = policy(fmt.render_prompt(tokenizer, example.messages, example.interface), max_new_tokens)
        parsed = fmt.parse(text)
        if not parsed.calls:
            return {"reward": 0.0, "steps": step + 1, "end": "unparsed", "last": text[:200]}
        try:
            call = nmap.translate_back(parsed.calls[0])
        except UndeclaredToolError:
            return {"reward": 0.0, "steps": step + 1, "end": "undeclared", "last": text[:200]}
        result = env.step(call)
        messages.append(Message("assistant", parsed.think or "", (call,)))
        if result.done:
            return {"reward": float(result.reward), "steps": step + 1, "end": "done"}
        messages.append(Message("user", clip(f"Observation:\n{result.observation}")))
    return {"reward": 0.0, "steps": max_steps, "end": "max_steps"}


def live_evaluate(policy: Policy, tokenizer: Any, env_factory: Callable[[], Environment],
                  tasks: Sequence[int], fmt: CallFormat, naming: Naming, **kwargs: Any) -> dict[str, float]:
    """Mean reward, success rate (reward 1) and the share of episodes ended by each cause over `tasks`."""
    episodes = [live_episode(policy, tokenizer, env_factory(), t, fmt, naming, **kwargs) for t in tasks]
    n = max(len(episodes), 1)
    out = {"reward": sum(e["reward"] for e in episodes) / n,
           "success": sum(e["reward"] >= 1.0 for e in episodes) / n, "episodes": float(len(episodes))}
    for end in ("done", "unparsed", "undeclared", "max_steps"):
        out[f"end/{end}"] = sum(e["end"] == end for e in episodes) / n
    return out
