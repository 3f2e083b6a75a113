"""cipr-plan: every GPU experiment checked on a CPU before it is launched, without weights or network.

`make_plan(overrides)` composes a cipr-train command, builds its model on the meta device, renders its
prompts, checks its call format and batches (`cipr.train.preflight`, which cipr-train also runs), and
estimates per-GPU memory (`memory`) and time (`cost`). The experiments layer: it reads the train layer.
"""

from cipr.plan.plan import Plan, PlanOptions, make_plan, write_plan

__all__ = ["Plan", "PlanOptions", "make_plan", "write_plan"]
