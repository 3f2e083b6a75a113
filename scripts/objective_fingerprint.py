"""Numbers that pin the training objective: one short run of every algorithm x regime on the tiny model.

Each case trains two optimizer steps (one for multi-turn ToyShop) with fixed seeds on one thread, from a
24-step SFT warm start of the tiny offline model (a random one puts ~1e-17 on opening a call, and every
action distribution is then ∅), with rollouts replayed (`cipr.train.replay`, ToyShop's scripted expert for
episodes) so that every case sees calls. It records, per step, the loss, the gradient norm and every
consistency and action metric, and per case a SHA-256 digest of the final weights and their L2 norm.

    .venv/bin/python scripts/objective_fingerprint.py --out FILE          # record
    .venv/bin/python scripts/objective_fingerprint.py --check FILE        # compare with a record

`--check` prints, per case, the largest relative difference of any recorded number and whether the weight
digests are equal (bit-identical training), and exits 1 when a number differs by more than `--atol` +
`--rtol` times its value. A refactor of the objective that must not change the numbers records before and
checks after, on the same machine (digests compare bit for bit only on one CPU kind and thread count); on
another machine tests/test_objective_fingerprint.py checks the record within a tolerance.

A record holds one entry per CPU kernel set (`by_cpu`, keyed by `torch.backends.cpu.get_cpu_capability()`:
AVX2, AVX512, ...): the 24-step warm start amplifies the kernels' rounding, so an AVX2 and an AVX-512 machine
differ by far more than any tolerance (entropy 2.58 against 2.46 at GRPO's first step). `--out` adds or
replaces this machine's entry; `--check` compares with it, else with the entry `other` (the first record,
taken on a machine whose kind was not written down, not an AVX2 one).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support code: tiny models

import argparse
import hashlib
import json
import math
import tempfile
import time
from typing import Any

import torch

SKIP = ("time", "speed/", "memory/", "step_time", "train_runtime", "train_tokens_per_second",
        "train_samples_per_second", "train_steps_per_second", "epoch", "learning_rate", "total_flos")
"""Metric-name prefixes left out: wall times, memory and schedule bookkeeping, not the objective."""

SINGLE = {"source": "synthetic", "n": 12, "eval_examples": 2, "tools_per_example": [1, 2], "seed": 0}
SUPERVISED = {"source": "synthetic", "n": 14, "eval_examples": 2, "tools_per_example": [2, 3], "seed": 0,
              "parallel_fraction": 0.0, "no_call_fraction": 0.0, "same_domain_distractors": 0.0}
WARM = 60


def weights(rescore: float, rollout: float) -> dict[str, Any]:
    """CIPR's two consistency terms at these weights (`algo.terms`)."""
    return {"terms": {"rescore": {"weight": rescore}, "rollout": {"weight": rollout}}}


ALGOS = {"grpo": {"name": "grpo"}, "multi_interface": {"name": "multi_interface"},
         "masking": {"name": "masking"}, "cipr": {"name": "cipr", **weights(0.5, 0.5)}}


def cases() -> dict[str, dict[str, Any]]:
    """Case name -> (warm start format, config sections, replay kind)."""
    out: dict[str, dict[str, Any]] = {}
    for algo in ("grpo", "multi_interface", "masking", "cipr"):
        out[f"rl/{algo}"] = {"format": "hermes", "replay": "single", "data": SINGLE, "algo": ALGOS[algo],
                             "rollout": {"num_generations": 2, "max_completion_length": 96},
                             "trainer": {"per_device_train_batch_size": 4,
                                         "gradient_accumulation_steps": 2 if algo == "cipr" else 1}}
    for algo in ("multi_interface", "cipr"):
        out[f"multi_turn/{algo}"] = {
            "format": "hermes", "replay": "episodes",
            "data": {"source": "synthetic", "n": 8, "eval_examples": 0, "tools_per_example": [2, 2],
                     "seed": 0},
            "algo": {**ALGOS[algo], **(weights(1.0, 1.0) if algo == "cipr" else {})},
            "rollout": {"num_generations": 2, "max_completion_length": 2048, "mode": "multi_turn",
                        "episode_tasks": 4},
            "env": {"name": "toyshop", "n_tasks": 40, "max_turns": 8},
            "trainer": {"max_steps": 1, "per_device_train_batch_size": 8}}
    for algo in ("grpo", "multi_interface", "cipr"):
        for action in (0.0, 1.0):
            changes = {"regime": "supervised", "action_weight": action,
                       **(weights(1.0, 0.0) if algo == "cipr" else {})}
            out[f"supervised/{algo}/action{action:g}"] = {
                "format": "compact", "replay": None, "data": SUPERVISED, "algo": {**ALGOS[algo], **changes},
                "rollout": {"num_generations": 2, "max_completion_length": 64},
                "trainer": {"per_device_train_batch_size": 2}}
    out["distill"] = {
        "format": "hermes", "replay": None,
        "data": {"n": 6, "eval_examples": 2, "max_observation_chars": 60, "max_turns": 2},
        "algo": {"name": "distill", "eval": {"namings": ["canonical", "synonyms", "swapped"]}},
        "trainer": {"per_device_train_batch_size": 2, "save_total_limit": 2}}
    return out


def warm_start(base: Path, work: Path, call_format: str) -> Path:
    """The tiny model after `WARM` supervised multi-interface steps with the action cross-entropy in
    `call_format`: its action distributions are far from all-∅ (after the tests' 24 plain SFT steps the
    mass on ∅ is ~0.9999, and every KL ~1e-5)."""
    from cipr.core.config import from_dict
    from cipr.train.run import TrainConfig, run

    data = SINGLE if call_format == "hermes" else SUPERVISED
    cfg = from_dict(TrainConfig, {
        "model": {"name_or_path": str(base), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "call_format": call_format},
        "data": data,
        "algo": {**ALGOS["multi_interface"], "regime": "supervised", "action_weight": 1.0},
        "trainer": {"run_dir": str(work / f"sft_{call_format}"), "max_steps": WARM, "save_steps": WARM,
                    "per_device_train_batch_size": 2, "learning_rate": 1e-2, "seed": 0,
                    "gradient_checkpointing": False, "warm_start": {"steps": 0, "eval_examples": 0}},
        "logging": {"progress_bar": False, "print_metrics": False}})
    return run(cfg) / "supervised" / "final"


def rollout_source(kind: str | None) -> Any:
    """GRPO's rollouts: replayed completions (single turns) or ToyShop's expert (episodes); None: sampled."""
    if kind is None:
        return None
    from cipr.train.replay import replay_rollouts

    if kind == "single":
        return replay_rollouts()
    from support.episode_replay import EpisodeReplay, expert_choice

    def episodes(trainer: Any) -> Any:
        replay = EpisodeReplay(trainer.episodes, expert_choice(trainer.episodes))
        return lambda prompt_ids: replay.generate(prompt_ids, step=trainer.state.global_step)

    return episodes


def weights_of(run_dir: Path) -> tuple[str, float]:
    """(SHA-256 of the final weights' bytes in name order, their L2 norm) of the run's last stage."""
    from safetensors.torch import load_file

    summary = json.loads((run_dir / "summary.json").read_text())
    stage = list(summary["final"])[-1]
    tensors = load_file(str(run_dir / stage / "final" / "model.safetensors"))
    digest = hashlib.sha256()
    total = 0.0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(name.encode())
        digest.update(t.numpy().tobytes())
        total += float(t.double().pow(2).sum())
    return digest.hexdigest(), math.sqrt(total)


def run_case(name: str, case: dict[str, Any], warm: Path, work: Path) -> dict[str, Any]:
    from cipr.train.config import config_from_dict
    from cipr.train.run import run

    trainer = {"run_dir": str(work / name.replace("/", "_")), "max_steps": 2, "learning_rate": 1e-3,
               "save_steps": 1, "seed": 0, "gradient_checkpointing": False, "gradient_accumulation_steps": 1,
               "warm_start": {"steps": 0, "eval_examples": 0}, **case["trainer"]}
    if case["algo"]["name"] == "distill":
        trainer.pop("gradient_checkpointing")
        trainer.pop("gradient_accumulation_steps")
        trainer.pop("warm_start")
    cfg = {"model": {"name_or_path": str(warm), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                     "call_format": case["format"]},
           "data": case["data"], "algo": case["algo"], "trainer": trainer,
           "logging": {"progress_bar": False, "print_metrics": False}}
    if "rollout" in case:
        cfg["rollout"] = case["rollout"]
    if "env" in case:
        cfg["env"] = case["env"]
    torch.manual_seed(0)
    run_dir = run(config_from_dict(cfg), rollout_source=rollout_source(case["replay"]))
    steps = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "step":
            steps.append({k: v for k, v in sorted(r.items()) if isinstance(v, int | float)
                          and not isinstance(v, bool) and not k.startswith(SKIP)})
    digest, norm = weights_of(run_dir)
    return {"steps": steps, "weights_sha256": digest, "weights_l2": norm}


def record(only: list[str] | None) -> dict[str, Any]:
    from support.tiny_models import save_tiny

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = save_tiny(work / "tiny")
        warm = {f: warm_start(base, work, f) for f in ("hermes", "compact")}
        for name, case in cases().items():
            if only and not any(name.startswith(o) for o in only):
                continue
            start = time.time()
            out[name] = run_case(name, case, warm[case["format"]], work)
            print(f"{name}: {len(out[name]['steps'])} step(s), loss "
                  f"{[round(s.get('loss', float('nan')), 6) for s in out[name]['steps']]}, "
                  f"{time.time() - start:.1f} s", flush=True)
    return out


RENAMED = {"consistency/rescore_kl": "consistency/rescore/kl",
           "consistency/rollout_kl": "consistency/rollout/kl",
           **{f"rescore/{k}": f"consistency/rescore/{k}" for k in ("kl", "max", "tv", "argmax_agree",
                                                                   "none_canon", "none_other", "decisions",
                                                                   "responses")}}
"""Metric names the one-objective refactor (issue 56) changed, old -> new (the values are compared)."""


def compare(before: dict[str, Any], after: dict[str, Any], rtol: float, atol: float = 0.0) -> bool:
    """Print each case's largest relative difference; True when every number x' is within `atol + rtol*|x|`
    of its recorded x. Metrics only the new record has (names the refactor added) are listed, not
    compared."""
    ok = True
    for name in before:
        if name not in after:
            continue
        a, b = before[name], after[name]
        worst, where = 0.0, ""
        added: set[str] = set()
        for i, (x, y) in enumerate(zip(a["steps"], b["steps"], strict=True)):
            x = {RENAMED.get(k, k): v for k, v in x.items()}
            for key in sorted(set(x) | set(y)):
                if key not in x:
                    added.add(key)
                    continue
                if key not in x or key not in y:
                    print(f"  {name} step {i + 1}: {key} only {'before' if key in x else 'after'}")
                    continue
                d = abs(x[key] - y[key]) / max(abs(x[key]), 1e-12)
                ok &= abs(x[key] - y[key]) <= atol + rtol * abs(x[key])
                if d > worst:
                    worst, where = d, f"step {i + 1} {key}: {x[key]!r} -> {y[key]!r}"
        d = abs(a["weights_l2"] - b["weights_l2"]) / a["weights_l2"]
        if d > worst:
            worst, where = d, f"weights_l2 {a['weights_l2']!r} -> {b['weights_l2']!r}"
        same = a["weights_sha256"] == b["weights_sha256"]
        ok &= abs(a["weights_l2"] - b["weights_l2"]) <= atol + rtol * a["weights_l2"]
        print(f"{name}: largest relative difference {worst:.2e}{' (' + where + ')' if where else ''}; "
              f"weights {'bit-identical' if same else 'differ'}"
              f"{'; new metrics: ' + ', '.join(sorted(added)) if added else ''}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the record here")
    p.add_argument("--check", type=Path, help="compare with this record")
    p.add_argument("--only", nargs="*", help="case-name prefixes to run (default: all)")
    p.add_argument("--rtol", type=float, default=1e-6)
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (for numbers near 0)")
    args = p.parse_args()
    result = record(args.only)
    kind = torch.backends.cpu.get_cpu_capability()
    if args.out:
        kept = json.loads(args.out.read_text()) if args.out.is_file() else {}
        kept = kept if "by_cpu" in kept else {"by_cpu": {}}
        kept["by_cpu"][kind] = result
        args.out.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    if args.check:
        records = json.loads(args.check.read_text())
        records = records.get("by_cpu", {"other": records})
        chosen = kind if kind in records else "other"
        print(f"this CPU's kernels: {kind}; compared with the record of {chosen}")
        sys.exit(0 if compare(records[chosen], result, args.rtol, args.atol) else 1)


if __name__ == "__main__":
    main()
