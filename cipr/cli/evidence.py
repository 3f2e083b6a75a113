"""`cipr-evidence [key=value ...]`: the evidence experiment in one command (cipr/experiments/evidence.py,
docs/results/cpu_evidence.md).

It trains every point of `configs/train/sweep/cpu_evidence.yaml` (baseline, multi-interface and CIPR,
supervised regime, seeds 0-2, one shared warm start), exports and evaluates each on held-out synthetic
items, and writes OUT/cpu_evidence.json, cpu_evidence_tables.md and cpu_evidence.png. Rerunning
resumes: finished work is skipped, a killed training continues from its last checkpoint.

Examples:
    one CPU (the committed run; its measured time is in the report):
        cipr-evidence
    a λ sweep beside the main arms (adds cipr_lambda<λ> points):
        cipr-evidence lambdas=[0.1]
    a quick run on another model (every `train.KEY=VALUE` is a cipr-train override for every point):
        cipr-evidence seeds=[0] limit=8 out_dir=/tmp/evidence train.model=tiny train.model.name_or_path=DIR
    one GPU / several GPUs / Slurm: the points are plain cipr-train runs; train them there with the sweep
    config's launch forms (its header), then run `cipr-evidence` where the run folders are to evaluate and
    report (finished points are not retrained), e.g. on Slurm:
        cipr-train -m launcher=slurm +sweep=cpu_evidence && sbatch --wrap ".venv/bin/cipr-evidence"

Exit status 2 with one line on bad input (`--debug` shows the traceback).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence

from cipr.cli.common import run_command
from cipr.experiments.evidence import EvidenceConfig


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-evidence`)."""
    given = list(sys.argv[1:] if argv is None else argv)

    def evidence(config: EvidenceConfig) -> int:
        from cipr.experiments.evidence import run_evidence

        report = run_evidence(config, "cipr-evidence " + shlex.join(given))
        took = f"{report['wall_s']:.0f} s of work in all; {report['wall_s_this_invocation']:.0f} s this time"
        print(f"cipr-evidence: {config.out_dir}/cpu_evidence.json, cpu_evidence_tables.md, "
              f"cpu_evidence.png ({took})")
        return 0

    return run_command("cipr-evidence", __doc__, {"": (EvidenceConfig, evidence)}, given)


if __name__ == "__main__":
    sys.exit(main())
