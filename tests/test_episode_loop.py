"""The one episode loop (`cipr.envs.base`) that training and evaluation play: each outcome of a turn pinned in
both, the episode taxonomy's classes, the backends' cut-off flag, and progress that moves while a slow round
of turns is still being generated (a fake slow backend, no model)."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from cipr.envs.base import Progress, play_rounds
from cipr.envs.registry import make_env
from cipr.envs.toyshop import TOOLS
from cipr.eval.episodes import EpisodeItem, make_view, run_episodes
from cipr.eval.runner import RunnerConfig
from cipr.eval.taxonomy import CLASSES, classify_episode
from cipr.formats import get_format
from cipr.perturb.config import PerturbConfig, resolved
from cipr.runtime.backends import Generation
from cipr.tools.interface import Call, Interface
from cipr.train.data import DataConfig
from cipr.train.episodes import EpisodeOptions, EpisodeRunner, build_episodes, env_factory

FMT = get_format("hermes")
SEARCH = Call("search_products", {"query": "red mug"})
CALL = FMT.render_target([SEARCH])
CUT = CALL[:-5]  # cut off inside the closing tag: the call itself is readable
BROKEN = CALL.replace('"red mug"}', '"red mug"')  # invalid JSON inside the call tags
REFUSED = FMT.render_target([Call("search_products", {})])  # ToyShop refuses a search without its query
UNDECLARED = FMT.render_target([Call("teleport", {})])


# -- evaluation ----------------------------------------------------------------------------------------------
class Scripted:
    """A backend answering each episode with its listed generations, after rendering the request as an
    in-process backend does (a conversation the format cannot render fails that request)."""

    name = "scripted"
    supports_forced_tool_choice = False

    def __init__(self, replies, delay: float = 0.0):
        self.replies = {k: list(v) for k, v in replies.items()}
        self.delay, self.calls = delay, 0

    def generate(self, requests):
        self.calls += 1
        time.sleep(self.delay)
        out = []
        for r in requests:
            try:
                FMT.chat(r.example.messages, r.example.interface)
            except ValueError as e:
                out.append(Generation("", error=f"ValueError: {e}"))
                continue
            queue = self.replies[r.example.id]
            reply = queue.pop(0) if queue else FMT.render_target((), response="Done.")
            out.append(reply if isinstance(reply, Generation) else Generation(reply))
        return out


def _item() -> EpisodeItem:
    """A held-out ToyShop `buy` task under original names."""
    env = make_env("toyshop", seed=0)
    task = next(t for t in env.tasks("heldout") if env.task(t).goal == "buy")
    view = make_view(TOOLS, env.reset(task), env.expert_calls(task), task, perturbation="original",
                     names="original", seed=0)
    return EpisodeItem(task, "toyshop", "original", "original", "original", "original", "toyshop",
                       {"seed": 0}, view)


def _evaluate(tmp_path, replies) -> dict:
    item = _item()
    run_episodes([item], Scripted({item.id: replies}), FMT, tmp_path, RunnerConfig(progress=False))
    (line,) = (tmp_path / "results.jsonl").read_text().splitlines()
    return json.loads(line)


def test_a_cut_off_turn_ends_the_episode_and_runs_nothing(tmp_path):
    """Its call is readable, yet a turn that reached max_new_tokens is not executed: the episode ends there,
    recorded as `cut_off`, not as a backend error or a wrong call."""
    rec = _evaluate(tmp_path, [Generation(CUT, cut_off=True)])
    assert rec["end"] == "cut_off" and rec["taxonomy"] == "cut_off" and rec["error"] == "cut_off"
    assert rec["counts"] == {"messages": 1} and rec["transcript"][0]["end"] == "cut_off"
    assert "executed" not in rec["transcript"][0]


def test_an_unparseable_turn_that_cannot_be_written_back_is_its_own_outcome(tmp_path):
    """Before, the episode went on, the next request could not render the turn, and the record said
    `backend_error`."""
    rec = _evaluate(tmp_path, [BROKEN])
    assert rec["end"] == rec["error"] == "unparseable" and rec["taxonomy"] == "parse_failure"
    assert rec["counts"] == {"messages": 1, "parse_failures": 1} and "backend_errors" not in rec["counts"]


def test_a_malformed_turn_with_a_readable_call_runs_it_and_answers_the_parse_error(tmp_path):
    unclosed = CALL + "\n<tool_call>\n{\"name\": \"view_item\""
    rec = _evaluate(tmp_path, [unclosed])
    first = rec["transcript"][0]
    assert first["executed"] == [SEARCH.to_dict()] and first["parse_error"]
    assert first["observations"][-1].startswith("Error: the call could not be parsed")
    assert rec["counts"]["executed"] == 1 and rec["counts"]["parse_failures"] == 1 and rec["end"] == "done"


@pytest.mark.parametrize(("replies", "taxonomy", "counts"), [
    (["I will not shop."], "no_call", {"calls": 0}),
    ([REFUSED, REFUSED], "refused_call", {"calls": 2, "refused": 2, "executed": 0}),
    ([UNDECLARED], "undeclared_tool", {"calls": 1, "undeclared": 1, "executed": 0}),
    ([CALL], "wrong_call", {"calls": 1, "executed": 1}),
])
def test_no_call_refused_calls_and_wrong_calls_are_told_apart(tmp_path, replies, taxonomy, counts):
    """Episodes whose calls were all refused were `no_call` before."""
    rec = _evaluate(tmp_path, replies)
    assert not rec["correct"] and rec["taxonomy"] == taxonomy and rec["end"] == "done"
    assert {k: rec["counts"].get(k, 0) for k in counts} == counts


def test_the_episode_taxonomy_in_its_order():
    def cls(end="done", roles=(), correct=False, reference=2, **counts):
        return classify_episode(counts, list(roles), correct=correct, end=end, reference_calls=reference)

    assert cls(correct=True, calls=1, executed=1) == "correct"
    assert cls("backend_error", backend_errors=1, calls=3) == "backend_error"
    assert cls("cut_off", calls=2, executed=2) == "cut_off"
    assert cls("unparseable", parse_failures=1, calls=1, executed=1) == "parse_failure"
    assert cls(parse_failures=1) == "parse_failure"  # no readable call, a malformed one
    assert cls() == "no_call" and cls(reference=0) == "other"
    assert cls(calls=2, undeclared=1, executed=1) == "undeclared_tool"
    assert cls(roles=["slower"], calls=1, added=1) == "equivalent_tool"
    assert cls(roles=["distractor"], calls=1, added=1) == "unrelated_tool"
    assert cls(calls=2, executed=1, parse_failures=1) == "parse_failure"
    assert cls(calls=2, refused=1, over_limit=1) == "refused_call"
    assert cls("max_turns", calls=4, executed=3, refused=1) == "wrong_call"
    assert {"cut_off", "refused_call", "wrong_call"} <= set(CLASSES)


# -- training: the same rule ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runner(tiny_tokenizer):
    factory = env_factory({"name": "toyshop", "n_tasks": 40, "max_turns": 8})
    names = resolved(PerturbConfig(), "grpo")  # original names
    episodes = build_episodes(2, DataConfig(), names, FMT, tiny_tokenizer, factory)
    return EpisodeRunner(episodes, FMT, tiny_tokenizer, EpisodeOptions(), factory, max_completion_length=4096)


def _train(runner, tiny_tokenizer, texts, *, end_token=True, delay=0.0):
    """Row 0 played with scripted turns (each ended by the end token unless `end_token` is False)."""
    names = runner.episodes.names[0]
    written = {orig: w for w, t in names.back.items() if t is not None for orig in [t[0]]}
    queue = [t.replace("search_products", written["search_products"]) for t in texts]

    def sample(contexts, n):
        time.sleep(delay)
        text = queue.pop(0) if queue else FMT.render_target((), response="Done.")
        ids = tiny_tokenizer(text + (tiny_tokenizer.eos_token if end_token else ""),
                             add_special_tokens=False)["input_ids"]
        return [ids for _ in contexts], None

    executed = []
    step = type(runner.env).step

    def recording(self, call):
        executed.append(call)
        return step(self, call)

    type(runner.env).step = recording
    try:
        (episode,) = runner.run([0], sample, [tiny_tokenizer.eos_token_id])
    finally:
        type(runner.env).step = step
    return episode, executed


def test_training_ends_an_episode_at_a_cut_off_turn_as_evaluation_does(runner, tiny_tokenizer):
    episode, executed = _train(runner, tiny_tokenizer, [CUT], end_token=False)
    assert episode.end == "cut_off" and episode.truncated and episode.turns == 1 and executed == []


def test_training_ends_an_episode_at_an_unparseable_turn_as_evaluation_does(runner, tiny_tokenizer):
    episode, executed = _train(runner, tiny_tokenizer, [BROKEN])
    assert episode.end == "unparseable" and episode.parse_errors == 1 and episode.turns == 1
    assert executed == []


def test_training_runs_a_readable_call_and_answers_an_answer(runner, tiny_tokenizer):
    episode, executed = _train(runner, tiny_tokenizer, [CALL])
    assert [c.name for c in executed] == ["search_products"] and episode.end == "done" and episode.turns >= 2


# -- progress ------------------------------------------------------------------------------------------------
def test_progress_moves_while_a_slow_round_is_generated():
    """A fake backend takes 0.5 s a round: the timer's lines come before the round ends, each turn and each
    finished episode updates the line, and the thread stops with the episodes."""
    lines: list[tuple[float, str]] = []
    rounds: list[tuple[float, float]] = []

    class Fake:
        def __init__(self, turns):
            self.end, self.left = None, turns

    def generate(active):
        if not active:
            return None
        start = time.monotonic()
        time.sleep(0.5)
        rounds.append((start, time.monotonic()))
        return [None] * len(active)

    def take(play, _):
        play.left -= 1
        play.end = "done" if not play.left else None

    plays = [Fake(1), Fake(2)]
    with Progress(2, lambda line: lines.append((time.monotonic(), line)), every_turn=True,
                  heartbeat_s=0.1) as progress:
        play_rounds(plays, generate, take, progress)  # type: ignore[arg-type]
        thread = progress._thread
    assert not thread.is_alive()
    (s1, e1), (s2, e2) = rounds
    during = [line for t, line in lines if s1 < t < e1]
    assert len(during) >= 3 and all("round 1: 2 turns" in line for line in during)
    assert any("2/2 episodes, 3 turns" in line for _, line in lines)
    assert any(s2 < t < e2 and "1/2 episodes" in line for t, line in lines)


def test_evaluation_says_what_it_is_doing_before_a_slow_round_ends(tmp_path, caplog):
    item = _item()
    backend = Scripted({item.id: [CALL]}, delay=0.5)
    seen: list[int] = []
    generate = backend.generate

    def watched(requests):
        before = len(caplog.records)
        out = generate(requests)
        seen.append(len(caplog.records) - before)
        return out

    backend.generate = watched
    with caplog.at_level(logging.INFO, logger="cipr.eval.episodes"):
        run_episodes([item], backend, FMT, tmp_path, RunnerConfig(progress=False), heartbeat_s=0.1)
    assert len(seen) == 2 and all(n >= 2 for n in seen)  # lines during each round, not only after it
    assert "round 1: 1 turns" in caplog.text and f"episodes {tmp_path.name}" in caplog.text


def test_a_training_step_logs_its_episodes_while_a_round_is_generated(runner, tiny_tokenizer, caplog):
    before, runner.heartbeat_s = runner.heartbeat_s, 0.1
    try:
        with caplog.at_level(logging.INFO, logger="cipr.train"):
            _train(runner, tiny_tokenizer, [CALL], delay=0.4)
    finally:
        runner.heartbeat_s = before
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("episodes: ")]
    assert len(lines) >= 4 and any("round 1: 1 turns" in x for x in lines)
    assert not [t for t in threading.enumerate() if t.name == "episode-progress"]


# -- the backends' cut-off flag ------------------------------------------------------------------------------
def test_the_in_process_backend_says_when_a_reply_was_cut_off(tiny_model, tiny_tokenizer):
    from cipr.runtime.backends import GenRequest, HFBackend
    from cipr.tools.interface import Example, Message

    backend = HFBackend(tiny_model, tiny_tokenizer, FMT)
    eos = tiny_tokenizer.eos_token_id
    backend.greedy.run = lambda prompts, limits, stops: [[5, 6], [7, eos]]
    example = Example("x", (Message("user", "hi"),), Interface(()))
    cut, ended = backend.generate([GenRequest(example, max_new_tokens=2)] * 2)
    assert cut.cut_off and not ended.cut_off and ended.error is None
