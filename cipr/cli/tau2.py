"""`cipr-tau2 key=value ...`: τ²-bench airline and retail with the agent behind cipr-serve, original names
against the adapter, into results.jsonl / summary.json / report.md (`cipr-eval-compare` reads them).

Examples. Set-up, once per checkout (Python 3.12 venv `.venv-tau2` with the vendored τ² wheel):
    scripts/setup_tau2.sh
One CPU (the embedded SmolLM2-135M as agent, user simulator and judge, served in this process):
    cipr-tau2 backend=embedded domains=[airline,retail] limit=2 max_steps=6 max_new_tokens=64 threads=1 \\
        out_dir=evals/tau2_embedded
The scripted gold-replay agent and a scripted user (no model; checks the name translation end to end):
    cipr-tau2 backend=gold judge=none out_dir=evals/tau2_gold
One GPU: serve the model with vLLM, put cipr-serve in front, point cipr-tau2 at it (the paper's setting:
all 50 airline and 114 retail tasks, both arms, the user simulator on any OpenAI-compatible endpoint):
    python -m vllm.entrypoints.openai.api_server --model exports/q3b_cipr --port 8001 &
    cipr-serve backend=http://127.0.0.1:8001/v1 port=8000 &
    cipr-tau2 serve=http://127.0.0.1:8000 user_url=http://127.0.0.1:8002/v1 user_model=gpt-4.1 \\
        out_dir=evals/tau2_q3b_cipr
  or in one process: `cipr-tau2 backend=http://127.0.0.1:8001/v1 ...` (cipr-serve started here).
Several GPUs: one vLLM server with --tensor-parallel-size N, or one cipr-tau2 per domain (domains=[airline]).
Slurm: the three lines above in one job step (`srun --gres=gpu:1 bash -c '...'`).
Resume: rerun the same command; simulations already in out_dir/tau2_records.jsonl are not run again.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cipr.cli.common import run_command
from cipr.tau2.run import Tau2Config


def tau2(config: Tau2Config) -> int:
    """Run τ²-bench and print the pass rates."""
    from cipr.tau2.run import run_tau2

    summary = run_tau2(config)
    for names, e in summary["names"].items():
        acc = e["types"]["original"]["accuracy"]
        print(f"{names} names: pass rate {acc['value']:.1f} % [{acc['low']:.1f}, {acc['high']:.1f}] "
              f"over {acc['n']} tasks")
    gap = (summary.get("canonical_minus_original") or {}).get("types", {}).get("original")
    if gap and gap["value"] is not None:
        print(f"canonical − original: {gap['value']:+.1f} points over {gap['n']} paired tasks")
    print(f"report: {config.out_dir}/report.md, summary: {config.out_dir}/summary.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`cipr-tau2` entry point."""
    return run_command("cipr-tau2", __doc__, {"": (Tau2Config, tau2)}, argv)


if __name__ == "__main__":
    sys.exit(main())
