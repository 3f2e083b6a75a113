"""`cipr-export run_dir=CHECKPOINT_OR_RUN_DIR out_dir=DIR`: a folder transformers and vLLM load directly.

Examples:
    one CPU or GPU (a finished run: its last stage's final weights, LoRA merged):
        cipr-export run_dir=runs/qwen25_3b_cipr out_dir=exports/q3b_cipr
    a given step, or an earlier stage of a run:
        cipr-export run_dir=runs/qwen25_3b_cipr/grpo/checkpoint-200 out_dir=exports/q3b_cipr_s200
        cipr-export run_dir=runs/qwen25_3b_cipr out_dir=exports/q3b_warm stage=warm_start
    a model folder from elsewhere (nothing records how it was trained, so say it):
        cipr-export run_dir=/models/my_sft out_dir=exports/my_sft call_format=hermes names=original
    add evaluation summaries to the model card of an existing export:
        cipr-export run_dir=runs/qwen25_3b_cipr out_dir=exports/q3b_cipr \\
            eval_dirs=[evals/q3b_cipr_bfcl,evals/q3b_cipr_rot]
    Slurm:
        sbatch --partition=P --time=00:30:00 slurm/export.sbatch run_dir=runs/qwen25_3b_cipr \\
            out_dir=exports/q3b_cipr
    then evaluate it (call format and tool naming come from the export's cipr_manifest.json):
        cipr-eval model=exports/q3b_cipr benchmark=bfcl backend=vllm out_dir=evals/q3b_cipr_bfcl

Exit status: 0 exported (or already up to date), 2 bad input (the message names the file and field).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from cipr.cli.common import run_command
from cipr.runtime.export import ExportConfig


@dataclass(kw_only=True)
class ExportCommand(ExportConfig):
    """`cipr-export`'s options: what to export, where, and how (`ExportConfig`)."""

    run_dir: str  # a cipr-train run folder, a checkpoint-<step>/ or final/ folder, or a model folder
    out_dir: str  # the export folder to write (overwrite=true replaces only a folder cipr-export wrote)


def run(cmd: ExportCommand) -> int:
    """Export and say how to load the result."""
    from cipr.runtime.export import export

    out = export(cmd.run_dir, cmd.out_dir, cmd)
    print(f"cipr-export: {out} (load it with from_pretrained or `vllm serve`; cipr-eval model={out})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-export`)."""
    return run_command("cipr-export", __doc__, {"": (ExportCommand, run)}, argv)


if __name__ == "__main__":
    sys.exit(main())
