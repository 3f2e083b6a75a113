"""Two CPU processes (gloo) through `accelerate launch` with configs/accelerate/ddp.yaml: a short SFT warm
start, then two CIPR steps on the tiny model. Each process must see whole canonical/perturbed pairs
(no pair split across processes or micro-batches), and both must end every stage with identical
weights, after the CIPR steps really moved them (consistency terms non-zero)."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from support.launch import accelerate_launch

pytestmark = pytest.mark.distributed  # two gloo processes: the distributed tier

ROOT = Path(__file__).resolve().parents[1]
G = 2  # completions per prompt


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    from support.tiny_models import save_tiny

    out = tmp_path_factory.mktemp("ddp")
    tiny = save_tiny(out / "tiny")
    config = {
        "model": {"name_or_path": str(tiny), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "dtype": "float32", "call_format": "hermes"},
        "data": {"source": "synthetic", "n": 8, "seed": 0, "eval_examples": 0, "tools_per_example": [2, 2]},
        "algo": {"name": "cipr", "terms": {"rescore": {"weight": 0.1}, "rollout": {"weight": 0.1}}},
        "rollout": {"backend": "hf", "num_generations": G, "max_completion_length": 24},
        # one pair (2G completions) per process and step; the warm start makes tool calls likely
        # enough that the consistency terms have non-zero gradients
        "trainer": {"run_dir": str(out / "run"), "max_steps": 2, "save_steps": 1,
                    "per_device_train_batch_size": 2 * G, "learning_rate": 1e-3, "torch_threads": 1,
                    "warm_start": {"steps": 12, "learning_rate": 0.03, "per_device_train_batch_size": 2}},
        "logging": {"progress_bar": False},
    }
    (out / "config.json").write_text(json.dumps(config))
    cmd = accelerate_launch(str(ROOT / "tests/distributed_worker.py"), str(out / "config.json"), str(out))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out


def test_each_process_sees_whole_pairs(two_process_run):
    seen = [json.loads((two_process_run / f"batches_rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["world_size"] for s in seen] == [2, 2]
    steps = [[b["step"] for b in s["batches"]] for s in seen]
    assert steps == [[0, 1], [0, 1]]
    for step in (0, 1):
        per_rank = []
        for s in seen:
            sides: dict[int, list[str]] = defaultdict(list)
            for pair, side in s["batches"][step]["rows"]:
                sides[pair].append(side)
            assert all(sorted(v) == ["canonical"] * G + ["perturbed"] * G for v in sides.values()), sides
            per_rank.append(set(sides))
        assert not per_rank[0] & per_rank[1]  # a pair never straddles the two processes


def test_processes_end_with_identical_weights(two_process_run):
    out = two_process_run
    for stage in ("warm_start", "grpo"):
        a, b = (torch.load(out / f"weights_{stage}_rank{r}.pt") for r in (0, 1))
        assert a.keys() == b.keys()
        different = [k for k in a if not torch.equal(a[k], b[k])]
        assert not different, f"{stage}: ranks differ in {different[:5]}"
    before, after = torch.load(out / "weights_warm_start_rank0.pt"), torch.load(out / "weights_grpo_rank0.pt")
    assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-5  # the CIPR steps moved them
    steps = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    cipr = [r for r in steps if r.get("stage") == "grpo" and r.get("kind") == "step"]
    assert [r["step"] for r in cipr] == [1, 2]
    assert all(r["consistency/rescore/kl"] > 0 and r["consistency/rollout/kl"] > 0 for r in cipr)
    assert (out / "run" / "grpo" / "stage.json").is_file()
