"""`cipr-dose run|report [key=value ...]`: the pre-registered dose study, Stage A (cipr/experiments/dose.py,
docs/results/cpu_dose_preregistration.md, docs/results/cpu_dose.md).

`run` trains every (λ, seed) point of `configs/train/sweep/cpu_dose.yaml` from one shared warm start, with
each step's rescoring term traced on its own pairs, reads each point at its checkpoints on the calibration
items under the held-in relabeling, in one process, then writes REPORT/cpu_dose.json, .md, the two plots, the
records and the traces (.jsonl.gz). Rerunning resumes: finished points are skipped, a killed training
continues from its last checkpoint. `run_lambdas` / `run_seeds` run a piece (the report then covers what has
finished). `report` recomputes every number from the committed records and traces.

Examples:
    one CPU, the whole study:
        cipr-dose run
    in pieces (each resumable; the last one writes the report over every finished point):
        cipr-dose run run_seeds=[0,1] report=false
        cipr-dose run run_seeds=[2,3]
    two single-threaded processes at once (disjoint pieces; the shared warm start is trained by one, the other
    waits for it):
        cipr-dose run run_lambdas=[0,1] report=false &  cipr-dose run run_lambdas=[3,10] report=false
    every number of the report again, from its records and traces:
        cipr-dose report
    a quick run on a tiny model (`train.KEY=VALUE`: a cipr-train override for every point):
        cipr-dose run seeds=[0,1] lambdas=[0,10] steps=[1,2] items=4 out_dir=/tmp/dose report_dir=/tmp/dose \\
            train.model=tiny train.model.name_or_path=DIR train.trainer.save_steps=1
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
from cipr.experiments.dose import DoseConfig


@dataclass
class ReportOptions:
    """`cipr-dose report`: where the records are.

    - `report_dir`: the folder of cpu_dose_records.jsonl.gz, cpu_dose_trace.jsonl.gz and cpu_dose.json
      (rewritten in place).
    """

    report_dir: str = "docs/results"


def _verdict(report: dict) -> str:
    dose = report["decision"]["dose"]
    return "no dose qualifies" if dose is None else f"dose lambda={dose['lambda']:g} at step {dose['step']}"


def _run(config: DoseConfig) -> int:
    from cipr.experiments.dose import run_dose

    report = run_dose(config)
    if report is not None:
        print(f"cipr-dose: {config.report_dir}/cpu_dose.md, .json, .png ({_verdict(report)})")
    return 0


def _report(options: ReportOptions) -> int:
    from cipr.experiments.dose_analysis import recompute

    report = recompute(Path(options.report_dir))
    print(f"cipr-dose: recomputed {options.report_dir}/cpu_dose.md, .json, .png ({_verdict(report)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-dose`)."""
    verbs = {"run": (DoseConfig, _run), "report": (ReportOptions, _report)}
    return run_command("cipr-dose", __doc__, verbs, argv)


if __name__ == "__main__":
    sys.exit(main())
