"""Training end to end on the tiny offline model: every algorithm, pairing, consistency, resume, NaN stop.

Rollouts come from `cipr.train.replay` (reference calls, twin/wrong calls, no-call answers, off-format
text; `replay_run`) where a test needs decisions in the rollouts: a random 2-layer model never emits a call.
Prompts use the compact Hermes format so the tiny byte-level tokenizer keeps them short.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from cipr.core.config import from_dict
from cipr.train.checkpoint import NonFiniteLossError, latest_complete
from cipr.train.grpo import CIPRGRPOTrainer
from cipr.train.replay import replay_rollouts
from cipr.train.run import TrainConfig, run

ALGOS: dict[str, dict[str, Any]] = {
    "sft": {"name": "sft"},
    "grpo": {"name": "grpo"},
    "multi_interface": {"name": "multi_interface"},
    "masking": {"name": "masking"},
    "cipr": {"name": "cipr", "terms": {"rescore": {"weight": 0.5}, "rollout": {"weight": 0.5}}},
}
G = 2
SFT_STEPS = 24


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from support.tiny_models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def sft_run(tiny_dir, tmp_path_factory):
    """algo=sft on the tiny model; its final weights put some mass on opening a call (a random model puts
    ~1e-17), so the action distributions the CIPR tests read are not all on ∅."""
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    cfg = make_config(tiny_dir, run_dir, "sft", max_steps=SFT_STEPS, learning_rate=1e-2,
                      per_device_train_batch_size=2, save_steps=SFT_STEPS)
    return run(cfg)


@pytest.fixture(scope="module")
def warm_dir(sft_run):
    return sft_run / "sft" / "final"


def make_config(tiny_dir: Path, run_dir: Path, algo: str = "cipr", **trainer: Any) -> TrainConfig:
    t = {"run_dir": str(run_dir), "max_steps": 2, "per_device_train_batch_size": 2 * G,
         "learning_rate": 1e-3, "save_steps": 1, "seed": 0, "warm_start": {"steps": 0}}
    t.update(trainer)
    return from_dict(TrainConfig, {
        "model": {"name_or_path": str(tiny_dir), "gguf_package": None, "gguf_file": None,
                  "short_name": "tiny", "call_format": "hermes"},
        "data": {"source": "synthetic", "n": 12, "eval_examples": 2, "tools_per_example": [1, 2], "seed": 0},
        "algo": ALGOS[algo],
        "rollout": {"num_generations": G, "max_completion_length": 96},
        "trainer": t,
        "logging": {"progress_bar": False},
    })


def replay_run(cfg: TrainConfig) -> Path:
    """`run` with GRPO's rollouts replayed (`cipr.train.replay.replay_rollouts`)."""
    return run(cfg, rollout_source=replay_rollouts())


@pytest.fixture
def replayed(monkeypatch):
    """The per-step batches every GRPO trainer's loss sees (rows' pair and side)."""
    seen: list[list[tuple[int, str]]] = []
    original = CIPRGRPOTrainer.compute_loss

    def compute_loss(self, model, inputs, *args, **kwargs):
        seen.append([(row.record.pair_id, row.record.side) for row in inputs["cipr_rows"]])
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(CIPRGRPOTrainer, "compute_loss", compute_loss)
    return seen


def steps(run_dir: Path, stage: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("stage") == stage and r.get("kind") == "step"]


def test_sft_trains_and_saves(sft_run):
    lines = steps(sft_run, "sft")
    assert [r["step"] for r in lines] == list(range(1, SFT_STEPS + 1))
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in lines)
    assert lines[-1]["loss"] < lines[0]["loss"]
    assert latest_complete(sft_run / "sft").name == f"checkpoint-{SFT_STEPS}"
    assert (sft_run / "sft" / "final" / "model.safetensors").is_file()
    assert json.loads((sft_run / "summary.json").read_text())["final"]["sft"]["step"] == SFT_STEPS


@pytest.mark.parametrize("algo", ["grpo", "multi_interface", "masking", "cipr"])
@pytest.mark.integration
def test_two_optimizer_steps_of_every_grpo_algorithm(warm_dir, tmp_path, replayed, algo):
    accumulation = 2 if algo == "cipr" else 1
    run_dir = replay_run(make_config(warm_dir, tmp_path / algo, algo,
                                     gradient_accumulation_steps=accumulation))
    stage = "grpo"
    lines = steps(run_dir, stage)
    assert [r["step"] for r in lines] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in lines)
    assert any(r["grad_norm"] > 0 for r in lines)  # a group whose rollouts tie has no advantage
    assert latest_complete(run_dir / stage).name == "checkpoint-2"
    assert (run_dir / stage / "checkpoint-2" / "model.safetensors").is_file()
    assert (run_dir / stage / "stage.json").is_file() and (run_dir / "config.yaml").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == algo and summary["final"][stage]["step"] == 2
    assert all("reward" in r and "reward/format" in r and "rollout/no_call_rate" in r for r in lines)
    timed = ("generate_and_score", "loss_forward", "backward") + (("action_read", "task_loss", "rescore_read")
                                                                   if algo == "cipr" else ())
    for r in lines:  # the step's time breakdown: parts of the step, so none exceeds it
        assert all(0 <= r[f"time/{k}"] <= r["speed/step_seconds"] for k in timed), r
        assert r["time/generate_and_score"] + r["time/loss_forward"] + r["time/backward"] <= \
            r["speed/step_seconds"]
    samples = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    rows = 2 * G * accumulation  # the generation batch: accumulation micro-batches of 2G rows
    assert [s["step"] for s in samples] == [1] * rows + [2] * rows
    for step, record in ((1, lines[0]), (2, lines[1])):  # the logged samples are the step's rollouts
        mine = [s for s in samples if s["step"] == step]
        assert mine and all(s["stage"] == "grpo" and isinstance(s["completion"], str) for s in mine)
        assert sum(s["format"] + s["correctness"] for s in mine) / len(mine) == \
            pytest.approx(record["reward"])
    if algo in ("multi_interface", "cipr"):  # paired by default
        assert all("reward/perturbed" in r and "rollout/twin_call_rate" in r for r in lines)
    if algo == "cipr":
        for r in lines:  # interfaces differ (twins, new ids, new order): both terms are positive
            assert r["consistency/rescore/kl"] > 0 and r["consistency/rollout/kl"] > 0
            assert r["actions/entropy"] > 0 and 0 < r["actions/p_no_call"] < 1
        # pairs never split: two micro-batches per step (gradient accumulation 2), where TRL's row
        # shuffle would separate a canonical group from its perturbed copy's group
        assert len(replayed) == 4
        assert len({p for batch in replayed[:2] for p, _ in batch}) == 2
        for batch in replayed:
            assert len(batch) == 2 * G
            pairs = {p for p, _ in batch}
            assert len(pairs) == 1
            assert sorted(s for _, s in batch) == ["canonical"] * G + ["perturbed"] * G
    else:
        assert not any(k.startswith("consistency/") for r in lines for k in r)


def test_folded_read_gives_trl_loss_at_a_sampling_temperature_below_one(warm_dir, tmp_path, replayed):
    """Folding the action read into the task forward changes no number, also at temperature 0.7 (TRL
    scores tokens at the sampling temperature; the folded read returns them at that temperature)."""
    first = {}
    for fold in (True, False):
        cfg = make_config(warm_dir, tmp_path / f"fold_{fold}", "cipr", max_steps=1)
        cfg.algo.fold_action_read = fold
        cfg.rollout.temperature = 0.7
        first[fold] = steps(replay_run(cfg), "grpo")[0]
    assert first[True]["actions/folded"] > 0 and first[False]["actions/folded"] == 0
    for key in ("loss", "grad_norm", "consistency/rescore/kl", "consistency/rollout/kl", "task"):
        assert first[True][key] == pytest.approx(first[False][key], rel=1e-4, abs=1e-6), key


def comparable(record: dict[str, Any]) -> dict[str, float]:
    skip = ("time", "speed/", "memory/", "step_time", "epoch")
    return {k: v for k, v in record.items() if isinstance(v, float) and not k.startswith(skip)}


class Kill(Exception):
    pass


def run_killed_after_step_1(cfg, monkeypatch) -> None:
    """Run `cfg` until the GRPO stage has saved its step-1 checkpoint, then kill it there (an exception out of
    the save, as a SIGKILL right after it would leave the folder); the save is restored afterwards."""
    from cipr.train import checkpoint

    original = checkpoint.CheckpointMixin._save_checkpoint

    def save_then_die(self, model, trial):
        original(self, model, trial)
        if isinstance(self, CIPRGRPOTrainer) and self.state.global_step == 1:
            raise Kill("killed after step 1")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint.CheckpointMixin, "_save_checkpoint", save_then_die)
        with pytest.raises(Kill):
            replay_run(cfg)


@pytest.mark.integration
def test_resume_after_kill_reproduces_the_uninterrupted_run(warm_dir, tmp_path, replayed, monkeypatch):
    full = replay_run(make_config(warm_dir, tmp_path / "full", "cipr", max_steps=3, warm_start={"steps": 1},
                                  gradient_accumulation_steps=2))
    reference = {r["step"]: comparable(r) for r in steps(full, "grpo")}

    cut = tmp_path / "cut"
    cfg = make_config(warm_dir, cut, "cipr", max_steps=3, warm_start={"steps": 1},
                      gradient_accumulation_steps=2)
    run_killed_after_step_1(cfg, monkeypatch)
    assert latest_complete(cut / "grpo").name == "checkpoint-1"
    replay_run(cfg)
    resumed = {r["step"]: comparable(r) for r in steps(cut, "grpo")}
    assert sorted(resumed) == [1, 2, 3]
    for step in (2, 3):
        assert resumed[step].keys() == reference[step].keys()
        for key, value in reference[step].items():
            assert resumed[step][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)
    assert len(steps(cut, "warm_start")) == 1  # the finished warm start was not rerun
    assert (cut / "rollouts.jsonl").read_text() == (full / "rollouts.jsonl").read_text()


@pytest.mark.integration
def test_frozen_layers_are_left_out_of_checkpoints_and_resume_from_them_is_exact(warm_dir, tmp_path, replayed,
                                                                                  monkeypatch):
    """With the bottom layer frozen, step folders and final/ hold the trainable tensors only; a run killed
    after a step and resumed from that folder ends with the uninterrupted run's weights."""
    from safetensors.torch import load_file

    from cipr.runtime.model import load_model
    from cipr.train import checkpoint

    def config(run_dir):
        cfg = make_config(warm_dir, run_dir, "cipr", max_steps=3, warm_start={"steps": 1},
                          gradient_accumulation_steps=2)
        cfg.model.freeze_bottom_layers = 1
        return cfg

    full = replay_run(config(tmp_path / "full"))
    base, _ = load_model(config(full).model)
    trainable = {n for n, p in base.named_parameters() if p.requires_grad}
    frozen = {n for n, p in base.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert trainable and frozen and \
        all(n.startswith("model.layers.1.") or n == "model.norm.weight" for n in trainable)

    cut = tmp_path / "cut"
    run_killed_after_step_1(config(cut), monkeypatch)
    step = latest_complete(cut / "grpo")
    assert step.name == "checkpoint-1"
    for folder in (step, cut / "warm_start" / "final"):  # what a resume and the GRPO stage load
        assert set(load_file(folder / "model.safetensors")) == trainable, folder
        assert set(json.loads((folder / "cipr_frozen.json").read_text())["omitted"]) == frozen, folder
    assert (step / "optimizer.pt").is_file()
    replay_run(config(cut))

    assert [r["step"] for r in steps(cut, "grpo")] == [1, 2, 3]
    for name in ("checkpoint-3/model.safetensors", "final/model.safetensors"):
        resumed, reference = load_file(cut / "grpo" / name), load_file(full / "grpo" / name)
        assert set(resumed) == set(reference) == trainable, name
        for key, tensor in reference.items():
            assert torch.equal(resumed[key], tensor), (name, key)
    # the full model: the base's frozen tensors under the trained ones, and training moved the trained ones
    trained, _ = checkpoint.load_trained(config(cut).model, cut / "grpo" / "final")
    weights, start = trained.state_dict(), base.state_dict()
    assert all(torch.equal(weights[n], start[n]) for n in frozen)
    assert any(not torch.equal(weights[n], start[n]) for n in trainable)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(warm_dir, tmp_path, replayed, monkeypatch):
    original = CIPRGRPOTrainer._consistency

    def poisoned(self, *args, **kwargs):
        total, parts = original(self, *args, **kwargs)
        if self.state.global_step == 1:
            return total * float("nan"), parts
        return total, parts

    monkeypatch.setattr(CIPRGRPOTrainer, "_consistency", poisoned)
    run_dir = tmp_path / "nan"
    with pytest.raises(NonFiniteLossError, match="optimizer step 2"):
        replay_run(make_config(warm_dir, run_dir, "cipr", max_steps=3))
    good = latest_complete(run_dir / "grpo")
    assert good.name == "checkpoint-1"
    from safetensors.torch import load_file

    weights = load_file(good / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert not (run_dir / "grpo" / "stage.json").exists()


def test_lora_adapter_trains_saves_and_feeds_the_next_stage(warm_dir, tmp_path, replayed):
    cfg = make_config(warm_dir, tmp_path / "lora", "cipr", warm_start={"steps": 1})
    cfg.model.lora.enabled = True
    cfg.model.lora.target_modules = ("q_proj", "v_proj")
    run_dir = replay_run(cfg)
    assert (run_dir / "warm_start" / "final" / "adapter_config.json").is_file()
    assert (run_dir / "grpo" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    lines = steps(run_dir, "grpo")
    assert [r["step"] for r in lines] == [1, 2] and all(math.isfinite(r["loss"]) for r in lines)
    assert all(r["consistency/rollout/kl"] >= 0 for r in lines)


def test_resume_truncation_drops_metrics_and_samples_past_the_checkpoint(tmp_path):
    from cipr.train.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        writer.write({"stage": "grpo", "kind": "step", "step": step})
        writer.write_samples("grpo", step, [{"completion": f"c{step}a"}, {"completion": f"c{step}b"}])
    writer.write({"stage": "warm_start", "kind": "step", "step": 5})
    assert writer.truncate_after("grpo", 1) == 2 + 4
    assert [(r["stage"], r["step"]) for r in writer.read()] == [("grpo", 1), ("warm_start", 5)]
    samples = [json.loads(x) for x in writer.samples_path.read_text().splitlines()]
    assert [s["completion"] for s in samples] == ["c1a", "c1b"]


def test_wandb_offline_mirrors_metrics_and_a_resumed_writer_continues_the_same_run(tmp_path, monkeypatch):
    from cipr.train.metrics import MetricsWriter, WandbOptions

    monkeypatch.setenv("WANDB_SILENT", "true")
    options = WandbOptions(mode="offline", project="cipr-test")
    ids = []
    for step in (1, 2):  # the second writer is what a resumed run opens
        writer = MetricsWriter(tmp_path, options, config={"algo": "cipr"})
        ids.append(writer._wandb.id)
        writer.write({"stage": "grpo", "kind": "step", "step": step, "loss": 0.5})
        writer.close()
    assert ids[0] == ids[1]
    # one folder a writer: offline-run-<second>-<id>, and -<id>-1 when both started in the same second
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{ids[0]}*"))
    assert len(runs) == 2 and all((r / f"run-{ids[0]}.wandb").stat().st_size > 0 for r in runs)
    assert [r["step"] for r in MetricsWriter(tmp_path).read()] == [1, 2]
