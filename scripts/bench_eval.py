"""Speed of the HF evaluation backend: items/s at the evaluation's batch size against batch size 1.

    .venv/bin/python scripts/bench_eval.py                  # default run (its wall time is printed)
    .venv/bin/python scripts/bench_eval.py --n 8 --max-new-tokens 256 --repeats 3   # a longer setting
    options: [--batch-size 8] [--device auto] [--dtype auto] [--threads N] [--model DIR] [--partition P]
             [--single-every 2] [--no-vllm]

Model: the embedded default (SmolLM2-135M-Instruct, `cipr.runtime.embedded`), or `--model DIR` (any folder
`from_pretrained` loads). Items: the first `--n` BFCL items of `--partition` (default simple_python),
original interface, ToolRL call format, exactly as `cipr-eval` renders them, through `cipr-eval`'s own
backend (`cipr.runtime.backends.HFBackend`: greedy, longest prompts first, each prompt prefilled alone on
CPU, finished rows dropped from the batch). One backend per batch size lives through the run and first
generates an item as a warm-up (not timed). Each repetition generates the items at batch size 1 (on
every `--single-every`-th item: batch size 1 costs the same per item whatever the count) and at the
batch size (the order alternates between repetitions, so drift in machine load hits both), and rates
are compared per item. An untrained model rarely stops early, so most items run the full
`--max-new-tokens`: the comparison is of equal work.

Per batch size it prints prefill seconds per item and milliseconds per decoding step (from
`HFBackend.greedy.timing`). With P s of prefill per item, N new tokens and steps of d1 and d8 seconds the
speedup is (P + N d1) / (P + N d8 / 8): it grows with N towards 8 d1 / d8.

Where vLLM is installed (its CPU build: see the README), the same items are also generated with
`backend=vllm` and its rate is printed beside HF's; `--no-vllm` skips it.

Every figure is the median over repetitions with its [min-max]. Last line:
`speedup=<items/s at the batch size / items/s at batch size 1> [min-max]` (target: at least 3). Wall
times of the default run: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from typing import Any

from cipr.eval.config import EvalConfig
from cipr.eval.evaluate import load_model, make_backend
from cipr.formats import get_format
from cipr.runtime.backends import GenRequest, HFBackend
from cipr.runtime.generation import GreedyConfig


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def run_hf(backend: HFBackend, reqs: list[GenRequest]) -> tuple[float, dict[str, float], list[str]]:
    """(items/s, prefill s per item and ms per decoding step, texts) of one pass of `backend` over `reqs`."""
    before = dict(backend.greedy.timing)
    t = time.perf_counter()
    gens = backend.generate(reqs)
    dt = time.perf_counter() - t
    errors = [g.error for g in gens if g.error]
    if errors:
        raise SystemExit(f"batch size {backend.config.batch_size}: {len(errors)} generation errors, "
                         f"first: {errors[0]}")
    tm = {k: v - before[k] for k, v in backend.greedy.timing.items()}
    return len(reqs) / dt, {"prefill_s_per_item": tm["prefill_seconds"] / len(reqs),
                            "step_ms": 1e3 * tm["decode_seconds"] / max(tm["decode_steps"], 1)}, \
        [g.text for g in gens]


def main() -> None:
    default_bs = EvalConfig().batch_size
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--n", type=int, default=8, help="items per setting")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per item")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--single-every", type=int, default=2, help="batch size 1 runs on every k-th item")
    p.add_argument("--batch-size", type=int, default=default_bs,
                   help=f"the batched setting (default {default_bs})")
    p.add_argument("--partition", default="simple_python")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-root", "--root", dest="root", default=None, metavar="DIR",
                   help="data root (default: $CIPR_DATA_ROOT or ../shared/data)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights' dtype (auto: float32 on CPU, bfloat16 on a GPU that has it)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--no-vllm", action="store_true", help="do not time vLLM even where it is installed")
    args = p.parse_args()
    started = time.perf_counter()

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from cipr.data.bfcl import load_bfcl

    cfg = EvalConfig(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads or None,
                     max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    model, tokenizer = load_model(cfg)
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.1f} s on "
          f"{next(model.parameters()).device}, {next(model.parameters()).dtype}, attention "
          f"{model.config._attn_implementation}, torch threads {torch.get_num_threads()}")
    fmt = get_format("toolrl")
    examples = load_bfcl(args.root, [args.partition])[: args.n + 1]
    warm = [GenRequest(examples[0])]
    reqs = [GenRequest(e) for e in examples[1:args.n + 1]]
    lengths = [len(tokenizer(fmt.render_prompt(tokenizer, r.example.messages, r.example.interface),
                             add_special_tokens=False)["input_ids"]) for r in reqs]
    single = reqs[::args.single_every]
    print(f"{len(reqs)} items from {args.partition}; prompt tokens min {min(lengths)} mean "
          f"{sum(lengths) / len(lengths):.0f} max {max(lengths)} (batch size 1 on {len(single)} of them); "
          f"max_new_tokens {args.max_new_tokens}")
    backends: dict[int, Any] = {bs: HFBackend(model, tokenizer, fmt, GreedyConfig(
        batch_size=bs, max_new_tokens=args.max_new_tokens)) for bs in (1, args.batch_size)}
    for backend in backends.values():  # warm-up, not timed
        run_hf(backend, warm)
    rates: dict[int, list[float]] = {bs: [] for bs in backends}
    parts: dict[int, dict[str, list[float]]] = {bs: {} for bs in backends}
    outputs: dict[int, list[str]] = {}
    for rep in range(args.repeats):
        for bs in list(backends) if rep % 2 == 0 else list(backends)[::-1]:
            rate, where, outputs[bs] = run_hf(backends[bs], single if bs == 1 else reqs)
            rates[bs].append(rate)
            for k, v in where.items():
                parts[bs].setdefault(k, []).append(v)
        print(f"repetition {rep + 1}: batch 1 {rates[1][-1]:.3f} items/s; batch {args.batch_size} "
              f"{rates[args.batch_size][-1]:.3f} items/s; speedup "
              f"{rates[args.batch_size][-1] / rates[1][-1]:.2f}")
    speedups = [b / a for a, b in zip(rates[1], rates[args.batch_size], strict=True)]
    for bs, where in parts.items():
        print(f"hf batch_size={bs}: {spread(rates[bs])} items/s; prefill "
              f"{spread(where['prefill_s_per_item'])} s/item, decode step {spread(where['step_ms'])} ms")
    same = sum(a == b for a, b in zip(outputs[1], outputs[args.batch_size][::args.single_every], strict=True))
    print(f"identical outputs at batch size 1 and {args.batch_size}: {same}/{len(single)}")
    if not args.no_vllm and importlib.util.find_spec("vllm") is not None:
        if next(model.parameters()).device.type == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            # unset, vLLM's CPU worker reserves gpu_memory_utilization of all memory and refuses to start
            # when that much is not free (this process already holds the HF model)
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
            print("vllm: VLLM_CPU_KVCACHE_SPACE=1 (GiB of key/value cache; set it to override)")
        vllm = make_backend(EvalConfig(model=args.model, backend="vllm", max_new_tokens=args.max_new_tokens),
                            fmt, tokenizer=tokenizer)
        vllm.generate(warm)
        vrates = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            errors = [g.error for g in vllm.generate(reqs) if g.error]
            if errors:
                raise SystemExit(f"vllm: {len(errors)} generation errors, first: {errors[0]}")
            vrates.append(len(reqs) / (time.perf_counter() - t))
        ratio = statistics.median(vrates) / statistics.median(rates[args.batch_size])
        print(f"vllm (all items at once): {spread(vrates)} items/s = {ratio:.2f}x hf at batch "
              f"{args.batch_size}")
    print(f"wall time {time.perf_counter() - started:.0f} s")
    print(f"speedup={spread(speedups)}")


if __name__ == "__main__":
    main()
