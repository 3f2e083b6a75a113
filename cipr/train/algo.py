"""The five training algorithms, selected by `algo=`; every one runs from the same code by config.

| algo              | names     | perturbed copies | task loss                  | consistency terms     |
|-------------------|-----------|------------------|----------------------------|-----------------------|
| `sft`             | canonical or original | no   | SFT (warm start alone)     | none                  |
| `grpo`            | original  | no               | GRPO, ToolRL recipe        | none (ToolRL baseline)|
| `multi_interface` | canonical | yes (paired)     | GRPO on both interfaces    | none                  |
| `masking`         | masked    | no               | GRPO                       | none (function masking)|
| `cipr`            | canonical | yes (paired)     | GRPO on both interfaces    | rescoring + rollout KL|

`algo.regime=supervised` trains the same names, copies and rescoring term with SFT on the reference
targets instead of GRPO (paper §3.4; `supervised.py`): `grpo` is then the plain SFT baseline on
original names, and `cipr` is SFT + λ_rescore·KL_rescore (there are no rollouts, so no rollout term).
The shared warm start, when configured, runs first as in the RL regime.

`cipr` with both weights at zero computes the same loss as `multi_interface` (it still reads the
action distributions, which only costs time); either weight alone switches one term off.
`masking` (Lin et al., 2025) replaces tool and argument names by random strings during training only
(see `data.py`); the perturbation of `multi_interface`/`cipr` is defined on canonical names, so it is
not combined with original or masked names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cipr.core.config import ConfigError

AlgoName = Literal["sft", "grpo", "multi_interface", "masking", "cipr"]
Names = Literal["original", "canonical", "masked"]


@dataclass
class AlgoConfig:
    """What is optimized: what tells the compared algorithms apart (GRPO's clipping, KL and loss type
    are the shared recipe, in `trainer`: see `cipr.train.schedule.TrainerConfig`).

    - `names`: the names the policy sees in training.
    - `perturbed`: pair every prompt with its perturbed copy (both enter the task loss).
    - `rescore_weight` / `rollout_weight`: λ of the rescoring and rollout consistency KL (0 = off).
    - `detach_reference`: the canonical side of each KL is a fixed target (no gradient through it).
      The paper leaves this open; detaching makes the term pull the perturbed/relabelled side toward
      the canonical one and never the reverse, so consistency cannot be met by degrading the
      canonical policy. Set false for a symmetric gradient.
    - `fold_action_read`: read the action distributions in the same forward as the GRPO token
      log-probabilities when the re-tokenized rollouts match the generated tokens (see `grpo.py`).
    - `regime`: `rl` (GRPO, the default) or `supervised` (SFT on the reference targets, `supervised.py`).
    - `action_weight` (supervised regime): > 0 adds the cross-entropy of the action distribution at the
      reference's calls to the SFT loss, for every algorithm alike (`supervised.py`).
    - `pairing_budget`: what a paired algorithm matches with `grpo` per step (`trainer.prompts_per_step`):
      `prompts` (default), the same number of training examples, each with its perturbed copy, so the
      same data in the same number of steps at twice the completions; `completions`, the same number
      of completions, so half the examples per step. No effect on unpaired algorithms. In the supervised
      regime the same holds for rows: `prompts` makes a paired batch `per_device_train_batch_size` pairs.
    """

    name: AlgoName = "cipr"
    names: Names = "canonical"
    perturbed: bool = True
    rescore_weight: float = 0.1
    rollout_weight: float = 0.1
    detach_reference: bool = True
    fold_action_read: bool = True
    regime: Literal["rl", "supervised"] = "rl"
    action_weight: float = 0.0
    pairing_budget: Literal["prompts", "completions"] = "prompts"

    @property
    def uses_grpo(self) -> bool:
        return self.name != "sft" and self.regime == "rl"

    @property
    def supervised(self) -> bool:
        """An SFT stage with the algorithm's rows (and terms) after the warm start."""
        return self.name != "sft" and self.regime == "supervised"

    @property
    def unit_size(self) -> int:
        """Dataset rows per sampling unit: 2 (canonical + perturbed) when paired, else 1."""
        return 2 if self.perturbed else 1

    @property
    def reads_actions(self) -> bool:
        return self.name == "cipr"


def validate_algo(cfg: AlgoConfig) -> None:
    """Reject combinations that cannot mean what they say, naming the override that fixes them."""
    if (cfg.rescore_weight or cfg.rollout_weight) and cfg.name != "cipr":
        raise ConfigError(f"algo.name={cfg.name} with consistency weights (rescore_weight={cfg.rescore_weight}, "
                          f"rollout_weight={cfg.rollout_weight}): the consistency terms belong to algo=cipr; set "
                          f"them to 0 or use algo=cipr")
    if cfg.name in ("cipr", "multi_interface") and not cfg.perturbed:
        raise ConfigError(f"algo={cfg.name} trains on paired canonical/perturbed prompts: set algo.perturbed=true")
    if cfg.perturbed and cfg.names != "canonical":
        raise ConfigError(f"algo.perturbed=true needs algo.names=canonical (the training perturbation is defined on "
                          f"canonical names); got algo.names={cfg.names}")
    if cfg.name == "masking" and cfg.names != "masked":
        raise ConfigError("algo=masking trains with random-string names: set algo.names=masked")
    if cfg.regime == "supervised" and cfg.rollout_weight:
        raise ConfigError(f"algo.regime=supervised has no rollouts, so no rollout term: set algo.rollout_weight=0 "
                          f"(got {cfg.rollout_weight}); the paper's supervised CIPR (§3.4) is SFT + the rescoring KL")
    if cfg.action_weight and cfg.regime != "supervised":
        raise ConfigError(f"algo.action_weight={cfg.action_weight} belongs to the supervised regime: set "
                          f"algo.regime=supervised or algo.action_weight=0")
    if cfg.rescore_weight < 0 or cfg.rollout_weight < 0 or cfg.action_weight < 0:
        raise ConfigError("algo.rescore_weight, algo.rollout_weight and algo.action_weight must be >= 0")
