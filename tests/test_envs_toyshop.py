"""ToyShop's nine tools: the expert, the reward, refusals, the split, the registry."""

import pytest

from cipr.core.errors import ConfigError
from cipr.envs.base import EpisodeLimits, EpisodeScore, no_such_tool
from cipr.envs.registry import make_env
from cipr.envs.toyshop import ACTIONS, TOOLS, ToyShop
from cipr.tools.interface import Call


def play(env, task, turns):
    """Run `turns` (calls per user turn) through `env`; the score."""
    env.reset(task)
    for calls in turns:
        for c in calls:
            res = env.step(c)
            assert res.valid, (c, res.observation)
            if res.done:
                return env.score()
        if env.end_turn("ok") is None:
            break
    return env.score()


def test_the_tools_overlap_and_the_registry_builds_them():
    env = make_env("toyshop", seed=3)
    assert env.interface is TOOLS and env.declared is TOOLS and len(TOOLS) >= 6
    assert {"search_products", "filter_results", "view_item", "compare_items", "buy_now", "add_to_cart",
            "checkout"} <= set(TOOLS.names)
    assert all(len(t.properties) <= 1 for t in TOOLS)  # one string argument at most: the webshop format too
    assert ToyShop(seed=0).interface is ACTIONS  # the distillation path keeps WebShop's two actions
    with pytest.raises(ConfigError, match="env.sede"):
        make_env("toyshop", sede=1)
    with pytest.raises(ConfigError, match="heldout_fraction"):
        make_env("toyshop", heldout_fraction=1.5)
    with pytest.raises(ConfigError, match="max_steps_per_turn=0 must be >= 1"):
        make_env("toyshop", max_steps_per_turn=0)
    assert make_env("toyshop", max_steps_per_turn=3).limits == EpisodeLimits(16, 4, 3)
    with pytest.raises(ConfigError, match="bfcl_multi_turn"):
        make_env("webshop_live")


def test_the_expert_earns_reward_one_on_both_goals_and_is_deterministic():
    env = make_env("toyshop", seed=0)
    goals = set()
    for task in env.tasks("train")[:60]:
        script = env.expert_calls(task)
        assert script == env.expert_calls(task)
        score = play(env, task, script)
        goals.add(score.details["goal"])
        assert score.reward == 1.0 and score.success and all(score.turns), (task, score)
    assert goals == {"buy", "cart"}


def test_rewards_are_shares_of_the_attributes_and_count_the_turn():
    env = make_env("toyshop", seed=0)
    task = next(t for t in env.tasks("train") if env.task(t).goal == "cart")
    script = env.expert_calls(task)
    t = env.task(task)
    # buying during the turn that says "don't buy": both turns score 0
    early = play(env, task, [script[0][:-1] + [Call("buy_now")]])
    assert early.reward == 0.0 and early.turns == (False, False)
    # the right cart, then buy_now of the open item (the same outcome) also counts
    ok = play(env, task, [script[0], [Call("buy_now")]])
    assert ok.reward == 1.0
    # a wrong-colour item: 3 of 4 attributes at best, in both turns
    env.reset(task)
    env.step(Call("search_products", {"query": t.kind}))
    wrong = next(p for p in env._results if p.kind == t.kind and p.color != t.color and t.size in p.sizes)
    for c in (Call("view_item", {"item_id": wrong.pid}), Call("select_option", {"option": t.size}),
              Call("add_to_cart")):
        assert env.step(c).valid
    env.end_turn("added")
    assert env.step(Call("checkout")).done
    score = env.score()
    assert score.reward == pytest.approx(0.75 if wrong.price <= t.max_price else 0.5)
    assert not score.success and isinstance(score, EpisodeScore)


def test_refusals_are_never_executed():
    env = make_env("toyshop", seed=1)
    env.reset("toyshop_5")
    res = env.step(Call("click", {"argument": "Buy Now"}))  # a WebShop action: not a tool here
    assert not res.valid and res.observation == no_such_tool("click")
    assert not env.step(Call("buy_now")).valid  # no product page open
    assert not env.step(Call("filter_results", {"constraint": "red"})).valid  # nothing listed yet
    assert not env.step(Call("search_products", {"words": "red"})).valid  # wrong argument name
    assert env.step(Call("search_products", {"argument": "red mug"})).valid  # the webshop format's key
    assert not env.step(Call("filter_results", {"constraint": "something nice"})).valid
    assert env.step(Call("filter_results", {"constraint": "under 40 dollars"})).valid
    assert all(p.price <= 40 for p in env._results)
    assert not env.step(Call("back", {"argument": "x"})).valid
    assert env.step(Call("back")).valid  # back to the unfiltered list
    listed = env._results
    cmp = env.step(Call("compare_items", {"item_ids": f"{listed[0].pid}, {listed[1].pid}"}))
    assert cmp.valid and listed[1].pid in cmp.observation
    assert env.score().reward == 0.0


def test_the_split_is_seeded_disjoint_and_complete():
    env = make_env("toyshop", n_tasks=50, heldout_fraction=0.2)
    train, held = env.tasks("train"), env.tasks("heldout")
    assert len(held) == 10 and not set(train) & set(held) and len(train) + len(held) == 50
    assert held == make_env("toyshop", n_tasks=50, heldout_fraction=0.2).tasks("heldout")
    assert held != make_env("toyshop", n_tasks=50, heldout_fraction=0.2, split_seed=1).tasks("heldout")
    with pytest.raises(ValueError, match="split"):
        env.tasks("test")


def test_two_turn_tasks_end_turns_and_the_turn_counter():
    env = make_env("toyshop", seed=0)
    task = next(t for t in env.tasks("heldout") if env.task(t).goal == "cart")
    first = env.reset(task)
    assert "cart" in first and env.turn == 0
    assert env.end_turn("I could not find it.") == env.task(task).user_turns[1] and env.turn == 1
    assert env.end_turn("done") is None
    assert env.score().reward == 0.0
