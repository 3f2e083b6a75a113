"""`cipr-guard`: the release gate for tool interfaces, and the guard's drift evaluation.

    cipr-guard diff OLD NEW [--report PATH] [--item ID] [--new-tools-are-drift]
    cipr-guard eval --model DIR|embedded --format toolrl --setting mild|medium \
        --policies none,naive_retry,tool_list,repair --sample study200|full --out DIR [--limit N]

OLD and NEW are JSON files holding a tool list: OpenAI `tools` (wrapped or bare functions), an MCP
`tools/list` result or its `tools` array, or a BFCL question / `cipr-data export` row (then, for a
JSON-lines file, `--item ID` picks the row). The markdown report goes to stdout, and with
`--report PATH` to PATH with the JSON report beside it (PATH with the suffix `.json`; a PATH
ending in `.json` gets the JSON, and the markdown goes beside it with `.md`).

Exit status of `diff`, as `diff`'s: 0 when the contract is unchanged (every change is drift), 1 when
it changed (any contract change: a deployment pipeline stops on it), 2 on trouble: bad input or usage
(a missing or unreadable file, a file that is not UTF-8 or not JSON, a tool list of the wrong shape, a
bad threshold, an output path that is a folder or an input), where one line on stderr says which
file, item and field, and what to do (`--debug` or `CIPR_DEBUG=1` shows the traceback instead).
Reports are written to a temporary name and renamed, and never over an input. `diff` runs on CPU in
well under a second, the same on any machine.

`eval` runs `cipr.guard.evaluate.evaluate_guard` on BFCL (the study's 200-item sample or the full
2,501 items) and writes results.jsonl, audit.jsonl and summary.json to `--out`:
- one CPU: `cipr-guard eval --model embedded --format toolrl --setting mild --sample study200
  --limit 20 --out runs/guard_cpu`;
- one GPU: the same with `--model DIR --device cuda --batch-size 32` (a transformers folder);
- several GPUs or Slurm: run one process per setting (mild, medium) or per `--shard K/N`, each with
  its own `--out`, e.g. `srun --gpus=1 cipr-guard eval ... --shard $SLURM_PROCID/$SLURM_NTASKS`.
Rerunning the same command resumes it: finished items are kept byte for byte and skipped; an
`--out` holding another configuration or another kind of run is refused (`cipr.guard.evaluate`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cipr.core.errors import EXIT_INPUT, ConfigError, UnsafeOutputError, cli_errors, debug_enabled
from cipr.guard.diff import DiffConfig, diff_interfaces, load_tool_list

EXIT_OK, EXIT_CONTRACT = 0, 1  # and EXIT_INPUT (2) on trouble, as `diff` exits
PROG = "cipr-guard"
EXAMPLE_DIFF = "cipr-guard diff tools_v1.json tools_v2.json --report reports/gate.md"
EXAMPLE_EVAL = ("cipr-guard eval --model embedded --format toolrl --setting mild --sample study200 --limit 20 "
                "--out runs/guard_cpu")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, the policy's exit status
        self.exit(EXIT_INPUT, f"{self.prog}: {message} (see {PROG} {self._subcommand()}--help)\n")

    def _subcommand(self) -> str:
        name = self.prog.split()[-1]
        return f"{name} " if name != PROG else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Release gate: classify tool-interface changes.",
                     epilog=f"Examples:\n  {EXAMPLE_DIFF}\n  {EXAMPLE_EVAL}",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("diff", help="compare two tool lists; exit 0 unchanged, 1 on a contract change, 2 on trouble",
                       description="Compare two tool lists and classify every change as drift or a contract change.",
                       epilog=f"Exit status, as diff's: {EXIT_OK} contract unchanged (drift only), {EXIT_CONTRACT} "
                              f"contract changed,\n{EXIT_INPUT} trouble (bad input or usage).\n\n"
                              f"Example:\n  {EXAMPLE_DIFF}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path)
    d.add_argument("--report", type=Path, help="write the markdown report here and the JSON beside it")
    d.add_argument("--item", help="row id when a file holds several tool lists (JSON lines)")
    d.add_argument("--new-tools-are-drift", action="store_true",
                   help="classify an added tool that overlaps nothing as drift instead of a contract change")
    d.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    d.add_argument("--rename-threshold", type=float, default=DiffConfig.rename_threshold)
    d.add_argument("--overlap-threshold", type=float, default=DiffConfig.overlap_threshold)
    e = sub.add_parser("eval", help="drift evaluation of the guard policies on BFCL",
                       epilog=f"Example:\n  {EXAMPLE_EVAL}", formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--model", required=True, help="a transformers folder or 'embedded' (SmolLM2-135M)")
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
    e.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    return parser


def _eval(args: argparse.Namespace) -> int:
    """`cipr-guard eval`: the flags spelled as `cipr-eval guard.enabled=true` options, then the one path."""
    from cipr.core.config import from_dict
    from cipr.eval.config import EvalConfig
    from cipr.guard.run import run_guard

    for name in ("limit", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    ecfg = from_dict(EvalConfig, {
        "model": args.model, "benchmark": {"name": "bfcl"}, "format": args.format, "seed": args.seed,
        "limit": args.limit, "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
        "device": args.device, "data_root": args.data_root, "out_dir": str(args.out),
        "guard": {"enabled": True, "setting": args.setting, "policies": policies, "sample": args.sample,
                  "shard": args.shard, "budget": args.budget}})
    run_guard(ecfg, progress=lambda msg: print(msg, file=sys.stderr))
    return EXIT_OK


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _report_paths(report: Path, inputs: Sequence[Path]) -> tuple[Path, Path]:
    """(markdown, json) paths for `--report`, refused when one is a folder or an input."""
    md_path, json_path = ((report.with_suffix(".md"), report) if report.suffix == ".json"
                          else (report, report.with_suffix(".json")))
    for path in (md_path, json_path):
        if path.is_dir():
            raise UnsafeOutputError(f"--report {str(report)!r}: {str(path)!r} is a folder; pass a file path such "
                                    f"as {str(path / 'diff.md')!r}")
        if any(_same(path, i) for i in inputs):
            raise UnsafeOutputError(f"--report {str(report)!r} would overwrite the input {str(path)!r}; "
                                    "write the report elsewhere")
    parent = md_path.parent
    if parent.exists() and not parent.is_dir() or any(p.exists() and not p.is_dir() for p in parent.parents):
        raise UnsafeOutputError(f"--report {str(report)!r}: a parent of it is a file, not a folder")
    return md_path, json_path


def _write_atomic(path: Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`; return it (the caller renames it into place)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    return tmp


def _diff(args: argparse.Namespace) -> int:
    config = DiffConfig(rename_threshold=args.rename_threshold, overlap_threshold=args.overlap_threshold,
                        added_tool_is_contract=not args.new_tools_are_drift)
    paths = _report_paths(args.report, (args.old, args.new)) if args.report is not None else None
    old = load_tool_list(args.old, item=args.item)
    new = load_tool_list(args.new, item=args.item)
    report = diff_interfaces(old, new, config)
    markdown = report.to_markdown()
    if paths is not None:
        md_path, json_path = paths
        md_path.parent.mkdir(parents=True, exist_ok=True)
        texts = ((md_path, markdown),
                 (json_path, json.dumps(report.to_json(), indent=2, ensure_ascii=False, default=str) + "\n"))
        tmps = []
        try:
            tmps = [(_write_atomic(path, text), path) for path, text in texts]
            for tmp, path in tmps:
                os.replace(tmp, path)
        finally:
            for tmp, _ in tmps:
                tmp.unlink(missing_ok=True)
    sys.stdout.write(markdown)
    return EXIT_CONTRACT if report.has_contract_change else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """The `cipr-guard` entry point; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        with cli_errors(PROG, debug_enabled(argv)):
            return _eval(args) if args.command == "eval" else _diff(args)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
