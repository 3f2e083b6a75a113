"""A/B of grouped-query attention under the padding mask against transformers' SDPA, in one alternating run.

    .venv/bin/python scripts/ab_grouped_attention.py [--n 8] [--max-new-tokens 128] [--repeats 3]

Why this exists: issue 34 asks for two things that meet here. bench_eval's batch-8 rate should be at
least 3x its batch-1 rate, and a hand-written replacement of a library component stays only if it makes an
end-to-end benchmark at least 1.3x faster. With a padding mask (every batched decoding step),
transformers' `sdpa_attention_forward` copies each key/value head once per query head (`repeat_kv`):
its `use_gqa_in_sdpa` hands grouped heads to torch only without a mask, because CUDA's kernels fall back
to the math kernel with one. At batch size 1 there is no mask, so only batch 8 pays for the copy. This
script measures, in one run, what removing that copy buys on the evaluation's own loop
(`cipr.runtime.backends.HFBackend`, exactly as `bench_eval.py` drives it):
- `sdpa`: transformers' own SDPA (the library's best setting on CPU, what the package uses);
- `gqa`: the same call with `enable_gqa=True` under the mask (torch's CPU kernel takes both);
- `fold`: for one query position, the query heads of a group folded into the query-length axis,
  `[B, H, 1, D] -> [B, K, H/K, D]`, so one SDPA call over the K key/value heads needs no copy and no
  `enable_gqa`; other shapes as `gqa`.
The two variants live only in this script (registered through transformers' attention interface for the
run); the package keeps transformers' SDPA. Per repetition the variants run in rotated order, each
generating the items at batch size 8 and every `--single-every`-th item at batch size 1 (bench_eval's
protocol). Printed per variant: items/s at both sizes, bench_eval's speedup (batch 8 / batch 1) and the
gain over `sdpa` at batch 8 (the 1.3x rule's quantity), each as median [min-max] over repetitions, and
whether the texts equal `sdpa`'s (greedy: they must). Wall time: printed at the end.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.nn.functional as F
from bench_eval import spread
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from cipr.data.bfcl import load_bfcl
from cipr.eval.config import EvalConfig
from cipr.eval.evaluate import load_model
from cipr.formats import get_format
from cipr.runtime.backends import GenRequest, HFBackend
from cipr.runtime.generation import GreedyConfig


def _grouped(fold: bool):
    def forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        """transformers' attention signature: query [B, H, Lq, D], key/value [B, K, Lk, D] -> [B, Lq, H,
        D]."""
        groups = getattr(module, "num_key_value_groups", 1)
        if attention_mask is None or groups == 1 or kwargs.get("position_bias") is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, is_causal=is_causal, **kwargs)
        b, h, lq, d = query.shape
        if fold and lq == 1:
            out = F.scaled_dot_product_attention(query.view(b, key.shape[1], groups, d), key, value,
                                                 attn_mask=attention_mask, scale=scaling)
            return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return forward


VARIANTS = {"sdpa": None, "gqa": _grouped(fold=False), "fold": _grouped(fold=True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8, help="items at batch size 8")
    p.add_argument("--single-every", type=int, default=2, help="batch size 1 runs on every k-th item")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="embedded")
    args = p.parse_args()
    started = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name, fn in VARIANTS.items():
        if fn is not None:
            AttentionInterface.register(f"ab_{name}", fn)
            AttentionMaskInterface.register(f"ab_{name}", sdpa_mask)
    model, tokenizer = load_model(EvalConfig(model=args.model, max_new_tokens=args.max_new_tokens))
    fmt = get_format("toolrl")
    examples = load_bfcl(None, ["simple_python"])[: args.n + 1]
    warm, reqs = [GenRequest(examples[0])], [GenRequest(e) for e in examples[1:]]
    single = reqs[::args.single_every]
    backends = {bs: HFBackend(model, tokenizer, fmt,
                              GreedyConfig(batch_size=bs, max_new_tokens=args.max_new_tokens))
                for bs in (1, 8)}
    names = list(VARIANTS)
    rates: dict[tuple[str, int], list[float]] = {(n, bs): [] for n in names for bs in (1, 8)}
    texts: dict[tuple[str, int], list[str]] = {}
    for name in names:  # warm-up of each variant, not timed
        model.set_attn_implementation("sdpa" if name == "sdpa" else f"ab_{name}")
        for b in backends.values():
            b.generate(warm * 2)
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            model.set_attn_implementation("sdpa" if name == "sdpa" else f"ab_{name}")
            for bs, items in ((8, reqs), (1, single)):
                t = time.perf_counter()
                gens = backends[bs].generate(items)
                dt = time.perf_counter() - t
                if any(g.error for g in gens):
                    raise SystemExit(f"{name} batch {bs}: {next(g.error for g in gens if g.error)}")
                texts[name, bs] = [g.text for g in gens]
                rates[name, bs].append(len(items) / dt)
            print(f"repetition {rep + 1} {name}: batch 8 {rates[name, 8][-1]:.3f} items/s, batch 1 "
                  f"{rates[name, 1][-1]:.3f} items/s", flush=True)
    for name in names:
        speedup = [b / a for a, b in zip(rates[name, 1], rates[name, 8], strict=True)]
        gain = [b / a for a, b in zip(rates["sdpa", 8], rates[name, 8], strict=True)]
        same = sum(a == b for bs in (8, 1) for a, b in zip(texts[name, bs], texts["sdpa", bs], strict=True))
        print(f"{name}: batch 8 {spread(rates[name, 8])} items/s, batch 1 {spread(rates[name, 1])}; "
              f"speedup (batch 8 / batch 1) {spread(speedup)}; batch 8 vs sdpa {spread(gain)}; "
              f"texts equal to sdpa's {same}/{len(reqs) + len(single)}")
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
