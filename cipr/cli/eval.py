"""`cipr-eval` (Hydra) and `cipr-eval-compare run_a=DIR run_b=DIR`.

Examples. One CPU (embedded SmolLM2-135M, a small BFCL slice, both tool namings):
    cipr-eval benchmark=bfcl limit=20 perturbations=[original,typos,cost_tag_explicit] \\
        names=[original,canonical] max_new_tokens=128 out_dir=evals/smoke
The inference-time guard's drift evaluation (policies none|naive_retry|tool_list|repair; `none` always runs):
    cipr-eval guard.enabled=true guard.setting=mild guard.sample=study200 limit=20 \\
        max_new_tokens=128 out_dir=evals/guard_mild
  one GPU: add model=DIR device=cuda batch_size=32; several GPUs or Slurm: one process per setting or
  shard, e.g. `srun --gpus=1 cipr-eval guard.enabled=true ... guard.shard=$SLURM_PROCID/$SLURM_NTASKS
  out_dir=evals/guard_$SLURM_PROCID`.
One GPU:
    cipr-eval model=exports/q3b_cipr benchmark=bfcl names=[canonical] batch_size=32 max_new_tokens=4096 \\
        out_dir=evals/q3b_cipr_bfcl                      # HF, batched
    cipr-eval model=exports/q3b_cipr backend=vllm benchmark=bfcl names=[canonical] out_dir=evals/q3b_cipr_bfcl
Several GPUs: one vLLM engine across them (`vllm.tensor_parallel_size=4`), or one job per benchmark.
An OpenAI-compatible endpoint (a `vllm serve` process, a hosted API; the key from $OPENAI_API_KEY):
    cipr-eval model=http://localhost:8000/v1 benchmark=rotbench out_dir=evals/rot
Slurm:
    sbatch --partition=P --gres=gpu:1 --time=04:00:00 slurm/eval.sbatch model=exports/q3b_cipr \\
        benchmark=bfcl backend=vllm out_dir=evals/q3b_cipr_bfcl
Rerunning a command continues its run: items already in out_dir/results.jsonl are skipped.
Compare two runs (paired over items; writes compare.md / compare.png / compare.json):
    cipr-eval-compare run_a=evals/q3b_grpo_bfcl run_b=evals/q3b_cipr_bfcl [out=DIR] [json=true]

Options are in configs/eval/eval.yaml and configs/eval/benchmark/*.yaml (see `cipr.eval.config.EvalConfig`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cipr.cli.common import begin, run_command
from cipr.core.config import EVAL_CONFIG_DIR
from cipr.core.errors import MissingInputError
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

        keys = ("model", "out_dir", "seed", "limit", "partitions", "data_root", "batch_size",
                "max_new_tokens", "device", "dtype", "threads", "attn_implementation")
        result = run_guard(ecfg.guard, call_format=ecfg.call_format, **{k: getattr(ecfg, k) for k in keys})
        return dict(result.summaries)
    summary = evaluate(ecfg)
    out = Path(ecfg.out_dir)
    if not ecfg.generate:
        lines = [f"consistency: {out / 'consistency.jsonl'}", f"summary: {out / 'summary.json'}",
                 f"report:  {out / 'report.md'}"]
        for names, e in summary["consistency"]["names"].items():
            kl = e["mean"].get("kl", {}).get("value")
            mean = f"mean KL over held-out groups {kl:.4f}" if kl is not None else \
                "no held-out group to average (only the original interface was read)"
            lines.append(f"{names} names: {len(e['types'])} types, {mean}")
        print("\n".join(lines))
        return summary
    lines = [f"results: {out / 'results.jsonl'}", f"summary: {out / 'summary.json'}",
             f"report:  {out / 'report.md'}", f"plots:   {out / 'plots'}"]
    for names, e in summary["names"].items():
        lines.append(f"{names} names: {accuracy_line(e, summary['config']['original'])}")
    print("\n".join(lines))
    return summary


def accuracy_line(entry: dict[str, Any], original: str) -> str:
    """`original 62.5 % (n items), held-out mean 50.0 %, gap -12.5 points` for one naming of summary.json,
    each part said in words where it is missing (no held-out type asked for, no original items)."""
    acc = entry["types"].get(original, {}).get("accuracy", {})
    parts = [f"original {acc['value']:.1f} %" if acc.get("value") is not None else "no original items"]
    mean = entry.get("mean", {}).get("accuracy", {}).get("value")
    gap = entry.get("gap", {}).get("value")
    if mean is not None:
        parts.append(f"held-out mean {mean:.1f} %")
    parts.append(f"gap {gap:+.1f} points" if gap is not None else
                 "no gap (no held-out perturbation type was evaluated)")
    return ", ".join(parts)


def main() -> None:
    """`cipr-eval` entry point (Hydra reads the overrides, e.g. `limit=20`; `--debug` shows tracebacks)."""
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
    from cipr.cli.common import check_hydra_command
    from cipr.eval.config import eval_config_from_dict

    check_hydra_command("cipr-eval", sys.argv[1:], Path(CONFIG_DIR), "eval", None, eval_config_from_dict)
    hydra.main(config_path=CONFIG_DIR, config_name="eval", version_base=None)(run)()


@dataclass
class CompareOptions:
    """`cipr-eval-compare`: run B − run A per type and group, paired over items."""

    run_a: str  # the baseline: a cipr-eval output folder
    run_b: str  # the run compared with it
    out: str | None = None  # output folder (null: RUN_B/compare_<A name>)
    json: bool = False  # print the comparison as JSON instead of markdown


def compare_main(argv: Sequence[str] | None = None) -> int:
    """`cipr-eval-compare run_a=DIR run_b=DIR [out=DIR] [json=true]` (module docstring)."""
    return run_command("cipr-eval-compare", __doc__, {"": (CompareOptions, compare)}, argv)


def compare(opts: CompareOptions) -> int:
    """Write and print the comparison of two cipr-eval output folders."""
    from cipr.eval.compare import render_comparison, write_comparison

    for d in (Path(opts.run_a), Path(opts.run_b)):
        if not (d / "results.jsonl").is_file():
            raise MissingInputError(f"{d} is not a cipr-eval output folder (no results.jsonl)", file=str(d))
    if opts.out is not None:
        check_not_source(opts.out, sources=[opts.run_a, opts.run_b], option="out")
    cmp = write_comparison(opts.run_a, opts.run_b, opts.out)
    print(json.dumps(cmp, indent=2) if opts.json else render_comparison(cmp))
    print(f"written to {cmp['out_dir']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    main()
