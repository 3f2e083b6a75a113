"""One process of the `distributed` tier's launches (tests/test_sharded.py), started by `accelerate launch`.

    python -m accelerate.commands.launch --config_file configs/accelerate/ddp.yaml --num_processes 2 \
        tests/sharded_worker.py PLAN_JSON

PLAN_JSON: {"shim": bool, "runs": [{"name": ..., "config": {cipr-train config}, "replay": bool}, ...]}. With
`shim`, the test-only CPU sharding shim is installed first (tests/support/cpu_sharding.py says why). A run
with `replay` draws its GRPO rollouts from `replay_rollouts("per_prompt")` (a random tiny model writes
no call; per prompt, so that one process and two draw the same completions); a run with `episodes`
(rollout.mode=multi_turn) draws each assistant turn from ToyShop's expert script
(tests/support/episode_replay.py, per context likewise), after the model's own generation of a few tokens
for the same contexts (dropped), so the rounds' collectives run as in training. A run with
`die_after_step: N` is killed (SIGKILL, every rank) right after its step-N checkpoint is saved. Each run is
`cipr.train.run.run` (algo=distill included) in this process group, one after another, so one launch pays
the interpreter and process-group start-up once for every algorithm. Each process records what it ran as
`<run_dir>/ran_rank<R>.json` (the accelerator's strategy and group size as the stages built them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def read_under(plan: dict) -> None:
    """The action reader on a model prepared by accelerate under `plan["strategy"]` (the shim's FSDP2 or
    ZeRO-3): the same queries on every process, loss = -Σ log p(reference class); writes the distributions and
    every parameter's full gradient (`reader_rank<R>.pt`)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.formats import get_format
    from cipr.method.actions import ActionReaderConfig, read_actions
    from cipr.perturb.config import PerturbConfig
    from cipr.train.data import DataConfig, build_prompts, load_examples
    from cipr.train.supervised import canonical_queries, reference_classes

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(plan["model"])
    model = AutoModelForCausalLM.from_pretrained(plan["model"], dtype=torch.float32)
    fmt = get_format("compact")
    data = DataConfig(source="synthetic", n=8, seed=0, eval_examples=0, tools_per_example=(2, 2))
    records = build_prompts(load_examples(data), data, PerturbConfig(names="canonical", paired=True), fmt=fmt,
                            tokenizer=tokenizer).records[:4]
    queries = canonical_queries(records, fmt, tokenizer.eos_token)
    num_actions = max(r.num_actions for r in records)
    strategy = plan["strategy"]
    if strategy == "fsdp":
        accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
            state_dict_type="FULL_STATE_DICT"))
    elif strategy == "zero3":
        accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
            "zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1, "zero_allow_untested_optimizer": True}))
    else:
        accelerator = Accelerator(cpu=True)
    names = [n for n, _ in model.named_parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    reading = read_actions(model, tokenizer, queries, num_actions, ActionReaderConfig())
    targets = torch.tensor([c for q in queries for c in reference_classes(q, num_actions)])
    scored = targets >= 0
    loss = -reading.probs[scored].gather(1, targets[scored][:, None]).clamp_min(1e-30).log().sum()
    accelerator.backward(loss)
    grads = {}
    if strategy == "zero3":
        from deepspeed.utils import safe_get_full_grad

        for name, param in model.module.named_parameters():
            grads[name] = safe_get_full_grad(param).detach().clone()
    else:
        for name, param in model.named_parameters():
            grad = param.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    assert sorted(grads) == sorted(names), (sorted(grads)[:3], sorted(names)[:3])
    rank = int(os.environ.get("RANK", "0"))
    torch.save({"probs": reading.probs.detach(), "grads": grads, "wrapped": type(model).__name__},
               Path(plan["out"]) / f"reader_{strategy}_rank{rank}.pt")


def main() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    plan = json.loads(Path(sys.argv[1]).read_text())
    if plan.get("shim"):
        from support.cpu_sharding import install

        install()
    from cipr.ops.launch import leave_process_group

    if "reader" in plan:
        read_under(plan["reader"])
        leave_process_group()
        return
    from cipr.train import stage as stage_module
    from cipr.train.strategy import built_strategy

    rank = int(os.environ.get("RANK", "0"))
    built: list[dict] = []
    check = stage_module.check_strategy

    def recording_check(accelerator, strategy, env=None):
        name, world = built_strategy(accelerator)
        built.append({"strategy": name, "processes": world})
        return check(accelerator, strategy, env)

    stage_module.check_strategy = recording_check
    from support.episode_replay import EpisodeReplay, expert_choice

    from cipr.train.grpo import CIPRGRPOTrainer
    from cipr.train.replay import replay_rollouts

    def episode_turns(trainer):
        replay = EpisodeReplay(trainer.episodes, expert_choice(trainer.episodes))

        def generate(prompt_ids):
            # the model generates too (4 tokens, dropped): ZeRO-3's generation needs every process each call
            config, saved = trainer.generation_config, trainer.generation_config.max_new_tokens
            config.max_new_tokens = 4
            try:
                super(CIPRGRPOTrainer, trainer)._generate_single_turn(prompt_ids, None, {}, 1)
            finally:
                config.max_new_tokens = saved
            return replay.generate(prompt_ids, step=trainer.state.global_step)

        return generate

    from cipr.train import checkpoint

    save_checkpoint = checkpoint.CheckpointMixin._save_checkpoint

    def save_then_die(self, model, trial):
        """A job killed right after a save: every rank, by SIGKILL, once all have saved."""
        save_checkpoint(self, model, trial)
        if self.state.global_step == die_after:
            self.accelerator.wait_for_everyone()
            os.kill(os.getpid(), signal.SIGKILL)

    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    from cipr.train.run import config_from_dict, run

    for item in plan["runs"]:
        built.clear()
        # a finished run's ZeRO-3 config would make the next from_pretrained partition
        unset_hf_deepspeed_config()
        die_after = item.get("die_after_step")
        checkpoint.CheckpointMixin._save_checkpoint = save_then_die if die_after else save_checkpoint
        source = episode_turns if item.get("episodes") else \
            replay_rollouts("per_prompt") if item.get("replay") else None
        run_dir = Path(run(config_from_dict(item["config"]), rollout_source=source))
        (run_dir / f"ran_rank{rank}.json").write_text(json.dumps(built))
    leave_process_group()


if __name__ == "__main__":
    main()
