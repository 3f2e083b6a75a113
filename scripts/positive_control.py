"""Does CIPR's rescoring term lower the held-out relabel KL when it is given enough weight? (The positive
control of docs/results/cpu_evidence.md, in isolation.)

From one model folder (e.g. an export of the evidence experiment's multi-interface point), two copies are
trained on the same canonical training pairs, batch by batch:
  A (control): the supervised task loss alone (token loss + action cross-entropy, `cipr.train.supervised`);
  B (CIPR):    the same plus `--lam` times the rescoring KL (`rescoring`, fresh function_XX relabeling).
Before and after, both read the held-in quantity on held-out evaluation items: KL(canonical ‖ relabeled) at
the reference decisions (`cipr-eval`'s consistency metric, type `relabel_function`), and the action accuracy.

    # the second run's arms' setting (every layer, 5e-5):
    .venv/bin/python scripts/positive_control.py \\
        runs/cpu_evidence/smollm2-135m/evidence/exports/multi_interface_s0 --lr 5e-5
    # the first run's setting (top 10 of 30 layers, 1e-4):
    .venv/bin/python scripts/positive_control.py DIR --freeze-bottom 20 --lr 1e-4

Prints one line per measurement and the B − A difference of the held-out KL after training, per item paired.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=2, help="canonical examples a step")
    p.add_argument("--lam", type=float, default=10.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--items", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trace", action="store_true",
                   help="print each step's rescoring KL on its own pairs before and after the update")
    p.add_argument("--freeze-embeddings", action="store_true",
                   help="freeze the token embeddings (and so a tied output head) while every layer trains")
    p.add_argument("--freeze-bottom", type=int, default=0,
                   help="layers frozen from the bottom (0: every layer trains, the second run's setting; 20: "
                        "the first's)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.eval.benchmarks import build, load_examples
    from cipr.eval.config import eval_config_from_dict
    from cipr.eval.consistency_metric import ConsistencyConfig, build_pairs, measure
    from cipr.formats import get_format
    from cipr.method.actions import ActionQuery, ActionReaderConfig, read_actions
    from cipr.method.objective import Objective, rescore_pairs
    from cipr.method.relabel import relabel
    from cipr.perturb.config import PerturbConfig
    from cipr.train.data import DataConfig, build_prompts
    from cipr.train.data import load_examples as load_training
    from cipr.train.supervised import action_nll, canonical_queries, reference_classes

    options = {"tools_per_example": [3, 3], "parallel_fraction": 0.0, "no_call_fraction": 0.0,
               "same_domain_distractors": 0.0}
    fmt = get_format("compact")
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    cfg = eval_config_from_dict({"benchmark": {"name": "synthetic", "format": "compact", **options},
                                 "names": ["canonical"], "perturbations": ["relabel_function"],
                                 "limit": args.items, "progress": False})
    items, _, _ = build(cfg)
    pairs, _ = build_pairs(load_examples(cfg), items, cfg.seed)
    data = DataConfig(n=400, seed=7, eval_examples=0, **options)
    perturb = PerturbConfig(names="canonical", paired=False)
    records = [r for r in build_prompts(load_training(data), data, perturb, fmt=fmt,
                                        tokenizer=tokenizer).records]

    def load() -> torch.nn.Module:
        m = AutoModelForCausalLM.from_pretrained(args.model_dir, attn_implementation="sdpa")
        # only layers k.. train: unlike `model.freeze_bottom_layers`, the final norm is frozen
        if args.freeze_bottom:
            # too (the first run's control was measured this way; kept so its figures reproduce)
            for name, param in m.named_parameters():
                layer = name.split("layers.")[1].split(".")[0] if "layers." in name else None
                param.requires_grad_(layer is not None and int(layer) >= args.freeze_bottom)
        if args.freeze_embeddings:
            m.get_input_embeddings().weight.requires_grad_(False)
        return m

    def held_out(model: torch.nn.Module) -> tuple[list[float], float]:
        model.eval()
        with torch.no_grad():
            recs = measure(model, tokenizer, fmt, pairs, ConsistencyConfig())
        model.train()
        kl = [r["kl"] for r in recs]
        acc = [r["action_acc_ref"] for r in recs]
        return kl, sum(acc) / len(acc)

    def rescoring(model: torch.nn.Module, batch: list, seeds: list[int],
                  p_canon: torch.Tensor | None = None) -> torch.Tensor:
        """The built-in rescoring KL of `batch` (every record relabeled with its own seed here)."""
        queries = []
        for r, seed in zip(batch, seeds, strict=True):
            c = relabel(r.prompt, r.target, r.tools, fmt, seed=seed)
            queries.append(ActionQuery(c.prompt, c.response, c.decisions, c.tools, r.classes,
                                       tuple(fmt.name_text(t) for t in c.tools)))
        if p_canon is None:
            with torch.no_grad():
                p_canon = read_actions(model, tokenizer, canonical_queries(batch, fmt), 3).probs
        reading = read_actions(model, tokenizer, queries, 3)
        pairs = rescore_pairs(p_canon, reading.probs, reading.sequence)
        return Objective.builtin(rescore=1.0)(pairs.p_other, rescore=pairs)[0]

    def train(model: torch.nn.Module, lam: float) -> None:
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr,
                                weight_decay=0.0)
        for step in range(args.steps):
            batch = records[step * args.batch:(step + 1) * args.batch]
            queries = canonical_queries(batch, fmt, tokenizer.eos_token)
            reading = read_actions(model, tokenizer, queries, 3, ActionReaderConfig(response_logprobs=True))
            mask = reading.response_mask
            token = -(reading.response_logprobs * mask).sum() / mask.sum()
            targets = torch.tensor([c for q in queries for c in reference_classes(q, 3)])
            ce, _ = action_nll(reading.probs, targets, reading.sequence)
            loss = token + ce
            seeds = [1000 + step * 10 + i for i in range(len(batch))]
            if lam:
                value = rescoring(model, batch, seeds, p_canon=reading.probs.detach())
                loss = loss + lam * value
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if args.trace and lam:  # the term on this step's own pairs, before and after its update
                with torch.no_grad():
                    after = rescoring(model, batch, seeds)
                print(f"  step {step + 1}: KL_rescore on its pairs {float(value.detach()):.4f} -> "
                      f"{float(after):.4f} (after the update)", flush=True)

    start = time.time()
    results = {}
    for label, lam in (("A control", 0.0), (f"B lambda={args.lam:g}", args.lam)):
        torch.manual_seed(0)
        model = load()
        before, acc0 = held_out(model)
        train(model, lam)
        after, acc1 = held_out(model)
        results[label] = after
        print(f"{label}: held-out relabel KL {sum(before) / len(before):.4f} -> "
              f"{sum(after) / len(after):.4f}; action accuracy {acc0:.3f} -> {acc1:.3f} ({len(after)} items, "
              f"{args.steps} steps of {args.batch})", flush=True)
    a, b = results.values()
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1))
    print(f"B - A held-out relabel KL after training: {mean:+.4f} ± {1.96 * sd / math.sqrt(len(d)):.4f} "
          f"(paired over {len(d)} items; B lower on {sum(v < 0 for v in d)}); {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
