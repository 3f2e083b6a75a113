"""Multi-turn GRPO (rollout.mode=multi_turn): the consistency terms' weighting across turns, the episode
loop's token-exact assembly and refusals, the config, and one training step of every algorithm on ToyShop
with the tiny model (turns replayed from ToyShop's scripted expert: a random tiny model writes no call)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support.episode_replay import EpisodeReplay, expert_choice, expert_script
from support.reference_kl import rescoring_kl

from cipr.core.config import ConfigError, from_dict
from cipr.envs.base import no_such_tool, unavailable
from cipr.formats import get_format
from cipr.method.consistency import kl_rows
from cipr.method.objective import Objective, rollout_pairs
from cipr.method.pairing import SideIndex, rollout_index
from cipr.method.relabel import relabel
from cipr.perturb.config import PerturbConfig, resolved
from cipr.tools.interface import Call, Message
from cipr.train.data import DataConfig
from cipr.train.episodes import (
    EpisodeOptions,
    EpisodeRenderError,
    EpisodeRunner,
    build_episodes,
    env_factory,
)
from cipr.train.run import TrainConfig, run, validate

TOYSHOP = {"name": "toyshop", "n_tasks": 40, "max_turns": 8}
PAIRED = resolved(PerturbConfig(), "cipr")  # canonical names, each task with its perturbed copy


def turn_rollout_kl(p_canon, canon, p_pert, pert, group_pairs, *, eps=1e-6):
    """The multi-turn engine's rollout term: its turn-aligned pairs (`rollout_pairs`), the objective."""
    pairs = rollout_pairs(p_canon, canon.units, canon.unit_groups, p_pert, pert.units, pert.unit_groups,
                          group_pairs)
    value, metrics = Objective.builtin(rollout=1.0, eps=eps)(p_pert, rollout=pairs)
    return value, {k.removeprefix("consistency/"): v for k, v in metrics.items()}


def _probs(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# -- the turn-aligned rollout term ---------------------------------------------------------------------------
def test_turn_rollout_kl_weighs_each_pairs_turns_then_pairs():
    """Pair 0 reached two turns, pair 1 one: value = ((KL_00 + KL_01) / 2 + KL_10) / 2, each group's sides
    being the mean over their episodes of each episode's mean over its decisions of that turn."""
    a, b, c = [0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]
    # canonical side: pair 0 turn 0 (episode 0: two decisions a, b; episode 1: one decision c), pair 0 turn 1
    # (episode 0: a), pair 1 turn 0 (episode 2: b)
    p_canon = _probs([a, b, c, a, b])
    canon = SideIndex(torch.tensor([0, 0, 1, 2, 3]), torch.tensor([0, 0, 1, 2, 3]),
                      torch.tensor([0, 0, 1, 2]))
    p_pert = _probs([c, b, c, a])
    pert = SideIndex(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 1, 2]))
    value, metrics = turn_rollout_kl(p_canon, canon, p_pert, pert, torch.tensor([0, 0, 1]), eps=0.0)
    def t(x):
        return torch.tensor(x, dtype=torch.float64)

    canon_00 = ((t(a) + t(b)) / 2 + t(c)) / 2
    kl00 = kl_rows(canon_00[None], t([c]), eps=0.0)[0]
    kl01 = kl_rows(t([a]), ((t(b) + t(c)) / 2)[None], eps=0.0)[0]
    kl10 = kl_rows(t([b]), t([a]), eps=0.0)[0]
    assert value.item() == pytest.approx(float(((kl00 + kl01) / 2 + kl10) / 2), rel=1e-12)
    assert metrics["rollout/groups"] == 3 and metrics["rollout/pairs"] == 2
    same, _ = turn_rollout_kl(p_canon, canon, p_canon, canon, torch.tensor([0, 0, 1]), eps=0.0)
    assert same.item() == 0.0


def test_turn_rollout_kl_equals_a_loop_over_pairs_and_turns():
    torch.manual_seed(0)
    pairs = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    sides = ["canonical", "canonical", "perturbed", "perturbed"] * 3
    sequence, turns = [], []
    for b in range(12):  # each episode: 1 to 3 turns of 1 to 2 decisions
        for k in range(1 + (b * 7) % 3):
            for _ in range(1 + (b + k) % 2):
                sequence.append(b)
                turns.append(k)
    probs = torch.softmax(torch.randn(len(sequence), 4, dtype=torch.float64), -1)
    index, _ = rollout_index(pairs, sides, sequence, turns)
    canon, pert = index.canonical, index.perturbed
    value, _ = turn_rollout_kl(probs[canon.decisions], canon, probs[pert.decisions], pert, index.group_pairs)
    per_pair = []
    for p in sorted(set(pairs)):
        kls = []
        for k in sorted(set(turns)):
            avg = {}
            for side in ("canonical", "perturbed"):
                episodes = [torch.stack([probs[d] for d in range(len(sequence)) if sequence[d] == b
                                         and turns[d] == k]).mean(0)
                            for b in range(12) if pairs[b] == p and sides[b] == side
                            and any(sequence[d] == b and turns[d] == k for d in range(len(sequence)))]
                avg[side] = torch.stack(episodes).mean(0) if episodes else None
            if avg["canonical"] is not None and avg["perturbed"] is not None:
                kls.append(kl_rows(avg["canonical"][None], avg["perturbed"][None])[0])
        if kls:
            per_pair.append(torch.stack(kls).mean())
    assert value.item() == pytest.approx(torch.stack(per_pair).mean().item(), rel=1e-10)


def test_turn_index_skips_turns_and_pairs_one_side_did_not_reach():
    # pair 7: canonical reaches turns 0 and 1, perturbed turn 0 only; pair 9: canonical only
    pairs, sides = [7, 7, 9], ["canonical", "perturbed", "canonical"]
    index, metrics = rollout_index(pairs, sides, sequence=[0, 0, 1, 2], turns=[0, 1, 0, 0])
    assert metrics == {"pairs_skipped": 1.0, "turns_skipped": 2.0}
    assert index.canonical.decisions.tolist() == [0] and index.perturbed.decisions.tolist() == [2]
    assert index.group_pairs.tolist() == [0] and index.group_turns.tolist() == [0]
    assert rollout_index([1, 1], ["canonical", "perturbed"], [0], [0]) == (None, {"pairs_skipped": 1.0,
                                                                               "turns_skipped": 1.0})
    with pytest.raises(ValueError, match="one entry per decision"):
        rollout_index([1], ["canonical"], [0, 0], [0])


def test_rescoring_weighs_every_episode_once_whatever_its_decisions():
    """An episode's decisions (over all its turns) weigh 1/n_decisions of it, episodes equally."""
    p = _probs([[0.5, 0.5], [0.9, 0.1], [0.9, 0.1], [0.9, 0.1]])
    q = _probs([[0.1, 0.9], [0.9, 0.1], [0.9, 0.1], [0.5, 0.5]])
    value, _ = rescoring_kl(p, q, torch.tensor([0, 1, 1, 1]), eps=0.0)
    per = kl_rows(p, q, eps=0.0)
    assert value.item() == pytest.approx(float((per[0] + per[1:].mean()) / 2))


def test_relabeling_an_episode_renames_every_turn_and_keeps_each_decision():
    fmt = get_format("hermes")
    turn0 = fmt.render_target([Call("function_02", {"arg_01": "red"})])
    obs = ("<|im_end|>\n<|im_start|>user\n<tool_response>\nfunction_02 listed 3 items\n</tool_response>"
           "<|im_end|>\n<|im_start|>assistant\n")
    turn1 = fmt.render_target([Call("function_01", {}), Call("function_02", {"arg_01": "x"})])
    response = turn0 + obs + turn1
    spans = [(0, len(turn0)), (len(turn0) + len(obs), len(response))]
    prompt = "tools: function_01, function_02"
    rel = relabel(prompt, response, ["function_01", "function_02"], fmt, seed=3, spans=spans)
    assert "function_01" not in rel.response.replace(rel.tools[0], "") or rel.tools[0] == "function_01"
    assert all(name in rel.prompt for name in rel.tools) and all(name in rel.response for name in rel.tools)
    old = [d for s, e in spans for d in fmt.decisions(response[s:e])]
    assert [d.taken for d in rel.decisions] == [dict(zip(["function_01", "function_02"], rel.tools,
                                                         strict=True)).get(d.taken) for d in old]
    for d in rel.decisions:  # each call's offset points at its opener and new name in the new text
        if d.taken is not None:
            assert rel.response.startswith(d.opener + d.taken, d.start)
        else:  # the end of a turn after its last call (the opener it did not write)
            assert rel.response[:d.start].endswith("</tool_call>")
    with pytest.raises(ValueError, match="not ascending"):
        relabel(prompt, response, ["function_01", "function_02"], fmt, seed=3, spans=spans[::-1])


# -- the episode loop ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory):
    """The tiny model after 24 SFT steps on synthetic single calls in the hermes format: it puts mass on
    opening a call (a random one puts ~1e-17 there, and every action distribution is then ∅)."""
    from support.tiny_models import save_tiny

    base = save_tiny(tmp_path_factory.mktemp("tiny") / "model")
    cfg = from_dict(TrainConfig, {
        "model": {"name_or_path": str(base), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "call_format": "hermes"},
        "data": {"source": "synthetic", "n": 26, "eval_examples": 2, "tools_per_example": [2, 3], "seed": 0,
                 "parallel_fraction": 0.0, "no_call_fraction": 0.0, "same_domain_distractors": 0.0},
        "algo": {"name": "sft"},
        "trainer": {"run_dir": str(tmp_path_factory.mktemp("sft")), "max_steps": 24, "save_steps": 24,
                    "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "learning_rate": 1e-2,
                    "seed": 0, "gradient_checkpointing": False,
                    "warm_start": {"steps": 0, "eval_examples": 0}},
        "logging": {"progress_bar": False},
    })
    return run(cfg) / "sft" / "final"



@pytest.fixture(scope="module")
def shop(tiny_tokenizer):
    """ToyShop episodes under canonical names with their perturbed copies (4 train tasks, hermes calls)."""
    fmt = get_format("hermes")
    factory = env_factory(TOYSHOP)
    episodes = build_episodes(4, DataConfig(), PAIRED, fmt, tiny_tokenizer, factory)
    return EpisodeRunner(episodes, fmt, tiny_tokenizer, EpisodeOptions(), factory, max_completion_length=4096)


def _replayed(runner: EpisodeRunner, choose) -> tuple[EpisodeReplay, Any]:
    replay = EpisodeReplay(runner, choose)

    def sample(contexts, max_new_tokens):
        return replay.generate(contexts)
    return replay, sample


def test_interfaces_differ_and_translate_back_to_the_environment(shop):
    records, names = shop.episodes.records, shop.episodes.names
    assert [r.side for r in records[:2]] == ["canonical", "perturbed"]
    assert records[0].pair_id == records[1].pair_id
    assert records[0].tools != records[1].tools and records[0].prompt != records[1].prompt
    assert len(records[1].tools) > len(records[0].tools)  # the twins
    original = set(shop.env.interface.names)
    for record, name in zip(records, names, strict=True):
        assert not original & set(record.tools)  # the policy never sees the environment's names
        for written, target in name.back.items():
            if target is not None:
                assert name.to_env(Call(written, {})).name in original
    twin = next(w for w, t in names[1].back.items() if t is None)
    canonical_search = names[0].forward["search_products"]
    assert names[0].to_env(Call(canonical_search, {"arg_01": "mug"})) == \
        Call("search_products", {"query": "mug"})
    assert names[1].text_in("use search_products") == f"use {names[1].forward['search_products']}"
    assert names[1].text_out(f"I used {names[1].forward['back']}") == "I used back"
    assert twin in records[1].tools


def test_the_expert_replayed_under_both_interfaces_succeeds_in_several_turns(shop, tiny_tokenizer):
    replay, sample = _replayed(shop, expert_choice(shop, follow=1.0))
    episodes = shop.run(list(range(len(shop.episodes.records))), sample, [tiny_tokenizer.eos_token_id])
    for e in episodes:
        assert e.success and e.score == 1.0 and e.format == 1.0 and e.reward == 2.0, e
        assert e.turns >= 2 and not e.truncated and e.ended
        assert e.undeclared_calls == e.twin_calls == e.parse_errors == 0
        assert len(e.turn_of) == len(e.decisions) and sorted(set(e.turn_of)) == list(range(e.turns))
        # one message per expert call and an answer closing each user turn; the purchase ends the episode
        assert e.turns == len(expert_script(shop, e.row)) - 1
    assert {e.turns for e in episodes} == {5, 7}  # a `buy` task and a `cart` task (two user turns)


def test_completion_is_the_sampled_ids_and_the_template_between_turns(shop, tiny_tokenizer, monkeypatch):
    """Turn by turn, the completion holds exactly the sampled ids (mask 1) and between them the ids of the
    chat template's own text for what follows (mask 0): prompt + decoded completion equals the template's
    rendering of the whole conversation."""
    follows: list[tuple[tuple[Call, ...], list[Message]]] = []
    original = EpisodeRunner.follow_text

    def spy(self, interface, calls, messages, end_text):
        follows.append((tuple(calls), list(messages)))
        return original(self, interface, calls, messages, end_text)

    monkeypatch.setattr(EpisodeRunner, "follow_text", spy)
    replay, sample = _replayed(shop, expert_choice(shop, follow=1.0))
    (e,) = shop.run([2], sample, [tiny_tokenizer.eos_token_id])
    sampled = [ids for row, _, ids in replay.sampled]
    assert len(sampled) == e.turns
    ids, mask = list(e.completion_ids), list(e.mask)
    for (start, end), turn_ids in zip(e.token_spans, sampled, strict=True):
        assert ids[start:end] == turn_ids and all(mask[start:end])
    spans = e.token_spans
    between = [(a_end, b_start) for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)]
    assert sum(b - a for a, b in between) == len(mask) - sum(mask)
    for (a, b), (calls, messages) in zip(between, follows, strict=True):
        assert not any(mask[a:b])
        interface = shop.episodes.records[2].example.interface
        text = original(shop, interface, calls, messages, tiny_tokenizer.eos_token)
        assert ids[a:b] == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    # the whole conversation, as the chat template renders it
    record = shop.episodes.records[2]
    conversation = [Message("user", shop.episodes.first[2])]
    for t, (start, end) in enumerate(e.turn_spans):
        parsed = shop.fmt.parse(e.text[start:end])
        conversation.append(Message("assistant", parsed.response or "", parsed.calls))
        conversation += follows[t][1] if t < len(follows) else []
    chat, tools = shop.fmt.chat(conversation, record.example.interface, native_tools=shop.native)
    rendered = tiny_tokenizer.apply_chat_template(chat, tools=tools, tokenize=False)
    assert rendered.startswith(record.prompt + e.text + tiny_tokenizer.eos_token)


def test_undeclared_and_twin_calls_are_answered_and_never_executed(shop, tiny_tokenizer, monkeypatch):
    executed: list[Call] = []
    env_step = type(shop.env).step

    def recording(self, call):
        executed.append(call)
        return env_step(self, call)

    monkeypatch.setattr(type(shop.env), "step", recording)
    twin = next(w for w, t in shop.episodes.names[1].back.items() if t is None)
    fmt = shop.fmt

    def texts(row, m, generator):
        if m == 0:
            return fmt.render_target([Call("function_99", {"arg_01": "x"}), Call(twin, {})])
        return fmt.render_target((), response="Done.")

    replay, sample = _replayed(shop, texts)
    canonical, perturbed = shop.run([0, 1], sample, [tiny_tokenizer.eos_token_id])
    assert executed == []  # neither the undeclared name nor the twin reached the environment
    assert canonical.undeclared_calls == 2 and canonical.twin_calls == 0  # the twin is undeclared there
    assert perturbed.undeclared_calls == 1 and perturbed.twin_calls == 1
    assert no_such_tool("function_99") in perturbed.text and unavailable(twin) in perturbed.text
    assert perturbed.turns >= 2 and perturbed.score == 0.0  # the answers end the user turns


def test_rounds_are_padded_in_lock_step_and_padding_changes_nothing(shop, tiny_tokenizer):
    calls: list[int] = []

    def run(sync):
        replay, sample = _replayed(shop, expert_choice(shop, follow=0.7))

        def counting(contexts, n):
            calls.append(len(contexts))
            return sample(contexts, n)
        return shop.run([0, 0, 1, 1], counting, [tiny_tokenizer.eos_token_id], sync)

    alone = run(None)
    rounds = len(calls)
    calls.clear()
    # another process has 6 unfinished episodes and more room while this one has any (then none either)
    padded = run(lambda values: [6 if values[0] else 0, values[1] + 7])
    assert len(calls) == rounds and all(n == 6 for n in calls)
    assert [e.completion_ids for e in padded] == [e.completion_ids for e in alone]


def test_a_format_that_renders_the_dialogue_as_one_message_is_refused(tiny_tokenizer):
    fmt = get_format("toolrl")
    factory = env_factory(TOYSHOP)
    episodes = build_episodes(2, DataConfig(), PAIRED, fmt, tiny_tokenizer, factory)
    with pytest.raises(EpisodeRenderError, match="renders the dialogue as one message"):
        EpisodeRunner(episodes, fmt, tiny_tokenizer, EpisodeOptions(), factory, max_completion_length=64)


def test_a_turn_cut_off_by_the_budget_ends_the_episode(shop, tiny_tokenizer):
    small = EpisodeRunner(shop.episodes, shop.fmt, tiny_tokenizer, EpisodeOptions(max_turn_tokens=12),
                          shop.factory, max_completion_length=4096)
    replay, sample = _replayed(small, expert_choice(small, follow=1.0))
    (e,) = small.run([0], sample, [tiny_tokenizer.eos_token_id])
    assert e.truncated and not e.ended and e.turns == 1 and len(e.completion_ids) == 12 and e.format == 0.0


# -- config --------------------------------------------------------------------------------------------------
def config(model: Path, run_dir: Path, name: str, **changes: Any) -> TrainConfig:
    algos = {"grpo": {"name": "grpo"}, "masking": {"name": "masking"},
             "multi_interface": {"name": "multi_interface"},
             "cipr": {"name": "cipr", "terms": {"rescore": {"weight": 1.0}, "rollout": {"weight": 1.0}}}}
    data: dict[str, Any] = {
        "model": {"name_or_path": str(model), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "call_format": "hermes"},
        "data": {"source": "synthetic", "n": 8, "eval_examples": 0, "tools_per_example": [2, 2], "seed": 0},
        "algo": {**algos[name], **changes.pop("algo", {})},
        "rollout": {"num_generations": 2, "max_completion_length": 2048, "mode": "multi_turn",
                    "episode_tasks": 4, **changes.pop("rollout", {})},
        "env": {**TOYSHOP, **changes.pop("env", {})},
        "trainer": {"run_dir": str(run_dir), "max_steps": 1, "per_device_train_batch_size": 8,
                    "gradient_accumulation_steps": 1, "learning_rate": 1e-3, "save_steps": 1, "seed": 0,
                    "gradient_checkpointing": False, "warm_start": {"steps": 0, "eval_examples": 0}},
        "logging": {"progress_bar": False},
    }
    assert not changes, changes
    return from_dict(TrainConfig, data)


def test_config_refuses_what_cannot_mean_what_it_says(tiny_dir, tmp_path):
    ok = config(tiny_dir, tmp_path / "r", "cipr")
    validate(ok)
    no_env = config(tiny_dir, tmp_path / "r", "cipr", env={"name": "none"})
    no_env.env = {"name": "none"}
    with pytest.raises(ConfigError, match="set env=toyshop"):
        validate(no_env)
    single = config(tiny_dir, tmp_path / "r", "cipr", rollout={"mode": "single_turn", "episode_tasks": 0})
    with pytest.raises(ConfigError, match="rollout.mode=multi_turn"):
        validate(single)
    single.env = {"name": "none"}
    single.rollout.format_weight = 0.5
    with pytest.raises(ConfigError, match="rollout.format_weight=0.5 applies to rollout.mode=multi_turn"):
        validate(single)
    with pytest.raises(ConfigError, match="nonsense"):
        validate(config(tiny_dir, tmp_path / "r", "cipr", env={"nonsense": 1}))
    supervised = config(tiny_dir, tmp_path / "r", "cipr",
                        algo={"regime": "supervised",
                              "terms": {"rescore": {"weight": 1.0}, "rollout": {"weight": 0.0}}})
    with pytest.raises(ConfigError, match="samples episodes for GRPO"):
        validate(supervised)
    from cipr.train.config import config_from_dict

    with pytest.raises(ConfigError, match="algo=distill plays no episodes"):
        config_from_dict({"algo": {"name": "distill"}, "env": {"name": "toyshop"}})


# -- training steps ------------------------------------------------------------------------------------------
SEEN: list[dict[str, Any]] = []


class Replayed:
    """A `rollout_source` replaying ToyShop's expert (75% of turns; the rest another declared tool) in every
    multi-turn GRPO run it is given to; `replays`: one per trainer."""

    def __init__(self) -> None:
        self.replays: list[EpisodeReplay] = []

    def __call__(self, trainer: Any) -> Any:
        replay = EpisodeReplay(trainer.episodes, expert_choice(trainer.episodes))
        self.replays.append(replay)
        return lambda prompt_ids: replay.generate(prompt_ids, step=trainer.state.global_step)


@pytest.fixture
def replayed(monkeypatch) -> Replayed:
    """Replayed episodes (`Replayed`), and each micro-batch's loss inputs recorded in SEEN."""
    from cipr.train.grpo import CIPRGRPOTrainer

    original = CIPRGRPOTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        SEEN.append({k: inputs[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                                            "tool_mask", "cipr_rows")})
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(CIPRGRPOTrainer, "compute_loss", spy)
    SEEN.clear()
    return Replayed()


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("kind") == "step"]


@pytest.mark.integration
def test_one_multi_turn_cipr_step(warm_dir, tmp_path, replayed):
    """One CIPR step on ToyShop episodes: at least two turns per episode, a loss mask that is zero exactly on
    the tokens between turns, the ids the loss scores equal to the ids sampled turn by turn, different
    interfaces within the batch, and both consistency terms over the turns."""
    run_dir = run(config(warm_dir, tmp_path / "cipr", "cipr"), rollout_source=replayed)
    (line,) = _steps(run_dir)
    assert line["turns_per_episode"] >= 2 and "time/env" in line and "frac_reward_zero_std" in line
    assert line["frac_reward_zero_std"] < 1.0 and "episode/success_rate" in line
    for key in ("consistency/rescore/kl", "consistency/rollout/kl", "consistency/rollout/groups"):
        assert math.isfinite(line[key]), key
    assert line["consistency/rollout/groups"] > line["consistency/rollout/pairs"] >= 1  # several turns a pair
    assert line["consistency/relabel_failures"] == 0
    (replay,) = replayed.replays
    drawn: dict[tuple[int, int], list[list[int]]] = {}
    for row, m, ids in replay.sampled:
        drawn.setdefault((row, m), []).append(ids)
    (batch,) = SEEN
    rows = [row.rollout for row in batch["cipr_rows"]]
    assert len(rows) == 8
    assert all(row.record is replay.runner.episodes.records[row.rollout.row] for row in batch["cipr_rows"])
    tools = {tuple(replay.runner.episodes.records[e.row].tools) for e in rows}
    assert len(tools) >= 3  # the canonical interface and two perturbed copies at least
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    for b, e in enumerate(rows):
        n = len(e.completion_ids)
        assert batch["completion_ids"][b, :n].tolist() == list(e.completion_ids)
        assert loss_mask[b, :n].tolist() == list(e.mask) and not loss_mask[b, n:].any()
        assert batch["prompt_ids"][b][batch["prompt_mask"][b].bool()].tolist() == list(e.prompt_ids)
        assert e.turns >= 2
        for t, (start, end) in enumerate(e.token_spans):  # the ids scored are the ids sampled, turn by turn
            assert list(e.completion_ids[start:end]) in [ids[:end - start] for ids in drawn[(e.row, t)]]


@pytest.mark.integration
def test_grpo_and_masking_take_a_multi_turn_step(warm_dir, tmp_path, replayed):
    """The unpaired algorithms (multi_interface: the next test): original and masked names reach the
    environment as its own."""
    for algo in ("grpo", "masking"):
        (line,) = _steps(run(config(warm_dir, tmp_path / algo, algo), rollout_source=replayed))
        assert line["turns_per_episode"] >= 2 and math.isfinite(line["loss"]), algo
        assert line["episode/undeclared_calls"] == 0 and line["episode/env_errors"] == 0, algo
        assert not any(k.startswith("consistency/") for k in line), algo


@pytest.mark.integration
def test_cipr_with_zero_weights_trains_like_multi_interface(warm_dir, tmp_path, replayed):
    """As in the single-turn case (tests/test_train_supervised.py): the folded read gives TRL's loss its token
    log-probabilities, so loss and gradient norm agree to 1e-4 and the weights to a tenth of how far they
    moved."""
    mi = run(config(warm_dir, tmp_path / "mi", "multi_interface"), rollout_source=replayed)
    zero = run(config(warm_dir, tmp_path / "zero", "cipr",
                      algo={"terms": {"rescore": {"weight": 0.0}, "rollout": {"weight": 0.0}}}),
               rollout_source=replayed)
    (x,), (y,) = _steps(mi), _steps(zero)
    assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-7)
    assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    assert y["actions/folded"] > 0  # the zero-weight run did read the actions, folded
    a = load_file(str(mi / "grpo" / "final" / "model.safetensors"))
    b = load_file(str(zero / "grpo" / "final" / "model.safetensors"))
    start = load_file(str(warm_dir / "model.safetensors"))
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 0.1 * moved


def test_consistency_terms_are_zero_on_identical_pairs_and_not_on_differing_ones(warm_dir):
    """On the warm tiny model, the action reader on the multi-turn context: the turn-aligned rollout KL of a
    pair whose episodes took different actions under the two interfaces is > 0, and exactly 0 when the
    perturbed side holds the canonical episodes themselves; the rescoring KL of the relabeled episodes > 0."""
    from cipr.method.actions import ActionQuery, read_actions
    from cipr.runtime.model import ModelConfig, load_model

    model, tok = load_model(ModelConfig(name_or_path=str(warm_dir), gguf_package=None, gguf_file=None,
                                        call_format="hermes"))
    fmt = get_format("hermes")
    factory = env_factory(TOYSHOP)
    runner = EpisodeRunner(build_episodes(1, DataConfig(), PAIRED, fmt, tok, factory), fmt, tok,
                           EpisodeOptions(), factory, max_completion_length=1024)
    replay, sample = _replayed(runner, expert_choice(runner, follow=0.5))
    episodes = runner.run([0, 0, 1, 1], sample, [tok.eos_token_id])
    records = [runner.episodes.records[e.row] for e in episodes]
    queries = [ActionQuery(r.prompt, e.text + tok.eos_token, e.decisions, r.tools, r.classes)
               for r, e in zip(records, episodes, strict=True)]
    num_actions = max(r.num_actions for r in records)
    with torch.no_grad():
        reading = read_actions(model, tok, queries, num_actions)
    seq, turns = reading.sequence.tolist(), [k for e in episodes for k in e.turn_of]
    sides = ["canonical", "canonical", "perturbed", "perturbed"]
    index, _ = rollout_index([0, 0, 0, 0], sides, seq, turns)
    differing, _ = turn_rollout_kl(reading.probs[index.canonical.decisions].double(), index.canonical,
                                   reading.probs[index.perturbed.decisions].double(), index.perturbed,
                                   index.group_pairs)
    assert differing.item() > 0.0
    mirrored = [b if b < 2 else b - 2 for b in range(4)]  # the perturbed side = the canonical episodes
    twice = torch.cat([reading.probs[[d for d, b in enumerate(seq) if b < 2]]] * 2).double()
    seq2 = [b for b in seq if b < 2] + [b + 2 for b in seq if b < 2]
    turns2 = [k for e in episodes[:2] for k in e.turn_of] * 2
    same_index, _ = rollout_index([0, 0, 0, 0], sides, seq2, turns2)
    same, _ = turn_rollout_kl(twice[same_index.canonical.decisions], same_index.canonical,
                              twice[same_index.perturbed.decisions], same_index.perturbed,
                              same_index.group_pairs)
    assert same.item() == 0.0 and mirrored == [0, 1, 0, 1]
    e, r = episodes[0], records[0]
    rel = relabel(r.prompt, e.text, r.tools, fmt, seed=1, spans=e.turn_spans)
    with torch.no_grad():
        relabeled = read_actions(model, tok, [ActionQuery(rel.prompt, rel.response + tok.eos_token,
                                                          rel.decisions, rel.tools, r.classes)], num_actions)
    canon = reading.probs[[d for d, b in enumerate(seq) if b == 0]].double()
    value, _ = rescoring_kl(canon, relabeled.probs.double(), relabeled.sequence)
    assert value.item() > 0.0


def test_an_episode_script_follows_the_rows_names(shop):
    script = expert_script(shop, 1)
    assert all(step is None or step[0].name in shop.episodes.records[1].tools for step in script)


# -- integration: the embedded model, from the command line --------------------------------------------------
def _command(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1])


SHOP_CLI = ["experiment=smollm2_toyshop_cipr", "env.n_tasks=40", "rollout.episode_tasks=8",
            "trainer.max_steps=2", "trainer.save_steps=2", "trainer.warm_start.steps=4", "data.n=16",
            "logging.progress_bar=false"]
"""The one-CPU experiment's config (configs/train/experiment/smollm2_toyshop_cipr.yaml), cut to two steps."""


@pytest.mark.integration
def test_embedded_model_trains_on_toyshop_episodes_and_its_export_plays_them(tmp_path):
    """`cipr-train experiment=smollm2_toyshop_cipr` on the embedded SmolLM2 (a 4-step warm start on the
    format, then two CIPR steps sampled by the model itself), then `cipr-export` and `cipr-eval
    benchmark=toyshop` on held-out tasks of the same shop."""
    run_dir = tmp_path / "run"
    trained = _command("cipr.cli.train", *SHOP_CLI, f"trainer.run_dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-4000:]
    lines = _steps(run_dir)
    assert [r["step"] for r in lines if r.get("stage") == "grpo"] == [1, 2]
    for line in (r for r in lines if r.get("stage") == "grpo"):
        for key in ("turns_per_episode", "frac_reward_zero_std", "time/env", "episode/success_rate",
                    "episode/env_reward", "consistency/rescore/kl", "reward"):
            assert key in line and math.isfinite(line[key]), key
        assert line["turns_per_episode"] >= 1
    exported = _command("cipr.cli.export", f"run_dir={run_dir}", f"out_dir={tmp_path / 'export'}")
    assert exported.returncode == 0, exported.stderr[-3000:]
    out = tmp_path / "eval"
    evaluated = _command("cipr.cli.eval", f"model={tmp_path / 'export'}", "benchmark=toyshop",
                         "format=compact", "limit=2", "perturbations=[original]", "names=[canonical]",
                         "max_new_tokens=64", "++benchmark.env={n_tasks:40,max_turns:4}", "progress=false",
                         f"out_dir={out}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert (out / "results.jsonl").is_file() and (out / "summary.json").is_file()


@pytest.mark.integration
def test_one_bfcl_multi_turn_training_step_runs(tmp_path):
    """One GRPO step on BFCL multi-turn episodes (base category, the train split's first two items) with the
    embedded model: executed by bfcl-eval's API classes, scored by BFCL's checker."""
    run_dir = tmp_path / "run"
    trained = _command("cipr.cli.train", "rollout.mode=multi_turn", "env=bfcl_multi_turn",
                       "env.categories=[base]", "env.max_turns=2", "algo=grpo", "model.call_format=compact",
                       "rollout.num_generations=2", "rollout.max_completion_length=192",
                       "rollout.max_turn_tokens=64", "rollout.episode_tasks=2", "trainer.max_steps=1",
                       "trainer.per_device_train_batch_size=4", "trainer.gradient_accumulation_steps=1",
                       "trainer.save_steps=1", "trainer.warm_start.steps=0",
                       "trainer.warm_start.eval_examples=0",
                       "data.n=8", "data.eval_examples=0", "logging.progress_bar=false",
                       f"trainer.run_dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-4000:]
    (line,) = [r for r in _steps(run_dir) if r.get("stage") == "grpo"]
    assert line["turns_per_episode"] >= 1 and math.isfinite(line["loss"]) and "episode/env_reward" in line
