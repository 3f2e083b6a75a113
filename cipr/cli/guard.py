"""`cipr-guard`: the release gate for tool interfaces.

    cipr-guard diff OLD NEW [--report PATH] [--item ID] [--new-tools-are-drift]

OLD and NEW are JSON files holding a tool list: OpenAI `tools` (wrapped or bare functions), an MCP
`tools/list` result or its `tools` array, or a BFCL question / `cipr-data export` row (then, for a
JSON-lines file, `--item ID` picks the row). The markdown report goes to stdout, and with
`--report PATH` to PATH with the JSON report beside it (PATH with the suffix `.json`; a PATH
ending in `.json` gets the JSON, and the markdown goes beside it with `.md`).

Exit status: 0 when every change is drift, 2 when any contract change is present (a deployment
pipeline stops on it), 1 for unreadable input or bad usage. Runs on CPU in well under a second;
the same command on any machine (no GPU, cluster or Slurm variant is needed).
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
