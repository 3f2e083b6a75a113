"""`cipr-data`: fetch, inspect and export the benchmark data.

Examples (CPU; the same anywhere, no GPU involved):
    cipr-data fetch bfcl --data-root DIR         # BFCL v4 from the pinned bfcl-eval wheel
    cipr-data stats {bfcl,toolrl,rotbench,synthetic} [--data-root DIR]
    cipr-data stats messages --path FILE_OR_DIR [--on-bad-row skip]   # your own messages + tools rows
    cipr-data export bfcl --names canonical --out bfcl.jsonl
    cipr-data export bfcl --perturb cost_tag_explicit --names canonical --order costly_first --seed 0 --out x.jsonl
    cipr-data list-perturbations
    cipr-data trajectories --n 64 --seed 0 --out toyshop.json   # ToyShop expert trajectories (AgentInstruct)

Each exported line: id, messages, tools (OpenAI function format), reference_calls (under the written
interface; BFCL keeps its accepted-values lists in `accepted`), name_map (written name -> original
name), and with --perturb: perturbation, order, correspondence (written tool name -> original tool
name, or null for an added tool).

The data root is `--data-root DIR` (`--root` is accepted too; `data_root=DIR` for cipr-eval), default
$CIPR_DATA_ROOT or ../shared/data. `cipr-data COMMAND --help` lists a command's options with an example.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cipr.core.errors import ConfigError, cli_errors
from cipr.core.io import atomic_write, check_output_file, write_text_atomic
from cipr.data.paths import data_root
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Example

SOURCES = ("bfcl", "toolrl", "rotbench", "synthetic", "messages")
ROOT_HELP = "data root (default: $CIPR_DATA_ROOT or ../shared/data)"


def load_source(source: str, root: str | None = None, *, split: str = "First_Turn", level: str = "clean",
                path: str | None = None, n: int = 200, seed: int = 0) -> list[Example]:
    """Examples of one source. ToolRL reads `--path` (a verl parquet or the raw SFT JSON), messages `--path`
    (a file or folder of messages + tools rows; required)."""
    if source == "bfcl":
        from cipr.data.bfcl import load_bfcl

        return load_bfcl(root)
    if source == "rotbench":
        from cipr.data.rotbench import load_rotbench

        return load_rotbench(root, split=split, level=level)
    if source == "toolrl":
        from cipr.data import toolrl

        p = Path(path) if path else data_root(root) / "toolrl" / "rlla_4k" / "test.parquet"
        return toolrl.load_toolrl_sft(p) if p.suffix == ".json" else toolrl.load_toolrl_parquet(p)
    if source == "synthetic":
        from cipr.data.synthetic import generate_synthetic

        return generate_synthetic(n, seed)
    if source == "messages":
        from cipr.data.messages import load_messages

        return load_messages(_messages_path(path)).examples
    raise ConfigError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")


def _messages_path(path: str | None) -> str:
    if not path:
        raise ConfigError("the messages source reads --path FILE_OR_DIR (a .jsonl, .json or .parquet file of "
                          "messages + tools rows, or a folder of them or saved by datasets)")
    return path


def stats(source: str, root: str | None = None, *, path: str | None = None,
          on_bad_row: str = "raise") -> dict[str, Any]:
    """Counts per partition or level, as printed by `cipr-data stats` (messages: of the rows at `path`)."""
    if source == "messages":
        from cipr.data.messages import load_messages, messages_stats

        return messages_stats(load_messages(_messages_path(path), on_bad_row=on_bad_row))  # type: ignore[arg-type]
    if path is not None or on_bad_row != "raise":
        raise ConfigError(f"--path and --on-bad-row are read by `cipr-data stats messages` only, not {source}")
    if source == "bfcl":
        from cipr.data.bfcl import bfcl_stats

        return bfcl_stats(root)
    if source == "rotbench":
        from cipr.data.rotbench import rotbench_stats

        return rotbench_stats(root)
    if source == "toolrl":
        from cipr.data.toolrl import toolrl_stats

        return toolrl_stats(root)
    if source == "synthetic":
        from cipr.data.synthetic import synthetic_stats

        return synthetic_stats()
    raise ConfigError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")


def export_record(example: Example, *, names: str = "original", perturb: str | None = None, seed: int = 0,
                  order: str = "original") -> dict[str, Any]:
    """One JSONL record of `cipr-data export` (shares the example's schemas: serialize it, do not mutate it)."""
    correspondence = None
    original_names = {t.name: t.name for t in example.interface}
    if perturb:
        from cipr.perturb import apply_perturbation

        example, corr = apply_perturbation(example, perturb, seed=seed, names=names, order=order)
        correspondence = corr.to_json()
        name_map = {k: v for k, v in correspondence.items()}
    elif names == "canonical":
        example, nmap = canonicalize(example)
        name_map = nmap.backward
    else:
        name_map = original_names
    rec: dict[str, Any] = {
        "id": example.id,
        "partition": example.partition,
        "messages": [m.to_dict() for m in example.messages],
        "tools": example.interface.to_openai(copy_schema=False),  # serialized at once
        "reference_calls": [c.to_dict() for c in example.reference],
        "name_map": name_map,
    }
    if example.accepted is not None:
        rec["accepted"] = [{k: list(v) for k, v in a.items()} for a in example.accepted]
    if example.alternatives:
        rec["alternatives"] = [[c.to_dict() for c in alt] for alt in example.alternatives]
    if example.response is not None:
        rec["response"] = example.response
    if perturb:
        rec.update({"perturbation": perturb, "order": order, "correspondence": correspondence})
    return rec


def export(examples: Iterable[Example], out: Path, **kwargs: Any) -> int:
    """Write one JSON object per example; returns the count. Writes to a temp file, then renames."""
    n = 0
    with atomic_write(out) as f:
        for ex in tqdm(examples, desc=f"export {out.name}", unit="item", disable=None):
            f.write(json.dumps(export_record(ex, **kwargs), ensure_ascii=False, default=str) + "\n")
            n += 1
    return n


def source_inputs(source: str, root: str | None, path: str | None) -> list[Path]:
    """The files and folders `source` reads (an output may not lie inside any of them)."""
    if source == "synthetic":
        return []
    if source == "messages":
        return [Path(path)] if path else []
    folder = {"bfcl": "bfcl_v4", "rotbench": "rotbench", "toolrl": "toolrl"}[source]
    inputs = [data_root(root) / folder]
    return inputs + [Path(path)] if path else inputs


def check_perturbation(perturb: str | None, names: str, order: str) -> None:
    """Refuse a perturbation option that `apply_perturbation` would reject on the first item."""
    from cipr.perturb.registry import ORDERED_TYPES, PERTURBATIONS

    if perturb is None:
        if order != "original":
            raise ConfigError(f"--order {order} applies to a cost or latency --perturb type")
        return
    if perturb not in PERTURBATIONS:
        raise ConfigError(f"--perturb {perturb!r} is not a perturbation type; `cipr-data list-perturbations` "
                          f"lists them")
    if order != "original" and perturb not in ORDERED_TYPES:
        raise ConfigError(f"--order {order} applies only to the cost and latency types, not {perturb!r}")
    if perturb == "in_distribution" and names != "canonical":
        raise ConfigError("--perturb in_distribution is defined on canonical names: add --names canonical")


def _check_count(value: int | None, option: str, *, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise ConfigError(f"{option} {value}: give a positive number" + (" (or 0)" if allow_zero else ""))


def _data_root_option(p: argparse.ArgumentParser, *aliases: str, help: str = ROOT_HELP) -> None:
    """The data root, spelled `--data-root` on every command (old spellings kept as aliases)."""
    p.add_argument("--data-root", *aliases, dest="root", default=None, metavar="DIR", help=help)


def _sub(sub: Any, name: str, help: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help, epilog=f"Example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cipr-data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = _sub(sub, "fetch", "download a benchmark into a data root", "cipr-data fetch bfcl --data-root ../shared/data")
    f.add_argument("source", choices=["bfcl"])
    _data_root_option(f, "--dest", help="data root to write into (default: $CIPR_DATA_ROOT or ../shared/data)")
    s = _sub(sub, "stats", "print JSON counts per partition or level", "cipr-data stats rotbench --data-root DIR")
    s.add_argument("source", choices=SOURCES)
    _data_root_option(s, "--root")
    s.add_argument("--path", default=None, help="messages: the .jsonl/.json/.parquet file or folder to count")
    s.add_argument("--on-bad-row", choices=["raise", "skip"], default="raise",
                   help="messages: stop at the first malformed row (raise) or count and skip them (skip)")
    e = _sub(sub, "export", "write items as JSONL under original or canonical names",
             "cipr-data export bfcl --perturb cost_tag_explicit --names canonical --out bfcl_cost.jsonl")
    e.add_argument("source", choices=SOURCES)
    _data_root_option(e, "--root")
    e.add_argument("--path", default=None, help="toolrl: a verl parquet or the raw SFT JSON; messages: the "
                   "file or folder of messages + tools rows")
    e.add_argument("--split", default="First_Turn", help="rotbench split")
    e.add_argument("--level", default="clean", help="rotbench level")
    e.add_argument("--n", type=int, default=200, help="synthetic: number of examples")
    e.add_argument("--names", choices=["original", "canonical"], default="original")
    e.add_argument("--perturb", default=None, help="a perturbation type (see list-perturbations)")
    e.add_argument("--order", choices=["original", "costly_first"], default="original")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--limit", type=int, default=None, help="only the first N items")
    e.add_argument("--out", required=True, type=Path, help="the JSONL file to write (a new file)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    lp = _sub(sub, "list-perturbations", "every perturbation type with its group and description",
              "cipr-data list-perturbations")
    t = _sub(sub, "trajectories", "write ToyShop expert trajectories as AgentInstruct JSON",
             "cipr-data trajectories --n 64 --seed 0 --out toyshop.json")
    t.add_argument("--n", type=int, default=64, help="number of trajectories (tasks 0..n-1)")
    t.add_argument("--seed", type=int, default=0, help="catalog and task seed")
    t.add_argument("--out", required=True, type=Path, help="the JSON file to write (a new file)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    for sp in (f, s, e, lp, t):
        sp.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`cipr-data` entry point: bad input ends with one line on stderr and exit status 2."""
    args = _parser().parse_args(argv)
    with cli_errors("cipr-data", debug=getattr(args, "debug", False) or None):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.cmd == "fetch":
        from cipr.data.fetch import fetch_bfcl

        dest = fetch_bfcl(data_root(args.root))
        print(f"BFCL v4 written to {dest}")
    elif args.cmd == "stats":
        print(json.dumps(stats(args.source, args.root, path=args.path, on_bad_row=args.on_bad_row), indent=2))
    elif args.cmd == "list-perturbations":
        from cipr.perturb import list_perturbations

        for name, group, desc in list_perturbations():
            print(f"{name:40s} {group:24s} {desc}")
    elif args.cmd == "trajectories":
        from cipr.data.trajectories import to_agentinstruct, toyshop_trajectories

        _check_count(args.n, "--n")
        check_output_file(args.out, overwrite=args.overwrite)
        records = to_agentinstruct(toyshop_trajectories(args.n, seed=args.seed))
        write_text_atomic(args.out, json.dumps(records, indent=1, ensure_ascii=False))
        print(f"wrote {len(records)} trajectories to {args.out}", file=sys.stderr)
    elif args.cmd == "export":
        _check_count(args.limit, "--limit")
        _check_count(args.n, "--n")
        check_perturbation(args.perturb, args.names, args.order)
        check_output_file(args.out, inputs=source_inputs(args.source, args.root, args.path), overwrite=args.overwrite)
        exs = load_source(args.source, args.root, split=args.split, level=args.level, path=args.path,
                          n=args.n, seed=args.seed)
        if args.limit is not None:
            exs = exs[: args.limit]
        n = export(exs, args.out, names=args.names, perturb=args.perturb, seed=args.seed, order=args.order)
        print(f"wrote {n} items to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
