"""Your own `messages` + `tools` data end to end (issue 37 item 1) on the tiny offline model.

The shipped ten-row example (`tests/data/messages_example.jsonl`, twelve examples: one per assistant
turn) trains every algorithm one optimizer step through `cipr-train data=messages data.path=...` (the
SFT warm start, GRPO with the ToolRL reward, multi-interface, masking, CIPR, CIPR in the supervised
regime, and self-distillation on the rows as trajectories), and a trained model is evaluated by
`cipr-eval benchmark=messages benchmark.path=... perturbations=[held_out]` under every held-out type,
with accuracy records and the held-out consistency metric. The commands' own code runs in this
process (Hydra composes the same overrides the command line gives, then the entry's `_main` / `run`),
which spares an interpreter start per command.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.tiny_models import save_tiny

from cipr.data.messages import load_messages

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

EXAMPLE = Path(__file__).resolve().parent / "data" / "messages_example.jsonl"
IDS = {e.id for e in load_messages(EXAMPLE).examples}
ROW_IDS = {e.id for e in load_messages(EXAMPLE, unit="conversation").examples}
FAST = ["data=messages", f"data.path={EXAMPLE}", "data.eval_examples=2", "model=tiny", "trainer=smoke",
        "trainer.max_steps=1", "trainer.save_steps=1", "trainer.per_device_train_batch_size=4",
        "rollout.num_generations=2", "rollout.max_completion_length=16", "++trainer.torch_threads=1",
        "logging.progress_bar=false"]
"""The overrides of every training run: one step, two rollouts of 16 tokens, two held-out examples."""

# algo -> (stage, keys its step row must carry, paired: canonical + perturbed copy per example)
EXPECTED: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "sft": ("sft", ("mean_token_accuracy",), False),
    "grpo": ("grpo", ("reward", "reward/format", "reward/correctness", "rollout/no_call_rate"), False),
    "multi_interface": ("grpo", ("reward/canonical", "reward/perturbed", "rollout/twin_call_rate"), True),
    "masking": ("grpo", ("reward", "reward/format", "rollout/no_call_rate"), False),
    "cipr": ("grpo",
             ("reward/perturbed", "consistency/rescore/kl", "consistency/rollout/kl", "actions/p_no_call"),
             True),
    "cipr_sft": ("supervised", ("consistency/rescore/kl", "consistency/rescore/decisions"), True),
}


def lines(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / name).read_text().splitlines()]


def step_rows(run_dir: Path, stage: str) -> list[dict[str, Any]]:
    return [r for r in lines(run_dir, "metrics.jsonl") if r.get("stage") == stage and r.get("kind") == "step"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def train(tiny_dir, tmp_path_factory) -> Callable[[str], Path]:
    """`train(algo)`: the run folder of `cipr-train algo=<algo> <FAST>`, trained once per module."""
    from hydra import compose, initialize_config_dir

    from cipr.cli.train import CONFIG_DIR, _main

    root = tmp_path_factory.mktemp("runs")
    done: dict[str, Path] = {}

    def run(algo: str) -> Path:
        if algo not in done:
            overrides = [f"algo={algo}", *FAST, f"model.name_or_path={tiny_dir}",
                         f"trainer.run_dir={root / algo}",
                         f"trainer.warm_start.steps={1 if algo == 'cipr' else 0}"]
            if algo == "distill":  # no rollouts; the synonym / swap tables name WebShop's actions only
                overrides = [o for o in overrides if not o.startswith("rollout.")]
                overrides += ["algo.eval.namings=[original,canonical]",
                              "trainer.per_device_train_batch_size=2"]
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
                cfg = compose(config_name="train", overrides=overrides)
            assert _main(cfg) == 0, algo
            done[algo] = root / algo
        return done[algo]

    return run


@pytest.mark.parametrize("algo", list(EXPECTED))
def test_every_algorithm_trains_one_step_on_messages(train, algo):
    run_dir = train(algo)
    stage, keys, paired = EXPECTED[algo]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["data"]["source"] == "messages" and config["data"]["path"] == str(EXAMPLE)
    rows = step_rows(run_dir, stage)
    assert [r["step"] for r in rows] == [1]
    assert math.isfinite(rows[0]["loss"]) and math.isfinite(rows[0]["grad_norm"])
    assert set(keys) <= set(rows[0]), sorted(set(keys) - set(rows[0]))
    if algo not in ("cipr", "cipr_sft"):
        assert not any(k.startswith("consistency/") for k in rows[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    # twelve examples, two held out, none skipped; paired algorithms add each one's perturbed copy
    assert (summary["train_prompts"], summary["held_out_prompts"], summary["skipped_examples"]) == (
        20 if paired else 10, 2, {})
    assert summary["stages"][stage]["steps"] == 1 and \
        (run_dir / stage / "final" / "model.safetensors").is_file()
    if algo == "cipr":  # the SFT warm start ran first, on the same prompts
        assert [r["step"] for r in step_rows(run_dir, "warm_start")] == [1]
        assert summary["stages"]["warm_start"]["steps"] == 1
    if stage == "grpo":  # the step's rollouts answer prompts of the example file
        rollouts = lines(run_dir, "rollouts.jsonl")
        assert rollouts and {r["id"] for r in rollouts} <= IDS
        assert {r["side"] for r in rollouts} == ({"canonical", "perturbed"} if paired else {"single"})
        named = [n for r in rollouts for n in r["reference"]]
        if algo == "grpo":
            assert all(n in {t for e in load_messages(EXAMPLE).examples for t in e.interface.names}
                       for n in named)
        elif algo == "masking":
            assert all(re.fullmatch(r"[a-z][a-z0-9]{7}", n) for n in named)


def test_distill_trains_one_step_on_the_rows_as_trajectories(train):
    run_dir = train("distill")
    config = json.loads((run_dir / "config.json").read_text())
    # the model's: hermes
    assert (config["data"]["source"], config["data"]["call_format"]) == ("messages", None)
    rows = step_rows(run_dir, "distill")
    assert [r["step"] for r in rows] == [1]
    assert all(math.isfinite(rows[0][k])
               for k in ("loss", "distill/token_kl", "distill/action_kl", "consistency/rescore/kl"))
    assert rows[0]["distill/decisions"] > 0 and rows[0]["distill/tokens"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["train_trajectories"], summary["held_out_trajectories"],
            summary["skipped_trajectories"]) == (8, 2, {})
    assert summary["data"]["trajectories"] == len(ROW_IDS) == 10
    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    assert set(report["offline"]["student"]) == {"original", "canonical"}
    assert report["offline"]["teacher"]["canonical"]["decisions"] > 0


def test_cipr_eval_on_messages_under_every_held_out_type(train, tmp_path):
    """The CIPR run's policy, evaluated with accuracy records and then the consistency metric alone."""
    from hydra import compose, initialize_config_dir

    from cipr.cli.eval import CONFIG_DIR, run
    from cipr.perturb import HELD_OUT, ORDERED_TYPES

    model = train("cipr") / "grpo" / "final"
    common = [f"model={model}", "benchmark=messages", f"benchmark.path={EXAMPLE}", "perturbations=[held_out]",
              "limit=3", "names=[original,canonical]", "max_new_tokens=4", "progress=false", "device=cpu",
              "threads=1"]
    outs = {"accuracy": tmp_path / "accuracy", "consistency": tmp_path / "consistency"}
    for kind, extra in (("accuracy", []), ("consistency", ["generate=false", "consistency.enabled=true"])):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose(config_name="eval", overrides=[*common, *extra, f"out_dir={outs[kind]}"])
        run(cfg)
        meta = json.loads((outs[kind] / "run.json").read_text())
        assert meta["build"]["skipped"] == {}  # every type applies to the first three examples
    first = {e.id for e in load_messages(EXAMPLE).examples[:3]}  # limit=3: the file's first three examples
    for kind, name in (("accuracy", "results.jsonl"), ("consistency", "consistency.jsonl")):
        records = lines(outs[kind], name)
        for names in ("original", "canonical"):
            assert {r["perturbation"] for r in records if r["names"] == names} == set(HELD_OUT), (kind, names)
        assert {r["id"] for r in records} == first
        costly_first = {r["perturbation"] for r in records if r["order"] == "costly_first"}
        assert costly_first == set(ORDERED_TYPES)  # both tool orders under canonical names
        assert all(r["names"] == "canonical" for r in records if r["order"] == "costly_first")
    accuracy = lines(outs["accuracy"], "results.jsonl")
    assert all(isinstance(r["correct"], bool) and isinstance(r["raw"], str) for r in accuracy)
    consistency = lines(outs["consistency"], "consistency.jsonl")
    assert all(r["decisions"] > 0 and math.isfinite(r["kl"]) for r in consistency)
    summary = json.loads((outs["consistency"] / "summary.json").read_text())
    assert set(summary["consistency"]["names"]) == {"original", "canonical"}
