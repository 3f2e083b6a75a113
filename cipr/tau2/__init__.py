"""τ²-bench (airline, retail) through cipr-serve: original tool names against the canonicalization adapter.

Modules: `run` (the driver), `harness` (runs inside the τ² environment; standard library and `tau2`
only), `convert` (τ² records into our report files), `gold` (a scripted agent replaying the gold
actions). The command is `cipr-tau2` (`cipr.cli.tau2`).
"""
