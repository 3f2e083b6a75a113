"""Experiment drivers, above evaluation and training: each trains (by running `cipr-train`), exports,
evaluates and reports a whole experiment, calling the public functions of the layers below.

- `evidence`: the evidence experiment over arms and seeds (`cipr-evidence`, docs/results/cpu_evidence.md).
- `ladder`: a ladder sweep's points exported, evaluated and compared in Table 1's layout (`cipr-ladder`).
"""
