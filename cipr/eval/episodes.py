"""Multi-turn evaluation: episodes in an environment (`benchmark=bfcl_multi_turn`, `benchmark=toyshop`).

An item is one task under one tool naming, perturbation and tool order (`EpisodeItem`, keyed like the
single-turn `EvalItem`, so results.jsonl, resuming, the report and `cipr-eval-compare` work unchanged).
Its `EpisodeView` says how the environment's tools are shown and how a shown call reaches the environment:

- The perturbation is applied once per episode to an Example holding the first user message, every tool
  the episode declares (`Environment.declared`; BFCL's withheld miss_func functions last, where BFCL
  appends them) and the reference calls of all turns (so "each called tool" gets its distractor or
  twin). Later user messages come from the environment as they are; where names in text are rewritten
  (canonical names, relabeling), each environment tool name in them and in observations becomes its
  equivalent's shown name. Typos and cost statements thus touch the first user message only.
- Under canonical names the adapter canonicalizes that interface (`cipr.tools.canonical`); the
  after-adapter types (relabeling, look-alikes, paraphrase, reorder) are applied to the canonical one.
- A shown tool is visible while its environment tool (or, for an added tool, the tool it imitates) is in
  `env.interface`; calls translate back by the view's map: a name the view does not declare is
  `UndeclaredToolError` (observation `no_such_tool`, never executed), a tool the perturbation added
  (twin, distractor, costlier or slower equivalent) has no environment tool (observation `unavailable`,
  never executed, and the episode is not correct: choosing it is the single-turn benchmark's error).
- Types whose translation back is not by names (`NOT_EXECUTABLE`: respelled enum values, narrowed types,
  split or merged tools) are not built: the environment could not run the perturbed call.

`run_episodes` plays the episodes of a chunk in lock step (one backend call per round) through the loop
training plays too (`cipr.envs.base`: the rule of a turn, its outcomes, `Progress`); each turn is kept in the
history as a message (`assistant_message`) for the next request. The record: `correct` (the environment's
success and no call to an added tool), `reward`, per-turn checks, `counts` (`cipr.envs.base.Play`), `end`
(`done`, `max_turns`, `force_quit`, `cut_off`, `unparseable`, `backend_error`), `error`, the `taxonomy`
class (`cipr.eval.taxonomy.classify_episode`: no call, refused and wrong calls apart) and the transcript.

Replay (`backend=replay replay=reference`): every request carries the next calls of the reference (BFCL's
ground truth, ToyShop's expert) in the shown names, at most `max_calls` per message, then a text answer;
`test_eval_multi_turn` replays all 800 BFCL items under original and canonical names.

The per-turn consistency metric (`run_episode_consistency`): along the reference trajectory (the
reference calls replayed in the environment, observations included), at every reference assistant message
the action distributions under the unperturbed view (original names, or the adapter's canonical ids) and
the perturbed one are read on one index set (`cipr.eval.consistency_metric.measure`); consistency.jsonl
gets one line per episode (the mean over its messages, so `summary.json` and `cipr-eval-compare` pair it
over episodes) with the per-turn means in `turns`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cipr.core.errors import DataError
from cipr.envs.base import (
    HEARTBEAT_S,
    AddedToolError,
    Environment,
    Play,
    Progress,
    Turn,
    assistant_message,
    play_rounds,
    read_turn,
)
from cipr.eval.report import RESULTS
from cipr.eval.runner import ItemKey, RunnerConfig, RunStats, append_record, existing_keys
from cipr.eval.taxonomy import classify_episode
from cipr.formats.base import CallFormat
from cipr.runtime.backends import Backend, Generation, GenRequest
from cipr.tools.canonical import UndeclaredToolError, canonicalize, rewrite_text
from cipr.tools.interface import Call, Example, Interface, Message

log = logging.getLogger(__name__)

NOT_EXECUTABLE = ("drift_type_narrowing", "drift_enum_replacement", "drift_refactor")
"""Types the environment cannot run after translating names back (values or tool structure change)."""
TEXT_RENAMING = ("relabel_function", "relabel_random")
ANSWER = "Done."
"""The replay's text answer that ends a user turn."""


# ---------------------------------------------------------------------- the view
@dataclass(frozen=True)
class EpisodeView:
    """How one episode's tools are shown and how a shown call reaches the environment.

    Per shown tool j: `sources[j]` the environment tool it executes (None: added), `arguments[j]` shown
    argument -> environment argument, `shows_with[j]` the environment tool whose presence shows it (None:
    always), `roles[j]` its Correspondence role. `text_map`: environment name -> shown name for free text
    ({} where text keeps its names). `script`: the reference calls per user turn in shown names.
    """

    tools: Interface
    sources: tuple[str | None, ...]
    arguments: tuple[Mapping[str, str], ...]
    shows_with: tuple[str | None, ...]
    roles: tuple[str, ...]
    text_map: Mapping[str, str]
    first_message: str
    script: tuple[tuple[Call, ...], ...]

    def interface(self, env_interface: Interface) -> Interface:
        """The tools shown while the environment shows `env_interface`."""
        names = set(env_interface.names)
        return Interface(tuple(t for t, w in zip(self.tools, self.shows_with, strict=True)
                               if w is None or w in names))

    def to_env(self, call: Call) -> Call:
        """`call` (shown names) in the environment's names; UndeclaredToolError / AddedToolError."""
        positions = [j for j, t in enumerate(self.tools) if t.name == call.name]
        if not positions:
            raise UndeclaredToolError(call.name, self.tools.names)
        j = next((j for j in positions if self.sources[j] is not None), None)
        if j is None:
            raise AddedToolError(call.name, self.roles[positions[0]])
        amap = self.arguments[j]
        return Call(self.sources[j], {amap.get(k, k): v for k, v in call.arguments.items()})  # type: ignore[arg-type]

    def text_in(self, text: str) -> str:
        """Environment text (a user message, an observation) with tool names as shown."""
        return rewrite_text(text, self.text_map) if self.text_map else text

    def text_out(self, text: str) -> str:
        """An answer of the policy with the environment's tool names."""
        inverse = {v: k for k, v in self.text_map.items() if v != k}
        return rewrite_text(text, inverse) if inverse else text


def _split(calls: Sequence[Call], lengths: Sequence[int]) -> tuple[tuple[Call, ...], ...]:
    out, k = [], 0
    for n in lengths:
        out.append(tuple(calls[k:k + n]))
        k += n
    return tuple(out)


def make_view(declared: Interface, first_message: str, script: Sequence[Sequence[Call]], item_id: str, *,
              perturbation: str, names: str, seed: int, order: str = "original") -> EpisodeView:
    """The view of one episode (module docstring); ValueError/KeyError/DataError when the type does not
    apply (e.g. a reorder of one tool) or cannot be executed."""
    from cipr.perturb import apply_perturbation
    from cipr.perturb.registry import AFTER_ADAPTER

    if perturbation in NOT_EXECUTABLE:
        raise ValueError(f"{perturbation} changes argument values or tool structure, which translating "
                         "names back cannot undo: the environment could not run the perturbed call")
    base = Example(item_id, (Message("user", first_message),), declared,
                   reference=tuple(c for turn in script for c in turn))
    lengths = [len(t) for t in script]
    if perturbation == "original":
        same = ("equivalent",) * len(declared)
        if names == "original":
            identity = tuple({a: a for a in t.properties} for t in declared)
            return EpisodeView(declared, declared.names, identity, declared.names, same, {}, first_message,
                               _split(base.reference, lengths))
        shown, nmap = canonicalize(base)
        originals = tuple(o for _, o in nmap.tools)
        return EpisodeView(shown.interface, originals, tuple(dict(nmap.arguments[c]) for c, _ in nmap.tools),
                           originals, same, nmap.forward, shown.messages[0].content,
                           _split(shown.reference, lengths))
    if perturbation in AFTER_ADAPTER:
        shown, corr = apply_perturbation(base, perturbation, seed=seed, names=names)
        arguments, written_names = list(corr.arguments), list(shown.interface.names)
    else:
        written, corr = apply_perturbation(base, perturbation, seed=seed, names="original", order=order)
        written_names = list(written.interface.names)
        if names == "canonical":
            shown, nmap = canonicalize(written)
            arguments = [{c: corr.arguments[j].get(w, w) for c, w in nmap.arguments[cid].items()}
                         for j, (cid, _) in enumerate(nmap.tools)]
        else:
            shown, arguments = written, list(corr.arguments)
    if any(r in ("split", "merged") for r in corr.roles):
        raise ValueError("a split or merged tool cannot be translated back by names")
    sources = [s[0] if s else None for s in corr.sources]
    for j, s in enumerate(list(sources)):  # a same-name duplicate executes its name's equivalent, as the
        if s is None:                      # adapter translates both ids back to that one name
            same = (k for k, w in enumerate(written_names) if w == written_names[j] and sources[k])
            twin = next(same, None)
            if twin is not None:
                sources[j] = sources[twin]
    shows_with = tuple(s if s is not None else t for s, t in zip(sources, corr.twin_of, strict=True))
    sources_t = tuple(sources)
    text_map: dict[str, str] = {}
    if names == "canonical" or perturbation in TEXT_RENAMING:
        for s, t in zip(sources, shown.interface, strict=True):
            if s is not None:
                text_map.setdefault(s, t.name)
    return EpisodeView(shown.interface, sources_t, tuple(arguments), shows_with, corr.roles, text_map,
                       shown.messages[0].content, _split(shown.reference, lengths))


# ---------------------------------------------------------------------- items
@dataclass(frozen=True)
class EpisodeItem(ItemKey):
    """One episode to run: task `id` of environment `env` (built with `env_options`) under a view."""

    env: str
    env_options: Mapping[str, Any]
    view: EpisodeView

    @staticmethod
    def run_items(items: Sequence[EpisodeItem], backend: Backend, fmt: CallFormat, out_dir: str | Path,
                  config: RunnerConfig | None = None) -> RunStats:
        """How `cipr.eval.runner.run_items` runs episodes (`run_episodes`) without importing this module."""
        return run_episodes(items, backend, fmt, out_dir, config)


def reference_script(env: Any, task_id: str) -> list[list[Call]]:
    """The reference calls per user turn: BFCL's ground truth, ToyShop's expert."""
    if env.name == "bfcl_multi_turn":
        from cipr.envs.bfcl_multi_turn import ground_truth_calls

        return ground_truth_calls(env.items[task_id])
    if env.name == "toyshop":
        return env.expert_calls(task_id)
    raise ValueError(f"no reference trajectory for environment {env.name!r}")


# ---------------------------------------------------------------------- the loop
class _Live(Play):
    """One running episode: the loop's `Play`, its history as messages and its transcript."""

    def __init__(self, item: EpisodeItem, env: Environment, fmt: CallFormat) -> None:
        super().__init__(env, item.view, fmt)
        env.reset(item.id)
        self.item = item
        self.messages = [Message("user", item.view.first_message)]
        self.transcript: list[dict[str, Any]] = []
        self.script_turn = self.script_pos = 0

    def next_calls(self) -> tuple[Call, ...]:
        """The reference's next calls in shown names (the replay backend answers with them)."""
        turn = self.env.turn
        if turn != self.script_turn:
            self.script_turn, self.script_pos = turn, 0
        script = self.item.view.script
        calls = script[turn] if turn < len(script) else ()
        out = calls[self.script_pos:self.script_pos + self.env.limits.max_calls]
        self.script_pos += len(out)
        return out

    def request(self) -> GenRequest:
        item = self.item
        return GenRequest(Example(item.id, tuple(self.messages), item.view.interface(self.env.interface),
                                  reference=self.next_calls(), response=ANSWER, partition=item.partition))

    def take(self, gen: Generation) -> None:
        """Apply one generation (`Play.act`) and keep it in the history and the transcript."""
        entry: dict[str, Any] = {"turn": self.env.turn, "raw": gen.text}
        self.transcript.append(entry)
        if gen.error is not None:
            entry["error"] = gen.error
            self.act(Turn(gen.text, error=gen.error))
            return
        turn = read_turn(self.fmt, gen.text, ended=not gen.cut_off, parse=gen.parsed)
        entry["calls"] = [c.to_dict() for c in turn.parse.calls]
        if not turn.parse.ok:
            entry["parse_error"] = turn.parse.error
        following = self.act(turn)
        if self.end in ("cut_off", "unparseable"):
            entry["end"] = self.end
            return
        self.messages.append(assistant_message(self.fmt, turn.parse, gen.text))
        self.messages.extend(following)
        if not turn.answer:
            entry["executed"] = [c.to_dict() if c is not None else None for c in self.executed]
            entry["observations"] = [m.content[:2000] for m in following]


def episode_record(live: _Live) -> dict[str, Any]:
    """The results.jsonl record of a finished episode (module docstring)."""
    it = live.item
    score = live.env.score()
    correct = bool(score.success) and not live.counts["added"]
    details = {k: (v[:1000] if isinstance(v, str) else v) for k, v in score.details.items()}
    error = None
    if not correct:
        fallback = "added_tool" if live.counts["added"] else (live.end if live.end != "done" else "failed")
        error = details.get("error_type") or fallback
    taxonomy = classify_episode(live.counts, live.added_roles, correct=correct, end=live.end,
                                reference_calls=sum(len(t) for t in it.view.script))
    return {"id": it.id, "partition": it.partition, "names": it.names, "perturbation": it.perturbation,
            "group": it.group, "order": it.order, "correct": correct, "reward": score.reward,
            "success": bool(score.success), "turn_checks": list(score.turns), "error": error,
            "detail": str(details.get("error_message") or "")[:1000], "taxonomy": taxonomy, "end": live.end,
            "turns": live.env.turn + 1, "counts": dict(live.counts), "score": details,
            "transcript": live.transcript}


def episode_plan(items: Sequence[EpisodeItem]) -> str:
    """What a multi-turn evaluation will run, said before it starts: `limit` counts tasks, and each task is
    played under every perturbation type (the cost and latency ones in both tool orders) and every naming."""
    tasks = len({it.id for it in items})
    types = len({it.perturbation for it in items})
    variants = len({(it.perturbation, it.order) for it in items})
    names = sorted({it.names for it in items})
    return (f"{len(items)} episodes: {tasks} task(s) x {types} perturbation type(s) ({variants} with their "
            f"tool orders) x {len(names)} naming(s) ({', '.join(names)}); `limit` counts tasks, "
            f"`perturbations=[original]` plays each task once")


def default_env_factory(item: EpisodeItem) -> Environment:
    from cipr.envs.registry import make_env

    return make_env(item.env, **dict(item.env_options))


def run_episodes(items: Sequence[EpisodeItem], backend: Backend, fmt: CallFormat, out_dir: str | Path,
                 config: RunnerConfig | None = None,
                 env_factory: Callable[[EpisodeItem], Environment] = default_env_factory, *,
                 heartbeat_s: float = HEARTBEAT_S) -> RunStats:
    """Run every episode not yet in `out_dir/results.jsonl`, `chunk_size` at a time in lock step, appending
    one flushed line per finished episode; the progress bar (or, without it, the log) says what is being
    generated at least every `heartbeat_s` seconds."""
    config = config or RunnerConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS
    keys = [it.key for it in items]
    if len(set(keys)) != len(keys):
        dup = next(k for k, n in Counter(keys).items() if n > 1)
        raise DataError(f"episode key {dup} occurs twice in the evaluation set", item=dup[0], field="id")
    done, torn = existing_keys(path)
    pending = [it for it in items if it.key not in done]
    stats = RunStats(total=len(items), skipped=len(items) - len(pending), torn_lines=torn)

    with path.open("a", encoding="utf-8") as f, tqdm(total=len(pending), desc=f"episodes {out.name}",
                                                     unit="episode", disable=not config.progress) as bar:
        def take(live: _Live, gen: Generation) -> None:
            live.take(gen)
            if live.end is not None:
                rec = episode_record(live)
                close = getattr(live.env, "close", None)
                if close is not None:
                    close()
                append_record(f, rec, stats)
                bar.update(1)

        def say(line: str) -> None:
            if config.progress:
                bar.set_postfix_str(line, refresh=True)
            else:
                log.info("episodes %s: %s", out.name, line)

        with Progress(len(pending), say, every_turn=config.progress, heartbeat_s=heartbeat_s) as progress:
            for start in range(0, len(pending), max(1, config.chunk_size)):
                lives = [_Live(it, env_factory(it), fmt) for it in pending[start:start + config.chunk_size]]
                play_rounds(lives, lambda active: backend.generate([lv.request() for lv in active])
                            if active else None, take, progress)
                os.fsync(f.fileno())
    return stats


# ---------------------------------------------------------------------- report section
def episode_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per names and perturbation: episodes, success and mean reward (%), mean messages and calls, the share
    passing each user turn's checks (by turn index), end reasons."""
    by: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r["names"], r["perturbation"])].append(r)
    out: dict[str, Any] = {}
    for (names, pert), recs in by.items():
        n = len(recs)
        turn_pass: dict[int, list[float]] = defaultdict(list)
        for r in recs:
            for t, ok in enumerate(r.get("turn_checks") or []):
                turn_pass[t].append(1.0 if ok else 0.0)
        out.setdefault(names, {})[pert] = {
            "episodes": n,
            "success": 100 * sum(bool(r.get("success")) for r in recs) / n,
            "reward": 100 * math.fsum(float(r.get("reward", 0.0)) for r in recs) / n,
            "messages": math.fsum(r.get("counts", {}).get("messages", 0) for r in recs) / n,
            "calls": math.fsum(r.get("counts", {}).get("calls", 0) for r in recs) / n,
            "turn_pass": {t: 100 * math.fsum(v) / len(v) for t, v in sorted(turn_pass.items())},
            "ends": dict(Counter(str(r.get("end")) for r in recs)),
        }
    return out


def episode_section(run_dir: str | Path, summary: dict[str, Any], config: Any) -> str:
    """A report section (`cipr.eval.report.write_report(sections=...)`): `summary["episodes"]` and its
    table (success, reward, messages, calls, per-turn pass rates)."""
    from cipr.eval.report import read_results, table

    records, _ = read_results(Path(run_dir) / RESULTS)
    summary["episodes"] = episode_summary(records)
    lines = ["", "## Episodes", "", "Success and reward in %; messages and calls per episode; turn k: share "
             "of episodes whose checks pass through user turn k."]
    for names, per in summary["episodes"].items():
        width = max((len(v["turn_pass"]) for v in per.values()), default=0)
        rows = [[p, str(v["episodes"]), f"{v['success']:.1f}", f"{v['reward']:.1f}", f"{v['messages']:.1f}",
                 f"{v['calls']:.1f}", *(f"{v['turn_pass'][t]:.1f}" if t in v["turn_pass"] else "–"
                                        for t in range(width))] for p, v in per.items()]
        lines += ["", f"### {names} names", "",
                  table(["perturbation", "episodes", "success", "reward", "messages", "calls",
                         *(f"turn {t + 1}" for t in range(width))], rows)]
    from cipr.eval.consistency_metric import read_records

    per_turn = turn_consistency(read_records(run_dir))
    if per_turn:
        summary["consistency_turns"] = per_turn
        lines += ["", "## Consistency by user turn", "", "Mean KL(unperturbed ‖ perturbed) in nats over the "
                  "episodes' reference messages of each user turn (per-turn consistency metric)."]
        for names, per in per_turn.items():
            width = max(len(v) for v in per.values())
            rows = [[p, *(f"{v[t]['kl']:.3f} (n={v[t]['n']})" if t < len(v) and v[t]["kl"] is not None
                          else "–" for t in range(width))] for p, v in per.items()]
            lines += ["", f"### {names} names", "", table(["perturbation",
                                                          *(f"turn {t + 1}" for t in range(width))], rows)]
    lines.append("")
    return "\n".join(lines)


def turn_consistency(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """names -> perturbation -> per user turn: mean KL over the episodes that reached it, and their number."""
    acc: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for r in records:
        for t in r.get("turns") or []:
            if t.get("kl") is not None:
                acc[(r["names"], r["perturbation"], int(t["turn"]))].append(float(t["kl"]))
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (names, pert, turn), v in sorted(acc.items()):
        rows = out.setdefault(names, {}).setdefault(pert, [])
        while len(rows) <= turn:
            rows.append({"kl": None, "n": 0})
        rows[turn] = {"kl": math.fsum(v) / len(v), "n": len(v)}
    return out


# ---------------------------------------------------------------------- per-turn consistency
@dataclass(frozen=True)
class _Event:
    """One message of the reference trajectory in environment names: a user message, an assistant message
    (its calls, empty for the text answer) with the observations, and the tools shown before it."""

    role: str
    text: str = ""
    calls: tuple[Call, ...] = ()
    observations: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()
    turn: int = 0


def reference_events(env: Any, task_id: str) -> list[_Event]:
    """The reference trajectory played in `env`: the calls of each turn in messages of at most
    `max_calls` (as the replay sends them), each turn closed by the text answer."""
    first = env.reset(task_id)
    script = reference_script(env, task_id)
    events = [_Event("user", first)]
    for turn, calls in enumerate(script):
        done = False
        for k in range(0, len(calls), env.limits.max_calls):
            chunk = tuple(calls[k:k + env.limits.max_calls])
            shown = env.interface.names
            results = [env.step(c) for c in chunk]
            events.append(_Event("assistant", calls=chunk, observations=tuple(r.observation for r in results),
                                 shown=shown, turn=turn))
            done = any(r.done for r in results)
            if done:
                break
        if done:
            break
        events.append(_Event("assistant", shown=env.interface.names, turn=turn))
        nxt = env.end_turn(ANSWER)
        if nxt is None:
            break
        events.append(_Event("user", nxt, turn=turn + 1))
    close = getattr(env, "close", None)
    if close is not None:
        close()
    return events


def _side(view: EpisodeView, events: Sequence[_Event], item_id: str) -> list[tuple[Example, int]]:
    """Per reference assistant message: the Example as `view` shows it (context, visible tools, the
    message's calls in shown names) and its user turn."""
    shown_calls = [c for turn in view.script for c in turn]
    messages: list[Message] = []
    out: list[tuple[Example, int]] = []
    k = 0
    for e in events:
        if e.role == "user":
            messages.append(Message("user", view.first_message if not messages else view.text_in(e.text)))
            continue
        calls = tuple(shown_calls[k:k + len(e.calls)])
        k += len(e.calls)
        interface = view.interface(_names_interface(e.shown))
        out.append((Example(item_id, tuple(messages), interface, reference=calls,
                            response=None if calls else ANSWER), e.turn))
        if calls:
            messages.append(Message("assistant", "", calls))
            messages.extend(Message("tool", view.text_in(o), name=c.name)
                            for c, o in zip(calls, e.observations, strict=True))
        else:
            messages.append(Message("assistant", ANSWER))
    return out


def _names_interface(names: Sequence[str]) -> Interface:
    """An interface holding only names (what `EpisodeView.interface` reads of the environment's)."""
    from cipr.tools.interface import Tool

    return Interface(tuple(Tool(n, "") for n in names))


@dataclass(frozen=True)
class _StepItem(ItemKey):
    """The unit `consistency_metric.measure` reads: one reference message of one episode item."""


def _step_classes(reference_view: EpisodeView, ref: Interface, view: EpisodeView, pert: Interface
                  ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """One message's index set: unperturbed tool i is class i; a perturbed tool takes its environment tool's
    class, an added tool one of its own. Returns (reference classes, perturbed classes, added, number)."""
    def source(v: EpisodeView, name: str) -> str | None:
        return v.sources[next(j for j, t in enumerate(v.tools) if t.name == name)]

    position: dict[str, int] = {}
    for i, t in enumerate(ref):
        position.setdefault(source(reference_view, t.name) or "", i)
    classes: list[int] = []
    added: list[int] = []
    for t in pert:
        s = source(view, t.name)
        if s is not None and s in position:
            classes.append(position[s])
        else:
            added.append(len(ref) + len(added))
            classes.append(added[-1])
    return tuple(range(len(ref))), tuple(classes), tuple(added), len(ref) + len(added)


def episode_pairs(item: EpisodeItem, reference_view: EpisodeView, events: Sequence[_Event]) -> list[Any]:
    """The ConsistencyPairs of one episode item: one per reference assistant message."""
    from cipr.eval.consistency_metric import ConsistencyPair

    pairs = []
    ref_side, pert_side = _side(reference_view, events, item.id), _side(item.view, events, item.id)
    for k, ((ref, turn), (pert, _)) in enumerate(zip(ref_side, pert_side, strict=True)):
        step = _StepItem(f"{item.id}#{k}", item.partition, item.names, item.perturbation, item.group,
                         f"{item.order}#t{turn}")
        rc, pc, added, n = _step_classes(reference_view, ref.interface, item.view, pert.interface)
        pairs.append(ConsistencyPair(step, ref, pert, rc, pc, added, n))  # type: ignore[arg-type]
    return pairs


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return math.fsum(kept) / len(kept) if kept else None


def episode_consistency_record(item: EpisodeItem, steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One consistency.jsonl line for an episode: each metric's mean over its reference messages, and per
    user turn (`turns`); messages whose two sides have different numbers of decisions are counted."""
    from cipr.eval.consistency_metric import METRICS

    base = {"id": item.id, "partition": item.partition, "names": item.names,
            "perturbation": item.perturbation, "group": item.group, "order": item.order}
    measured = [s for s in steps if "skipped" not in s]
    if not measured:
        return {**base, "skipped": f"no reference message read ({len(steps)} with unequal decisions)"}
    by_turn: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for s in measured:
        by_turn[int(s["order"].rsplit("#t", 1)[1])].append(s)
    return {**base, **{m: _mean([s.get(m) for s in measured]) for m in METRICS},
            "decisions": sum(int(s.get("decisions", 0)) for s in measured), "messages": len(measured),
            "messages_skipped": len(steps) - len(measured),
            "turns": [{"turn": t, "messages": len(v), **{m: _mean([s.get(m) for s in v]) for m in METRICS}}
                      for t, v in sorted(by_turn.items())]}


def run_episode_consistency(items: Sequence[EpisodeItem], model: Any, tokenizer: Any, fmt: CallFormat,
                            out_dir: str | Path, config: Any, *, progress: bool = True,
                            env_factory: Callable[[EpisodeItem], Environment] = default_env_factory
                            ) -> dict[str, int]:
    """Append the per-turn consistency of every perturbed episode item not yet in
    `out_dir/consistency.jsonl` (module docstring); `config` a `ConsistencyConfig`. Counts."""
    from cipr.eval.consistency_metric import CONSISTENCY, NOT_COMPARED, measure

    path = Path(out_dir) / CONSISTENCY
    done, _ = existing_keys(path)
    todo = [it for it in items if it.perturbation not in NOT_COMPARED and it.key not in done]
    by_task: dict[tuple[str, str], list[EpisodeItem]] = defaultdict(list)
    for it in todo:
        by_task[(it.id, it.names)].append(it)
    was_training = getattr(model, "training", False)
    model.eval()
    written = 0
    try:
        with path.open("a", encoding="utf-8") as f, tqdm(total=len(todo), desc="episode consistency",
                                                         unit="episode", disable=not progress) as bar:
            for (task, names), group in by_task.items():
                env = env_factory(group[0])
                events = reference_events(env, task)
                env.reset(task)
                reference_view = make_view(env.declared, events[0].text, reference_script(env, task), task,
                                           perturbation="original", names=names, seed=0)
                close = getattr(env, "close", None)
                if close is not None:
                    close()
                pairs = [episode_pairs(it, reference_view, events) for it in group]
                flat = [p for ps in pairs for p in ps]
                steps = {}
                for start in range(0, len(flat), config.chunk_size):
                    for rec in measure(model, tokenizer, fmt, flat[start:start + config.chunk_size], config):
                        steps[(rec["id"], rec["perturbation"], rec["order"])] = rec
                for it, ps in zip(group, pairs, strict=True):
                    recs = [steps[(p.item.id, p.item.perturbation, p.item.order)] for p in ps]
                    f.write(json.dumps(episode_consistency_record(it, recs), ensure_ascii=False) + "\n")
                    written += 1
                f.flush()
                bar.update(len(group))
    finally:
        model.train(was_training)
    return {"read": written, "already_done": len(done)}
