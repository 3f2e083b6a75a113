"""Step cost of CIPR against multi-interface training on identical rollouts (tiny model and SmolLM2-135M).

Both algorithms see the same interfaces and, here, the same rollouts: the trainers are built from
one initial model, and each repetition draws its completions with `ReplayRollouts` (reference calls,
twin/wrong calls, no-call answers, off-format text: rollouts with decisions, as a trained policy
makes) under the same RNG seed for both, so the canonical and perturbed groups are identical
(asserted). Per repetition and algorithm:
- generation: HF `generate` of the same batch (G samples per prompt, sampling, up to
  `max_completion_length` tokens) timed once per repetition and shared, since it is the same
  computation for both algorithms;
- scoring: `_generate_and_score_completions` with the replayed completions (rewards, advantages,
  decisions);
- update: the trainer's loss (`compute_loss`), backward and optimizer step.
The whole step is generation + scoring + update. Medians over repetitions (the order of the
algorithms alternates between repetitions so drift in machine load hits all). `cipr_unfolded` is
CIPR with `algo.fold_action_read=false`: TRL's own forward for the task loss plus separate action
reads, i.e. the cost of the consistency terms on top of TRL's path (the folded read skips TRL's
per-token entropy, which is why folded CIPR can update faster than multi-interface training). The
last line is `step_ratio=<r> update_ratio=<r>` for `cipr` (the default) against `multi_interface`,
the larger ratio over the models benchmarked (targets: 1.5, 2.2).

    .venv/bin/python scripts/bench_step.py                 # tiny model and SmolLM2-135M (prints its wall time)
    .venv/bin/python scripts/bench_step.py --models tiny --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm


def build(model_name: str, workdir: Path, pairs: int, g: int, max_len: int) -> tuple[Any, Any, Any, Any]:
    from cipr.formats import get_format
    from cipr.testing import save_tiny
    from cipr.train.data import DataConfig, build_prompts, load_examples
    from cipr.train.model import ModelConfig, load_model

    if model_name == "tiny":
        cfg = ModelConfig(name_or_path=str(save_tiny(workdir / "tiny")), gguf_package=None, gguf_file=None,
                          call_format="hermes")
    else:
        cfg = ModelConfig(freeze_bottom_layers=20)
    model, tokenizer = load_model(cfg)
    fmt = get_format(cfg.call_format)
    # the tiny byte-level tokenizer needs ~3x the tokens of SmolLM2's for the same text: fewer tools keep
    # its prompts under 2,048 tokens
    data = DataConfig(n=pairs * 4 + 2, eval_examples=2, tools_per_example=(1, 2) if model_name == "tiny" else (2, 3))
    prompts = build_prompts(load_examples(data), data, names="canonical", perturbed=True, fmt=fmt,
                            tokenizer=tokenizer)
    return model, tokenizer, fmt, prompts


def make_trainer(algo: str, model: Any, tokenizer: Any, fmt: Any, prompts: Any, g: int, pairs: int, max_len: int,
                 out: Path) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig

    from cipr.train.algo import AlgoConfig
    from cipr.train.grpo import CIPRGRPOTrainer
    from cipr.train.replay import ReplayRollouts
    from cipr.train.reward import RolloutScorer

    weights = (0.1, 0.1) if algo.startswith("cipr") else (0.0, 0.0)
    algo_cfg = AlgoConfig(name="cipr" if algo.startswith("cipr") else algo, rescore_weight=weights[0],
                          rollout_weight=weights[1], fold_action_read=algo != "cipr_unfolded")
    args = GRPOConfig(output_dir=str(out / algo), per_device_train_batch_size=2 * g * pairs, num_generations=g,
                      max_completion_length=max_len, learning_rate=1e-6, bf16=False, gradient_checkpointing=True,
                      gradient_checkpointing_kwargs={"use_reentrant": False},
                      report_to="none", use_cpu=not torch.cuda.is_available(), beta=0.0, loss_type="grpo",
                      logging_steps=1, disable_tqdm=True, remove_unused_columns=False)
    scorer = RolloutScorer(prompts.records, fmt, tokenizer, [tokenizer.eos_token_id, tokenizer.pad_token_id])
    trainer = CIPRGRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(prompts.rows()),
                              processing_class=tokenizer, prompts=prompts, scorer=scorer, algo=algo_cfg, fmt=fmt)
    ReplayRollouts(prompts.records, fmt, tokenizer, max_completion_length=max_len).install(trainer)
    trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def batch_rows(trainer: Any, start_pair: int, pairs: int, g: int) -> list[dict[str, Any]]:
    rows = trainer.train_dataset
    out = []
    for k in range(start_pair, start_pair + pairs):
        for row in (2 * k, 2 * k + 1):
            out += [dict(rows[row]) for _ in range(g)]
    return out


def time_generation(trainer: Any, inputs: list[dict[str, Any]]) -> float:
    """The trainer's own HF generation (shared prompt prefill) of this batch; replay replaced it on the instance."""
    from cipr.train.grpo import CIPRGRPOTrainer

    ids = trainer.processing_class(text=[x["prompt"] for x in inputs])["input_ids"]
    start = time.perf_counter()
    with torch.no_grad():
        CIPRGRPOTrainer._generate_single_turn(trainer, ids, None, {}, trainer.num_generations)
    return time.perf_counter() - start


def one_step(trainer: Any, inputs: list[dict[str, Any]], seed: int) -> tuple[float, float, torch.Tensor]:
    torch.manual_seed(seed)
    start = time.perf_counter()
    batch = trainer._generate_and_score_completions(inputs)
    scored = time.perf_counter()
    loss = trainer.compute_loss(trainer.model, batch)
    trainer.accelerator.backward(loss)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    done = time.perf_counter()
    return scored - start, done - scored, batch["completion_ids"]


def bench_model(name: str, repeats: int, pairs: int, g: int, max_len: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, tokenizer, fmt, prompts = build(name, work, pairs, g, max_len)
        trainers = {algo: make_trainer(algo, copy.deepcopy(model), tokenizer, fmt, prompts, g, pairs, max_len, work)
                    for algo in ("multi_interface", "cipr", "cipr_unfolded")}
        times: dict[str, dict[str, list[float]]] = {a: {"gen": [], "score": [], "update": []} for a in trainers}
        for r in tqdm(range(repeats + 1), desc=f"{name}: repetitions (first is warm-up)"):  # warm-up not counted
            inputs = batch_rows(trainers["cipr"], (r * pairs) % (len(prompts.records) // 2 - pairs), pairs, g)
            gen = time_generation(trainers["cipr"], inputs)
            completions = {}
            order = list(trainers)[r % len(trainers):] + list(trainers)[:r % len(trainers)]
            for algo in order:
                score, update, completions[algo] = one_step(trainers[algo], inputs, seed=1000 + r)
                if r:
                    times[algo]["gen"].append(gen)
                    times[algo]["score"].append(score)
                    times[algo]["update"].append(update)
            if not all(torch.equal(c, completions["multi_interface"]) for c in completions.values()):
                raise RuntimeError("the algorithms did not see identical rollouts")
    med = {a: {k: statistics.median(v) for k, v in t.items()} for a, t in times.items()}
    step = {a: m["gen"] + m["score"] + m["update"] for a, m in med.items()}
    print(f"\n{name}: {pairs} pair(s) x G={g} x 2 interfaces per step, {repeats} repetitions (medians, seconds)")
    print(f"{'algo':<16}{'generation':>12}{'scoring':>10}{'update':>10}{'step':>10}")
    for algo, m in med.items():
        print(f"{algo:<16}{m['gen']:>12.3f}{m['score']:>10.3f}{m['update']:>10.3f}{step[algo]:>10.3f}")
    ratios = {"step": step["cipr"] / step["multi_interface"],
              "update": med["cipr"]["update"] / med["multi_interface"]["update"]}
    unfolded = med["cipr_unfolded"]["update"] / med["multi_interface"]["update"]
    print(f"{name}: step_ratio={ratios['step']:.2f} update_ratio={ratios['update']:.2f} "
          f"(unfolded: update_ratio={unfolded:.2f})")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1, help="canonical/perturbed pairs per step")
    parser.add_argument("--generations", type=int, default=4, help="G")
    parser.add_argument("--max-completion-length", type=int, default=96)
    args = parser.parse_args()
    worst = {"step": 0.0, "update": 0.0}
    started = time.perf_counter()
    for name in args.models.split(","):
        ratios = bench_model(name.strip(), args.repeats, args.pairs, args.generations, args.max_completion_length)
        worst = {k: max(worst[k], ratios[k]) for k in worst}
    print(f"wall_s={time.perf_counter() - started:.0f}")
    print(f"step_ratio={worst['step']:.2f} update_ratio={worst['update']:.2f}")


if __name__ == "__main__":
    main()
