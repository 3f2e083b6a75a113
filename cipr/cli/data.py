"""`cipr-data`: fetch, inspect and export the benchmark data.

Commands (CPU; the same anywhere, no GPU involved):
    cipr-data fetch bfcl --dest DIR              # BFCL v4 from the pinned bfcl-eval wheel
    cipr-data stats {bfcl,toolrl,rotbench,synthetic} [--root DIR]
    cipr-data export bfcl --names canonical --out bfcl.jsonl
    cipr-data export bfcl --perturb cost_tag_explicit --names canonical --order costly_first --seed 0 --out x.jsonl
    cipr-data list-perturbations
    cipr-data trajectories --n 64 --seed 0 --out toyshop.json   # ToyShop expert trajectories (AgentInstruct)

Each exported line: id, messages, tools (OpenAI function format), reference_calls (under the written
interface; BFCL keeps its accepted-values lists in `accepted`), name_map (written name -> original
name), and with --perturb: perturbation, order, correspondence (written tool name -> original tool
name, or null for an added tool).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cipr.canonical import canonicalize
from cipr.data.paths import data_root
from cipr.interface import Example

SOURCES = ("bfcl", "toolrl", "rotbench", "synthetic")


def load_source(source: str, root: str | None = None, *, split: str = "First_Turn", level: str = "clean",
                path: str | None = None, n: int = 200, seed: int = 0) -> list[Example]:
    """Examples of one source. ToolRL reads `--path` (a verl parquet or the raw SFT JSON)."""
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
    raise SystemExit(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")


def stats(source: str, root: str | None = None) -> dict[str, Any]:
    """Counts per partition or level, as printed by `cipr-data stats`."""
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
    raise SystemExit(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")


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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".partial")
    n = 0
    with tmp.open("w") as f:
        for ex in tqdm(examples, desc=f"export {out.name}", unit="item", disable=None):
            f.write(json.dumps(export_record(ex, **kwargs), ensure_ascii=False, default=str) + "\n")
            n += 1
    tmp.replace(out)
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cipr-data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download a benchmark into a data root")
    f.add_argument("source", choices=["bfcl"])
    f.add_argument("--dest", default=None, help="data root to write into (default: the data root)")
    s = sub.add_parser("stats", help="print JSON counts per partition or level")
    s.add_argument("source", choices=SOURCES)
    s.add_argument("--root", default=None, help="data root (default: $CIPR_DATA_ROOT or ../shared/data)")
    e = sub.add_parser("export", help="write items as JSONL under original or canonical names")
    e.add_argument("source", choices=SOURCES)
    e.add_argument("--root", default=None)
    e.add_argument("--path", default=None, help="toolrl: a verl parquet or the raw SFT JSON")
    e.add_argument("--split", default="First_Turn", help="rotbench split")
    e.add_argument("--level", default="clean", help="rotbench level")
    e.add_argument("--n", type=int, default=200, help="synthetic: number of examples")
    e.add_argument("--names", choices=["original", "canonical"], default="original")
    e.add_argument("--perturb", default=None, help="a perturbation type (see list-perturbations)")
    e.add_argument("--order", choices=["original", "costly_first"], default="original")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--limit", type=int, default=None, help="only the first N items")
    e.add_argument("--out", required=True, type=Path)
    sub.add_parser("list-perturbations", help="every perturbation type with its group and description")
    t = sub.add_parser("trajectories", help="write ToyShop expert trajectories as AgentInstruct JSON")
    t.add_argument("--n", type=int, default=64, help="number of trajectories (tasks 0..n-1)")
    t.add_argument("--seed", type=int, default=0, help="catalog and task seed")
    t.add_argument("--out", required=True, type=Path)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "fetch":
        from cipr.data.fetch import fetch_bfcl

        dest = fetch_bfcl(Path(args.dest) if args.dest else data_root())
        print(f"BFCL v4 written to {dest}")
    elif args.cmd == "stats":
        print(json.dumps(stats(args.source, args.root), indent=2))
    elif args.cmd == "list-perturbations":
        from cipr.perturb import list_perturbations

        for name, group, desc in list_perturbations():
            print(f"{name:40s} {group:24s} {desc}")
    elif args.cmd == "trajectories":
        from cipr.data.trajectories import to_agentinstruct, toyshop_trajectories

        records = to_agentinstruct(toyshop_trajectories(args.n, seed=args.seed))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1, ensure_ascii=False))
        print(f"wrote {len(records)} trajectories to {args.out}", file=sys.stderr)
    elif args.cmd == "export":
        exs = load_source(args.source, args.root, split=args.split, level=args.level, path=args.path,
                          n=args.n, seed=args.seed)
        if args.limit is not None:
            exs = exs[: args.limit]
        n = export(exs, args.out, names=args.names, perturb=args.perturb, seed=args.seed, order=args.order)
        print(f"wrote {n} items to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
