"""`cipr-guard diff old=OLD new=NEW [report=PATH]`: the release gate for tool interfaces.

Examples (CPU, the same on any machine):
    cipr-guard diff old=tools_v1.json new=tools_v2.json report=reports/gate.md
    cipr-guard diff old=bfcl_v1.jsonl new=bfcl_v2.jsonl item=simple_python_0 added_tool_is_contract=false

OLD and NEW are JSON files holding a tool list: OpenAI `tools` (wrapped or bare functions), an MCP
`tools/list` result or its `tools` array, or a BFCL question / `cipr-data export` row (then, for a
JSON-lines file, `item=ID` picks the row). The markdown report goes to stdout, and with `report=PATH`
to PATH with the JSON beside it (suffix `.json`; a PATH ending in `.json` gets the JSON, the markdown
`.md`), written atomically and never over an input.

Exit status, as `diff`'s: 0 when the contract is unchanged (every change is drift), 1 when it changed
(a deployment pipeline stops on it), 2 on bad input or usage, with one line on stderr naming the
file, item and field and what to do (`--debug` or `CIPR_DEBUG=1` shows the traceback).

The guard's drift evaluation on BFCL is an option of cipr-eval: `cipr-eval guard.enabled=true ...`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cipr.cli.common import run_command
from cipr.core.io import check_output_file, write_json_atomic, write_text_atomic
from cipr.guard.diff import DiffConfig, diff_interfaces, load_tool_list

EXIT_OK, EXIT_CONTRACT = 0, 1  # and EXIT_INPUT (2) on trouble, as `diff` exits


@dataclass(frozen=True, kw_only=True)
class DiffCommand(DiffConfig):
    """`cipr-guard diff`: classify every change between two tool lists as drift or a contract change.

    - `rename_threshold`: the least similarity (0-1) of a removed and an added tool paired as a rename.
    - `overlap_threshold`: the least description overlap (0-1) of an added tool that resembles an old one.
    - `added_tool_is_contract`: an added tool that overlaps nothing is a contract change (false: drift).
    """

    old: str  # the tool list before (a JSON or JSON-lines file)
    new: str  # the tool list after
    report: str | None = None  # write the markdown report here and the JSON beside it
    item: str | None = None  # the row id when a file holds several tool lists (JSON lines)


def diff(cmd: DiffCommand) -> int:
    """Print the report (and write it to `cmd.report`); the exit status says whether the contract changed."""
    paths: tuple[Path, ...] = ()
    if cmd.report is not None:  # (markdown, JSON), the given name as it is
        md = Path(cmd.report)
        paths = (md.with_suffix(".md"), md) if md.suffix == ".json" else (md, md.with_suffix(".json"))
        for path in paths:
            check_output_file(path, inputs=(cmd.old, cmd.new), overwrite=True, option="report")
    old, new = (load_tool_list(Path(p), item=cmd.item) for p in (cmd.old, cmd.new))
    result = diff_interfaces(old, new, cmd)
    markdown = result.to_markdown()
    if paths:
        write_json_atomic(paths[1], result.to_json())
        write_text_atomic(paths[0], markdown)
    sys.stdout.write(markdown)
    return EXIT_CONTRACT if result.has_contract_change else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """The `cipr-guard` entry point; returns the exit status (see the module docstring)."""
    return run_command("cipr-guard", __doc__, {"diff": (DiffCommand, diff)}, argv)


if __name__ == "__main__":
    sys.exit(main())
