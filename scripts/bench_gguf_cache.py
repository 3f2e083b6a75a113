"""Time loading the embedded model from its GGUF file against loading the cached transformers folder.

    .venv/bin/python scripts/bench_gguf_cache.py [--reps 3]

Every cipr command that loads the embedded default model (training, evaluation, the service, the
tests) reads the folder `cipr.runtime.embedded.gguf_hf_dir` converted once from the GGUF. This script
alternates the two loads (model and tokenizer, float32) in one process, checks that the tensors are
identical, and prints the conversion's one-time cost, each load's median [min-max] seconds, and last
`speedup=<median> [min-max]` (GGUF seconds / folder seconds, per repetition).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cipr.runtime.embedded import RAW_TOKENIZER, embedded_gguf, gguf_hf_dir


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    start = time.perf_counter()
    folder, name = embedded_gguf()
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        converted = gguf_hf_dir(folder, name, cache)
        print(f"conversion (once per machine): {time.perf_counter() - t:.1f} s")
        gguf_s, folder_s = [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            a = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
            AutoTokenizer.from_pretrained(folder, gguf_file=name)
            gguf_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
            AutoTokenizer.from_pretrained(converted / RAW_TOKENIZER)
            folder_s.append(time.perf_counter() - t)
            same = all(torch.equal(x, y)
                       for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
            if not same:
                raise SystemExit("the cached folder's tensors differ from the GGUF's")
        print(f"GGUF load: {spread(gguf_s)} s; cached folder load: {spread(folder_s)} s; tensors identical")
        ratios = [g / f for g, f in zip(gguf_s, folder_s, strict=True)]
        print(f"speedup={spread(ratios)} (total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
