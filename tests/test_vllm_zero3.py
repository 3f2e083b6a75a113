"""vLLM colocated with `distributed=zero3` on two CPU processes (marker `vllm`, `extended`): see
tests/test_vllm.py, section 2. A module of its own so that test_vllm.py's server and models are torn down
before its two engines start (the run is sized for 24 GiB)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import test_vllm
from support.launch import accelerate_launch
from test_vllm import COLOCATE, ROOT, VLLM_ENV, WARM, check_pushes, grpo_steps, read_probe

pytestmark = test_vllm.pytestmark


@pytest.mark.extended(seconds=544)
def test_colocate_cipr_under_zero3_on_two_processes_gathers_the_shards_into_vllm(tmp_path):
    """`distributed=zero3` with vLLM colocated, on two CPU processes (DeepSpeed on its CPU accelerator, gloo):
    a one-step warm start, then CIPR GRPO step 1. Each rank holds half of every parameter; before generating,
    each rank's push gathers the full weights (TRL's `_iter_named_params` under ZeRO-3) into its own vLLM
    engine, and the probe then checks that engine against the gathered HF policy. Sized for 24 GiB: the top 10
    layers train, with gradient checkpointing (every layer trained without it held 8 GB a process). Launched
    as accelerate launches cipr-train's workers, with tests/test_vllm.py as the worker, so the probe runs on
    both ranks."""
    from cipr.runtime.embedded import embedded_hf_dir

    embedded_hf_dir()  # converted once here, not by both ranks at once
    run_dir, probe = tmp_path / "run", tmp_path / "probe.jsonl"
    env = {**os.environ, **VLLM_ENV, "CIPR_VLLM_PROBE": str(probe), "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "disabled"}
    overrides = [*COLOCATE, *WARM, "trainer.max_steps=1", "distributed=zero3", "launcher.num_processes=2",
                 "trainer.gradient_checkpointing=true", f"trainer.run_dir={run_dir}"]
    cmd = accelerate_launch(str(Path(test_vllm.__file__).resolve()), *overrides)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    print(f"zero3 colocate, two processes: {time.time() - start:.0f} s, exit {proc.returncode}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "distributed=zero3: accelerate built zero3 over 2 processes" in proc.stdout + proc.stderr
    pushes = read_probe(probe)
    assert sorted(p["rank"] for p in pushes) == [0, 1]  # one push per rank, at step 1
    assert all(p["zero3_partitioned"] for p in pushes), pushes  # the policy's weights are ZeRO-3 shards
    check_pushes(pushes, "zero3")
    assert all(p["gap_before"] > 1.0 for p in pushes), "the warm start did not move the policy: no teeth"
    steps = grpo_steps(run_dir)
    assert [r["step"] for r in steps] == [1] and "actions/folded" in steps[0]
    assert (run_dir / "grpo" / "final" / "model.safetensors").is_file()
