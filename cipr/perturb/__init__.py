"""Interface perturbations: the training generator (paper §3.2) and every held-out type.

    from cipr.perturb import apply_perturbation, list_perturbations, perturb_for_training
    perturbed, corr = apply_perturbation(example, "cost_tag_explicit", seed=0, names="canonical",
                                         order="costly_first")

Each returns the perturbed Example (reference calls and BFCL accepted lists rewritten to the written
names) and a Correspondence (written tool -> equivalent source tool, None for added tools).
One module per family: training, typos, distractors, cost_latency, drift, rotbench; registry names
them all.
"""

from cipr.perturb.correspondence import Correspondence
from cipr.perturb.registry import HELD_OUT, PERTURBATIONS, apply_perturbation, list_perturbations
from cipr.perturb.training import TrainingPerturbationConfig, in_distribution, perturb_for_training

__all__ = ["Correspondence", "HELD_OUT", "PERTURBATIONS", "TrainingPerturbationConfig", "apply_perturbation",
           "in_distribution", "list_perturbations", "perturb_for_training"]
