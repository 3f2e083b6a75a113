"""The environment interface and the one episode loop training and evaluation both play.

An episode: `env.reset(task_id)` gives the first user message, `Play.act` applies each assistant turn, and
`env.score()` scores the episode as it stands once it ends. The rule of a turn, in this order (the reasons
are in docs/multi_turn.md), with the episode's `end` in brackets:
1. the backend failed (evaluation): the episode ends [`backend_error`];
2. the turn was cut off by the token limit (no end token): it ends, nothing of the turn runs [`cut_off`];
3. it does not parse and the call format cannot write it back as a message (call syntax it could not read):
   it ends, nothing runs [`unparseable`];
4. it opens no call (no decision naming a tool) and none is read: an answer, `env.end_turn(text)` gives the
   next user message or None [`done`], malformed or not (BFCL moves on after a response it cannot decode);
5. else its readable calls run in order, one observation message each, then a malformed turn's parse error;
   a call that ends the episode (`StepResult.done`) ends it [`done`] and the turn's later calls do not run;
then [`force_quit`] after more than `limits.max_steps_per_turn` turns with calls in a user turn, and
[`max_turns`] after `limits.max_turns` turns. A call never reaches `step` when its name is not declared
(`UndeclaredToolError`: `no_such_tool`), its tool was added by the perturbation (`AddedToolError`:
`unavailable`) or it is past `limits.max_calls` (`over_call_limit`); `step` refuses an undeclared name
itself too (`valid=False`); an environment that raises on a call answers it with the error, counted. The
environment never sees an episode's names: calls and answers are translated back, its texts into them
(`Names`). `play_rounds` plays episodes in lock step (one generation call a round) and `Progress` says what
they are doing, from a timer too while a round is generated.

The protocol: `interface` holds the tools shown now, under the environment's own names; it may grow between
user turns (BFCL's miss_func reveals a function): read it after every `end_turn`. `declared` holds every
tool `step` executes (BFCL's withheld ones too); it never changes during an episode, so an adapter built on
it keeps its ids. `tasks(split)`: "train" or "heldout", disjoint seeded task ids; `turn`: the current user
turn (0-based). Deviations from the shared spec, for H14: the protocol adds `limits`, `turn` and `declared`,
and `reset` also takes an int task id; a step's `reward` is 0 in the multi-turn environments (the reward is
`score().reward`); `done=True` ends the episode (ToyShop's purchase). `ToyShop` and `BFCLMultiTurn`
implement it offline, `cipr.envs.webshop.WebShopEnv` wraps the real WebShop (single turn);
`cipr.envs.registry.make_env(name, **options)` builds one by name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from cipr.formats.base import CallFormat, Decision, ParseResult, TemplateFormat
from cipr.tools.canonical import UndeclaredToolError
from cipr.tools.interface import Call, Interface, Message

log = logging.getLogger(__name__)

SPLITS = ("train", "heldout")
HEARTBEAT_S = 20.0
"""Seconds between progress lines while a round of turns is generated: the first within 30 s, then at least
one a minute, however long a round takes."""


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


class AddedToolError(KeyError):
    """A call to a tool the perturbation added (a twin, a distractor, a costlier equivalent): no environment
    tool stands behind it."""

    def __init__(self, name: str, role: str) -> None:
        self.name, self.role = name, role
        super().__init__(f"{name!r} was added by the perturbation ({role}); nothing executes it")

    def __str__(self) -> str:
        return self.args[0]


def unavailable(name: str) -> str:
    """The observation for a call to an added tool (never executed)."""
    return f"Error: the tool {name!r} is unavailable."


class Names(Protocol):
    """How one episode's names reach the environment (evaluation's `EpisodeView`, training's `EpisodeNames`):
    a call translated back (UndeclaredToolError, AddedToolError), an environment text into the episode's
    names, an answer of the policy out of them."""

    def to_env(self, call: Call) -> Call: ...
    def text_in(self, text: str) -> str: ...
    def text_out(self, text: str) -> str: ...


def assistant_message(fmt: CallFormat, parse: ParseResult, text: str) -> Message:
    """A turn as a conversation message the format renders back (ReAct formats keep the thought with the
    calls, the others the response text)."""
    from cipr.formats.react import ReActFormat, WebShopFormat

    if parse.calls:
        react = isinstance(fmt, (ReActFormat, WebShopFormat))
        return Message("assistant", (parse.think if react else parse.response) or "", tuple(parse.calls))
    return Message("assistant", parse.response if parse.response is not None else text.strip())


def writable(fmt: CallFormat, message: Message) -> bool:
    """Whether the call format writes `message` back into a conversation (rule 3 of the module docstring)."""
    try:
        fmt.chat([message], Interface(()), native_tools=isinstance(fmt, TemplateFormat))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Turn:
    """One assistant turn as the loop reads it: its text (without the end token), what the call format parsed,
    whether it opens a call (a decision naming a tool), whether it ended (False: cut off by the token limit),
    and the backend's error (evaluation)."""

    text: str
    parse: ParseResult = field(default_factory=ParseResult)
    opens_call: bool = False
    ended: bool = True
    error: str | None = None

    @property
    def answer(self) -> bool:
        """Rule 4: no call read and none opened."""
        return not self.parse.calls and not self.opens_call


def read_turn(fmt: CallFormat, text: str, *, ended: bool = True, parse: ParseResult | None = None,
              decisions: Sequence[Decision] | None = None) -> Turn:
    """`text` read by `fmt`: parsed (unless the backend parsed it) and whether it opens a call (`decisions`
    when the caller has them)."""
    if decisions is None:
        try:
            decisions = fmt.decisions(text)
        except Exception:  # noqa: BLE001 - a format that cannot read the text found no call in it
            decisions = []
    return Turn(text, parse if parse is not None else fmt.parse(text),
                any(d.taken is not None for d in decisions), ended)


class Play:
    """One episode while it is played: the rule of a turn (module docstring) and what it counted.

    `counts`: `messages` (assistant turns), `calls` (written), `executed`, `refused` (by the environment,
    `valid=False`), `undeclared`, `added`, `over_limit`, `parse_failures`, `env_errors`, `backend_errors`;
    `added_roles`: the role of each added tool called; `calls`: every call written; `executed`: the last
    turn's calls as the environment ran them (None: not run); `end`: why it ended (None while it runs)."""

    def __init__(self, env: Environment, names: Names, fmt: CallFormat) -> None:
        self.env, self.names, self.fmt = env, names, fmt
        self.counts: Counter[str] = Counter()
        self.added_roles: list[str] = []
        self.calls: list[Call] = []
        self.executed: list[Call | None] = []
        self.steps_in_turn = 0
        self.end: str | None = None
        self.env_seconds = 0.0

    def in_env(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, its time counted in `env_seconds`."""
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.env_seconds += time.perf_counter() - start

    def act(self, turn: Turn) -> list[Message]:
        """Apply one turn (the rule, module docstring): the messages that follow it (observations and the
        parse error, or the next user message); `end` is set once the episode is over."""
        c, parse, limits = self.counts, turn.parse, self.env.limits
        c["messages"] += 1
        self.executed = []
        if turn.error is not None:
            c["backend_errors"] += 1
            self.end = "backend_error"
            return []
        if not turn.ended:
            self.end = "cut_off"
            return []
        if not parse.ok:
            c["parse_failures"] += 1
            if not writable(self.fmt, assistant_message(self.fmt, parse, turn.text)):
                self.end = "unparseable"
                return []
        if turn.answer:
            answer = parse.response if parse.response is not None else turn.text.strip()
            following = self.in_env(self.env.end_turn, self.names.text_out(answer))
            self.steps_in_turn = 0
            if following is None:
                self.end = "done"
                return []
            out = [Message("user", self.names.text_in(following))]
        else:
            out = [Message("tool", self._call(k, call), name=call.name) for k, call in enumerate(parse.calls)]
            if not parse.ok:
                out.append(Message("tool" if parse.calls else "user",
                                   unparseable(parse.error or "malformed response")))
            self.steps_in_turn += 1
            bound = limits.max_steps_per_turn
            if self.end is None and bound is not None and self.steps_in_turn > bound:
                self.end = "force_quit"
        if self.end is None and c["messages"] >= limits.max_turns:
            self.end = "max_turns"
        return out

    def _call(self, k: int, call: Call) -> str:
        """Execute the turn's `k`-th call unless it may not be (module docstring); its observation."""
        c, limits = self.counts, self.env.limits
        c["calls"] += 1
        self.calls.append(call)
        ran = None
        if self.end is not None:
            obs = "Error: the episode is over; the call was not executed."
        elif k >= limits.max_calls:
            c["over_limit"] += 1
            obs = over_call_limit(limits.max_calls)
        else:
            try:
                target = self.names.to_env(call)
            except UndeclaredToolError:
                c["undeclared"] += 1
                obs = no_such_tool(call.name)
            except AddedToolError as e:
                c["added"] += 1
                self.added_roles.append(e.role)
                obs = unavailable(call.name)
            else:
                try:
                    result = self.in_env(self.env.step, target)
                except Exception as e:  # noqa: BLE001 - an environment bug must not end a long run: counted
                    c["env_errors"] += 1
                    if c["env_errors"] == 1:
                        log.warning("environment %s raised on %s: %r", self.env.name, target, e)
                    obs = f"Error: {type(e).__name__}: {e}"
                else:
                    ran = target
                    c["executed" if result.valid else "refused"] += 1
                    obs = self.names.text_in(str(result.observation))
                    if result.done:
                        self.end = "done"
        self.executed.append(ran)
        return obs


class Progress:
    """What episodes being played say: `say` gets a line (episodes finished, turns and their rate, the round
    being generated and for how long) from a timer thread every `heartbeat_s` seconds, so a lock-step round
    that takes minutes still says it is alive, and at every round and turn when `every_turn`."""

    def __init__(self, episodes: int, say: Callable[[str], None], *, every_turn: bool = False,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.episodes, self.say, self.every_turn, self.heartbeat_s = episodes, say, every_turn, heartbeat_s
        self.rounds = self.turns = self.finished = self.generating = 0
        self.started = self.round_started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beats, name="episode-progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beats(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.say(self.line())

    def line(self) -> str:
        now = time.monotonic()
        return (f"{self.finished}/{self.episodes} episodes, {self.turns} turns "
                f"({self.turns / max(now - self.started, 1e-9):.2f}/s); round {self.rounds}: "
                f"{self.generating} turns, {now - self.round_started:.0f} s")

    def round(self, n: int) -> None:
        """A round of `n` turns starts."""
        self.rounds, self.generating, self.round_started = self.rounds + 1, n, time.monotonic()
        if self.every_turn and n:
            self.say(self.line())

    def turn(self, finished: bool) -> None:
        """A turn was applied; `finished`: its episode is over."""
        self.turns, self.finished = self.turns + 1, self.finished + finished
        if self.every_turn:
            self.say(self.line())


P = TypeVar("P", bound=Play)


def play_rounds(plays: Sequence[P], generate: Callable[[list[P]], Sequence[Any] | None],
                take: Callable[[P, Any], None], progress: Progress) -> None:
    """Play `plays` in lock step: each round `generate` gives every unfinished episode its next turn (None:
    no round is left, e.g. when no process has an unfinished episode) and `take` applies each, in order."""
    while True:
        active = [p for p in plays if p.end is None]
        progress.round(len(active))
        outs = generate(active)
        if outs is None:
            return
        if len(outs) != len(active):
            raise RuntimeError(f"{len(outs)} turns were generated for {len(active)} episodes")
        for play, out in zip(active, outs, strict=True):
            take(play, out)
            progress.turn(play.end is not None)
