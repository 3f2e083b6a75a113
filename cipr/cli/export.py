"""`cipr-export CHECKPOINT_OR_RUN_DIR OUT_DIR`: a folder transformers and vLLM load directly.

Examples:
    one CPU or GPU (a finished run: its last stage's final weights, LoRA merged):
        cipr-export runs/qwen25_3b_cipr exports/q3b_cipr
    a given step, or an earlier stage of a run:
        cipr-export runs/qwen25_3b_cipr/grpo/checkpoint-200 exports/q3b_cipr_s200
        cipr-export runs/qwen25_3b_cipr exports/q3b_warm --stage warm_start
    a model folder from elsewhere (nothing records how it was trained, so say it):
        cipr-export /models/my_sft exports/my_sft --format hermes --names original
    add evaluation summaries to the model card of an existing export:
        cipr-export runs/qwen25_3b_cipr exports/q3b_cipr --eval evals/q3b_cipr_bfcl --eval evals/q3b_cipr_rot
    Slurm:
        sbatch --partition=P --time=00:30:00 slurm/export.sbatch runs/qwen25_3b_cipr exports/q3b_cipr
    then evaluate it (call format and tool naming come from the export's cipr_manifest.json):
        cipr-eval model=exports/q3b_cipr benchmark=bfcl backend=vllm out_dir=evals/q3b_cipr_bfcl

Exit status: 0 exported (or already up to date), 2 bad input (the message names the file and field).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cipr.cli.common import begin
from cipr.core.errors import cli_errors


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cipr-export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a cipr-train run folder, a checkpoint-<step>/ or final/ folder, or a model folder")
    p.add_argument("out_dir", help="the export folder to write")
    p.add_argument("--stage", default=None, help="export this stage's final/ of a run folder (default: its last)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights dtype (auto: as trained)")
    p.add_argument("--format", dest="call_format", default=None,
                   help="call format, for a folder outside any cipr-train run")
    p.add_argument("--names", default=None, choices=["original", "canonical", "masked"],
                   help="tool naming in training, for a folder outside any cipr-train run")
    p.add_argument("--eval", dest="eval_dirs", action="append", default=[],
                   help="a cipr-eval output folder to summarize in the model card (repeatable)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different export already in OUT_DIR (only a folder cipr-export wrote; never "
                        "the source or a folder holding it)")
    p.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (default 5GB)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`cipr-export`)."""
    from cipr.runtime.export import ExportConfig, export

    begin()
    args = build_parser().parse_args(argv)
    cfg = ExportConfig(stage=args.stage, dtype=args.dtype, call_format=args.call_format, names=args.names,
                       eval_dirs=tuple(args.eval_dirs), overwrite=args.overwrite, max_shard_size=args.max_shard_size)
    with cli_errors("cipr-export", debug=args.debug or None):
        out = export(args.source, args.out_dir, cfg)
    print(f"cipr-export: {out} (load with from_pretrained or `vllm serve`; evaluate with cipr-eval model={out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
