"""A/B of the evaluation's greedy loop against transformers' best setting, end to end, in one alternating run.

    .venv/bin/python scripts/ab_decode_stack.py [--n 8] [--max-new-tokens 128] [--repeats 2]

Issue 34's rule: a hand-written replacement of a library component stays only if it makes an end-to-end
benchmark at least 1.3x faster than the library's best setting. This script generates the first `--n`
BFCL simple_python items (ToolRL format, the embedded SmolLM2, float32, greedy, `--max-new-tokens`) at
batch size 8 and 1 under:
- `cipr`: `cipr-eval`'s HF backend (`cipr.runtime.backends.HFBackend`: its greedy loop with each prompt
  prefilled alone into a left-padded key/value cache that appends in place, prefix reuse, finished rows
  dropped), on the model's own attention (SDPA);
- `lib_dynamic`: `model.generate` with SDPA attention and transformers' DynamicCache;
- `lib_static`: `model.generate` with SDPA and `cache_implementation="static"`.
The settings alternate within each repetition (rotated each repetition) on one loaded model (SDPA
attention, float32, 2 threads); items/s is printed per setting and batch size, then cipr / the best
library setting, and whether the texts are identical (greedy: they must be).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cipr.data.bfcl import load_bfcl
from cipr.eval.config import EvalConfig
from cipr.eval.evaluate import load_model
from cipr.formats import get_format
from cipr.runtime.backends import GenRequest, HFBackend
from cipr.runtime.generation import GreedyConfig, end_token_ids


def lib_generate(model, tokenizer, prompts: list[str], bs: int, max_new: int, cache: str | None) -> list[str]:
    ends = sorted(end_token_ids(tokenizer, model))
    out_texts = []
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    texts: dict[int, str] = {}
    for s in range(0, len(order), bs):
        idx = order[s:s + bs]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        kw = {"cache_implementation": cache} if cache else {}
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=ends, **kw)
        for i, row in zip(idx, out[:, enc["input_ids"].shape[1]:].tolist(), strict=True):
            cut = next((j for j, t in enumerate(row) if t in ends), len(row))
            texts[i] = tokenizer.decode(row[:cut], skip_special_tokens=False)
    out_texts = [texts[i] for i in range(len(prompts))]
    return out_texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--single", type=int, default=4, help="items at batch size 1")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    t_start = time.perf_counter()
    cfg = EvalConfig(max_new_tokens=args.max_new_tokens, threads=2)
    model, tokenizer = load_model(cfg)
    tokenizer.padding_side = "left"
    fmt = get_format("toolrl")
    examples = load_bfcl(None, ["simple_python"])[: args.n + 1]
    reqs = [GenRequest(e) for e in examples[1:]]
    prompts = [fmt.render_prompt(tokenizer, r.example.messages, r.example.interface) for r in reqs]
    backends = {bs: HFBackend(model, tokenizer, fmt,
                              GreedyConfig(batch_size=bs, max_new_tokens=args.max_new_tokens))
                for bs in (1, 8)}
    for b in backends.values():  # warm-up
        b.generate([GenRequest(examples[0])] * 2)
    lib_generate(model, tokenizer, prompts[:1], 1, 4, None)
    lib_generate(model, tokenizer, prompts[:1], 1, 4, "static")

    def run(name: str, bs: int) -> list[str]:
        ps = prompts if bs > 1 else prompts[:args.single]
        if name == "cipr":
            return [g.text for g in backends[bs].generate(reqs if bs > 1 else reqs[:args.single])]
        return lib_generate(model, tokenizer, ps, bs, args.max_new_tokens,
                            None if name == "lib_dynamic" else "static")

    names = ["cipr", "lib_dynamic", "lib_static"]
    rates: dict[tuple[str, int], list[float]] = {}
    texts: dict[tuple[str, int], list[str]] = {}
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for bs in (8, 1):
            for name in order:
                t = time.perf_counter()
                texts[name, bs] = run(name, bs)
                dt = time.perf_counter() - t
                n = args.n if bs > 1 else args.single
                rates.setdefault((name, bs), []).append(n / dt)
                print(f"repetition {rep + 1} {name} batch {bs}: {n / dt:.3f} items/s ({dt:.1f} s)",
                      flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for (name, bs), v in sorted(rates.items()):
        print(f"{name} batch {bs}: {med[name, bs]:.3f} items/s [{min(v):.3f}-{max(v):.3f}]")
    for bs in (8, 1):
        same = sum(a == b for a, b in zip(texts["cipr", bs], texts["lib_dynamic", bs], strict=True))
        best = max(("lib_dynamic", "lib_static"), key=lambda k: med[k, bs])
        print(f"batch {bs}: cipr / {best} = {med['cipr', bs] / med[best, bs]:.2f} "
              f"(identical texts cipr vs lib_dynamic: {same}/{len(texts['cipr', bs])})")
    for name in names:
        print(f"{name}: batch 8 / batch 1 = {med[name, 8] / med[name, 1]:.2f} (different items: not "
              "bench_eval's speedup)")
    print(f"wall time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
