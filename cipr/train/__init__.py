"""Training: SFT warm start, GRPO (ToolRL recipe), multi-interface, function masking and CIPR, by config.

One module per concept:
- `config`: strict dict -> dataclass conversion (unknown keys and bad values fail before any work).
- `model`: ModelConfig; hub id / local folder / GGUF in an installed package; tokenizer eos, pad, side.
- `data`: DataConfig; prompts under original / canonical / masked names, paired with perturbed copies.
- `algo`: AlgoConfig; the five algorithms and their valid combinations.
- `rollout`: RolloutConfig; HF generate, vLLM colocate or server (never imported without it).
- `schedule`: TrainerConfig (steps, batches, optimizer, precision, saves), distributed and launcher.
- `sampler`: the paired sampler that keeps a prompt and its perturbed copy in one batch.
- `reward`: ToolRL's reward on decoded completions, and per-rollout facts for the metrics.
- `grpo`: the GRPOTrainer subclass hosting CIPR's consistency terms.
- `sft`: the SFTTrainer warm start.
- `checkpoint`: tracked HF checkpoints, extra resume state, the non-finite loss guard.
- `metrics`: metrics.jsonl (and wandb) every step.
- `evaluate`: greedy held-out probe before and after the warm start.
- `replay`: replayed rollouts for tests and the step benchmark.
- `run`: TrainConfig and the run orchestration (`cipr-train` in `cipr/cli/train.py`).
"""
