"""Benchmark the one-pass action reader against one plain forward and against the brute-force per-name loop.

For the embedded SmolLM2-135M-Instruct (and, with `--full`, the tiny test model), with declared tools
under canonical names (`function_01`, ...), a prompt rendered by a call format and a response with
two parallel calls (three decisions: two calls and the end of the turn), it times without gradients,
in `--repeats` interleaved rounds after a warm-up round:
- forward: one plain forward of the model over the prompt + response tokens;
- reader: `cipr.method.actions.read_actions` on the same pair (tokenization, packing and its one pass), in
  both modes: "packed" (one call, tree mask over everything) and "prefix_cache" (causal pass over the
  sequence, then the tries reading its cache);
- brute force: `support.actions_reference.read_actions_bruteforce` (one forward per decision and name).
Each round gives the ratio reader/forward; the brute force (tens of forwards) is timed in the first
`--brute-repeats` rounds only, and bruteforce/reader is the ratio of the medians, its range that of
the extremes. The table prints each ratio's median and [min-max], and the maximum absolute
difference of log-probabilities between reader and brute force. The last line gives the ratios of
the default mode ("auto", which is "prefix_cache" for a model in eval mode) at 8 tools on SmolLM2,
`vs_forward=<median> [<min>-<max>] vs_bruteforce=...` (targets: at most 1.5 and at least 3), and
the script's own running time.

    .venv/bin/python scripts/bench_actions.py                 # SmolLM2, 8 tools, 5 rounds
    .venv/bin/python scripts/bench_actions.py --full          # tiny and SmolLM2, 4, 8 and 16 tools
    .venv/bin/python scripts/bench_actions.py --device cuda   # one GPU
    .venv/bin/python scripts/bench_actions.py --grad          # forward + backward instead
    .venv/bin/python scripts/bench_actions.py --threads 1 --clock cpu   # on a busy shared CPU machine
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support code: tiny models

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from support.actions_reference import read_actions_bruteforce

from cipr.formats import get_format
from cipr.method.actions import ActionQuery, ActionReaderConfig, read_actions
from cipr.tools.canonical import canonical_tool_id
from cipr.tools.interface import Call, Interface, Message, Tool

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
MODES = ("packed", "prefix_cache")
DEFAULT = "prefix_cache"  # what mode "auto" picks for a model in eval mode


def interface(n: int) -> Interface:
    """n canonical tools with ordinary descriptions and two arguments each."""
    topics = ["weather", "stock price", "flight status", "currency rate", "news", "recipe", "translation",
              "calendar", "distance", "time zone", "movie times", "sports score", "air quality", "hotel",
              "book", "traffic"]
    tools = []
    for i in range(n):
        topic = topics[i % len(topics)]
        schema = {"type": "object", "properties": {
            "arg_01": {"type": "string", "description": f"What to look up for the {topic}."},
            "arg_02": {"type": "integer", "description": "How many results to return."}},
            "required": ["arg_01"]}
        tools.append(Tool(canonical_tool_id(i, n), f"Returns the current {topic} for a query.", schema))
    return Interface(tuple(tools))


def query(tokenizer: Any, fmt_name: str, n: int) -> ActionQuery:
    fmt = get_format(fmt_name)
    iface = interface(n)
    prompt = fmt.render_prompt(tokenizer, [Message("user", "What is the weather in Paris, and the stock "
                                                           "price of ACME? Use the tools.")], iface)
    calls = [Call(iface[0].name, {"arg_01": "Paris", "arg_02": 1}), Call(iface[1].name, {"arg_01": "ACME"})]
    response = fmt.render_target(calls, think="The user asks two things, so I call two tools.")
    return ActionQuery.from_format(fmt, prompt, response, iface.names)


CLOCK: Callable[[], float] = time.perf_counter


def timed(fns: dict[str, Callable[[], Any]], repeats: int, grad: bool, rare: dict[str, int]
          ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds of each function in each of `repeats` interleaved rounds (after one warm-up round), last
    outputs.

    Interleaving spreads the drift of a shared machine's load evenly over the functions compared. A
    function in `rare` (the brute force, tens of forwards) runs only in that many rounds, not in the warm-up.
    """
    times: dict[str, list[float]] = {k: [] for k in fns}
    outs: dict[str, Any] = {}
    for i in range(repeats + 1):
        for key, fn in fns.items():
            if key in rare and not 0 < i <= rare[key]:
                continue
            start = CLOCK()
            with torch.set_grad_enabled(grad):
                outs[key] = fn()
                if grad:
                    outs[key].sum().backward()
            if i:
                times[key].append(CLOCK() - start)
    return times, outs


Spread = tuple[float, float, float]


def spread(values: list[float]) -> Spread:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def bench(name: str, model: Any, tokenizer: Any, fmt_name: str, tools: list[int], repeats: int, grad: bool,
          brute_repeats: int) -> dict[int, tuple[Spread, Spread]]:
    """One table row per tool count and reader mode; returns {tools: (vs_forward, vs_bruteforce)} of
    DEFAULT."""
    ratios = {}
    device = next(model.parameters()).device
    for n in tools:
        q = query(tokenizer, fmt_name, n)
        ids = tokenizer(q.prompt, add_special_tokens=False)["input_ids"] + \
            tokenizer(q.response, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids], device=device)
        fns = {"forward": lambda x=x: model(input_ids=x, use_cache=False).logits,
               "brute": lambda q=q, n=n: read_actions_bruteforce(model, tokenizer, [q], n)}
        for mode in MODES:
            fns[mode] = lambda q=q, n=n, mode=mode: read_actions(model, tokenizer, [q], n,
                                                                 ActionReaderConfig(mode=mode)).probs
        t, outs = timed(fns, repeats, grad, {"brute": brute_repeats})
        with torch.no_grad():
            packed = read_actions(model, tokenizer, [q], n).packed_tokens
        brute = outs["brute"]
        for mode in MODES:
            nz = brute > 0  # the random tiny model gives tools ~1e-17: compare in log space
            diff = (outs[mode][nz].log() - brute[nz].log()).abs().max().item()
            vs_fwd = spread([r / f for r, f in zip(t[mode], t["forward"], strict=True)])
            # the brute force ran in fewer rounds: ratio of the medians, range from the extremes
            med = statistics.median(t["brute"]) / statistics.median(t[mode])
            vs_brute = (med, min(t["brute"]) / max(t[mode]), max(t["brute"]) / min(t[mode]))
            print(f"{name:<8} {mode:<12} {n:>5} {len(ids):>6} {len(q.decisions):>3} {packed:>6} "
                  f"{statistics.median(t['forward']) * 1e3:>9.1f} {statistics.median(t[mode]) * 1e3:>9.1f} "
                  f"{statistics.median(t['brute']) * 1e3:>10.1f} {fmt(vs_fwd, 2):>17} {fmt(vs_brute, 1):>17} "
                  f"{diff:>9.1e}", flush=True)
            if mode == DEFAULT:
                ratios[n] = (vs_fwd, vs_brute)
    return ratios


def fmt(s: Spread, digits: int) -> str:
    return f"{s[0]:.{digits}f} [{s[1]:.{digits}f}-{s[2]:.{digits}f}]"


def main() -> None:
    begin = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", default="hermes", help="call format (toolrl, hermes, react, webshop)")
    parser.add_argument("--full", action="store_true",
                        help="the full sweep: tiny and smollm2, 4, 8 and 16 tools")
    parser.add_argument("--tools", default=None, help="tool counts (default 8; 4,8,16 with --full)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--brute-repeats", type=int, default=2, help="rounds that also time the brute force")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grad", action="store_true", help="time forward + backward")
    parser.add_argument("--models", default=None, help="which models to run: tiny, smollm2 (default smollm2; "
                                                       "both with --full)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine; with "
                             "--threads 1 it is the compute each variant costs)")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    models = (args.models or ("tiny,smollm2" if args.full else "smollm2")).split(",")
    tools = [int(t) for t in (args.tools or ("4,8,16" if args.full else "8")).split(",")]
    from support.tiny_models import tiny_model, tiny_tokenizer

    from cipr.runtime.embedded import load_embedded

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# median [min-max] over {args.repeats} rounds ({args.brute_repeats} for the brute force); times "
          "are medians")
    print(f"{'model':<8} {'mode':<12} {'tools':>5} {'tokens':>6} {'dec':>3} {'packed':>6} {'fwd ms':>9} "
          f"{'read ms':>9} {'brute ms':>10} {'vs fwd':>17} {'vs brute':>17} {'max|dlog|':>9}")
    if "tiny" in models:
        tok = tiny_tokenizer()
        bench("tiny", tiny_model(tok).to(args.device), tok, args.format, tools, args.repeats, args.grad,
              args.brute_repeats)
    if "smollm2" in models:
        start = time.perf_counter()
        model, tok = load_embedded()
        print(f"# SmolLM2-135M loaded in {time.perf_counter() - start:.1f} s", flush=True)
        ratios = bench("smollm2", model.to(args.device), tok, args.format, tools, args.repeats, args.grad,
                       args.brute_repeats)
        vs_forward, vs_brute = ratios.get(8, next(iter(ratios.values())))
        print(f"vs_forward={fmt(vs_forward, 2)} vs_bruteforce={fmt(vs_brute, 1)} "
              f"(total {time.perf_counter() - begin:.0f} s)")


if __name__ == "__main__":
    main()
