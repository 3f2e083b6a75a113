"""`cipr-plan OVERRIDES...`: a dry run on this CPU of the cipr-train command with the same overrides.

No weights and no network: the model is built without weights from its config.json, the prompts are
rendered with its chat template, and the plan checks the call format against the template, the prompt
and target lengths against their limits, every divisibility of the batches, and the per-GPU memory of the
strategy against the card (`plan.gpu_memory_gb`), then estimates the wall time from stated throughputs.
It prints a table and writes plan.json into trainer.run_dir (plan.out=PATH elsewhere, plan.out='' none).
Options other than plan.* are cipr-train's, composed as cipr-train composes them (cipr/plan/plan.py).

Examples:
    one GPU:        cipr-plan experiment=qwen25_3b_cipr
    several GPUs:   cipr-plan experiment=qwen25_3b_cipr launcher.num_processes=8 distributed=zero2
    another card:   cipr-plan experiment=qwen35_4b_cipr plan.gpu=h200 plan.gpu_memory_gb=141
    before Slurm:   cipr-plan experiment=qwen25_3b_cipr launcher.num_processes=8 distributed=zero2 \\
                        data.path=/data/toolrl/rlla_4k/train.parquet \\
                    && sbatch --gres=gpu:8 slurm/train.sbatch experiment=qwen25_3b_cipr ...

Exit status: 0 the plan holds, 2 a defect (each named on one line with the option to change) or bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from cipr.cli.common import HELP, begin, usage
from cipr.core.config import from_overrides
from cipr.core.errors import EXIT_INPUT, cli_errors
from cipr.plan.plan import PlanOptions


@dataclass
class PlanCommand:
    """cipr-plan's own options (`plan.KEY=VALUE`); every other option is a cipr-train override."""

    plan: PlanOptions = field(default_factory=PlanOptions)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-plan`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in HELP for a in args):
        print(usage("cipr-plan", __doc__, {"": (PlanCommand, lambda _: 0)})
              .replace("cipr-plan key=value ...", "cipr-plan [cipr-train overrides] plan.KEY=VALUE ..."))
        return 0
    debug = "--debug" in args or None
    args = [a for a in args if a != "--debug"]
    try:
        with cli_errors("cipr-plan", debug):
            command = from_overrides(PlanCommand, [a for a in args if a.startswith("plan.")])
            begin()
            from cipr.plan.plan import make_plan, write_plan

            plan = make_plan([a for a in args if not a.startswith("plan.")], command.plan)
            print(plan.table())
            written = write_plan(plan)
            if written is not None:
                print(f"cipr-plan: {written}")
            return 0 if plan.ok else EXIT_INPUT
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
