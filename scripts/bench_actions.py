"""Benchmark the one-pass action reader against one plain forward and against the brute-force per-name loop.

For the embedded SmolLM2-135M-Instruct and the tiny test model, with 4, 8 and 16 declared tools under
canonical names (`function_01`, ...), a prompt rendered by a call format and a response with two
parallel calls (three decisions: two calls and the end of the turn), it times, without gradients
(median of `--repeats` runs, after a warm-up):
- forward: one plain forward of the model over the prompt + response tokens;
- reader: `cipr.actions.read_actions` on the same pair (tokenization, packing and its one forward);
- brute force: `cipr.actions.read_actions_bruteforce` (one forward per decision and declared name).
It also checks that reader and brute force agree (max absolute difference of the distributions).
The last line gives the ratios at 8 tools on SmolLM2: `vs_forward=<reader/forward>
vs_bruteforce=<bruteforce/reader>` (targets: at most 1.5 and at least 3).

    .venv/bin/python scripts/bench_actions.py                 # CPU, about 3 minutes on 2 cores
    .venv/bin/python scripts/bench_actions.py --device cuda   # one GPU
    .venv/bin/python scripts/bench_actions.py --grad          # forward + backward instead
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from cipr.actions import ActionQuery, read_actions, read_actions_bruteforce
from cipr.canonical import canonical_tool_id
from cipr.formats import get_format
from cipr.interface import Call, Interface, Message, Tool

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    prompt = fmt.render_prompt(tokenizer, [Message("user", "What is the weather in Paris, and the stock price "
                                                           "of ACME? Use the tools.")], iface)
    calls = [Call(iface[0].name, {"arg_01": "Paris", "arg_02": 1}), Call(iface[1].name, {"arg_01": "ACME"})]
    response = fmt.render_target(calls, think="The user asks two things, so I call two tools.")
    return ActionQuery.from_format(fmt, prompt, response, iface.names)


def timed(fn: Callable[[], Any], repeats: int, grad: bool, warmup: bool = True) -> tuple[float, Any]:
    """Median seconds of `fn` over `repeats` runs (after one warm-up run), and its last output."""
    times = []
    for i in range(repeats + int(warmup)):
        start = time.perf_counter()
        with torch.set_grad_enabled(grad):
            out = fn()
            if grad:
                out.sum().backward()
        if i or not warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench(name: str, model: Any, tokenizer: Any, fmt_name: str, tools: list[int], repeats: int, grad: bool
          ) -> dict[int, tuple[float, float]]:
    ratios = {}
    device = next(model.parameters()).device
    for n in tools:
        q = query(tokenizer, fmt_name, n)
        ids = tokenizer(q.prompt, add_special_tokens=False)["input_ids"] + \
            tokenizer(q.response, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids], device=device)
        t_fwd, _ = timed(lambda x=x: model(input_ids=x, use_cache=False).logits, repeats, grad)
        t_read, probs = timed(lambda q=q, n=n: read_actions(model, tokenizer, [q], n).probs, repeats, grad)
        # the forwards above warmed the model up; the loop is timed once
        t_brute, brute = timed(lambda q=q, n=n: read_actions_bruteforce(model, tokenizer, [q], n), 1, grad,
                               warmup=False)
        diff = (probs - brute).abs().max().item()
        with torch.no_grad():
            packed = read_actions(model, tokenizer, [q], n).packed_tokens
        print(f"{name:<10} {n:>5} {len(ids):>7} {len(q.decisions):>4} {packed:>7} "
              f"{t_fwd * 1e3:>10.1f} {t_read * 1e3:>10.1f} {t_brute * 1e3:>11.1f} {t_read / t_fwd:>10.2f} "
              f"{t_brute / t_read:>13.1f} {diff:>9.1e}", flush=True)
        ratios[n] = (t_read / t_fwd, t_brute / t_read)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", default="hermes", help="call format (toolrl, hermes, react, webshop)")
    parser.add_argument("--tools", default="4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grad", action="store_true", help="time forward + backward")
    parser.add_argument("--models", default="tiny,smollm2", help="which models to run (tiny, smollm2)")
    args = parser.parse_args()
    models = args.models.split(",")
    tools = [int(t) for t in args.tools.split(",")]
    from cipr.embedded import load_embedded
    from cipr.testing import tiny_model, tiny_tokenizer

    print(f"{'model':<10} {'tools':>5} {'tokens':>7} {'dec':>4} {'packed':>7} {'fwd ms':>10} {'reader ms':>10} "
          f"{'brute ms':>11} {'vs fwd':>10} {'vs brute':>13} {'max diff':>9}")
    if "tiny" in models:
        tok = tiny_tokenizer()
        bench("tiny", tiny_model(tok).to(args.device), tok, args.format, tools, args.repeats, args.grad)
    if "smollm2" not in models:
        return
    start = time.perf_counter()
    model, tok = load_embedded()
    print(f"# SmolLM2-135M loaded in {time.perf_counter() - start:.1f} s", flush=True)
    ratios = bench("smollm2", model.to(args.device), tok, args.format, tools, args.repeats, args.grad)
    vs_forward, vs_brute = ratios.get(8, next(iter(ratios.values())))
    print(f"vs_forward={vs_forward:.2f} vs_bruteforce={vs_brute:.1f}")


if __name__ == "__main__":
    main()
