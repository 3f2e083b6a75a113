"""`cipr-evidence`: the evidence experiment in one command (cipr/eval/evidence.py, docs/results/cpu_evidence.md).

It trains every point of `configs/train/sweep/cpu_evidence.yaml` (baseline, multi-interface and CIPR in the
supervised regime, seeds 0-2, from one shared warm start), exports and evaluates each on held-out synthetic
items (action KL and accuracy under the held-in relabeling and the held-out types; full-call accuracy on the
original interface), and writes OUT/cpu_evidence.json, cpu_evidence_tables.md and cpu_evidence.png. Rerunning
resumes: finished trainings and evaluations are skipped, a killed one continues from its last checkpoint.

Examples:
    one CPU (the committed run; about 90 minutes on 2 cores, see the report for the measured time):
        cipr-evidence
    a λ sweep beside the main arms (adds cipr_lambda<λ> points):
        cipr-evidence --lambdas 0.1
    one GPU / several GPUs / Slurm: the points are plain cipr-train runs; train them there with the sweep
    config's launch forms (its header), then run `cipr-evidence` where the run folders are to evaluate and
    report (finished points are not retrained), e.g. on Slurm:
        cipr-train -m launcher=slurm +sweep=cpu_evidence && sbatch --wrap ".venv/bin/cipr-evidence"

Options: `--out DIR` (default docs/results), `--sweep-dir DIR` (where the sweep config puts the points),
`--seeds 0,1,2`, `--limit N` (evaluation items), `--threads N` (torch threads of the evaluations), and
cipr-train overrides after `--train` for every point (e.g. `--train model=tiny model.name_or_path=DIR`).
Exit status 2 with one line on bad input (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from cipr.cli.common import begin
from cipr.core.errors import cli_errors

PREDICTIONS = {
    "P0": "Positive control (CIPR at λ_rescore = 1). On the held-in relabeled copies (every tool of the "
          "canonical interface of a held-out item renamed to a fresh function_XX id, the copy CIPR's rescoring term compares with), CIPR's action KL "
          "at the reference decision ends lower than multi-interface's: the paired difference CIPR − "
          "multi-interface over seeds has a 95% t interval below 0.",
    "P1": "On the held-out types (relabel_random: names of a shape never trained on; typos; "
          "distractor_similar_name), CIPR's action KL and its action-accuracy drop (original − perturbed) are "
          "smaller than multi-interface's (paired interval below 0). Expected for relabel_random, which shares "
          "the relabeling's mechanism; no directional expectation for typos and distractors, which the term "
          "does not touch.",
    "P2": "Original accuracy is kept: CIPR's action accuracy on the unperturbed interface is not more than 5 "
          "points below multi-interface's (the paired interval's lower end above −5 points).",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cipr-evidence", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="report folder (default docs/results)")
    p.add_argument("--sweep-dir", default=None, help="the sweep config's points folder")
    p.add_argument("--seeds", default=None, help="comma-separated training seeds (default 0,1,2)")
    p.add_argument("--limit", type=int, default=None, help="evaluation items (default 48)")
    p.add_argument("--generation-limit", type=int, default=None, help="items generated for full-call accuracy")
    p.add_argument("--lambdas", default=None, help="comma-separated extra λ_rescore values for CIPR points")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the evaluations")
    p.add_argument("--train", nargs=argparse.REMAINDER, default=[], help="cipr-train overrides for every point")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-evidence`)."""
    import dataclasses

    from cipr.core.errors import ConfigError
    from cipr.eval.evidence import Arm, EvidenceConfig, run_evidence

    begin()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    with cli_errors("cipr-evidence", debug=args.debug or None):
        changes: dict = {"train_overrides": tuple(args.train)}
        if args.out:
            changes["out_dir"] = args.out
        if args.sweep_dir:
            changes["sweep_dir"] = args.sweep_dir
        if args.seeds:
            try:
                changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
            except ValueError:
                raise ConfigError(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2") from None
        for key in ("limit", "generation_limit", "threads"):
            value = getattr(args, key)
            if value is not None:
                if value < 1:
                    raise ConfigError(f"--{key.replace('_', '-')} {value} must be >= 1")
                changes[key] = value
        if args.lambdas:
            try:
                lams = [float(x) for x in args.lambdas.split(",")]
            except ValueError:
                raise ConfigError(f"--lambdas {args.lambdas!r}: give comma-separated numbers, e.g. 0.1,3") from None
            changes["extra_arms"] = tuple(Arm(f"cipr_lambda{lam:g}", ("algo=cipr_sft", f"algo.rescore_weight={lam}"),
                                              "canonical", 3.0) for lam in lams)
        config = dataclasses.replace(EvidenceConfig(), **changes)
        report = run_evidence(config, PREDICTIONS, "cipr-evidence " + shlex.join(argv))
    print(f"cipr-evidence: {config.out_dir}/cpu_evidence.json, cpu_evidence_tables.md, cpu_evidence.png "
          f"({report['wall_s']:.0f} s of work in all; this invocation {report['wall_s_this_invocation']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
