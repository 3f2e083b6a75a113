"""Training by config: SFT warm start, GRPO (ToolRL recipe), multi-interface, masking, CIPR, distillation.

- `config`: TrainConfig, the run config, its per-algorithm sections, and the refusal of ignored options.
- `data`: DataConfig; prompts under original / canonical / masked names, paired with perturbed copies.
- `algo`: AlgoConfig and DistillConfig; the algorithms and their valid combinations.
- `rollout`: RolloutConfig; HF generate, vLLM colocate or server (never imported without it).
- `schedule`: TrainerConfig (steps, batches, optimizer, precision, saves), distributed and launcher.
- `sampler`: the paired sampler that keeps a prompt and its perturbed copy in one batch.
- `reward`: ToolRL's reward on decoded completions, and per-rollout facts for the metrics.
- `grpo`: the GRPOTrainer subclass hosting CIPR's consistency terms.
- `sft`: the SFTTrainer warm start; `supervised`: the supervised regime.
- `distill`: the self-distillation stage (its trainer and evaluation; the math is `cipr.distill`).
- `stage`: one stage run the same way for every algorithm (build, resume, train, save final/).
- `checkpoint`: tracked HF checkpoints, extra resume state, the non-finite loss guard.
- `metrics`: metrics.jsonl (and wandb) every step.
- `evaluate`: greedy held-out probe before and after the warm start.
- `replay`: replayed rollouts for tests and the step benchmark.
- `run`: the run orchestration (`cipr-train` in `cipr/cli/train.py`).
"""
