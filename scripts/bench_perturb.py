"""Time exporting all BFCL items under every held-out perturbation type, on one core.

    .venv/bin/python scripts/bench_perturb.py [--data-root DIR] [--names original|canonical] [--out DIR]

For each held-out type (every registered type but `in_distribution`), every item is perturbed and
written as one JSONL record through the CLI's own `export_record` (the `cipr-data export perturb=`
path), to files under --out (default: a temporary directory, deleted afterwards). Loading BFCL is
timed separately and not counted. The issue's target: under 20 s in total for the 2,501 items.
Prints one line per type (wall and CPU seconds), a line with the CPU total (on a shared machine
the wall clock also counts other processes' turns), then `items_per_s=<N> total_s=<seconds>` (items
= items x types, wall clock). Most of the time goes to the export record itself
(JSON encoding), not to the perturbations.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from cipr.cli.data import export_record
from cipr.data.bfcl import load_bfcl
from cipr.perturb import HELD_OUT


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-root", "--root", dest="root", default=None, metavar="DIR",
                   help="data root (default: $CIPR_DATA_ROOT or ../shared/data)")
    p.add_argument("--names", default="original", choices=["original", "canonical"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for the JSONL files (default: a temporary one)")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    t0 = time.perf_counter()
    examples = load_bfcl(args.root)
    print(f"loaded {len(examples)} BFCL items in {time.perf_counter() - t0:.2f}s (not counted)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        total = cpu = 0.0
        n = 0
        for name in HELD_OUT:
            t, c = time.perf_counter(), time.process_time()
            with (out / f"bfcl_{name}.jsonl").open("w") as f:
                for ex in examples:
                    rec = export_record(ex, names=args.names, perturb=name, seed=args.seed)
                    f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            dt, dc = time.perf_counter() - t, time.process_time() - c
            total += dt
            cpu += dc
            n += len(examples)
            print(f"{name:28s} {len(examples)} items {dt:6.2f}s wall {dc:6.2f}s cpu")
    print(f"cpu_s={cpu:.2f}")
    print(f"items_per_s={n / total:.0f} total_s={total:.2f}")


if __name__ == "__main__":
    main()
