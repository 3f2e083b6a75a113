"""Multi-turn GRPO (`rollout.mode=multi_turn env=...`): episode rows, the rollout loop, token-exact assembly.

An episode is played by the loop evaluation plays too (`cipr.envs.base`: `Play.act` applies each turn by one
rule, `play_rounds` runs the rounds): the environment's first user message -> the policy's assistant turn ->
its calls' observations, or the environment's next user message -> ... -> `Environment.score()`.

Rows and interfaces. One dataset row per (task, side): the task's tools and first message form an Example
(`cipr.train.data.build_prompts` renders it under `perturb.names`, paired with its perturbed copy for
multi_interface and cipr), so each episode sees its own tool list, and a pair's two rows start from the same
task (the environment is reset to the same state). A task whose tools change during the episode (BFCL's
miss_func reveals a function at a later turn) is skipped and counted: the tool list is part of the prompt,
which a token-exact episode never re-renders. `EpisodeNames` translates every call back before the
environment sees it: canonical (or masked) ids through the adapter's name map, a perturbed name through the
perturbation's correspondence and then the name map (a degraded twin, declared without an equivalent, is
an added tool: "unavailable", never executed); the texts the environment sends (later user messages,
observations) are rewritten into the episode's names as canonicalization rewrites the first message
(`perturb.rewrite_text`).

Token-exact trajectories. The completion is the concatenation of the sampled ids of every turn (kept as
sampled, never re-tokenized) and of the ids between turns: the observation (or next user) messages with
the chat template's own rendering, through the next turn's generation prompt, rendered once
(`follow_text`: the template's text after a turn's end token) and tokenized on their own. `mask` is 1 on
sampled ids and 0 on those ids; it reaches TRL as the rollout function's `env_mask`, which TRL multiplies
into the loss mask. A turn cut off by the length budget (`rollout.max_completion_length` in all, at most
`rollout.max_turn_tokens` a turn) ends the episode (`cut_off`, the loop's rule 2), and so does a turn after
which the ids between turns would leave no room for another (`budget`); the ids between turns are appended
only when another turn follows, so a finished episode's completion ends with its last turn's end token.

The rounds run every episode of the generation batch in lock step: one call of the trainer's generation
hook per round with every unfinished episode's context (prompt + completion so far), so HF and vLLM
(colocate or server) sample through the same code. Under several processes the rounds are synchronised
(`sync`: the largest number of unfinished episodes and token budget of all processes), and a process with
fewer pads its call with copies of a prompt whose samples it drops: ZeRO-3's gathered generation and vLLM's
server split their work per call and need every process in every call. A step whose episodes take longer
than `HEARTBEAT_S` logs what they are doing at that interval (`cipr.envs.base.Progress`).

Reward: the environment's score in [0, 1] plus `rollout.format_weight` x the share of assistant turns that
ended with the end token and parse under the call format (the single-turn reward's format term for call
formats without ToolRL's tags, turn by turn). The decisions of each turn are the call format's decisions
of its text, at their offsets in the episode's text, so the consistency terms read every turn's decisions
on the multi-turn context (`cipr.method.pairing`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.core.config import ConfigError
from cipr.core.errors import DataError
from cipr.envs.base import HEARTBEAT_S, AddedToolError, Environment, Play, Progress, play_rounds, read_turn
from cipr.formats.base import CallFormat, Decision, supports_native_tools
from cipr.perturb.config import PerturbConfig
from cipr.tools.canonical import RewriteText, UndeclaredToolError, canonicalize, rewrite_text
from cipr.tools.interface import Call, Example, Interface, Message
from cipr.train.data import DataConfig, PromptRecord, PromptSet, build_prompts

log = logging.getLogger("cipr.train")

Sample = Callable[[list[list[int]], int], tuple[list[list[int]], list[list[float]] | None]]
"""Generation hook: (contexts, max new tokens) -> (sampled ids per context, their log-probs or None)."""
Sync = Callable[[list[int]], list[int]]
"""Element-wise maximum of a few integers over every process (identity on one process)."""


@dataclass(frozen=True)
class EpisodeOptions:
    """The rollout options of episodes (`cipr.train.rollout.RolloutConfig`'s multi-turn fields).

    `tasks`: how many of the environment's `train` tasks to train on (0: all; the held-out split is never
    used here); `max_turn_tokens`: sampled tokens per turn (None: the rest of the budget); `format_weight`:
    the format term's weight in the reward."""

    tasks: int = 0
    max_turn_tokens: int | None = None
    format_weight: float = 1.0


def env_name(env: Mapping[str, Any]) -> str:
    """The `env` section's environment (`none`: no episodes)."""
    return str(env.get("name", "none"))


def validate_env(env: Mapping[str, Any], rollout: Any, algo: Any) -> None:
    """Refuse an `env` section and episode options that cannot mean what they say; the environment's own
    options are checked by its config class (`cipr.envs.registry.env_config`), before any work."""
    name = env_name(env)
    if rollout.mode != "multi_turn":
        if name != "none" or set(env) - {"name"}:
            raise ConfigError(f"env={name} (or an env option) is set but rollout.mode={rollout.mode}: "
                              f"episodes run with rollout.mode=multi_turn; set it, or remove the env options")
        return
    if name == "none":
        raise ConfigError("rollout.mode=multi_turn plays episodes in an environment: set env=toyshop or "
                          "env=bfcl_multi_turn")
    if not getattr(algo, "uses_grpo", False):
        raise ConfigError(f"rollout.mode=multi_turn samples episodes for GRPO; algo={algo.name} with "
                          f"algo.regime={getattr(algo, 'regime', None)} samples none (use grpo, "
                          f"multi_interface, masking or cipr with algo.regime=rl)")
    from cipr.envs.registry import env_config

    env_config(name, env)


def env_factory(env: Mapping[str, Any]) -> Callable[[], Environment]:
    """A function building one fresh environment of the `env` section (one per concurrent episode)."""
    from cipr.envs.registry import make_env

    name = env_name(env)
    options = {k: v for k, v in env.items() if k != "name"}

    def build() -> Environment:
        return make_env(name, **options)

    return build


@dataclass(frozen=True)
class EpisodeNames:
    """One episode's tool names against the environment's (original) ones.

    `back[name]`: (original name, {argument as written: original argument}) for each declared tool, None for
    a declared tool without an equivalent (a twin); `forward`: original name -> this episode's name, for the
    environment's texts; `rewrite`: how texts are rewritten (`cipr.tools.canonical.rewrite_text`)."""

    back: Mapping[str, tuple[str, Mapping[str, str]] | None]
    forward: Mapping[str, str]
    rewrite: RewriteText = "identifiers"

    def to_env(self, call: Call) -> Call:
        """The call under the environment's names: UndeclaredToolError for a name this episode does not
        declare, AddedToolError for a twin."""
        if call.name not in self.back:
            raise UndeclaredToolError(call.name, list(self.back))
        target = self.back[call.name]
        if target is None:
            raise AddedToolError(call.name, "twin")
        name, args = target
        return Call(name, {args.get(k, k): v for k, v in call.arguments.items()})

    def text_in(self, text: str) -> str:
        """An environment text under this episode's names."""
        return rewrite_text(text, self.forward, self.rewrite) if self.forward else text

    def text_out(self, text: str) -> str:
        """An answer of the policy under the environment's names."""
        inverse = {v: k for k, v in self.forward.items() if v != k}
        return rewrite_text(text, inverse, self.rewrite) if inverse else text


def episode_names(source: Example, record: PromptRecord, data: DataConfig, perturb: PerturbConfig
                  ) -> EpisodeNames:
    """The `EpisodeNames` of `record` (built by `build_prompts` from `source` under the resolved `perturb`),
    by the same deterministic steps (canonicalization or masking, then the training perturbation for a
    perturbed row)."""
    from cipr.train.data import mask_example

    rewrite = perturb.rewrite_text or "identifiers"
    if perturb.names == "original":
        out = EpisodeNames({t: (t, {}) for t in source.interface.names}, {}, rewrite)
    else:
        if perturb.names == "masked":
            example, nmap = mask_example(source, seed=data.seed, length=perturb.mask_length, rewrite=rewrite)
        else:
            example, nmap = canonicalize(source, rewrite)
        out = EpisodeNames({cid: (orig, dict(nmap.arguments.get(cid, {}))) for cid, orig in nmap.tools},
                           nmap.forward, rewrite)
        if record.side == "perturbed":
            from cipr.perturb.registry import training_copy

            seed = data.seed if perturb.seed is None else perturb.seed
            _, corr = training_copy(example, perturb.preset, seed=seed, twin_wordings=perturb.twin_wordings)
            corr = corr.compose(nmap.backward, nmap.arguments)
            forward: dict[str, str] = {}
            for written, sources in zip(corr.names, corr.sources, strict=True):
                if sources:
                    forward.setdefault(sources[0], written)
            out = EpisodeNames({w: ((s[0], dict(a)) if s else None)
                                for w, s, a in zip(corr.names, corr.sources, corr.arguments, strict=True)},
                               forward, rewrite)
    if tuple(out.back) != tuple(record.tools):
        raise RuntimeError(f"episode {record.example.id} ({record.side}): the names rebuilt for the "
                           f"environment {tuple(out.back)} are not the row's tools {record.tools}")
    return out


@dataclass
class EpisodeSet(PromptSet):
    """Training rows of episodes: a `PromptSet` (records, pairs adjacent) plus, per row, the environment's
    task id (`tasks`), its `EpisodeNames` (`names`) and the first user message as the environment wrote it
    (`first`, checked again at every reset)."""

    tasks: list[Any] = field(default_factory=list)
    names: list[EpisodeNames] = field(default_factory=list)
    first: list[str] = field(default_factory=list)

    def without_long_prompts(self, tokenizer: Any, max_tokens: int) -> EpisodeSet:
        kept = super().without_long_prompts(tokenizer, max_tokens)
        index = {(r.pair_id, r.side): i for i, r in enumerate(self.records)}
        rows = [index[(r.pair_id, r.side)] for r in kept.records]
        return EpisodeSet(kept.records, kept.eval_records, kept.unit_size, kept.skipped,
                          [self.tasks[i] for i in rows], [self.names[i] for i in rows],
                          [self.first[i] for i in rows])


def build_episodes(tasks: int, data: DataConfig, perturb: PerturbConfig, fmt: CallFormat, tokenizer: Any,
                   factory: Callable[[], Environment]) -> EpisodeSet:
    """One row per training task (the first `tasks` of the environment's `train` split, 0: all), under
    `perturb.names`, each followed by its perturbed copy when `perturb.paired` (`perturb` resolved). Tasks
    whose tools change during the episode are skipped and counted."""
    world = factory()
    task_ids = list(world.tasks("train"))
    if tasks:
        task_ids = task_ids[:tasks]
    sources, first, kept = [], [], []
    skipped: dict[str, int] = {}
    for task in task_ids:
        message = world.reset(task)
        if world.declared.names != world.interface.names:
            key = "tools revealed during the episode (the prompt shows the tool list once)"
            skipped[key] = skipped.get(key, 0) + 1
            continue
        kept.append(task)
        first.append(message)
        sources.append(Example(id=f"{world.name}/{task}", messages=(Message("user", message),),
                               interface=world.interface, source=world.name))
    if not sources:
        raise DataError(f"no training task left of {len(task_ids)} (skipped: {skipped})", item=world.name,
                        field="tasks")
    prompts = build_prompts(sources, dataclasses.replace(data, eval_examples=0), perturb, fmt=fmt,
                            tokenizer=tokenizer, skipped=skipped)
    records = prompts.records
    return EpisodeSet(records, [], prompts.unit_size, prompts.skipped,
                      [kept[r.pair_id] for r in records],
                      [episode_names(sources[r.pair_id], r, data, perturb) for r in records],
                      [first[r.pair_id] for r in records])


@dataclass(frozen=True)
class Episode:
    """One played episode: ids, masks, text, decisions, what it did, and its reward parts.

    - `prompt_ids`, `completion_ids` [C], `mask` [C] (1 sampled, 0 between turns), `logprobs` [C] (the
      sampler's, 0.0 between turns; None when the sampler gives none).
    - `text`: the decoded completion without its final end token (`ended`: the completion ends with one);
      `turn_spans`: each turn's text as (start, end) characters of `text`; `token_spans`: each turn's
      sampled ids as (start, end) positions of `completion_ids` (end token included).
    - `decisions`: every turn's decisions at their offsets in `text`; `turn_of[d]`: the turn of decision d.
    - `calls`: every call the policy wrote, in its own names; `twin_calls`, `undeclared_calls`,
      `parse_errors`, `env_errors`: counts; `end`: why it ended (`cipr.envs.base`; `budget`: no room for
      another turn); `truncated`: a turn was cut off by the budget (`cut_off`).
    - `score`: the environment's reward; `format`: the share of well-formed turns; `reward`: the GRPO reward.
    """

    row: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    mask: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    text: str
    ended: bool
    turn_spans: tuple[tuple[int, int], ...]
    token_spans: tuple[tuple[int, int], ...]
    decisions: tuple[Decision, ...]
    turn_of: tuple[int, ...]
    calls: tuple[Call, ...]
    twin_calls: int
    undeclared_calls: int
    parse_errors: int
    env_errors: int
    end: str
    score: float
    success: bool
    format: float
    reward: float
    env_seconds: float

    @property
    def turns(self) -> int:
        return len(self.turn_spans)

    @property
    def truncated(self) -> bool:
        return self.end == "cut_off"

    @property
    def correctness(self) -> float:
        """The environment's score (the single-turn rollout's correctness slot)."""
        return self.score

    @property
    def no_call(self) -> bool:
        return not self.calls


class EpisodeRenderError(ConfigError):
    """The call format and chat template do not render a conversation turn by turn."""


class _Play(Play):
    """One episode while it is played (`EpisodeRunner.run`): the loop's `Play` and the token-exact
    trajectory around it."""

    def __init__(self, runner: EpisodeRunner, row: int, env: Environment) -> None:
        episodes = runner.episodes
        super().__init__(env, episodes.names[row], runner.fmt)
        self.runner, self.row = runner, row
        self.record = episodes.records[row]
        first = self.in_env(env.reset, episodes.tasks[row])
        if first != episodes.first[row]:
            raise RuntimeError(f"environment {runner.env.name}, task {episodes.tasks[row]!r}: reset returned "
                               f"another first message than when the rows were built (a reset must restore "
                               f"the same state, or the pair's episodes would not start from one)")
        self.prompt_ids = runner.prompt_ids(row)
        self.completion: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] | None = []
        self.pieces: list[str] = []
        self.length = 0
        self.turn_spans: list[tuple[int, int]] = []
        self.token_spans: list[tuple[int, int]] = []
        self.decisions: list[Decision] = []
        self.turn_of: list[int] = []
        self.formats: list[float] = []
        self.ended = False

    def _add(self, text: str) -> None:
        self.pieces.append(text)
        self.length += len(text)

    def limit(self) -> int:
        """Tokens the next turn may sample."""
        rest = self.runner.max_completion_length - len(self.completion)
        cap = self.runner.options.max_turn_tokens
        return min(rest, cap) if cap else rest

    def context(self) -> list[int]:
        return list(self.prompt_ids) + self.completion

    def take(self, ids: Sequence[int], logprobs: Sequence[float] | None, limit: int) -> None:
        """Append a sampled turn, act on it in the environment (`Play.act`), and append what follows it."""
        runner = self.runner
        ids = [int(i) for i in ids][:limit]
        ended = bool(ids) and ids[-1] in runner.eos_ids
        start = len(self.completion)
        self.completion += ids
        self.mask += [1] * len(ids)
        if logprobs is None or self.logprobs is None:
            self.logprobs = None
        else:
            self.logprobs += [float(x) for x in list(logprobs)[:limit]]
        self.token_spans.append((start, len(self.completion)))
        text = runner.decode(ids[:-1] if ended else ids)
        turn = len(self.turn_spans)
        self.turn_spans.append((self.length, self.length + len(text)))
        found = runner.fmt.decisions(text)
        for d in found:
            self.decisions.append(Decision(d.start + self.length, d.opener, d.name_suffix, d.taken))
            self.turn_of.append(turn)
        self._add(text)
        read = read_turn(runner.fmt, text, ended=ended, decisions=found)
        self.formats.append(1.0 if ended and read.parse.ok else 0.0)
        following = self.act(read)
        if not ended:
            return
        self.ended = True
        end_text = runner.decode(ids[-1:])
        self._add(end_text)
        if self.end is not None:
            return
        ids_between = runner.between_ids(self.record.example.interface, read.parse.calls, following, end_text)
        if len(self.completion) + len(ids_between) >= runner.max_completion_length:
            self.end = "budget"  # no room for another turn: the episode ends on this turn's end token
            return
        self.completion += ids_between
        self.mask += [0] * len(ids_between)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(ids_between)
        self._add(runner.decode(ids_between))
        self.ended = False

    def finish(self) -> Episode:
        runner = self.runner
        result = self.in_env(self.env.score)
        score = float(getattr(result, "reward", result))
        success = getattr(result, "success", None)
        text = "".join(self.pieces)
        if self.ended:
            text = text[:len(text) - len(runner.decode(self.completion[-1:]))]
        form = sum(self.formats) / len(self.formats) if self.formats else 0.0
        c = self.counts
        return Episode(
            row=self.row, prompt_ids=tuple(self.prompt_ids), completion_ids=tuple(self.completion),
            mask=tuple(self.mask), logprobs=tuple(self.logprobs) if self.logprobs is not None else None,
            text=text, ended=self.ended, turn_spans=tuple(self.turn_spans),
            token_spans=tuple(self.token_spans),
            decisions=tuple(self.decisions), turn_of=tuple(self.turn_of), calls=tuple(self.calls),
            twin_calls=c["added"], undeclared_calls=c["undeclared"], parse_errors=c["parse_failures"],
            env_errors=c["env_errors"], end=str(self.end),
            score=score, success=bool(success) if success is not None else score >= 1.0 - 1e-9, format=form,
            reward=score + runner.options.format_weight * form, env_seconds=self.env_seconds)


class EpisodeRunner:
    """Plays the episodes of a generation batch (module docstring); one environment per concurrent episode,
    kept across batches."""

    def __init__(self, episodes: EpisodeSet, fmt: CallFormat, tokenizer: Any, options: EpisodeOptions,
                 factory: Callable[[], Environment], *, max_completion_length: int) -> None:
        self.episodes, self.fmt, self.tokenizer, self.options = episodes, fmt, tokenizer, options
        self.factory = factory
        self.max_completion_length = max_completion_length
        self.native = supports_native_tools(tokenizer) and fmt.uses_native_tools
        self.eos_ids: frozenset[int] = frozenset()
        self.heartbeat_s = HEARTBEAT_S
        self._pool: list[Environment] = []
        self._prompt_ids: dict[int, tuple[int, ...]] = {}
        self.env = factory()
        self._pool.append(self.env)
        self.check_turns(episodes.records[0].example.interface)

    def prompt_ids(self, row: int) -> tuple[int, ...]:
        """Row `row`'s prompt ids (its rendered prompt tokenized once, no special tokens added)."""
        if row not in self._prompt_ids:
            self._prompt_ids[row] = tuple(self.tokenizer(self.episodes.records[row].prompt,
                                                         add_special_tokens=False)["input_ids"])
        return self._prompt_ids[row]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False) if ids else ""

    def follow_text(self, interface: Interface, calls: Sequence[Call], messages: Sequence[Message],
                    end_text: str) -> str:
        """What the chat template writes after an assistant turn that made `calls` (and ended with `end_text`)
        when `messages` follow it, through the next generation prompt. EpisodeRenderError when the template
        does not render the turn as a prefix of the longer conversation."""
        base = [Message("user", "Hello."), Message("assistant", "OK.", tuple(calls))]
        head = self._template(base, interface, False)
        full = self._template(base + list(messages), interface, True)
        cut = head.rfind(end_text) if end_text else -1
        if cut < 0:
            raise EpisodeRenderError(f"call format {self.fmt.name}: the chat template does not end an "
                                     f"assistant turn with the end token {end_text!r}, so a sampled turn "
                                     f"cannot be continued")
        head = head[:cut + len(end_text)]
        if not full.startswith(head):
            raise EpisodeRenderError(f"call format {self.fmt.name} with this chat template rewrites a turn "
                                     f"when messages follow it (it renders the dialogue as one message), so "
                                     f"episodes cannot be assembled turn by turn: use a format that renders "
                                     f"turns (model.call_format=hermes, react, llama3_json, gptoss, "
                                     f"qwen35_xml)")
        return full[len(head):]

    def _template(self, messages: Sequence[Message], interface: Interface, generation: bool) -> str:
        chat, tools = self.fmt.chat(messages, interface, native_tools=self.native)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation}
        if tools is not None:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(chat, **kwargs)

    def between_ids(self, interface: Interface, calls: Sequence[Call], messages: Sequence[Message],
                    end_text: str) -> list[int]:
        """`follow_text` tokenized on its own (no special tokens added)."""
        text = self.follow_text(interface, calls, messages, end_text)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def check_turns(self, interface: Interface) -> None:
        """Fail before training when the format and template cannot continue a turn (EpisodeRenderError)."""
        end = self.tokenizer.eos_token or ""
        call = Call(interface.names[0], {}) if len(interface) else None
        self.follow_text(interface, (call,) if call else (), [Message("tool", "ok", name=call.name if call
                                                                     else None)], end)
        self.follow_text(interface, (), [Message("user", "And then?")], end)

    def _environments(self, n: int) -> list[Environment]:
        while len(self._pool) < n:
            self._pool.append(self.factory())
        return self._pool[:n]

    def run(self, rows: Sequence[int], sample: Sample, eos_ids: Sequence[int], sync: Sync | None = None
            ) -> list[Episode]:
        """Play one episode per row (rows in batch order) and return them in that order."""
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        sync = sync or (lambda values: values)
        plays = [_Play(self, row, env) for row, env in zip(rows, self._environments(len(rows)), strict=False)]
        filler = list(self.prompt_ids(rows[0] if rows else 0))

        def generate(active: list[_Play]) -> list[tuple[Any, Any, int]] | None:
            limits = [p.limit() for p in active]
            count, limit = sync([len(active), max(limits, default=0)])
            if count == 0:
                return None
            contexts = [p.context() for p in active] + [filler] * (count - len(active))
            ids, logprobs = sample(contexts, max(limit, 1))
            return [(ids[i], logprobs[i] if logprobs is not None else None, limits[i])
                    for i in range(len(active))]

        with Progress(len(plays), lambda line: log.info("episodes: %s", line),
                      heartbeat_s=self.heartbeat_s) as progress:
            play_rounds(plays, generate, lambda play, out: play.take(*out), progress)
        return [p.finish() for p in plays]


class EpisodeScorer:
    """TRL reward function of multi-turn GRPO: each row's `Episode` (the rollout function's `cipr_episode`
    field) gives its reward; keeps the last batch's episodes for the trainer."""

    __name__ = "episode"

    def __init__(self) -> None:
        self.last: list[Episode] = []

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any],
                 row_id: Sequence[int], cipr_episode: Sequence[Episode], log_metric: Any = None,
                 **_: Any) -> list[float]:
        episodes = list(cipr_episode)
        if [e.row for e in episodes] != [int(r) for r in row_id]:
            raise RuntimeError("the episodes reached the reward in another order than their rows")
        self.last = episodes
        if log_metric is not None and episodes:
            n = len(episodes)
            log_metric("reward/env", sum(e.score for e in episodes) / n)
            log_metric("reward/format", sum(e.format for e in episodes) / n)
        return [e.reward for e in episodes]


TOTALS = ("episodes", "turns", "success", "score", "format", "calls", "undeclared", "twin", "parse",
          "env_errors", "truncated", "observation_tokens")


def episode_totals(episodes: Sequence[Episode]) -> list[float]:
    """Sums over a batch's episodes, in `TOTALS` order (summed over processes before `episode_metrics`)."""
    return [float(len(episodes)), float(sum(e.turns for e in episodes)),
            float(sum(e.success for e in episodes)), sum(e.score for e in episodes),
            sum(e.format for e in episodes),
            float(sum(len(e.calls) for e in episodes)), float(sum(e.undeclared_calls for e in episodes)),
            float(sum(e.twin_calls for e in episodes)), float(sum(e.parse_errors for e in episodes)),
            float(sum(e.env_errors for e in episodes)), float(sum(e.truncated for e in episodes)),
            float(sum(len(e.mask) - sum(e.mask) for e in episodes))]


def episode_metrics(totals: Sequence[float]) -> dict[str, float]:
    """Per-episode means (`turns_per_episode`, `episode/*`; calls per turn) from `episode_totals`."""
    t = dict(zip(TOTALS, totals, strict=True))
    n = t["episodes"]
    if not n:
        return {}
    return {"turns_per_episode": t["turns"] / n, "episode/success_rate": t["success"] / n,
            "episode/env_reward": t["score"] / n, "episode/format": t["format"] / n,
            "episode/calls_per_turn": t["calls"] / max(t["turns"], 1.0),
            "episode/undeclared_calls": t["undeclared"] / n, "episode/twin_calls": t["twin"] / n,
            "episode/parse_errors": t["parse"] / n, "episode/env_errors": t["env_errors"] / n,
            "episode/truncated": t["truncated"] / n,
            "episode/observation_tokens": t["observation_tokens"] / n}
