"""Evaluation harness: held-out interface perturbations, original names vs the canonicalization adapter.

Modules, one concept each:
- `config`: EvalConfig / BenchmarkConfig (what `cipr-eval` composes from configs/eval/eval.yaml).
- `benchmarks`: examples, perturbation tokens and groups, items per perturbation x order x names.
- `items`: one EvalItem, with the adapter applied as at deployment (canonicalize, translate back).
- `backends`: HF (batched, left padding, greedy), vLLM, OpenAI-compatible endpoint, replay.
- `runner`: the crash-safe, resumable loop writing results.jsonl.
- `scorers`: BFCL AST matching and RoTBench Content Filling as runner scorers.
- `taxonomy`: the failure classes of the paper's Appendix E.
- `stats`: Wilson / normal / paired confidence intervals.
- `report`: summary.json, report.md (Tables 1, 6, 10 shapes), plots.
- `compare`: paired differences between two runs.
- `evaluate`: one run end to end (`evaluate(cfg)`).
- `consistency_metric`: held-out action consistency read from the model (`consistency.enabled`).
"""
