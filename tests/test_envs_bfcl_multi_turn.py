"""BFCL's multi-turn categories as an environment: BFCL's execution and checker, the split, refusals."""

import pytest

from cipr.envs.base import no_such_tool
from cipr.envs.bfcl_multi_turn import (
    CATEGORIES,
    call_text,
    check_episode,
    ground_truth_calls,
    parse_call,
)
from cipr.envs.registry import make_env
from cipr.tools.interface import Call


@pytest.fixture(scope="module")
def env(shared_data):
    return make_env("bfcl_multi_turn", data_root=str(shared_data))


def instances():
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    return [k for k in vars(multi_turn_utils) if k.startswith("cipr_")]


def replay(env, task, turns):
    env.reset(task)
    for k, calls in enumerate(turns):
        for c in calls:
            assert env.step(c).valid
        nxt = env.end_turn("done")
        assert (nxt is None) == (k == len(turns) - 1)
    return env.score()


def test_items_and_the_split_by_scenario_number(env):
    assert len(env.items) == 800
    assert {it.category for it in env.items.values()} == {f"multi_turn_{c}" for c in CATEGORIES}
    train, held = env.tasks("train"), env.tasks("heldout")
    assert len(train) == len(held) == 400 and not set(train) & set(held)
    held_numbers = {env.items[t].number for t in held}
    assert not held_numbers & {env.items[t].number for t in train}  # base_k and long_context_k together
    base = {f"multi_turn_base_{k}" for k in held_numbers}
    assert {t for t in held if t.startswith("multi_turn_base_")} == base
    other = make_env("bfcl_multi_turn", data_root=env.config.data_root, split_seed=1)
    assert other.tasks("heldout") != held


def test_ground_truth_passes_and_a_wrong_call_fails_its_turn(env):
    task = "multi_turn_base_0"
    truth = ground_truth_calls(env.items[task])
    assert truth[2] == [Call("sort", {"file_name": "final_report.pdf"})]  # positional in the data
    score = replay(env, task, truth)
    assert score.success and score.reward == 1.0 and score.turns == (True,) * 4
    wrong = [list(t) for t in truth]
    wrong[1] = wrong[1][1:]  # grep without entering temp: its result differs
    score = replay(env, task, wrong)
    assert not score.success and score.turns == (True, False, None, None)
    assert score.details["error_type"] == "multi_turn:execution_response_mismatch"
    assert score.reward == pytest.approx(0.25)  # reward="turns": one turn of four passed
    episode = make_env("bfcl_multi_turn", data_root=env.config.data_root, reward="episode")
    assert replay(episode, task, wrong).reward == 0.0
    env.close()
    episode.close()
    assert instances() == []


def test_observations_are_bfcl_execution_results(env):
    first = env.reset("multi_turn_base_0")
    assert first.startswith("Move 'final_report.pdf'")
    moved = env.step(Call("cd", {"folder": "document"}))
    assert moved.observation == '{"current_working_directory": "document"}'
    bad = env.step(Call("cd", {"folder": "nowhere"}))
    assert bad.valid and "No such" in bad.observation
    assert env.executed == [["cd(folder='document')", "cd(folder='nowhere')"]]


def test_undeclared_and_unsafe_calls_are_refused_unexecuted(env):
    env.reset("multi_turn_base_0")
    res = env.step(Call("format_disk", {"file_name": "x"}))
    assert not res.valid and res.observation == no_such_tool("format_disk")
    assert not env.step(Call("post_tweet_now", {})).valid
    res = env.step(Call("cd", {"folder=__import__('os').getcwd(),x": 1}))
    assert not res.valid and "identifier" in res.observation
    assert not env.step(Call("cd", {"folder": object()})).valid
    assert env.executed == [[]]
    with pytest.raises(ValueError, match="identifier"):
        call_text(Call("cd", {"class": "x"}))


def test_miss_func_reveals_the_held_out_function_with_bfcl_prompt(env):
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    task = "multi_turn_miss_func_0"
    env.reset(task)
    declared = env.declared.names
    assert "sort" not in env.interface.names and declared[-1] == "sort"
    assert env.interface.get("cd").description.endswith("Python 3 syntax.")
    for _ in range(3):
        prompt = env.end_turn("ok")
    assert prompt == DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC and env.turn == 3
    assert env.interface.names[-1] == "sort" and env.declared.names == declared
    assert not env.interface.get("sort").description.endswith("syntax.")  # BFCL adds no note to it


def test_an_episode_cut_short_is_force_terminated(env):
    item = env.items["multi_turn_base_1"]
    verdict = check_episode(item, [[]])
    assert not verdict["valid"] and verdict["error_type"] == "multi_turn:force_terminated"
    env.reset("multi_turn_base_1")
    score = env.score()
    assert not score.success and score.turns[0] is False


def test_parse_call_names_positional_arguments_from_the_method():
    assert parse_call("mv('a.txt', destination='b')", ["GorillaFileSystem"]) == \
        Call("mv", {"source": "a.txt", "destination": "b"})
    with pytest.raises(ValueError, match="no class"):
        parse_call("fly(to='moon')", ["GorillaFileSystem"])
