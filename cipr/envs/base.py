"""The environment interface: what a multi-turn episode, a live evaluation or a trajectory generator needs.

An episode (issue 50's shared spec, as built):

    first = env.reset(task_id)                   # the first user message
    while True:                                  # one assistant message per pass, at most limits.max_turns
        calls = <the agent's calls, translated back to env.interface's names>
        if calls:                                # executed in order, one observation message per call
            for call in calls[:limits.max_calls]:
                result = env.step(call)          # result.observation; result.done ends the episode
        else:                                    # answered without a call: the user turn ends
            nxt = env.end_turn(text)             # the next user message, or None: the episode is over
    score = env.score()                          # reward in [0, 1], success, per-turn checks, details

- `interface` holds the tools shown now, under the environment's own names; it may grow between user
  turns (BFCL's miss_func reveals a held-out function): read it after every `end_turn`. `declared` holds
  every tool `step` executes (the shown ones and, in BFCL's miss_func, the withheld ones, which BFCL
  executes too); it never changes during an episode, so an adapter built on it keeps its ids.
- A call the agent's text does not make executable is never passed to `step`: a name outside the tools the
  agent was given (the adapter's `UndeclaredToolError`) gets `no_such_tool(name)` as its observation,
  arguments that cannot be parsed get `unparseable(error)`. `step` refuses an undeclared name itself too
  (`valid=False`, the same text), so nothing undeclared ever executes.
- `limits`: `max_turns` assistant messages per episode (the episode ends, and is scored, when it is
  reached), `max_calls` calls per assistant message (calls past it are not executed; each gets
  `over_call_limit()`), `max_steps_per_turn`: after a message's calls are executed, a user turn that has
  had more than this many messages with calls force-quits the episode (BFCL's inference, 20; None: no
  bound). A force-quit or max_turns episode is scored as it stands (BFCL: too few turns, invalid).
- `tasks(split)`: "train" or "heldout", disjoint seeded lists of task ids (each module states its split).
- `turn`: index of the current user turn (0-based), for per-turn records.

Deviations from the shared spec, for H14: the protocol adds `limits`, `turn` and `declared` (read-only
properties or attributes), and `reset` also takes an int task id (ToyShop's older callers pass ints).
`StepResult` keeps its fields; `reward` of a step is 0 in the multi-turn environments (the reward is
`score().reward`); `done=True` ends the episode (ToyShop's purchase).

`ToyShop` (cipr/envs/toyshop.py) and `BFCLMultiTurn` (cipr/envs/bfcl_multi_turn.py) implement it
offline; `cipr.envs.webshop.WebShopEnv` wraps the real WebShop where it is installed (single turn).
`cipr.envs.registry.make_env(name, **options)` builds one by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cipr.tools.interface import Call, Interface

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class StepResult:
    """What an environment returns after a call: the observation, a reward, whether the episode ended, and
    whether the call was accepted (False: refused, nothing executed)."""

    observation: str
    reward: float = 0.0
    done: bool = False
    valid: bool = True


@dataclass(frozen=True)
class EpisodeScore:
    """An episode's outcome.

    - `reward`: in [0, 1], what training optimizes (each environment states how it is computed).
    - `success`: the environment's own verdict (BFCL: its checker's `valid`; ToyShop: reward 1).
    - `turns`: per user turn, whether its checks passed (None: not checked, e.g. after the first failure).
    - `details`: environment-specific (BFCL: the checker's error type and message).
    """

    reward: float
    success: bool
    turns: tuple[bool | None, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"an episode's reward must lie in [0, 1], got {self.reward}")

    def to_json(self) -> dict[str, Any]:
        return {"reward": self.reward, "success": self.success, "turns": list(self.turns),
                "details": dict(self.details)}


@dataclass(frozen=True)
class EpisodeLimits:
    """Bounds of one episode (see the module docstring); each environment's config sets them."""

    max_turns: int = 24
    max_calls: int = 8
    max_steps_per_turn: int | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_calls < 1:
            raise ValueError(f"max_turns={self.max_turns} and max_calls={self.max_calls} must be >= 1")
        if self.max_steps_per_turn is not None and self.max_steps_per_turn < 1:
            raise ValueError(f"max_steps_per_turn={self.max_steps_per_turn} must be >= 1 (or None)")


def no_such_tool(name: str) -> str:
    """The observation for a call to a tool the interface does not declare (never executed)."""
    return f"Error: no such tool: {name!r}. Call one of the tools listed."


def unparseable(error: str) -> str:
    """The observation for a call whose text cannot be parsed (never executed)."""
    return f"Error: the call could not be parsed: {error}"


def over_call_limit(max_calls: int) -> str:
    """The observation for a call past `max_calls` in one message (never executed)."""
    return f"Error: at most {max_calls} calls per message are executed; this one was not."


class ActionEnvironment(Protocol):
    """The single-instruction part (WebShop, distillation's live episodes): reset, step, interface."""

    interface: Interface

    def reset(self, task_id: Any) -> str:
        """Start task `task_id`; returns the first user message (the instruction)."""
        ...

    def step(self, call: Call) -> StepResult:
        """Execute one call to one of `interface`'s tools (its own names)."""
        ...


class Environment(ActionEnvironment, Protocol):
    """An episodic multi-turn environment whose actions are calls to its interface's tools."""

    name: str
    limits: EpisodeLimits

    @property
    def declared(self) -> Interface:
        """Every tool `step` executes in this episode (`interface` and any withheld ones; fixed)."""
        ...

    @property
    def turn(self) -> int:
        """Index of the current user turn (0 after `reset`)."""
        ...

    def tasks(self, split: str) -> list[str]:
        """Task ids of `split` ("train" or "heldout"; disjoint, seeded, stated by the module)."""
        ...

    def end_turn(self, text: str) -> str | None:
        """The agent answered `text` without a call: the next user message, or None (episode over)."""
        ...

    def score(self) -> EpisodeScore:
        """The episode's outcome (call once it is over; calling earlier scores what happened so far)."""
        ...


def check_split(split: str, where: str) -> None:
    """ValueError naming `where` unless `split` is one of SPLITS."""
    if split not in SPLITS:
        raise ValueError(f"{where}: split must be one of {', '.join(SPLITS)}, got {split!r}")
