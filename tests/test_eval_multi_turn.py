"""Multi-turn evaluation: views, the episode loop's refusals and limits, cipr-eval end to end, the replay of
every BFCL ground truth under original and canonical names, and the per-turn consistency metric."""

import json
import time

import pytest

from cipr.envs.base import AddedToolError, no_such_tool, over_call_limit, unavailable
from cipr.envs.registry import make_env
from cipr.envs.toyshop import TOOLS
from cipr.eval.config import compose_eval_config
from cipr.eval.episodes import EpisodeItem, episode_pairs, make_view, reference_events, run_episodes
from cipr.eval.evaluate import evaluate
from cipr.eval.runner import RunnerConfig
from cipr.formats import get_format
from cipr.runtime.backends import Generation
from cipr.tools.canonical import UndeclaredToolError
from cipr.tools.interface import Call, Interface

FMT = get_format("toolrl")
SCRIPT = [[Call("search_products", {"query": "red mug"}), Call("buy_now")]]


def test_views_translate_shown_calls_back_to_the_environment():
    plain = make_view(TOOLS, "buy a red mug", SCRIPT, "t", perturbation="original", names="original", seed=0)
    assert plain.to_env(SCRIPT[0][0]) == SCRIPT[0][0] and plain.script == tuple(map(tuple, SCRIPT))
    canon = make_view(TOOLS, "use search_products", SCRIPT, "t", perturbation="original", names="canonical",
                      seed=0)
    assert canon.tools.names[0] == "function_01" and canon.first_message == "use function_01"
    assert canon.script[0][0] == Call("function_01", {"arg_01": "red mug"})
    assert canon.to_env(Call("function_01", {"arg_01": "x"})) == Call("search_products", {"query": "x"})
    assert canon.text_in("then filter_results") == "then function_02"
    with pytest.raises(UndeclaredToolError):
        canon.to_env(Call("search_products", {"query": "x"}))  # an original name is undeclared here
    distract = make_view(TOOLS, "buy a red mug", SCRIPT, "t", perturbation="distractor_similar_name",
                         names="original", seed=0)
    added = [t.name for t, s in zip(distract.tools, distract.sources, strict=True) if s is None]
    assert added and len(distract.tools) == len(TOOLS) + len(added)
    with pytest.raises(AddedToolError):
        distract.to_env(Call(added[0], {}))
    with pytest.raises(ValueError, match="translating names back"):
        make_view(TOOLS, "x", SCRIPT, "t", perturbation="drift_refactor", names="original", seed=0)


def test_withheld_tools_show_with_their_turn_and_keep_their_ids(shared_data):
    env = make_env("bfcl_multi_turn", data_root=str(shared_data), categories=["miss_func"])
    task = "multi_turn_miss_func_0"
    first = env.reset(task)
    from cipr.eval.episodes import reference_script

    view = make_view(env.declared, first, reference_script(env, task), task, perturbation="original",
                     names="canonical", seed=0)
    before = view.interface(env.interface)
    assert len(before) == len(env.declared) - 1
    for _ in range(3):
        env.end_turn("ok")
    after = view.interface(env.interface)
    assert after.names[:-1] == before.names and view.to_env(Call(after.names[-1], {})).name == "sort"
    env.close()


class Scripted:
    """A backend answering each episode with its listed texts, in order (then a text answer)."""

    name = "scripted"
    supports_forced_tool_choice = False

    def __init__(self, replies):
        self.replies = {k: list(v) for k, v in replies.items()}
        self.prompts = []

    def generate(self, requests):
        self.prompts += [r.example for r in requests]
        return [Generation(self.replies[r.example.id].pop(0) if self.replies[r.example.id]
                           else FMT.render_target((), response="Done.")) for r in requests]


def _item(task, view, perturbation="original", group="original", **env_options):
    return EpisodeItem(task, "toyshop", "original", perturbation, group, "original", "toyshop",
                       {"seed": 0, **env_options}, view)


def _records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_the_loop_refuses_undeclared_and_added_calls_and_reports_parse_errors(tmp_path):
    env = make_env("toyshop", seed=0)
    task = next(t for t in env.tasks("heldout") if env.task(t).goal == "buy")
    script = env.expert_calls(task)
    env.reset(task)
    view = make_view(TOOLS, env.reset(task), script, task, perturbation="distractor_similar_name",
                     names="original", seed=0)
    added = next(t.name for t, s in zip(view.tools, view.sources, strict=True) if s is None)
    expert = [FMT.render_target(view.script[0][k:k + 2]) for k in range(0, len(script[0]), 2)]
    broken = FMT.render_target([Call("view_item", {"item_id": "B1"})]).replace('"B1"}', '"B1"')
    replies = {task: [FMT.render_target([Call("teleport", {})]), FMT.render_target([Call(added, {})]),
                      broken, *expert]}
    backend = Scripted(replies)
    stats = run_episodes([_item(task, view)], backend, FMT, tmp_path, RunnerConfig(progress=False))
    rec = _records(tmp_path)[0]
    assert stats.evaluated == 1 and rec["success"] and not rec["correct"]  # it bought the item, after a
    assert rec["taxonomy"] == "undeclared_tool" and rec["error"] == "added_tool"  # call to an added tool
    assert rec["counts"]["undeclared"] == 1 and rec["counts"]["added"] == 1
    assert rec["counts"]["parse_failures"] == 1 and rec["end"] == "done"
    obs = [e.get("observations") for e in rec["transcript"]]
    assert obs[0] == [no_such_tool("teleport")] and obs[1] == [unavailable(added)]
    assert obs[2][0].startswith("Error: the call could not be parsed")
    assert rec["transcript"][0]["executed"] == [None]  # never executed
    last = backend.prompts[-1].messages
    assert [m.role for m in last[:3]] == ["user", "assistant", "tool"]


def test_call_and_step_limits_end_or_cut_the_episode(tmp_path):
    env = make_env("toyshop", seed=0, max_calls=2, max_turns=3)
    task = env.tasks("heldout")[0]
    view = make_view(TOOLS, env.reset(task), env.expert_calls(task), task, perturbation="original",
                     names="original", seed=0)
    three = FMT.render_target([Call("search_products", {"query": "mug"})] * 3)
    run_episodes([_item(task, view, max_calls=2, max_turns=3)], Scripted({task: [three] * 5}), FMT, tmp_path,
                 RunnerConfig(progress=False))
    rec = _records(tmp_path)[0]
    assert rec["end"] == "max_turns" and rec["counts"]["messages"] == 3
    assert rec["transcript"][0]["observations"][2] == over_call_limit(2)
    assert rec["counts"]["executed"] == 6 and rec["counts"]["over_limit"] == 3 and not rec["correct"]


def test_cipr_eval_runs_toyshop_episodes_with_the_adapter_and_resumes(tmp_path, caplog):
    import logging

    out = tmp_path / "ev"
    overrides = ["benchmark=toyshop", "backend=replay", f"out_dir={out}", "limit=6", "progress=false",
                 "perturbations=[original,relabel_random,drift_distractors]"]
    with caplog.at_level(logging.INFO, logger="cipr.eval.evaluate"):
        summary = evaluate(compose_eval_config(overrides))
    # said before the run: limit counts tasks, and what they multiply into
    assert "36 episodes: 6 task(s) x 3 perturbation type(s) (3 with their tool orders) x 2 naming(s)" in \
        caplog.text
    for names in ("original", "canonical"):
        for t in ("original", "relabel_random", "drift_distractors"):
            assert summary["names"][names]["types"][t]["accuracy"]["value"] == 100.0
    assert summary["canonical_minus_original"]["types"]["original"]["value"] == 0.0
    recs = _records(out)
    assert len(recs) == 6 * 3 * 2 and all(r["reward"] == 1.0 for r in recs)
    assert any(r["turns"] == 2 for r in recs)  # two-turn (cart) tasks among them
    again = evaluate(compose_eval_config(overrides))
    assert again["run_stats"]["evaluated"] == 0 and again["run_stats"]["skipped"] == 36
    from cipr.eval.episodes import episode_section

    text = episode_section(out, {}, None)
    assert "## Episodes" in text and "turn 2" in text


@pytest.mark.integration
def test_every_bfcl_ground_truth_passes_under_original_and_canonical_names(tmp_path, shared_data):
    """All 800 items of the four categories, replayed through benchmark=bfcl_multi_turn, pass BFCL's
    checker under both namings."""
    start = time.perf_counter()
    summary = evaluate(compose_eval_config([
        "benchmark=bfcl_multi_turn", "backend=replay", f"out_dir={tmp_path / 'gt'}",
        "perturbations=[original]", "names=[original,canonical]", f"data_root={shared_data}",
        "progress=false"]))
    recs = _records(tmp_path / "gt")
    assert len(recs) == 1600
    failed = [(r["id"], r["names"], r["error"]) for r in recs if not r["correct"]]
    assert failed == []
    for names in ("original", "canonical"):
        assert summary["names"][names]["types"]["original"]["accuracy"]["value"] == 100.0
        assert set(summary["names"][names]["partitions"]) == {
            "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"}
    print(f"replayed 1600 episodes in {time.perf_counter() - start:.1f} s")


def test_per_turn_consistency_pairs_and_records(tmp_path, tiny_model, tiny_tokenizer):
    from cipr.eval.consistency_metric import ConsistencyConfig, read_records, summarize_consistency
    from cipr.eval.episodes import run_episode_consistency

    env = make_env("toyshop", seed=0)
    task = next(t for t in env.tasks("heldout") if env.task(t).goal == "cart")
    events = reference_events(env, task)
    assert [e.role for e in events].count("user") == 2
    script = env.expert_calls(task)
    plain = make_view(TOOLS, events[0].text, script, task, perturbation="original", names="original", seed=0)
    view = make_view(TOOLS, events[0].text, script, task, perturbation="drift_distractors", names="original",
                     seed=0)
    item = _item(task, view, "drift_distractors", "drift")
    pairs = episode_pairs(item, plain, events)
    assert len(pairs) == sum(e.role == "assistant" for e in events)
    p = pairs[0]
    assert p.ref_classes == tuple(range(len(TOOLS))) and p.added and p.num_actions == len(view.tools)
    assert sorted(c for c in p.pert_classes if c < len(TOOLS)) == list(range(len(TOOLS)))
    assert p.perturbed.interface.names == view.tools.names and p.reference.reference == tuple(script[0][:4])
    counts = run_episode_consistency([item], tiny_model, tiny_tokenizer, FMT, tmp_path,
                                     ConsistencyConfig(batch_size=4), progress=False)
    assert counts["read"] == 1
    rec = read_records(tmp_path)[0]
    assert rec["messages"] == len(pairs) and [t["turn"] for t in rec["turns"]] == [0, 1]
    assert rec["kl"] is not None and rec["kl"] > -1e-9 and rec["added_mass"] is not None
    cons = summarize_consistency(read_records(tmp_path))
    assert "drift_distractors" in cons["names"]["original"]["types"]
    assert run_episode_consistency([item], tiny_model, tiny_tokenizer, FMT, tmp_path, ConsistencyConfig(),
                                   progress=False)["read"] == 0  # resumed: nothing left
    from cipr.eval.episodes import turn_consistency

    per_turn = turn_consistency(read_records(tmp_path))["original"]["drift_distractors"]
    assert [t["n"] for t in per_turn] == [1, 1]


def test_interface_filtering_is_by_environment_names():
    view = make_view(TOOLS, "x", SCRIPT, "t", perturbation="original", names="canonical", seed=0)
    only = Interface((TOOLS[0], TOOLS[6]))
    assert view.interface(only).names == ("function_01", "function_07")


def test_text_without_a_call_ends_the_turn_and_too_many_steps_force_quit(tmp_path):
    from cipr.envs.toyshop import ToyShop

    env = make_env("toyshop", seed=0)
    task = next(t for t in env.tasks("heldout") if env.task(t).goal == "cart")
    view = make_view(TOOLS, env.reset(task), env.expert_calls(task), task, perturbation="original",
                     names="original", seed=0)
    search = FMT.render_target([Call("search_products", {"query": "mug"})])
    replies = {task: ["Sorry, I cannot shop.", *[search] * 4]}  # malformed (no <think>), opens no call

    def factory(item):
        return ToyShop(seed=0, actions="tools", max_steps_per_turn=2)

    run_episodes([_item(task, view)], Scripted(replies), FMT, tmp_path, RunnerConfig(progress=False),
                 env_factory=factory)
    rec = _records(tmp_path)[0]
    assert rec["counts"]["parse_failures"] == 1 and rec["transcript"][1]["turn"] == 1  # the next user turn
    assert rec["end"] == "force_quit" and rec["counts"]["messages"] == 4  # 3 steps with calls > 2
    assert rec["turn_checks"] == [False, False] and rec["taxonomy"] == "parse_failure"
