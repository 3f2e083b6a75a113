"""Items per second of the HF evaluation backend at batch size 1 and at the default batch size.

    .venv/bin/python scripts/bench_eval.py [--n 8] [--max-new-tokens 256] [--batch-size 8] [--device auto] \
        [--threads N] [--attn auto|sdpa|eager]

Model: the embedded default (SmolLM2-135M-Instruct, `cipr.embedded`), or `--model DIR` (any folder
`from_pretrained` loads). Items: the first `--n` BFCL items of `--partition` (default simple_python),
original interface, ToolRL call format, exactly as `cipr-eval` renders them. Each setting first
generates one warm-up item (not timed), then all `--n` items through `HFBackend.generate` (greedy,
left padding, longest prompts first). An untrained model rarely stops early, so most items run the
full `--max-new-tokens`: the comparison is of equal work.

On CPU, prefill is compute-bound and gains nothing from batching, while each decoding step costs
nearly the same for 8 sequences as for one; the speedup therefore grows with the number of new
tokens per item (the paper decodes up to 4,096). `--threads` sets torch's thread count: on a machine
shared with other jobs, more threads than free cores makes every step many times slower. Also prints how many outputs agree
between the two settings (batching changes only padding, so greedy outputs should mostly agree;
float rounding under padding can flip a near-tie).

Measured on the project's shared 2-core CPU (other jobs running, `--threads 1`, 8 simple_python
items of 486 to 669 prompt tokens, up to 256 new tokens): eager attention 237 s at batch size 1 and
97 s at batch size 8, speedup 2.43; SDPA 187 s and 121 s, speedup 1.54 (its masked path is slow
on CPU, hence `attn_implementation: auto` = eager on CPU). Timings on a shared machine vary by tens
of percent from run to run.

Last line: `speedup=<items/s at the default batch size divided by items/s at batch size 1>` (the
issue's target is at least 2).
"""

from __future__ import annotations

import argparse
import os
import time

from cipr.eval.backends import GenRequest, HFBackend, HFBackendConfig
from cipr.eval.config import EvalConfig
from cipr.eval.evaluate import load_model
from cipr.formats import get_format


def main() -> None:
    default_bs = EvalConfig().batch_size
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--n", type=int, default=8, help="items per setting")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=default_bs, help=f"the batched setting (default {default_bs})")
    p.add_argument("--partition", default="simple_python")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-root", "--root", dest="root", default=None, metavar="DIR",
                   help="data root (default: $CIPR_DATA_ROOT or ../shared/data)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--attn", default="auto", help="attn_implementation: auto (eager on CPU), sdpa, eager")
    args = p.parse_args()

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from cipr.data.bfcl import load_bfcl

    cfg = EvalConfig(model=args.model, device=args.device, threads=args.threads or None,
                     attn_implementation=args.attn)
    t0 = time.perf_counter()
    model, tokenizer = load_model(cfg)
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.1f} s on {next(model.parameters()).device}, "
          f"attention {model.config._attn_implementation}, torch threads {torch.get_num_threads()}")
    fmt = get_format("toolrl")
    examples = load_bfcl(args.root, [args.partition])[: args.n + 1]
    warm, reqs = [GenRequest(examples[0])], [GenRequest(e) for e in examples[1:]]
    lengths = [len(tokenizer(fmt.render_prompt(tokenizer, r.example.messages, r.example.interface),
                             add_special_tokens=False)["input_ids"]) for r in reqs]
    print(f"{len(reqs)} items from {args.partition}; prompt tokens min {min(lengths)} mean "
          f"{sum(lengths) / len(lengths):.0f} max {max(lengths)}; max_new_tokens {args.max_new_tokens}")
    rates, outputs = {}, {}
    for bs in (1, args.batch_size):
        backend = HFBackend(model, tokenizer, fmt, HFBackendConfig(batch_size=bs, max_new_tokens=args.max_new_tokens))
        backend.generate(warm)
        t = time.perf_counter()
        gens = backend.generate(reqs)
        dt = time.perf_counter() - t
        errors = [g.error for g in gens if g.error]
        if errors:
            raise SystemExit(f"batch size {bs}: {len(errors)} generation errors, first: {errors[0]}")
        rates[bs], outputs[bs] = len(reqs) / dt, [g.text for g in gens]
        new_tokens = sum(len(tokenizer(g.text, add_special_tokens=False)["input_ids"]) for g in gens)
        print(f"batch_size={bs}: {rates[bs]:.3f} items/s ({dt:.1f} s, {new_tokens / dt:.1f} new tokens/s)")
    same = sum(a == b for a, b in zip(outputs[1], outputs[args.batch_size], strict=True))
    print(f"identical outputs at batch size 1 and {args.batch_size}: {same}/{len(reqs)}")
    print(f"speedup={rates[args.batch_size] / rates[1]:.2f}")


if __name__ == "__main__":
    main()
