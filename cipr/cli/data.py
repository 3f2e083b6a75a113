"""`cipr-data VERB key=value ...`: fetch, inspect and export the benchmark data.

Examples (CPU; the same anywhere, no GPU involved):
    cipr-data fetch data_root=DIR                  # BFCL v4 from the pinned bfcl-eval wheel
    cipr-data stats source=rotbench                # also bfcl, toolrl, synthetic; data_root=DIR
    cipr-data stats source=messages path=FILE_OR_DIR on_bad_row=skip   # your own messages + tools rows
    cipr-data stats source=messages format=xlam path=xlam.json on_bad_row=skip    # a published format's rows
    cipr-data convert format=hermes_fc path=hermes.json out=rows.jsonl   # into messages + tools rows
    cipr-data export source=bfcl names=canonical out=bfcl.jsonl
    cipr-data export source=bfcl perturb=cost_tag_explicit names=canonical order=costly_first seed=0 \\
        out=bfcl_cost.jsonl
    cipr-data list-perturbations
    cipr-data trajectories n=64 seed=0 out=toyshop.json   # ToyShop expert trajectories (AgentInstruct)

Each exported line: id, messages, tools (OpenAI format), reference_calls (written interface; BFCL's
accepted values in `accepted`), name_map (written -> original name), and with `perturb=`: perturbation,
order, correspondence (written tool -> original tool, null for an added one).

The data root is `data_root=DIR` (as for cipr-eval), default $CIPR_DATA_ROOT or ../shared/data.
`cipr-data VERB --help` lists a verb's options.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from tqdm import tqdm

from cipr.cli.common import run_command
from cipr.core.errors import ConfigError
from cipr.core.io import atomic_write, check_output_file, write_text_atomic
from cipr.data.paths import data_root
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Example

Source = Literal["bfcl", "toolrl", "rotbench", "synthetic", "messages"]
RowFormat = Literal["auto", "messages", "xlam", "hermes_fc", "glaive"]
SOURCES: tuple[str, ...] = get_args(Source)


@dataclass
class Fetch:
    """`cipr-data fetch`: download a benchmark into a data root."""

    source: Literal["bfcl"] = "bfcl"
    data_root: str | None = None  # the data root to write into (null: $CIPR_DATA_ROOT or ../shared/data)


@dataclass
class Stats:
    """`cipr-data stats`: JSON counts per partition or level."""

    source: Source  # a benchmark, or `messages`: your own messages + tools rows at `path`
    data_root: str | None = None  # null: $CIPR_DATA_ROOT or ../shared/data
    path: str | None = None  # toolrl: a verl parquet or the raw SFT JSON; messages: the rows' file or folder
    on_bad_row: Literal["raise", "skip"] = "raise"  # messages: stop at a malformed row, or count and skip it
    format: RowFormat = "auto"  # messages: the rows' format (auto: read from the first row, reason printed)


@dataclass
class Convert:
    """`cipr-data convert`: a published format's rows (xLAM, Hermes FC, Glaive) as messages + tools JSONL."""

    path: str  # the source file or folder
    out: str  # the JSONL file to write (a new file)
    format: RowFormat = "auto"  # auto: read from the first row (the reason is printed)
    on_bad_row: Literal["raise", "skip"] = "raise"  # stop at a malformed row, or count and skip it
    overwrite: bool = False  # replace an existing `out` file


@dataclass
class Export(Stats):
    """`cipr-data export`: items as JSONL under original or canonical names, perturbed or not."""

    out: str = field(kw_only=True)  # the JSONL file to write (a new file)
    overwrite: bool = False  # replace an existing `out` file
    split: Literal["First_Turn", "Third_Turn"] = "First_Turn"  # rotbench split
    level: str = "clean"  # rotbench level
    n: int = 200  # synthetic: number of examples
    names: Literal["original", "canonical"] = "original"
    perturb: str | None = None  # a perturbation type (`cipr-data list-perturbations`)
    order: Literal["original", "costly_first"] = "original"  # tool order of the cost and latency types
    seed: int = 0
    limit: int | None = None  # only the first N items


@dataclass
class Trajectories:
    """`cipr-data trajectories`: ToyShop expert trajectories as AgentInstruct JSON."""

    out: str  # the JSON file to write (a new file)
    overwrite: bool = False  # replace an existing `out` file
    n: int = 64  # number of trajectories (tasks 0..n-1)
    seed: int = 0  # catalog and task seed


NoOptions = make_dataclass("NoOptions", [])
"""A verb without options."""


def load_source(o: Export) -> list[Example]:
    """The examples of `o.source`."""
    if o.source == "bfcl":
        from cipr.data.bfcl import load_bfcl

        return load_bfcl(o.data_root)
    if o.source == "rotbench":
        from cipr.data.rotbench import load_rotbench

        return load_rotbench(o.data_root, split=o.split, level=o.level)
    if o.source == "toolrl":
        from cipr.data import toolrl

        p = Path(o.path) if o.path else data_root(o.data_root) / "toolrl" / "rlla_4k" / "test.parquet"
        return toolrl.load_toolrl_sft(p) if p.suffix == ".json" else toolrl.load_toolrl_parquet(p)
    if o.source == "synthetic":
        from cipr.data.synthetic import generate_synthetic

        return generate_synthetic(o.n, o.seed)
    from cipr.data.row_formats import load_rows

    return load_rows(_messages_path(o.path), o.format, on_bad_row=o.on_bad_row).examples


def _messages_path(path: str | None) -> str:
    if not path:
        raise ConfigError("source=messages reads path=FILE_OR_DIR (a .jsonl, .json or .parquet file of "
                          "messages + tools rows, or a folder of them or saved by datasets)")
    return path


def stats(o: Stats) -> dict[str, Any]:
    """Counts per partition or level, as printed by `cipr-data stats` (messages: of the rows at `path`)."""
    if o.source == "messages":
        from cipr.data.row_formats import format_stats

        return format_stats(_messages_path(o.path), o.format, on_bad_row=o.on_bad_row)
    if o.path is not None or o.on_bad_row != "raise" or o.format != "auto":
        raise ConfigError(f"path, format and on_bad_row are read by `stats source=messages` only, not "
                          f"{o.source}")
    if o.source == "bfcl":
        from cipr.data.bfcl import bfcl_stats

        return bfcl_stats(o.data_root)
    if o.source == "rotbench":
        from cipr.data.rotbench import rotbench_stats

        return rotbench_stats(o.data_root)
    if o.source == "toolrl":
        from cipr.data.toolrl import toolrl_stats

        return toolrl_stats(o.data_root)
    from cipr.data.synthetic import synthetic_stats

    return synthetic_stats()


def export_record(example: Example, *, names: str = "original", perturb: str | None = None, seed: int = 0,
                  order: str = "original") -> dict[str, Any]:
    """One JSONL record of `cipr-data export` (shares the example's schemas: serialize, do not mutate)."""
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


def source_inputs(o: Stats) -> list[Path]:
    """The files and folders `o.source` reads (an output may not lie inside any of them)."""
    given = [Path(o.path)] if o.path else []
    folder = {"bfcl": "bfcl_v4", "rotbench": "rotbench", "toolrl": "toolrl"}.get(o.source)
    return [data_root(o.data_root) / folder, *given] if folder else given


def check_perturbation(o: Export) -> None:
    """Refuse a perturbation option that `apply_perturbation` would reject on the first item."""
    from cipr.perturb.registry import ORDERED_TYPES, PERTURBATIONS

    if o.perturb is None:
        if o.order != "original":
            raise ConfigError(f"order={o.order} applies to a cost or latency perturb= type")
        return
    if o.perturb not in PERTURBATIONS:
        raise ConfigError(f"perturb={o.perturb!r} is not a perturbation type; `cipr-data list-perturbations` "
                          f"lists them")
    if o.order != "original" and o.perturb not in ORDERED_TYPES:
        raise ConfigError(f"order={o.order} applies only to the cost and latency types, not {o.perturb!r}")
    if o.perturb == "in_distribution" and o.names != "canonical":
        raise ConfigError("perturb=in_distribution is defined on canonical names: add names=canonical")


def _check_count(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option}={value}: give a positive number")


def _fetch(o: Fetch) -> int:
    from cipr.data.fetch import fetch_bfcl

    print(f"BFCL v4 written to {fetch_bfcl(data_root(o.data_root))}")
    return 0


def _stats(o: Stats) -> int:
    print(json.dumps(stats(o), indent=2))
    return 0


def _list(_: Any) -> int:
    from cipr.perturb import list_perturbations

    for name, group, desc in list_perturbations():
        print(f"{name:40s} {group:24s} {desc}")
    return 0


def _trajectories(o: Trajectories) -> int:
    from cipr.data.trajectories import to_agentinstruct, toyshop_trajectories

    _check_count(o.n, "n")
    out = check_output_file(o.out, overwrite=o.overwrite)
    records = to_agentinstruct(toyshop_trajectories(o.n, seed=o.seed))
    write_text_atomic(out, json.dumps(records, indent=1, ensure_ascii=False))
    print(f"wrote {len(records)} trajectories to {o.out}", file=sys.stderr)
    return 0


def _export(o: Export) -> int:
    _check_count(o.limit, "limit")
    _check_count(o.n, "n")
    check_perturbation(o)
    out = check_output_file(o.out, inputs=source_inputs(o), overwrite=o.overwrite)
    examples = load_source(o)[: o.limit]
    n = export(examples, out, names=o.names, perturb=o.perturb, seed=o.seed, order=o.order)
    print(f"wrote {n} items to {o.out}", file=sys.stderr)
    return 0


def _convert(o: Convert) -> int:
    from cipr.data.row_formats import convert_rows, resolve_format

    out = check_output_file(o.out, inputs=[Path(o.path)], overwrite=o.overwrite)
    name, why = resolve_format(o.path, o.format)
    rows, data = convert_rows(o.path, name, on_bad_row=o.on_bad_row)
    write_text_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    skipped = ", ".join(f"{k}: {n}" for k, n in sorted(data.skipped.items())) or "none"
    print(f"wrote {len(rows)} messages + tools rows to {o.out} (format {name}: {why}; skipped {skipped})",
          file=sys.stderr)
    return 0


VERBS = {"fetch": (Fetch, _fetch), "stats": (Stats, _stats), "export": (Export, _export),
         "convert": (Convert, _convert), "list-perturbations": (NoOptions, _list),
         "trajectories": (Trajectories, _trajectories)}


def main(argv: Sequence[str] | None = None) -> int:
    """`cipr-data` entry point: bad input ends with one line on stderr and exit status 2."""
    return run_command("cipr-data", __doc__, VERBS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
