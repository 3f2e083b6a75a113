"""The training algorithms, selected by `algo=`; every one runs from the same code by config.

| algo              | names     | perturbed copies | task loss                  | consistency terms     |
|-------------------|-----------|------------------|----------------------------|-----------------------|
| `sft`             | canonical or original | no   | SFT (warm start alone)     | none                  |
| `grpo`            | original  | no               | GRPO, ToolRL recipe        | none (ToolRL baseline)|
| `multi_interface` | canonical | yes (paired)     | GRPO on both interfaces    | none                  |
| `masking`         | masked    | no               | GRPO                       | none (function masking)|
| `cipr`            | canonical | yes (paired)     | GRPO on both interfaces    | rescoring + rollout KL|
| `distill`         | canonical (teacher: original) | no | KL to the frozen teacher | rescoring KL  |

The first five train on prompts (`AlgoConfig`); `distill` (paper §4.3, `DistillConfig`) trains on agent
trajectories with the released model as its teacher (`cipr.train.distill`), and has no rollouts.

`algo.regime=supervised` trains the same names, copies and rescoring term with SFT on the reference
targets instead of GRPO (paper §3.4; `supervised.py`): `grpo` is then the plain SFT baseline on
original names, and `cipr` is SFT + λ_rescore·KL_rescore (there are no rollouts, so no rollout term).
The shared warm start, when configured, runs first as in the RL regime.

The consistency terms are `algo.terms` (`cipr.method.objective`: the built-in `rescore` and `rollout`, or a
term from your own file, `algo.terms.NAME.fn=module:function`), each weighted by its one key
`algo.terms.NAME.weight` (the former `algo.rescore_weight` / `algo.rollout_weight` are refused, naming it).
`cipr` with every weight at zero computes `multi_interface`'s loss (it still reads the action distributions
and logs the terms: the trace of a control arm); a weight of null switches a term off.

The names and copies columns are the algorithm's defaults in the `perturb` group
(`cipr.perturb.config.PerturbConfig`: `perturb.names`, `perturb.paired`, the preset, twin wordings, seeds and
the relabeling, shared by every regime). `masking` (Lin et al., 2025; `data.py`): random tool and argument
names in training only. The perturbation of `multi_interface`/`cipr` is defined on canonical names, so it is
not combined with original or masked names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cipr.core.config import ConfigError
from cipr.distill.batch import LossWeights
from cipr.distill.evaluate import EvalConfig, check_eval
from cipr.method.objective import Objective, TermConfig
from cipr.perturb.config import PerturbConfig

AlgoName = Literal["sft", "grpo", "multi_interface", "masking", "cipr"]


@dataclass
class AlgoConfig:
    """What is optimized: what tells the compared algorithms apart (GRPO's clipping, KL and loss type
    are the shared recipe, in `trainer`: see `cipr.train.schedule.TrainerConfig`).

    - `terms`: the consistency terms by name (`cipr.method.objective.TermConfig`: weight, fn, kind, options;
      null: the algorithm's own, `rescore` and `rollout` at 0.1 for cipr, none for the others).
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
      `prompts` (default), the same examples, each with its copy (twice the completions); `completions`,
      the same completions (half the examples). Unpaired: no effect. Supervised: `prompts` makes a paired
      batch `per_device_train_batch_size` pairs.
    """

    name: AlgoName = "cipr"
    terms: dict[str, TermConfig] | None = None
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

    def __post_init__(self) -> None:
        if self.terms is None:  # the algorithm's own: CIPR's two terms at the GRPO recipe's 0.1, else none
            cipr = {"rescore": TermConfig(0.1), "rollout": TermConfig(0.1)}
            self.terms = cipr if self.name == "cipr" else {}

    @property
    def active_terms(self) -> dict[str, TermConfig]:
        """The terms that run (weight not null)."""
        return {k: t for k, t in self.terms.items() if t.weight is not None}

    @property
    def reads_actions(self) -> bool:
        return self.name == "cipr" and bool(self.active_terms)

    def objective(self) -> Objective:
        """The run's consistency terms (`cipr.method.objective`); none but for algo=cipr, and no rollout term
        in the supervised regime (it has no rollouts)."""
        if not self.reads_actions:
            return Objective([])
        return Objective.from_config(self.terms, regime=self.regime, detach_reference=self.detach_reference)


def validate_algo(cfg: AlgoConfig, perturb: PerturbConfig) -> None:
    """Reject combinations that cannot mean what they say, naming the override that fixes them (`perturb`:
    the run's resolved perturbation group)."""
    weighted = {k: t.weight for k, t in cfg.active_terms.items() if t.weight}
    own = sorted(k for k, t in cfg.terms.items() if t.fn)
    if own and cfg.name != "cipr":
        raise ConfigError(f"algo.terms.{own[0]}.fn: algo={cfg.name} runs no consistency terms (they "
                          f"belong to algo=cipr, or algo=cipr_sft in the supervised regime)")
    if weighted and cfg.name != "cipr":
        listed = ", ".join(f"{k}={w}" for k, w in weighted.items())
        raise ConfigError(f"algo.name={cfg.name} with consistency terms ({listed}): the consistency terms "
                          f"belong to algo=cipr; set their weights to 0 (algo.terms.NAME.weight) or use "
                          f"algo=cipr")
    if cfg.name == "cipr":
        try:
            cfg.objective()
        except ConfigError as e:
            if cfg.regime == "supervised" and "needs pairs this regime" in str(e):
                raise ConfigError(f"{e}. algo.regime=supervised has no rollouts, so no rollout-kind term: "
                                  f"set its weight to null; the paper's supervised CIPR (§3.4) is SFT + the "
                                  f"rescoring KL") from None
            raise
    if cfg.name in ("cipr", "multi_interface") and not perturb.paired:
        raise ConfigError(f"algo={cfg.name} trains on paired canonical/perturbed prompts: set "
                          f"perturb.paired=true")
    if perturb.paired and perturb.names != "canonical":
        raise ConfigError(f"perturb.paired=true needs perturb.names=canonical (the training perturbation is "
                          f"defined on canonical names); got perturb.names={perturb.names}")
    if cfg.name == "masking" and perturb.names != "masked":
        raise ConfigError("algo=masking trains with random-string names: set perturb.names=masked")
    if cfg.action_weight and cfg.regime != "supervised":
        raise ConfigError(f"algo.action_weight={cfg.action_weight} belongs to the supervised regime: set "
                          f"algo.regime=supervised or algo.action_weight=0")
    if cfg.action_weight < 0:
        raise ConfigError("algo.action_weight must be >= 0")


@dataclass
class DistillConfig:
    """`algo=distill`: the weights of the loss terms, the relabeling, and the evaluation.

    - `token_weight`, `action_weight`: the task loss, KL(teacher original || student canonical) on
      aligned tokens and on action distributions at decisions (`cipr.distill.loss`).
    - `terms`: the consistency terms (`cipr.method.objective`; rescore-kind only: student canonical vs
      relabeled), weighted by `terms.rescore.weight`.
    - `detach_reference`: the canonical side of the rescoring KL is a fixed target
      (`cipr.method.consistency`).
    - `teacher_dtype`: "bfloat16" runs the frozen teacher in bfloat16 (inference only); "model" keeps
      the loaded dtype. Without LoRA only.
    - `autocast_bf16`: on CPU, run the student's forward and backward under bfloat16 autocast (weights
      and optimizer stay float32); on a GPU use `trainer.precision=bf16` instead.
    - `eval`: what the evaluation reads and plays (`cipr.distill.evaluate.EvalConfig`).
    """

    name: Literal["distill"] = "distill"
    token_weight: float = 1.0
    action_weight: float = 1.0
    terms: dict[str, TermConfig] = field(default_factory=lambda: {"rescore": TermConfig(1.0)})
    detach_reference: bool = True
    eps: float = 1e-6
    teacher_dtype: Literal["model", "bfloat16"] = "model"
    autocast_bf16: bool = False
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def weights(self) -> LossWeights:
        return LossWeights(self.token_weight, self.action_weight, self.eps)

    def objective(self) -> Objective:
        """The consistency terms (rescore-kind only: distillation has no rollouts)."""
        return Objective.from_config(self.terms, regime="distill", detach_reference=self.detach_reference,
                                     eps=self.eps)

    @property
    def reads_actions(self) -> bool:
        return True


def validate_distill(cfg: DistillConfig, lora: bool, perturb: PerturbConfig) -> None:
    """Reject weights and evaluation settings that cannot mean what they say, naming the option."""
    if perturb.names != "canonical" or perturb.paired:
        raise ConfigError(f"algo=distill trains the student under canonical names on unpaired trajectories: "
                          f"perturb.names={perturb.names}, perturb.paired={perturb.paired}; leave both unset")
    unused = {k: getattr(perturb, k) for k in ("preset", "twin_wordings", "seed", "mask_length")
              if getattr(perturb, k) != getattr(PerturbConfig(), k)}
    if unused:
        listed = ", ".join(f"perturb.{k}={v}" for k, v in unused.items())
        raise ConfigError(f"{listed}: algo=distill makes no perturbed copies (its rescoring term relabels, "
                          f"perturb.relabel); leave it unset")
    if cfg.teacher_dtype != "model" and lora:
        raise ConfigError("algo.teacher_dtype must be 'model' with model.lora.enabled (the teacher is the "
                          "base)")
    if min(cfg.token_weight, cfg.action_weight) < 0:
        raise ConfigError("algo.token_weight and algo.action_weight must be >= 0")
    cfg.objective()
    if not (cfg.token_weight or cfg.action_weight):
        raise ConfigError("algo.token_weight and algo.action_weight are both 0: the student would not learn "
                          "from the teacher (the rescoring term alone only makes it consistent with itself)")
    if cfg.eps < 0:
        raise ConfigError("algo.eps must be >= 0")
    check_eval(cfg.eval)
