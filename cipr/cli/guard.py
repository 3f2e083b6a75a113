"""`cipr-guard`: the release gate for tool interfaces, and the guard's drift evaluation.

    cipr-guard diff OLD NEW [--report PATH] [--item ID] [--new-tools-are-drift]
    cipr-guard eval --model DIR|embedded|tiny --format toolrl --setting mild|medium \
        --policies none,naive_retry,tool_list,repair --sample study200|full --out DIR [--limit N]

OLD and NEW are JSON files holding a tool list: OpenAI `tools` (wrapped or bare functions), an MCP
`tools/list` result or its `tools` array, or a BFCL question / `cipr-data export` row (then, for a
JSON-lines file, `--item ID` picks the row). The markdown report goes to stdout, and with
`--report PATH` to PATH with the JSON report beside it (PATH with the suffix `.json`; a PATH
ending in `.json` gets the JSON, and the markdown goes beside it with `.md`).

`diff` exit status: 0 when every change is drift, 2 when any contract change is present (a
deployment pipeline stops on it), 1 for unreadable input or bad usage. It runs on CPU in well under
a second, the same on any machine.

`eval` runs `cipr.guard.evaluate.evaluate_guard` on BFCL (the study's 200-item sample or the full
2,501 items) and writes results.jsonl, audit.jsonl and summary.json to `--out`:
- one CPU: `cipr-guard eval --model embedded --format toolrl --setting mild --sample study200
  --limit 20 --out runs/guard_cpu` (`--model tiny` is a seconds-long smoke test: garbage replies);
- one GPU: the same with `--model DIR --device cuda --batch-size 32` (a transformers folder);
- several GPUs or Slurm: run one process per setting (mild, medium) or per `--shard K/N`, each with
  its own `--out`, e.g. `srun --gpus=1 cipr-guard eval ... --shard $SLURM_PROCID/$SLURM_NTASKS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from cipr.errors import DataError
from cipr.guard.diff import DiffConfig, diff_interfaces, load_tool_list

EXIT_OK, EXIT_INPUT, EXIT_CONTRACT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 1, so 2 always means a contract change
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cipr-guard", description="Release gate: classify tool-interface changes.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("diff", help="compare two tool lists; exit 2 on a contract change")
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path)
    d.add_argument("--report", type=Path, help="write the markdown report here and the JSON beside it")
    d.add_argument("--item", help="row id when a file holds several tool lists (JSON lines)")
    d.add_argument("--new-tools-are-drift", action="store_true",
                   help="classify an added tool that overlaps nothing as drift instead of a contract change")
    d.add_argument("--rename-threshold", type=float, default=DiffConfig.rename_threshold)
    d.add_argument("--overlap-threshold", type=float, default=DiffConfig.overlap_threshold)
    e = sub.add_parser("eval", help="drift evaluation of the guard policies on BFCL")
    e.add_argument("--model", required=True, help="a transformers folder, 'embedded' (SmolLM2-135M) or 'tiny'")
    e.add_argument("--format", default="toolrl", help="call format name (cipr.formats), or 'json' for the "
                                                      "tokenizer's native tools template with JSON calls")
    e.add_argument("--setting", choices=("mild", "medium"), default="mild")
    e.add_argument("--policies", default="none,naive_retry,tool_list,repair")
    e.add_argument("--sample", choices=("study200", "full"), default="study200")
    e.add_argument("--limit", type=int, help="only the first N items of the sample (smoke runs)")
    e.add_argument("--shard", help="K/N: every N-th item starting at K (one process per shard)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--budget", type=int, default=512, help="max new tokens per guard model call")
    e.add_argument("--max-new-tokens", type=int, default=512, help="max new tokens per task turn")
    e.add_argument("--batch-size", type=int, default=8)
    e.add_argument("--device", default="auto", help="auto, cpu or cuda")
    e.add_argument("--data-root", help="the data root holding bfcl_v4/ (default: cipr.data.paths.data_root())")
    e.add_argument("--out", type=Path, required=True)
    return parser


def _load_model(spec: str, device: str):
    import torch

    if spec == "tiny":
        from cipr.testing import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer)
    elif spec == "embedded":
        from cipr.embedded import load_embedded

        model, tokenizer = load_embedded()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(spec).is_dir():
            raise DataError("not a model folder (pass a transformers folder, 'embedded' or 'tiny')", file=spec)
        tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(spec, local_files_only=True, dtype="auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    return model, tokenizer


def _eval(args: argparse.Namespace) -> int:
    from cipr.data.bfcl import load_bfcl
    from cipr.guard.backend import HFBackend
    from cipr.guard.evaluate import STUDY_PARTITIONS, GuardEvalConfig, evaluate_guard, study_sample

    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    config = GuardEvalConfig(setting=args.setting, policies=policies, seed=args.seed, budget=args.budget,
                             max_new_tokens=args.max_new_tokens)
    call_format = None if args.format == "json" else args.format
    model, tokenizer = _load_model(args.model, args.device)
    backend = HFBackend(model, tokenizer, call_format, batch_size=args.batch_size)
    if args.sample == "study200":
        examples = study_sample(load_bfcl(args.data_root, partitions=STUDY_PARTITIONS), seed=args.seed)
    else:
        examples = load_bfcl(args.data_root)
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        if not 0 <= k < n:
            raise DataError(f"--shard must be K/N with 0 <= K < N, got {args.shard}", field="shard")
        examples = examples[k::n]
    if args.limit is not None:
        examples = examples[: args.limit]
    result = evaluate_guard(examples, backend, config, call_format=backend.call_format, out_dir=args.out,
                            progress=lambda msg: print(msg, file=sys.stderr))
    for policy, summary in result.summaries.items():
        line = ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())
        print(f"{policy}: {line}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "eval":
        try:
            return _eval(args)
        except (DataError, ValueError) as e:
            print(f"cipr-guard: {e}", file=sys.stderr)
            return EXIT_INPUT
    try:
        old = load_tool_list(args.old, item=args.item)
        new = load_tool_list(args.new, item=args.item)
        config = DiffConfig(rename_threshold=args.rename_threshold, overlap_threshold=args.overlap_threshold,
                            added_tool_is_contract=not args.new_tools_are_drift)
        report = diff_interfaces(old, new, config)
    except DataError as e:
        print(f"cipr-guard: {e}", file=sys.stderr)
        return EXIT_INPUT
    markdown = report.to_markdown()
    sys.stdout.write(markdown)
    if args.report is not None:
        md_path, json_path = ((args.report.with_suffix(".md"), args.report) if args.report.suffix == ".json"
                              else (args.report, args.report.with_suffix(".json")))
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(markdown, encoding="utf-8")
        json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False, default=str) + "\n",
                             encoding="utf-8")
    return EXIT_CONTRACT if report.has_contract_change else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
