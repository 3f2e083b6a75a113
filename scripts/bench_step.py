"""Step cost of CIPR against multi-interface training, and of our GRPO against stock TRL, on identical
rollouts.

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
algorithms alternates between repetitions so drift in machine load hits all), with the
[min-max] of the per-repetition ratios.

Against the library it extends: `grpo` is our trainer with `algo=grpo` and `trl` stock
`trl.GRPOTrainer` on the same GRPOConfig, model copy, prompts, reward function (our scorer) and
replayed completions; each generates with its own class's HF path (ours: one prefill per distinct
prompt shared by its G samples; TRL's: `generate` over the repeated prompts). `vs_trl` is the step
ratio grpo / trl (target <= 1.05), `vs_trl_train` the same without generation (scoring + update). Off
Triton devices our trainer scores only the completion positions (`cipr.train.grpo_fast.completion_logps`),
where TRL's fused head projects every prompt position onto the vocabulary too; both trainers get the
same model, whose backward stops at the frozen bottom layers (`cipr.runtime.model.freeze_bottom`).
`cipr_unfolded` is CIPR with `algo.fold_action_read=false`: the task loss from the scoring above plus
separate action reads, i.e. the cost of the consistency terms on their own (`--full`). The
last line is `step_ratio=<r> update_ratio=<r>` for `cipr` (the default) against `multi_interface`,
then `vs_trl` and `vs_trl_train`, each the larger over the models benchmarked (targets: 1.5, 2.2, 1.05).

Default: SmolLM2-135M (bottom 20 of 30 layers frozen, as the main job), one pair x G=2 x 2 interfaces
per step, 1-2 tools per interface, completions of at most 64 tokens, a warm-up repetition (scoring and
updates; generation is timed only in the measured ones) and 2 measured ones; it prints its wall time.
Larger settings by option (`--generations 4 --max-completion-length 96` is the main job's rollout shape;
its prompts also have 1-2 tools).

    .venv/bin/python scripts/bench_step.py                 # the default above
    .venv/bin/python scripts/bench_step.py --full          # tiny model too, and cipr_unfolded
    .venv/bin/python scripts/bench_step.py --models tiny --repeats 3
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support code: tiny models

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm


def build(model_name: str, workdir: Path, pairs: int, g: int, max_len: int, tools: tuple[int, int] = (1, 2)
          ) -> tuple[Any, Any, Any, Any]:
    from support.tiny_models import save_tiny

    from cipr.formats import get_format
    from cipr.perturb.config import PerturbConfig
    from cipr.runtime.model import ModelConfig, load_model
    from cipr.train.data import DataConfig, build_prompts, load_examples

    if model_name == "tiny":
        cfg = ModelConfig(name_or_path=str(save_tiny(workdir / "tiny")), gguf_package=None, gguf_file=None,
                          call_format="hermes")
    else:
        cfg = ModelConfig(freeze_bottom_layers=20)
    model, tokenizer = load_model(cfg)
    fmt = get_format(cfg.call_format)
    data = DataConfig(n=pairs * 4 + 2, eval_examples=2, tools_per_example=tools)
    prompts = build_prompts(load_examples(data), data, PerturbConfig(names="canonical", paired=True), fmt=fmt,
                            tokenizer=tokenizer)
    return model, tokenizer, fmt, prompts


def make_trainer(algo: str, model: Any, tokenizer: Any, fmt: Any, prompts: Any, g: int, pairs: int,
                 max_len: int, out: Path) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig

    from cipr.train.algo import AlgoConfig
    from cipr.train.grpo import CIPRGRPOTrainer
    from cipr.train.replay import ReplayRollouts, replay_rollouts
    from cipr.train.reward import RolloutScorer

    args = GRPOConfig(output_dir=str(out / algo), per_device_train_batch_size=2 * g * pairs,
                      num_generations=g, max_completion_length=max_len, learning_rate=1e-6, bf16=False,
                      gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
                      report_to="none", use_cpu=not torch.cuda.is_available(), beta=0.0, loss_type="grpo",
                      logging_steps=1, disable_tqdm=True, remove_unused_columns=False)
    scorer = RolloutScorer(prompts.records, fmt, tokenizer, [tokenizer.eos_token_id, tokenizer.pad_token_id])
    data = Dataset.from_list(prompts.rows())
    if algo == "trl":  # stock TRL: the same scorer as its reward function, nothing of ours in the trainer
        from trl import GRPOTrainer

        class ReplayedGRPOTrainer(GRPOTrainer):
            """Stock TRL, its completions replayed as ours are."""

            replay = ReplayRollouts(prompts.records, fmt, tokenizer, max_completion_length=max_len)

            def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
                return self.replay(prompt_ids)

        trainer = ReplayedGRPOTrainer(model=model, reward_funcs=[scorer], args=args, train_dataset=data,
                                      processing_class=tokenizer)
    else:
        algo_cfg = AlgoConfig(name="cipr" if algo.startswith("cipr") else algo,
                              fold_action_read=algo != "cipr_unfolded")  # cipr: its terms at 0.1 each
        trainer = CIPRGRPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                  prompts=prompts, scorer=scorer, algo=algo_cfg, fmt=fmt,
                                  objective=algo_cfg.objective(), rollout_source=replay_rollouts())
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
    """The trainer's own HF generation of this batch (ours: shared prompt prefill, `GRPOFastPaths`; TRL's:
    `generate`), past the replay that stands in for it in training steps."""
    from trl import GRPOTrainer

    from cipr.train.grpo_fast import GRPOFastPaths

    ids = trainer.processing_class(text=[x["prompt"] for x in inputs])["input_ids"]
    sample = GRPOFastPaths if isinstance(trainer, GRPOFastPaths) else GRPOTrainer
    start = time.perf_counter()
    with torch.no_grad():
        sample._generate_single_turn(trainer, ids, None, {}, trainer.num_generations)
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


ALGOS = ("multi_interface", "cipr", "grpo", "trl")
FULL_ALGOS = (*ALGOS, "cipr_unfolded")


def spread(values: list[float]) -> str:
    return f"[{min(values):.2f}-{max(values):.2f}]"


def bench_model(name: str, repeats: int, pairs: int, g: int, max_len: int, algos: tuple[str, ...] = ALGOS,
                tools: tuple[int, int] = (1, 2)) -> dict[str, list[float]]:
    """Per-repetition ratios of one model: step and update of cipr / multi_interface, step of grpo / trl."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, tokenizer, fmt, prompts = build(name, work, pairs, g, max_len, tools)
        trainers = {algo: make_trainer(algo, copy.deepcopy(model), tokenizer, fmt, prompts, g, pairs,
                                       max_len, work)
                    for algo in algos}
        times: dict[str, dict[str, list[float]]] = {a: {"gen": [], "score": [], "update": []}
                                                    for a in trainers}
        # warm-up not counted
        for r in tqdm(range(repeats + 1), desc=f"{name}: repetitions (first is warm-up)"):
            inputs = batch_rows(trainers["cipr"], (r * pairs) % (len(prompts.records) // 2 - pairs), pairs, g)
            gen = {"ours": time_generation(trainers["cipr"], inputs),  # not timed in the warm-up: its times
                   "trl": time_generation(trainers["trl"], inputs)} if r else {}  # would be discarded anyway
            completions = {}
            order = list(trainers)[r % len(trainers):] + list(trainers)[:r % len(trainers)]
            for algo in order:
                score, update, completions[algo] = one_step(trainers[algo], inputs, seed=1000 + r)
                if r:
                    times[algo]["gen"].append(gen["trl" if algo == "trl" else "ours"])
                    times[algo]["score"].append(score)
                    times[algo]["update"].append(update)
            if not all(torch.equal(c, completions["multi_interface"]) for c in completions.values()):
                raise RuntimeError("the trainers did not see identical rollouts")
    med = {a: {k: statistics.median(v) for k, v in t.items()} for a, t in times.items()}
    step = {a: [sum(x) for x in zip(*t.values(), strict=True)] for a, t in times.items()}
    print(f"\n{name}: {pairs} pair(s) x G={g} x 2 interfaces per step, {repeats} repetitions (medians, "
          "seconds)")
    print(f"{'algo':<16}{'generation':>12}{'scoring':>10}{'update':>10}{'step':>10}")
    for algo, m in med.items():
        print(f"{algo:<16}{m['gen']:>12.3f}{m['score']:>10.3f}{m['update']:>10.3f}"
              f"{statistics.median(step[algo]):>10.3f}")
    per_rep = {
        "step": [a / b for a, b in zip(step["cipr"], step["multi_interface"], strict=True)],
        "update": [a / b
                   for a, b in zip(times["cipr"]["update"], times["multi_interface"]["update"], strict=True)],
        "vs_trl": [a / b for a, b in zip(step["grpo"], step["trl"], strict=True)],
        "vs_trl_train": [(a1 + a2) / (b1 + b2) for a1, a2, b1, b2 in zip(
            times["grpo"]["score"], times["grpo"]["update"], times["trl"]["score"], times["trl"]["update"],
            strict=True)],
    }
    unfolded = (" (unfolded: "
                f"update_ratio={med['cipr_unfolded']['update'] / med['multi_interface']['update']:.2f})"
                if "cipr_unfolded" in med else "")
    print(f"{name}: " + " ".join(f"{k}={statistics.median(v):.2f} {spread(v)}" for k, v in per_rep.items())
          + unfolded)
    return per_rep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated: tiny, smollm2 (default smollm2; "
                        "both with --full)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="both models, and CIPR without folding too")
    parser.add_argument("--pairs", type=int, default=1, help="canonical/perturbed pairs per step")
    parser.add_argument("--generations", type=int, default=2, help="G")
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--tools", default="1,2", help="MIN,MAX tools per training interface")
    args = parser.parse_args()
    worst: dict[str, list[float]] = {}
    started = time.perf_counter()
    models = args.models or ("tiny,smollm2" if args.full else "smollm2")
    for name in models.split(","):
        low, high = (int(x) for x in args.tools.split(","))
        per_rep = bench_model(name.strip(), args.repeats, args.pairs, args.generations,
                              args.max_completion_length, FULL_ALGOS if args.full else ALGOS, (low, high))
        for k, v in per_rep.items():
            if k not in worst or statistics.median(v) > statistics.median(worst[k]):
                worst[k] = v
    print(f"wall_s={time.perf_counter() - started:.0f}")
    print(" ".join(f"{'step_ratio' if k == 'step' else 'update_ratio' if k == 'update' else k}="
                   f"{statistics.median(v):.2f} {spread(v)}" for k, v in worst.items()))

if __name__ == "__main__":
    main()
