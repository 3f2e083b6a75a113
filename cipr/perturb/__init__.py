"""Interface perturbations: the training generator (paper §3.2) and every held-out type.

    from cipr.perturb import apply_perturbation, list_perturbations, perturb_for_training
    perturbed, corr = apply_perturbation(example, "cost_tag_explicit", seed=0, names="canonical",
                                         order="costly_first")

Each returns the perturbed Example (reference calls and BFCL accepted lists rewritten to the written
names) and a Correspondence (written tool -> equivalent source tool, None for added tools).
One module per family: training, typos, distractors, cost_latency, drift, rotbench (RoTBench levels
re-applied to canonical ids, which pairs two files and so is not in the single-example registry);
registry names the single-example types.
"""

from cipr.perturb.correspondence import Correspondence
from cipr.perturb.registry import (
    GROUPS,
    HELD_OUT,
    ORDERED_TYPES,
    PERTURBATIONS,
    apply_perturbation,
    list_perturbations,
    register_perturbation,
)
from cipr.perturb.rotbench import canonical_level, reapply_level, shipped_correspondence
from cipr.perturb.training import TrainingPerturbationConfig, in_distribution, perturb_for_training

__all__ = ["GROUPS", "Correspondence", "HELD_OUT", "ORDERED_TYPES", "PERTURBATIONS",
           "TrainingPerturbationConfig", "apply_perturbation", "canonical_level", "in_distribution",
           "list_perturbations", "perturb_for_training", "reapply_level", "register_perturbation",
           "shipped_correspondence"]
