"""Peak resident memory and time of one GRPO update on CPU, glibc's default allocator settings against
`cipr.memory.limit_heap_growth` (fixed mmap threshold, heap trimmed on free).

Each setting runs in its own process (allocator settings and peak RSS are per process): SmolLM2-135M
(bottom 20 layers frozen, as the main job), one canonical/perturbed pair x G=4 replayed completions of
<= 96 tokens, 1-2 tools per interface (the main job's shapes, built with bench_step's code), then `--repeats` updates (loss, backward, optimizer step) of `--algo`. Printed
per setting: the peak RSS added by the updates over what model and trainer hold, and the median update
time; last line `rss_ratio=<limited/default> time_ratio=<limited/default>`.

    .venv/bin/python scripts/bench_memory.py                      # algo=cipr, 2 updates per setting
    .venv/bin/python scripts/bench_memory.py --algo grpo --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(algo: str, repeats: int, limited: bool) -> dict[str, float]:
    if limited:
        from cipr.memory import limit_heap_growth

        os.environ["CIPR_LOW_MEMORY"] = "1"
        assert limit_heap_growth(), "no glibc here: nothing to compare"
    import resource
    import tempfile

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_step

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB (Linux)

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer, fmt, prompts = bench_step.build("smollm2", Path(tmp), 1, 4, 96)
        trainer = bench_step.make_trainer(algo, model, tokenizer, fmt, prompts, 4, 1, 96, Path(tmp))
        inputs = bench_step.batch_rows(trainer, 0, 1, 4)
        torch.manual_seed(0)
        batch = trainer._generate_and_score_completions(inputs)
        base, times = peak(), []
        for _ in range(repeats):
            start = time.perf_counter()
            loss = trainer.compute_loss(trainer.model, batch)
            trainer.accelerator.backward(loss)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()
            times.append(time.perf_counter() - start)
    return {"base_gb": base, "added_gb": peak() - base, "update_s": statistics.median(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", default="cipr", choices=("grpo", "multi_interface", "cipr"))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", choices=("default", "limited"), help=argparse.SUPPRESS)
    args = p.parse_args()
    started = time.perf_counter()
    if args.child:
        print(json.dumps(child(args.algo, args.repeats, args.child == "limited")))
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "CIPR_LOW_MEMORY"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    out = {}
    for setting in ("default", "limited"):
        run = subprocess.run([sys.executable, __file__, "--algo", args.algo, "--repeats", str(args.repeats),
                              "--child", setting], capture_output=True, text=True, env=env, check=False)
        if run.returncode != 0:
            sys.exit(f"{setting} run failed:\n{run.stderr[-3000:]}")
        out[setting] = json.loads(run.stdout.strip().splitlines()[-1])
        r = out[setting]
        print(f"{setting:<8} model+trainer {r['base_gb']:.2f} GB, updates add {r['added_gb']:.2f} GB peak, "
              f"update {r['update_s']:.1f} s (median of {args.repeats})", flush=True)
    d, lim = out["default"], out["limited"]
    print(f"wall time {time.perf_counter() - started:.0f} s")
    print(f"rss_ratio={lim['added_gb'] / max(d['added_gb'], 1e-9):.2f} time_ratio={lim['update_s'] / d['update_s']:.2f}")


if __name__ == "__main__":
    main()
