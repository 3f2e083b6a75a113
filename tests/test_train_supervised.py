"""The supervised regime (algo.regime=supervised) on the tiny offline model: SFT with each algorithm's rows,
pairs kept whole, CIPR's rescoring term, and CIPR at λ = 0 equal to multi-interface in both regimes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from cipr.core.config import ConfigError, from_dict
from cipr.formats import get_format
from cipr.method.actions import read_actions
from cipr.method.objective import Objective
from cipr.method.pairing import Response, build_rescore, rows_by_response
from cipr.method.relabel import RelabelConfig, Relabeling
from cipr.perturb.config import PerturbConfig
from cipr.train.data import build_prompts, load_examples
from cipr.train.run import TrainConfig, run, validate
from cipr.train.supervised import SupervisedTrainer, canonical_queries

ALGOS: dict[str, dict[str, Any]] = {
    "sft": {"name": "sft"},
    "grpo": {"name": "grpo"},
    "multi_interface": {"name": "multi_interface"},
    "cipr": {"name": "cipr", "terms": {"rescore": {"weight": 1.0}, "rollout": {"weight": 0.0}}},
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny model after 24 SFT steps: it puts mass on opening a call (a random one puts ~1e-17 there, and
    every action distribution is then ∅ on both sides, so the rescoring KL would be 0 whatever the code)."""
    from support.tiny_models import save_tiny

    base = save_tiny(tmp_path_factory.mktemp("tiny") / "model")
    cfg = config(base, tmp_path_factory.mktemp("sft") / "run", "sft")
    cfg.trainer.max_steps = cfg.trainer.save_steps = 24
    cfg.trainer.learning_rate = 1e-2
    cfg.trainer.per_device_train_batch_size = 2
    return run(cfg) / "sft" / "final"


def config(tiny_dir: Path, run_dir: Path, algo: str, regime: str = "supervised",
           **algo_changes: Any) -> TrainConfig:
    return from_dict(TrainConfig, {
        "model": {"name_or_path": str(tiny_dir), "gguf_package": None, "gguf_file": None,
                  "short_name": "tiny", "call_format": "compact"},
        "data": {"source": "synthetic", "n": 14, "eval_examples": 2, "tools_per_example": [2, 3], "seed": 0,
                 "parallel_fraction": 0.0, "no_call_fraction": 0.0, "same_domain_distractors": 0.0},
        "algo": {**ALGOS[algo], "regime": regime, **algo_changes},
        "rollout": {"num_generations": 2, "max_completion_length": 64},
        "trainer": {"run_dir": str(run_dir), "max_steps": 2,
                    "per_device_train_batch_size": 2 if regime != "rl" else 4,
                    "gradient_accumulation_steps": 1, "learning_rate": 1e-3, "save_steps": 2, "seed": 0,
                    "gradient_checkpointing": False, "warm_start": {"steps": 0, "eval_examples": 0}},
        "logging": {"progress_bar": False},
    })


def weights(rescore: float, rollout: float) -> dict[str, dict[str, float]]:
    """CIPR's two terms at these weights (`algo.terms`)."""
    return {"rescore": {"weight": rescore}, "rollout": {"weight": rollout}}


def final_weights(run_dir: Path, stage: str) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / stage / "final" / "model.safetensors"))


def steps(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("kind") == "step"]


def test_supervised_regime_refuses_a_rollout_term(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"algo.terms.rollout.*no rollout-kind term: set its weight to nul"):
        validate(config(tiny_dir, tmp_path / "r", "cipr", terms=weights(1.0, 0.1)))


@pytest.mark.parametrize("algo", ["grpo", "multi_interface", "cipr"])
def test_every_algorithm_takes_two_supervised_steps(tiny_dir, tmp_path, algo):
    run_dir = run(config(tiny_dir, tmp_path / algo, algo))
    lines = steps(run_dir)
    assert [(r["stage"], r["step"]) for r in lines] == [("supervised", 1), ("supervised", 2)]
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 for r in lines)
    if algo == "cipr":
        assert all(r["consistency/rescore/kl"] > 0 and r["consistency/relabel_failures"] == 0 for r in lines)
        assert all(r["consistency/rescore/responses"] == 2 for r in lines)  # the canonical half of 2 pairs
    else:
        assert not any(k.startswith("consistency/") for r in lines for k in r)


def test_pairs_stay_whole_in_every_batch(tiny_dir, tmp_path, monkeypatch):
    seen: list[list[int]] = []
    original = SupervisedTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        seen.append([r.row for r in inputs["cipr_records"]])
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SupervisedTrainer, "compute_loss", spy)
    run(config(tiny_dir, tmp_path / "mi", "multi_interface"))
    assert len(seen) == 2 and all(len(rows) == 4 for rows in seen)
    for rows in seen:  # rows 2k (canonical) and 2k + 1 (its perturbed copy) arrive together
        assert sorted(rows) == sorted(r ^ 1 for r in rows)
        assert all(rows[i] % 2 == 0 and rows[i + 1] == rows[i] + 1 for i in range(0, len(rows), 2))


@pytest.mark.parametrize(("regime", "fold"), [("supervised", False), ("rl", False), ("rl", True)])
@pytest.mark.integration
def test_cipr_with_zero_weights_trains_like_multi_interface(tiny_dir, tmp_path, regime, fold):
    """Bit for bit, except GRPO's folded read: there the task loss's token log-probabilities come from the
    action reader's forward (other padding, so float32 rounding differs). Then loss and gradient norm agree to
    1e-4 and the weights to a tenth of the distance they moved (Adam turns rounding in a near-zero gradient
    component into a step of up to the learning rate, so bit equality cannot hold)."""
    from cipr.train.replay import replay_rollouts

    # GRPO's rollouts from the replayed references (a random tiny model writes no call)
    source = replay_rollouts() if regime == "rl" else None
    stage = "supervised" if regime == "supervised" else "grpo"
    mi = run(config(tiny_dir, tmp_path / "mi", "multi_interface", regime), rollout_source=source)
    zero = run(config(tiny_dir, tmp_path / "zero", "cipr", regime, terms=weights(0.0, 0.0),
                      fold_action_read=fold), rollout_source=source)
    a, b = final_weights(mi, stage), final_weights(zero, stage)
    assert a.keys() == b.keys()
    lines = steps(zero)  # the zero-weight run did read the action distributions
    assert all(any(k.startswith(("consistency/", "actions/")) for k in r) for r in lines)
    if fold:
        moved = max((a[k] - final_weights(tiny_dir.parent.parent, "sft")[k]).abs().max().item() for k in a)
        worst = max((a[k] - b[k]).abs().max().item() for k in a)
        assert worst <= 0.1 * moved, (worst, moved)
        for x, y in zip(steps(mi), lines, strict=True):
            assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-7)
            assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    else:
        for k in a:
            assert torch.equal(a[k], b[k]), k
    weighted = run(config(tiny_dir, tmp_path / "one", "cipr", regime, fold_action_read=fold,
                          terms=weights(1.0, 0.0 if regime == "supervised" else 1.0)), rollout_source=source)
    c = final_weights(weighted, stage)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # and a weight > 0 changes the update


def test_rescoring_term_gradient_reaches_the_model_through_the_relabeled_side_only(tiny_dir):
    """The regime's rescoring pairs as `SupervisedTrainer._rescore` builds them: the canonical rows read
    without gradient, their relabeled copies read by the engine's reader (`cipr.method.pairing`)."""
    from cipr.runtime.model import ModelConfig, load_model

    cfg = config(tiny_dir, Path("unused"), "cipr")
    model, tokenizer = load_model(ModelConfig(name_or_path=str(tiny_dir), gguf_package=None, gguf_file=None,
                                              call_format="compact"))
    fmt = get_format("compact")
    prompts = build_prompts(load_examples(cfg.data), cfg.data, PerturbConfig(names="canonical", paired=True),
                            fmt=fmt, tokenizer=tokenizer)
    canonical = [r for r in prompts.records if r.side == "canonical"][:3]
    relabeling = Relabeling(RelabelConfig(), 1)

    def rescoring() -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            table = read_actions(model, tokenizer, canonical_queries(canonical, fmt), 3)
        rows = rows_by_response(table.sequence.tolist(), len(canonical))
        view = [Response(r.example.id, r.pair_id, r.side, 0, r.prompt, r.target, r.tools, r.classes, rows[b])
                for b, r in enumerate(canonical)]
        pairs, counts = build_rescore(view, table.probs, lambda q: read_actions(model, tokenizer, q, 3).probs,
                                      fmt, relabeling, step=0)
        value, metrics = Objective.builtin(rescore=1.0)(pairs.p_other, rescore=pairs)
        return value, {**counts, **metrics}

    value, metrics = rescoring()
    assert value.dtype == torch.float64 and value.item() > 0
    assert metrics["consistency/rescore/responses"] == 3 and metrics["consistency/relabel_failures"] == 0
    value.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad()
    same, _ = rescoring()
    assert same.item() == pytest.approx(value.item(), rel=1e-9)  # seeded: the same relabeling again


def test_action_nll_by_hand_and_loop():
    from cipr.train.supervised import action_nll

    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.7, 0.1], [0.6, 0.2, 0.2]],
                         dtype=torch.float64)
    targets = torch.tensor([0, -1, 1, 2])  # the second decision (an end of turn after a call) is not scored
    segments = torch.tensor([0, 0, 1, 1])
    value, m = action_nll(probs, targets, segments)
    by_hand = (-math.log(0.5) + (-math.log(0.7) - math.log(0.2)) / 2) / 2
    assert value.item() == pytest.approx(by_hand) and m["action/scored"] == 3
    assert m["action/accuracy"] == pytest.approx(2 / 3)  # 0 = 0, 1 = 1, 0 ≠ 2
    loop = []
    for s in (0, 1):
        rows = [-math.log(probs[d, targets[d]].item())
                for d in range(4) if segments[d] == s and targets[d] >= 0]
        loop.append(sum(rows) / len(rows))
    assert value.item() == pytest.approx(sum(loop) / len(loop))
    zero, _ = action_nll(probs.requires_grad_(), torch.full((4,), -1), segments)
    assert zero.item() == 0.0 and zero.requires_grad
    with pytest.raises(ValueError, match="expected probs"):
        action_nll(probs, targets[:3], segments)


@pytest.mark.parametrize("algo", ["multi_interface", "cipr"])
def test_action_supervision_trains_from_one_reader_forward(tiny_dir, tmp_path, algo):
    cfg = config(tiny_dir, tmp_path / algo, algo, action_weight=1.0)
    lines = steps(run(cfg))
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        assert r["action/scored"] == 4 and 0 <= r["action/accuracy"] <= 1  # one call in each of 4 rows
        assert r["loss"] == pytest.approx(r["token_loss"] + r["action/nll"], rel=1e-4)
        assert ("consistency/rescore/kl" in r) == (algo == "cipr")


def test_a_supervised_run_after_its_own_warm_start_keeps_both_stages_metrics(tiny_dir, tmp_path):
    """The supervised stage resuming its metrics after a warm start in the same folder (a KeyError once: the
    stage order lacked `supervised`)."""
    cfg = config(tiny_dir, tmp_path / "run", "cipr")
    cfg.trainer.warm_start.steps = 1
    run_dir = run(cfg)
    stages = {r["stage"] for r in steps(run_dir)}
    assert stages == {"warm_start", "supervised"}
    from cipr.core.run_folder import truncate_metrics
    from cipr.train.metrics import STAGES

    assert truncate_metrics([run_dir / "metrics.jsonl"], "warm_start", 1, STAGES) > 0  # later stage dropped
    assert {r["stage"] for r in steps(run_dir)} == {"warm_start"}
