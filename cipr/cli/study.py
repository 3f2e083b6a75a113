"""`cipr-study run|report|commands study=NAME [--config-dir DIR] [key=value ...]`: a study from its spec
(cipr/experiments/spec.py, configs/study/NAME.yaml or DIR/study/NAME.yaml; docs/studies.md).

`run` trains every (arm, seed) point of the spec from one shared warm start as plain cipr-train runs, reads
each at the spec's steps on its calibration items, and writes REPORT/NAME.json, .md, the plots, the per-item
records and the per-step traces (.jsonl.gz). Rerunning resumes: finished points are skipped, a killed training
continues from its last checkpoint. `run_arms` / `run_seeds` run a piece (the report then covers what has
finished). `report` rewrites every file of the report from its committed records and traces. `commands`
prints the cipr-train command of every point, to train them elsewhere (Slurm, GPU nodes); `run` then finds
them finished and only reads, evaluates and reports.

Examples:
    one CPU, the whole study:
        cipr-study run study=frontier
    two single-threaded processes at once, split by seed (the first trains the shared warm start, the other
    waits for it), then the report over every finished point:
        cipr-study run study=frontier run_seeds=[0,2,4,6] report=false &
        cipr-study run study=frontier run_seeds=[1,3,5,7] report=false
        cipr-study run study=frontier
    your own spec (DIR/study/mine.yaml), a spec key changed on the command line:
        cipr-study run study=mine --config-dir DIR study.seeds=[0,1] report_dir=reports
    every number again, from the records and traces:
        cipr-study report study=frontier
    a quick run on a tiny model (`train.KEY=VALUE`: a cipr-train override for every point):
        cipr-study run study=mine --config-dir DIR train.model=tiny train.model.name_or_path=TINY_DIR
    one GPU / several GPUs / Slurm: the points are plain cipr-train runs; print them and submit each:
        cipr-study commands study=cpu_frontier | while read -r c; do sbatch --gres=gpu:1 --wrap "$c"; done
    then read, evaluate and report where their run folders are:
        cipr-study run study=cpu_frontier

Options: every key of StudyOptions (`out_dir`, `report_dir`, `run_arms`, `run_seeds`, `report`,
`keep_weights`, `batch_size`, `train.*`) and of the spec as `study.KEY`. Exit status 2 with one line on bad
input (`--debug` shows the traceback).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from cipr.cli.common import HELP, begin, hydra_overrides, options
from cipr.core.errors import EXIT_INPUT, ConfigError, cli_errors

VERBS = ("run", "report", "commands")


def _verdict(report: dict) -> str:
    decision = report.get("decision")
    if not isinstance(decision, dict) or "chosen" not in decision:
        return "recomputed"
    if not decision.get("rule"):
        return "no decision rule"
    return f"{decision['chosen']} qualifies" if decision.get("chosen") else "no arm qualifies"


def _run(argv: list[str]) -> int:
    from cipr.experiments.spec import load_options
    from cipr.experiments.study import run_study

    opts = load_options(argv)
    if not opts.study.run:
        raise ConfigError(f"study {opts.study.name!r} is a report kept from before the study engine, "
                          f"without a design the engine runs; `cipr-study report study={opts.study.name}` "
                          f"recomputes it")
    begin()
    report = run_study(opts)
    if report is not None:
        print(f"cipr-study: {opts.report_dir}/{opts.study.name}.md, .json, plots ({_verdict(report)})")
    return 0


def _report(argv: list[str]) -> int:
    from cipr.experiments.spec import load_options
    from cipr.experiments.study_report import recompute

    opts = load_options(argv)
    begin()
    folder = Path(opts.report_dir)
    if opts.study.analysis:
        report = importlib.import_module(opts.study.analysis).recompute(folder, opts.study.name)
    else:
        report = recompute(folder, opts.study.name)
    print(f"cipr-study: recomputed {folder}/{opts.study.name} from its records ({_verdict(report)})")
    return 0


def _commands(argv: list[str]) -> int:
    import shlex

    from cipr.experiments.spec import load_options
    from cipr.experiments.study import Point, point_overrides

    opts = load_options(argv)
    seeds = opts.study.seeds if opts.run_seeds is None else opts.run_seeds
    arms = [a for a in opts.study.arms if opts.run_arms is None or a in opts.run_arms]
    path = ":".join(opts.study.pythonpath)
    for seed in seeds:
        for arm in arms:
            words = ["cipr-train", *point_overrides(opts, Point(arm, seed))]
            print((f"PYTHONPATH={path} " if path else "") + shlex.join(words))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-study`)."""
    from cipr.experiments.spec import StudyOptions

    given = list(sys.argv[1:] if argv is None else argv)
    args, debug = [a for a in given if a != "--debug"], "--debug" in given or None
    if not args or args[0] in HELP or any(a in HELP for a in args):
        print("cipr-study run|report study=NAME [--config-dir DIR] key=value ...\n"
              + "\n".join(options(StudyOptions)) + "\n\n" + (__doc__ or ""))
        return 0
    verb = args.pop(0)
    try:
        with cli_errors("cipr-study", debug):
            if verb not in VERBS:
                raise ConfigError(f"unknown command {verb!r}; choose one of {', '.join(VERBS)} "
                                  f"(`cipr-study --help`)")
            overrides, _ = hydra_overrides(args)
            return {"run": _run, "report": _report, "commands": _commands}[verb](overrides)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
