"""The vLLM rollout path on a GPU: two CIPR steps with vLLM colocated in the training process, in bf16.

Skipped on machines without CUDA (conftest) and where vLLM is not installed. The same code runs on CPU
in float32 with vLLM's CPU build in `tests/test_vllm.py` (weight push checked after every step); this
test adds the CUDA build, bf16 and the GPU memory settings. With vLLM's importance-sampling correction
the rollouts keep vLLM's token ids, so the action read is not folded into the task forward
(`actions/folded` is 0) and the loss uses TRL's own log-probabilities.
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.gpu
def test_vllm_colocate_runs_two_cipr_steps(tmp_path):
    pytest.importorskip("vllm")
    from support.tiny_models import save_tiny

    from cipr.core.config import from_dict
    from cipr.train.run import TrainConfig, run

    tiny = save_tiny(tmp_path / "tiny")
    cfg = from_dict(TrainConfig, {
        "model": {"name_or_path": str(tiny), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "call_format": "hermes", "dtype": "bfloat16"},
        "data": {"source": "synthetic", "n": 12, "eval_examples": 2, "tools_per_example": [1, 2]},
        "rollout": {"backend": "vllm_colocate", "num_generations": 2, "max_completion_length": 32,
                    "gpu_memory_utilization": 0.2, "max_model_length": 4096},
        "trainer": {"run_dir": str(tmp_path / "run"), "max_steps": 2, "per_device_train_batch_size": 4,
                    "save_steps": 1, "precision": "bf16", "warm_start": {"steps": 0}},
        "logging": {"progress_bar": False},
    })
    run_dir = run(cfg)
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("stage") == "grpo" and r.get("kind") == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("reward" in r and r.get("actions/folded") == 0.0 for r in steps)
    assert (run_dir / "grpo" / "checkpoint-2" / "model.safetensors").is_file()
