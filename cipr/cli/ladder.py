"""`cipr-ladder SWEEP_DIR [cipr-eval options]`: export, evaluate and compare every finished point of a ladder
sweep (`cipr-train -m +sweep=ladder`), and write SWEEP_DIR/ladder/ladder.md, ladder.json and ladder.png
(cipr/eval/ladder.py). Rerunning it evaluates only what is new; unfinished points are listed.

Examples. The whole comparison, one CPU (the embedded SmolLM2-135M, synthetic data; both commands resume):
    cipr-train -m +sweep=ladder algo=grpo,multi_interface,cipr trainer.seed=0
    cipr-ladder runs/ladder/smollm2-135m limit=40 max_new_tokens=128 threads=2
One GPU (the paper's recipe; each point trains on the GPU, then vLLM evaluates; the consistency read loads
the model in HF next to it, so leave it memory: vllm.gpu_memory_utilization=0.6):
    cipr-train -m +sweep=ladder experiment=qwen25_3b_cipr data.path=/data/toolrl/rlla_4k/train.parquet
    cipr-ladder runs/ladder/qwen25-3b benchmark=bfcl backend=vllm max_new_tokens=4096 vllm.gpu_memory_utilization=0.6
Several GPUs on one node (training with accelerate; evaluation with one vLLM engine across them):
    cipr-train -m +sweep=ladder experiment=qwen25_3b_cipr data.path=... launcher.num_processes=8 distributed=zero2
    cipr-ladder runs/ladder/qwen25-3b benchmark=bfcl backend=vllm vllm.tensor_parallel_size=8
Slurm (one job per point for training; then one evaluation job):
    CIPR_SLURM_PARTITION=P cipr-train -m launcher=slurm +sweep=ladder experiment=qwen25_3b_cipr data.path=...
    sbatch --partition=P --gres=gpu:1 --time=12:00:00 --wrap \\
        ".venv/bin/cipr-ladder runs/ladder/qwen25-3b benchmark=bfcl backend=vllm vllm.gpu_memory_utilization=0.6"

Options: `--no-consistency` (accuracy only), `--no-base` (skip the shared warm start's Base row), `--out DIR`.
Any `key=value` after SWEEP_DIR is a cipr-eval option for every evaluation (configs/eval/eval.yaml; default
benchmark=synthetic). Exit status 2 with one line on bad input (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cipr.cli.common import begin
from cipr.core.errors import cli_errors


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cipr-ladder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", type=Path, help="the sweep folder of `cipr-train -m +sweep=ladder`")
    p.add_argument("overrides", nargs="*", help="cipr-eval options (key=value) for every evaluation")
    p.add_argument("--no-consistency", action="store_true", help="skip the held-out consistency metric")
    p.add_argument("--no-base", action="store_true", help="do not evaluate the shared warm start as Base")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: SWEEP_DIR/ladder)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-ladder`)."""
    from cipr.core.errors import ConfigError
    from cipr.eval.ladder import LadderConfig, run_ladder

    begin()
    args = build_parser().parse_intermixed_args(argv)  # options may follow the key=value overrides
    with cli_errors("cipr-ladder", debug=args.debug or None):
        bad = [o for o in args.overrides if "=" not in o]
        if bad:
            raise ConfigError(f"{bad[0]!r}: cipr-eval options are key=value (e.g. limit=40)")
        fixed = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+") in ("model", "out_dir", "names")]
        if fixed:
            raise ConfigError(f"{fixed[0]!r}: cipr-ladder sets model, out_dir and names for every point itself")
        config = LadderConfig(eval_overrides=list(args.overrides), consistency=not args.no_consistency,
                              base=not args.no_base, out_dir=str(args.out) if args.out else None)
        report = run_ladder(args.sweep_dir, config)
    out = Path(report["out_dir"])
    print(f"cipr-ladder: {out / 'ladder.md'}, {out / 'ladder.json'}, {out / 'ladder.png'} "
          f"({len(report['work']['evaluated'])} evaluated, {len(report['work']['exported'])} exported, "
          f"{len(report['work']['skipped'])} already done)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
