"""`cipr-eval` (Hydra) and `cipr-eval-compare RUN_A RUN_B`.

One CPU (embedded SmolLM2-135M, a small BFCL slice, both tool namings):
    cipr-eval benchmark=bfcl limit=20 perturbations=[original,typos,cost_tag_explicit] \
        names=[original,canonical] max_new_tokens=128 out_dir=evals/smoke
The inference-time guard's drift evaluation (policies none|naive_retry|tool_list|repair; `none` always runs):
    cipr-eval guard.enabled=true guard.setting=mild guard.sample=study200 limit=20 \
        max_new_tokens=128 out_dir=evals/guard_mild
One GPU:
    cipr-eval model=exports/q3b_cipr benchmark=bfcl names=[canonical] batch_size=32 max_new_tokens=4096 \
        out_dir=evals/q3b_cipr_bfcl                      # HF, batched
    cipr-eval model=exports/q3b_cipr backend=vllm benchmark=bfcl names=[canonical] out_dir=evals/q3b_cipr_bfcl
Several GPUs: one vLLM engine across them (`vllm.tensor_parallel_size=4`), or one job per benchmark.
An OpenAI-compatible endpoint (a `vllm serve` process, a hosted API; the key from $OPENAI_API_KEY):
    cipr-eval model=http://localhost:8000/v1 benchmark=rotbench out_dir=evals/rot
Slurm:
    sbatch --partition=P --gres=gpu:1 --time=04:00:00 slurm/eval.sbatch model=exports/q3b_cipr \
        benchmark=bfcl backend=vllm out_dir=evals/q3b_cipr_bfcl
Rerunning a command continues its run: items already in out_dir/results.jsonl are skipped.
Compare two runs (paired over items; writes compare.md / compare.png / compare.json):
    cipr-eval-compare evals/q3b_grpo_bfcl evals/q3b_cipr_bfcl [--out DIR]

Options are in configs/eval/eval.yaml and configs/eval/benchmark/*.yaml (see `cipr.eval.config.EvalConfig`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cipr.cli.common import begin
from cipr.core.config import EVAL_CONFIG_DIR
from cipr.core.errors import MissingInputError, cli_errors
from cipr.core.io import check_not_source

CONFIG_DIR = str(EVAL_CONFIG_DIR)


def to_eval_config(cfg: Any) -> Any:
    """A composed config as a validated EvalConfig (`cipr.eval.config.to_eval_config`, imported when used)."""
    from cipr.eval.config import to_eval_config as convert

    return convert(cfg)


def run(cfg: Any) -> dict[str, Any]:
    """Evaluate a composed config and print where the outputs are (bad input: one line, exit status 2)."""
    from cipr.core.errors import cli_errors

    with cli_errors("cipr-eval"):
        return _run(cfg)


def _run(cfg: Any) -> dict[str, Any]:
    from cipr.eval.evaluate import evaluate

    ecfg = to_eval_config(cfg)
    if ecfg.guard.enabled:
        from cipr.guard.run import run_guard

        return dict(run_guard(ecfg).summaries)
    summary = evaluate(ecfg)
    out = Path(ecfg.out_dir)
    if not ecfg.generate:
        lines = [f"consistency: {out / 'consistency.jsonl'}", f"summary: {out / 'summary.json'}",
                 f"report:  {out / 'report.md'}"]
        for names, e in summary["consistency"]["names"].items():
            kl = e["mean"].get("kl", {}).get("value")
            lines.append(f"{names} names: {len(e['types'])} types, mean KL over held-out groups {kl}")
        print("\n".join(lines))
        return summary
    lines = [f"results: {out / 'results.jsonl'}", f"summary: {out / 'summary.json'}",
             f"report:  {out / 'report.md'}", f"plots:   {out / 'plots'}"]
    for names, e in summary["names"].items():
        acc = e["types"].get(summary["config"]["original"], {}).get("accuracy", {})
        gap = e.get("gap", {})
        lines.append(f"{names} names: original {acc.get('value')} %, gap {gap.get('value')} points")
    print("\n".join(lines))
    return summary


def main() -> None:
    """`cipr-eval` entry point (Hydra parses sys.argv overrides such as `limit=20`; `--debug` shows tracebacks)."""
    import hydra

    from cipr.core.errors import EXIT_INPUT, debug_enabled, pop_debug_flag, report
    from cipr.core.io import file_in_the_way, override_value

    pop_debug_flag()
    begin()
    out_dir = override_value(sys.argv[1:], "out_dir")
    blocker = file_in_the_way(out_dir) if out_dir else None
    if blocker is not None and not debug_enabled():  # Hydra creates out_dir before the config is read
        from cipr.core.errors import UnsafeOutputError

        report("cipr-eval", UnsafeOutputError(f"out_dir={out_dir!r}: {blocker} is a file; give a folder"))
        sys.exit(EXIT_INPUT)
    hydra.main(config_path=CONFIG_DIR, config_name="eval", version_base=None)(run)()


def compare_main(argv: Sequence[str] | None = None) -> int:
    """`cipr-eval-compare RUN_A RUN_B [--out DIR]`: B − A per type and group, paired over items."""
    p = argparse.ArgumentParser(prog="cipr-eval-compare", description=compare_main.__doc__,
                                epilog="Example:\n  cipr-eval-compare evals/q3b_grpo_bfcl evals/q3b_cipr_bfcl --out evals/cmp",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", type=Path, help="baseline run directory (A)")
    p.add_argument("run_b", type=Path, help="run directory compared with it (B)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: RUN_B/compare_<A name>)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON instead of markdown")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = p.parse_args(argv)
    with cli_errors("cipr-eval-compare", debug=args.debug or None):
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from cipr.eval.compare import render_comparison, write_comparison

    for d in (args.run_a, args.run_b):
        if not (d / "results.jsonl").is_file():
            raise MissingInputError(f"{d} is not a cipr-eval output folder (no results.jsonl)", file=str(d))
    if args.out is not None:
        check_not_source(args.out, sources=[args.run_a, args.run_b], option="--out")
    cmp = write_comparison(args.run_a, args.run_b, args.out)
    print(json.dumps(cmp, indent=2) if args.json else render_comparison(cmp))
    print(f"written to {cmp['out_dir']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    main()
