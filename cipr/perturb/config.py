"""The interfaces a run trains on, in one config group (`perturb=`, `perturb.KEY=VALUE`), shared by every
regime: GRPO single- and multi-turn, the supervised regime, distillation and the shared warm start.

What it fixes:
- the names the policy sees (`names`: original, canonical ids, or function masking's random strings);
- whether each example is paired with its perturbed copy (`paired`), built by the training perturbation
  (`cipr.perturb.training`: degraded twins, relabeling, reordering) with its ablation `preset`, its
  `twin_wordings` and its own `seed`;
- how the query and earlier turns are rewritten when names change (`rewrite_text`);
- the fresh names of the rescoring term's relabeling (`relabel`, `cipr.method.relabel`).

`names`, `paired` and `rewrite_text` default to null: the algorithm's own (`algorithm_defaults`), so
`algo=grpo` trains on original names and `algo=cipr` on canonical names paired with perturbed copies
without a word; setting one overrides it, and the run checks that the combination means something
(`cipr.train.algo.validate_algo`). Before this group the same settings were six keys across `algo` and
`data`; `MOVED` maps each old key to its new one, and an old key is refused with that name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

Names = Literal["original", "canonical", "masked"]
RewriteText = Literal["identifiers", "all", "none"]

MOVED = {"algo.names": "perturb.names", "algo.perturbed": "perturb.paired", "algo.relabel": "perturb.relabel",
         "data.perturbation": "perturb.preset", "data.twin_wordings": "perturb.twin_wordings",
         "data.perturbation_seed": "perturb.seed", "data.rewrite_text": "perturb.rewrite_text",
         "data.mask_length": "perturb.mask_length"}
"""Keys that moved into this group: old dotted key -> new one."""


@dataclass(frozen=True)
class RelabelConfig:
    """How the rescoring term's fresh names are made (`cipr.method.relabel`): scheme, digits of numbered
    schemes, number pool, and the seed (None: the run's `trainer.seed`) that
    `cipr.method.relabel.Relabeling` combines with the step and the example."""

    scheme: Literal["function", "tool", "random"] = "function"
    width: int = 2
    pool: int = 99
    seed: int | None = None


@dataclass
class PerturbConfig:
    """The training interfaces (module docstring).

    - `names`: the names the policy sees in training (null: the algorithm's: grpo original, masking masked,
      the others canonical).
    - `paired`: pair every example with its perturbed copy, both trained on (null: the algorithm's:
      multi_interface and cipr).
    - `preset`: the training perturbation (`full`: twins, relabeling, reordering) or an ablation of it
      (`cipr.perturb.training.VARIANTS`), or the name of a perturbation type registered with
      `cipr.perturb.register_perturbation` (from your own file: `plugins=[your_module]`), which then makes
      each copy (`cipr.perturb.registry.training_copy`).
    - `twin_wordings`: the degraded twins' wordings (`default` never names a cost; `with_cost`: the ablation).
    - `seed`: the perturbed copies' seed (null: `data.seed`), so runs can share examples and differ in copies.
    - `rewrite_text`: how texts are rewritten when names change (null: `identifiers`; `all` for trajectories).
    - `mask_length`: the length of function masking's random names.
    - `relabel`: the rescoring term's fresh names (scheme, width, pool, seed).
    """

    names: Names | None = None
    paired: bool | None = None
    preset: str = "full"
    twin_wordings: Literal["default", "with_cost"] = "default"
    seed: int | None = None
    rewrite_text: RewriteText | None = None
    mask_length: int = 8
    relabel: RelabelConfig = field(default_factory=RelabelConfig)

    def __post_init__(self) -> None:
        from cipr.perturb.registry import check_preset

        check_preset(self.preset)

    @property
    def unit_size(self) -> int:
        """Dataset rows per sampling unit: 2 (canonical + perturbed) when paired, else 1."""
        return 2 if self.paired else 1


def algorithm_defaults(algo: str) -> dict[str, object]:
    """The `names`, `paired` and `rewrite_text` an algorithm trains with when the group leaves them null."""
    names = {"grpo": "original", "masking": "masked"}.get(algo, "canonical")
    return {"names": names, "paired": algo in ("multi_interface", "cipr"),
            "rewrite_text": "all" if algo == "distill" else "identifiers"}


def resolved(cfg: PerturbConfig, algo: str) -> PerturbConfig:
    """`cfg` with every null among `names`, `paired`, `rewrite_text` set to the algorithm's own."""
    defaults = algorithm_defaults(algo)
    return dataclasses.replace(cfg, **{k: v for k, v in defaults.items() if getattr(cfg, k) is None})
