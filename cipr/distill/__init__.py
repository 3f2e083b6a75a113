"""Self-distillation's math and data (paper §4.3): teacher under original names, student under canonical ones.

The stage that trains with them is `cipr.train.distill` (`cipr-train algo=distill`); this package sits
below train and never imports it.

- `naming`: the same trajectory under other action names (canonical, relabeled, synonyms, swapped).
- `conversation`: a trajectory rendered as one chat text, its assistant turns and decisions.
- `alignment`: token pairs of two renderings whose action names tokenize differently.
- `loss`: token-level KL on aligned tokens and action-distribution KL at decisions (pure functions).
- `data`: trajectories for `data=trajectories` (load or generate ToyShop ones, trim, split, build items).
- `batch`: a trajectory's teacher/student/relabeled views and the loss of a batch of them.
- `evaluate`: offline agreement/KL under renames, and live evaluation in an environment.
"""
