"""`cipr-ladder sweep_dir=DIR [eval.KEY=VALUE ...]`: export, evaluate and compare every finished point of a
ladder sweep into SWEEP_DIR/ladder/ (cipr/experiments/ladder.py); a rerun evaluates only what is new.

Examples. The whole comparison, one CPU (the embedded SmolLM2-135M, synthetic data; both commands resume):
    cipr-train -m +sweep=ladder algo=grpo,multi_interface,cipr trainer.seed=0
    cipr-ladder sweep_dir=runs/ladder/smollm2-135m eval.limit=40 eval.max_new_tokens=128 eval.threads=2
One GPU (the paper's recipe; each point trains on the GPU, then vLLM evaluates; the consistency read loads
the model in HF next to it, so leave it memory: eval.vllm.gpu_memory_utilization=0.6):
    cipr-train -m +sweep=ladder experiment=qwen25_3b_cipr data.path=/data/toolrl/rlla_4k/train.parquet
    cipr-ladder sweep_dir=runs/ladder/qwen25-3b eval.benchmark=bfcl eval.backend=vllm \\
        eval.max_new_tokens=4096 eval.vllm.gpu_memory_utilization=0.6
Several GPUs on one node (training with accelerate; evaluation with one vLLM engine across them):
    cipr-train -m +sweep=ladder experiment=qwen25_3b_cipr data.path=... launcher.num_processes=8 \\
        distributed=zero2
    cipr-ladder sweep_dir=runs/ladder/qwen25-3b eval.benchmark=bfcl eval.backend=vllm \\
        eval.vllm.tensor_parallel_size=8
Slurm (one job per point for training; then one evaluation job):
    CIPR_SLURM_PARTITION=P cipr-train -m launcher=slurm +sweep=ladder experiment=qwen25_3b_cipr data.path=...
    sbatch --partition=P --gres=gpu:1 --time=12:00:00 --wrap ".venv/bin/cipr-ladder \\
        sweep_dir=runs/ladder/qwen25-3b eval.benchmark=bfcl eval.backend=vllm \\
        eval.vllm.gpu_memory_utilization=0.6"

Every `eval.KEY=VALUE` is the cipr-eval option `KEY=VALUE` for every evaluation (configs/eval/eval.yaml;
default benchmark=synthetic). Exit status 2 with one line on bad input (`--debug` shows the traceback).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from cipr.cli.common import run_command
from cipr.experiments.ladder import LadderConfig


def ladder(config: LadderConfig) -> int:
    """Run the ladder and say what it wrote."""
    from cipr.experiments.ladder import run_ladder

    report = run_ladder(config)
    out, work = Path(report["out_dir"]), report["work"]
    print(f"cipr-ladder: {out / 'ladder.md'}, {out / 'ladder.json'}, {out / 'ladder.png'} "
          f"({len(work['evaluated'])} evaluated, {len(work['exported'])} exported, "
          f"{len(work['skipped'])} already done)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-ladder`)."""
    return run_command("cipr-ladder", __doc__, {"": (LadderConfig, ladder)}, argv)


if __name__ == "__main__":
    sys.exit(main())
