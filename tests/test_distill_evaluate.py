"""Evaluation of self-distillation: agreement/KL by hand, the table, renamings by equivalence, live
episodes."""

import pytest
import torch

from cipr.data.trajectories import toyshop_trajectories
from cipr.distill.evaluate import (
    EvalConfig,
    Readings,
    check_eval,
    compare,
    greedy_policy,
    live_episode,
    live_evaluate,
    markdown_table,
    offline_rows,
    render_named,
)
from cipr.distill.naming import named
from cipr.envs.toyshop import ToyShop
from cipr.envs.webshop import WebShopEnv, WebShopMissing
from cipr.formats import get_format

FMT = get_format("webshop")



pytestmark = pytest.mark.usefixtures("one_thread")

def test_compare_hand_computed():
    ref = Readings(torch.tensor([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0], [0.2, 0.7, 0.1]]), torch.tensor([0, 0, 1]))
    other = Readings(torch.tensor([[0.25, 0.75, 0.0], [0.9, 0.1, 0.0], [0.1, 0.2, 0.7]]),
                     torch.tensor([0, 0, 1]))
    got = compare(ref, other, eps=0.0)
    k0 = 0.5 * torch.log(torch.tensor(2.0)) + 0.5 * torch.log(torch.tensor(0.5 / 0.75))
    k2 = (0.2 * torch.log(torch.tensor(2.0)) + 0.7 * torch.log(torch.tensor(3.5))
          + 0.1 * torch.log(torch.tensor(1 / 7)))
    assert got["kl"] == pytest.approx(float((k0 / 2 + k2) / 2), abs=1e-5)
    assert got["agreement"] == pytest.approx(1 / 3) and got["no_call"] == pytest.approx(1 / 3)
    assert got["decisions"] == 3.0
    with pytest.raises(ValueError, match="different decisions"):
        compare(ref, Readings(other.probs[:2], other.segments[:2]))


def test_table_lists_models_and_namings():
    ref = Readings(torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0]]), torch.tensor([0, 1]))
    swap = Readings(torch.tensor([[0.1, 0.9, 0.0], [0.2, 0.8, 0.0]]), torch.tensor([0, 1]))
    rows = offline_rows({"teacher": {"canonical": ref, "swapped": swap}, "student": {"canonical": ref}}, ref)
    assert rows["teacher"]["swapped"]["agreement"] == 0.5 and rows["student"]["canonical"]["agreement"] == 1.0
    table = markdown_table(rows, {"student": {"canonical": {"reward": 0.75}}})
    lines = table.splitlines()
    assert lines[0] == ("| model | canonical agree | swapped agree | canonical KL | swapped KL | "
                        "canonical reward | swapped reward |")
    # swapped KL: trajectory 0 has 0.8 ln 9 = 1.7578, trajectory 1 has 0; their mean is 0.8789
    assert lines[2] == "| teacher | 1.000 | 0.500 | 0.0000 | 0.8789 |  |  |"
    assert lines[3] == "| student | 1.000 |  | 0.0000 |  | 0.750 |  |"
    assert "2 held-out decisions" in table


def test_renamings_keep_actions_by_position(tiny_tokenizer):
    ex = toyshop_trajectories(1, seed=3)[0]
    taken = {n: [d.taken for d in render_named([ex], FMT, tiny_tokenizer, n)[0].decisions]
             for n in ("original", "canonical", "synonyms", "swapped")}
    pos = {"search": 0, "click": 1}
    assert taken["synonyms"] == [{"search": "find", "click": "press"}[t] for t in taken["original"]]
    assert taken["swapped"] == [{"search": "click", "click": "search"}[t] for t in taken["original"]]
    assert taken["canonical"] == [f"function_0{pos[t] + 1}" for t in taken["original"]]
    swapped = named(ex, "swapped")[0]
    assert swapped.interface[0].description == ex.interface[0].description
    assert swapped.interface[0].name == "click"
    with pytest.raises(ValueError, match="no new name"):
        named(ex, "synonyms", renames={"synonyms": {"search": "find"}})


def test_check_eval_rejects_unknown_namings():
    check_eval(EvalConfig())
    with pytest.raises(ValueError, match="unknown"):
        check_eval(EvalConfig(namings=("canonical", "typo")))


class _Scripted:
    """A stand-in policy for live episodes: writes the expert's next action under the names it is shown."""

    def __init__(self, shop, task_id, rename, bad_name=None):
        self.rename, self.bad_name = rename, bad_name
        self.actions = [m.calls[0] for m in shop.expert(task_id)[0] if m.role == "assistant"]
        self.step = 0

    def __call__(self, prompt: str, max_new_tokens: int) -> str:
        call = self.actions[self.step]
        self.step += 1
        name = self.bad_name or self.rename.get(call.name, call.name)
        return f"Thought: go.\nAction: {name}[{call.arguments['argument']}]"


def test_live_episode_translates_renamed_actions_back_and_refuses_undeclared(tiny_tokenizer):
    shop = ToyShop(seed=0)
    policy = _Scripted(ToyShop(seed=0), 3, {"search": "find", "click": "press"})
    out = live_episode(policy, tiny_tokenizer, shop, 3, FMT, "synonyms")
    assert out == {"reward": 1.0, "steps": len(policy.actions), "end": "done"}
    policy = _Scripted(ToyShop(seed=0), 3, {}, bad_name="search")
    out = live_episode(policy, tiny_tokenizer, ToyShop(seed=0), 3, FMT, "synonyms")
    assert out["end"] == "undeclared" and out["reward"] == 0.0
    canon = _Scripted(ToyShop(seed=0), 5, {"search": "function_01", "click": "function_02"})
    summary = live_evaluate(canon, tiny_tokenizer, lambda: ToyShop(seed=0), [5], FMT, "canonical")
    assert summary["reward"] == 1.0 and summary["end/done"] == 1.0


def test_live_episode_with_a_real_tiny_model_ends_and_reports(tiny_tokenizer, tiny_model):
    out = live_episode(greedy_policy(tiny_model, tiny_tokenizer), tiny_tokenizer, ToyShop(seed=0), 0, FMT,
                       "canonical", max_steps=2,
                       max_new_tokens=6)
    assert out["end"] in ("unparsed", "undeclared", "max_steps", "done")
    assert out["reward"] in (0.0, 1.0, 0.25, 0.5, 0.75)


def test_webshop_adapter_says_how_to_install_it():
    with pytest.raises(WebShopMissing, match="princeton-nlp/WebShop"):
        WebShopEnv()
