"""τ²-bench (airline, retail) through cipr-serve: original tool names against the canonicalization adapter.

Modules: `run` (the driver: cipr-serve, the τ² harness per arm and domain, resume), `harness` (runs
inside the τ² environment with τ²'s own orchestrator, user simulator and evaluator; standard
library and `tau2` only), `convert` (τ² records into results.jsonl / summary.json / report.md),
`gold` (a scripted agent replaying each task's gold actions, for the end-to-end name check). The
command is `cipr-tau2` (`cipr.cli.tau2`).
"""
