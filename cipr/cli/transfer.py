"""`cipr-transfer run|report [key=value ...]`: the pre-registered transfer experiment
(cipr/experiments/transfer.py, docs/results/cpu_transfer_preregistration.md, docs/results/cpu_transfer.md).

`run` trains every (arm, seed) point of `configs/train/sweep/cpu_transfer.yaml` from one shared warm start and
reads each on the near and hard evaluation items under the held-out perturbation types, in one process, then
writes REPORT/cpu_transfer.json, .md, .png and the records (.jsonl.gz). Rerunning resumes: finished points
are skipped, a killed training continues from its last checkpoint. `run_seeds` runs a piece of the seeds (the
report then covers the seeds finished so far). `report` recomputes every number from the committed records.

Examples:
    one CPU, the whole experiment:
        cipr-transfer run
    the same in pieces of about an hour (each resumable; the last one writes the complete report):
        cipr-transfer run run_seeds=[0,1,2] report=false
        cipr-transfer run run_seeds=[3,4,5] report=false  ...  cipr-transfer run run_seeds=[9,10,11]
    every number of the report again, from its records:
        cipr-transfer report
    a quick run on a tiny model (`train.KEY=VALUE`: a cipr-train override for every point):
        cipr-transfer run seeds=[0,1] items_per_split=4 secondary_items=2 out_dir=/tmp/tr \\
            report_dir=/tmp/tr train.model=tiny train.model.name_or_path=DIR train.trainer.max_steps=2
    one GPU / several GPUs / Slurm: the points are plain cipr-train runs (the sweep config's header gives
    their launch forms); the reading runs where their run folders are.

Exit status 2 with one line on bad input (`--debug` shows the traceback).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cipr.cli.common import run_command
from cipr.experiments.transfer import TransferConfig


@dataclass
class ReportOptions:
    """`cipr-transfer report`: where the records are.

    - `report_dir`: the folder of cpu_transfer_records.jsonl.gz and cpu_transfer.json (rewritten in place).
    """

    report_dir: str = "docs/results"


def _run(config: TransferConfig) -> int:
    from cipr.experiments.transfer import run_transfer

    report = run_transfer(config)
    if report is not None:
        print(f"cipr-transfer: {config.report_dir}/cpu_transfer.md, .json, .png "
              f"(decision: {report['decision']})")
    return 0


def _report(options: ReportOptions) -> int:
    from cipr.experiments.transfer_analysis import recompute

    report = recompute(Path(options.report_dir))
    print(f"cipr-transfer: recomputed {options.report_dir}/cpu_transfer.md, .json, .png "
          f"(decision: {report['decision']})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-transfer`)."""
    verbs = {"run": (TransferConfig, _run), "report": (ReportOptions, _report)}
    return run_command("cipr-transfer", __doc__, verbs, argv)


if __name__ == "__main__":
    sys.exit(main())
