"""Peak memory of one optimizer step of each training regime at the example configs, each in its own process.

    .venv/bin/python scripts/bench_memory.py                                   # every regime, its own batch
    .venv/bin/python scripts/bench_memory.py --regimes supervised --batch 2    # one regime, a smaller batch
    .venv/bin/python scripts/bench_memory.py --regimes grpo,supervised --set trainer.seed=1 --out mem.json

Regimes and the cipr-train overrides each runs (`REGIMES`; the examples' own batches unless `--batch`):

- grpo:        experiment=smoke                           (one CIPR GRPO step: 1 pair x G=4, 8 completions)
- supervised:  experiment=smoke algo=cipr_sft              (8 examples and their copies: 16 rows)
- distill:     experiment=smollm2_distill_toyshop          (self-distillation, ToyShop trajectories)
- multi_turn:  experiment=smollm2_toyshop_cipr             (multi-turn CIPR GRPO on ToyShop episodes)

Each runs `cipr-train`'s engine (`cipr.train.run.run`) in a fresh Python process for one step of its main
stage (`trainer.max_steps=1`), without the warm start (`trainer.warm_start.steps=0`; `--warm-start` keeps
it) and without held-out probes, in a temporary run folder. Every Trainer the run builds gets a callback
that samples the process's resident set size (RSS) every 5 ms from the step's beginning to its end (its
micro-batches, for GRPO its generation, the optimizer update); on CUDA also `torch.cuda.max_memory_allocated`
over the step. `--batch N` sets `trainer.per_device_train_batch_size=N` (what that is per regime: prompts
x unit for the supervised regime's rows, completions for GRPO, trajectories for distillation), `--set`
adds overrides to every regime.

Printed per regime: the RSS when its main stage's first step began, the step's peak RSS (the figure to
compare across regimes and with issue 67's 4.1 GB), their difference, the process's peak (ru_maxrss,
model loading and saving included), the step's seconds and its per-device batch; `--out` writes the same
as JSON. Regimes run one after another, never two at once; a failed one is reported and the rest go on
(exit status 1). Peak RSS on Linux counts memory the allocator keeps after tensors are freed, so it is an
upper bound of what the tensors need at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, where it is not installed

import argparse
import json
import os
import resource
import subprocess
import tempfile
import threading
import time
from typing import Any

from transformers import TrainerCallback

REGIMES: dict[str, list[str]] = {
    "grpo": ["experiment=smoke"],
    "supervised": ["experiment=smoke", "algo=cipr_sft"],
    "distill": ["experiment=smollm2_distill_toyshop"],
    "multi_turn": ["experiment=smollm2_toyshop_cipr"],
}
"""The example configs of each regime (configs/train/experiment/)."""
SAMPLE_SECONDS = 0.005


def regime_overrides(regime: str, run_dir: Path, *, batch: int | None = None, warm_start: bool = False,
                     extra: tuple[str, ...] = ()) -> list[str]:
    """The cipr-train overrides of one benchmarked step of `regime` (module docstring), run in `run_dir`."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; one of {', '.join(REGIMES)}")
    out = [*REGIMES[regime], "trainer.max_steps=1", "trainer.save_steps=1", f"trainer.run_dir={run_dir}",
           "trainer.resume=never", "logging.progress_bar=false"]
    if regime == "distill":
        out.append("data.eval_examples=0")  # no held-out evaluation after the step
    else:
        out.append("trainer.warm_start.eval_examples=0")  # no held-out probes around the stages
        if not warm_start:
            out.append("trainer.warm_start.steps=0")
    if batch is not None:
        out.append(f"trainer.per_device_train_batch_size={batch}")
    return [*out, *extra]


def rss_gb() -> float:
    """This process's resident set size now, GB (2^30 bytes)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def max_rss_gb() -> float:
    """This process's peak resident set size so far, GB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


class StepMemory(TrainerCallback):
    """Records, for the first optimizer step of each Trainer, the RSS at its beginning, its peak (sampled by a
    thread) and its seconds."""

    def __init__(self, interval: float | None = SAMPLE_SECONDS) -> None:
        """`interval`: seconds between samples (None: no sampling thread, the step's two ends only)."""
        self.stages: list[dict[str, Any]] = []
        self._peak = 0.0
        self._sampling = False
        self._start = 0.0
        if interval is not None:
            threading.Thread(target=self._sample, args=(interval,), daemon=True).start()

    def _sample(self, interval: float) -> None:
        while True:
            if self._sampling:
                self._peak = max(self._peak, rss_gb())
            time.sleep(interval)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        if self.stages and self.stages[-1]["output_dir"] == args.output_dir:
            return  # the stage's first step only
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        start = rss_gb()
        self.stages.append({"output_dir": args.output_dir, "rss_before_step_gb": start,
                            "per_device_train_batch_size": args.per_device_train_batch_size,
                            "gradient_accumulation_steps": args.gradient_accumulation_steps})
        self._peak, self._start, self._sampling = start, time.time(), True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        stage = self.stages[-1] if self.stages else None
        if not self._sampling or stage is None or "step_seconds" in stage:
            return
        self._sampling = False
        peak = max(self._peak, rss_gb())
        stage.update(step_peak_rss_gb=peak, step_growth_gb=peak - stage["rss_before_step_gb"],
                     step_seconds=time.time() - self._start)
        if torch.cuda.is_available():
            stage["cuda_step_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30


def child(regime: str, overrides: list[str], result: Path) -> None:
    """Run one regime's step in this process and write what `StepMemory` saw to `result`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    import transformers.trainer

    from cipr.cli.common import quiet_libraries
    from cipr.train.config import compose_train
    from cipr.train.run import run

    quiet_libraries()
    memory = StepMemory()
    transformers.trainer.DEFAULT_CALLBACKS.append(memory)  # every Trainer the run builds gets it
    start = time.time()
    run(compose_train(overrides))
    stages = [s for s in memory.stages if "step_seconds" in s]
    if not stages:
        raise RuntimeError("no optimizer step was taken")
    result.write_text(json.dumps({"regime": regime, "overrides": overrides, "main": stages[-1],
                                  "stages": stages, "process_peak_rss_gb": max_rss_gb(),
                                  "wall_s": time.time() - start}, indent=1) + "\n")


def measure(regime: str, overrides: list[str], work: Path, timeout: float) -> dict[str, Any]:
    """One regime in a fresh process (`child`); its record, or {"error": ...} when it failed."""
    result = work / f"{regime}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", regime, "--result", str(result), "--",
           *overrides]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"regime": regime, "overrides": overrides, "error": f"timed out after {timeout:.0f} s"}
    if done.returncode or not result.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"regime": regime, "overrides": overrides,
                "error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(result.read_text())


def table(records: list[dict[str, Any]]) -> str:
    """The printed summary: one line per regime."""
    head = (f"{'regime':<12}{'batch':>6}{'RSS before':>12}{'step peak':>11}{'growth':>9}{'process peak':>14}"
            f"{'step s':>9}   GB = 2^30 bytes")
    lines = [head]
    for r in records:
        if "error" in r:
            lines.append(f"{r['regime']:<12} failed: {r['error']}")
            continue
        m = r["main"]
        lines.append(f"{r['regime']:<12}{m['per_device_train_batch_size']:>6}{m['rss_before_step_gb']:>12.2f}"
                     f"{m['step_peak_rss_gb']:>11.2f}{m['step_growth_gb']:>9.2f}"
                     f"{r['process_peak_rss_gb']:>14.2f}{m['step_seconds']:>9.1f}"
                     + (f"   CUDA peak {m['cuda_step_peak_gb']:.2f}" if "cuda_step_peak_gb" in m else ""))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regimes", default=",".join(REGIMES),
                   help=f"comma-separated, among {', '.join(REGIMES)} (default: all)")
    p.add_argument("--batch", type=int, default=None,
                   help="trainer.per_device_train_batch_size for every regime (default: each example's)")
    p.add_argument("--warm-start", action="store_true", help="keep the examples' warm starts (slower)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a cipr-train override added to every regime (repeatable)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per regime")
    p.add_argument("--work", type=Path, default=None, help="run folders here (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="write the records as JSON here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.overrides, args.result)
        return
    regimes = [r.strip() for r in args.regimes.split(",") if r.strip()]
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown:
        p.error(f"unknown regime(s) {unknown}; choose among {', '.join(REGIMES)}")
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for regime in regimes:
            overrides = regime_overrides(regime, work / regime, batch=args.batch, warm_start=args.warm_start,
                                         extra=tuple(args.set))
            print(f"{regime}: cipr-train {' '.join(overrides)}", flush=True)
            records.append(measure(regime, overrides, work, args.timeout))
    print(table(records))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1) + "\n")
    sys.exit(1 if any("error" in r for r in records) else 0)


if __name__ == "__main__":
    main()
