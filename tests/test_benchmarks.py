"""The benchmark scripts run end to end on the tiny model and print their last line (integration tier).

They measure speed on SmolLM2 by default (minutes); here they only have to run and report, so that a
change in the code they drive cannot break them unnoticed. Their numbers are not checked here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def output(script: str, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True,
                            text=True, env=env, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def last_line(script: str, *args: str) -> str:
    return output(script, *args).splitlines()[-1]


def test_bench_step_prints_its_ratios():
    line = last_line("bench_step.py", "--models", "tiny", "--repeats", "1")
    assert re.fullmatch(r"step_ratio=\S+ \[\S+\] update_ratio=\S+ \[\S+\] vs_trl=\S+ \[\S+\] "
                        r"vs_trl_train=\S+ \[\S+\]", line), line


def test_bench_eval_prints_its_speedup(tiny_dir):
    text = output("bench_eval.py", "--model", str(tiny_dir), "--n", "2", "--max-new-tokens", "4",
                  "--batch-size", "2", "--repeats", "1", "--no-vllm", "--device", "cpu")
    line = text.splitlines()[-1]
    assert re.fullmatch(r"speedup=\S+ \[\S+\]", line), line
    # one repetition: the median of one value
    rep = re.search(r"^repetition 1: .*; speedup (\S+)$", text, re.M)
    assert rep and line == f"speedup={rep[1]} [{rep[1]}-{rep[1]}]", text
    assert re.search(r"^identical outputs at batch size 1 and 2: \d/1$", text, re.M), text


def test_bench_actions_prints_its_table():
    """The summary line is of SmolLM2 at 8 tools (the default run); the tiny model prints its table rows."""
    text = output("bench_actions.py", "--models", "tiny", "--tools", "4", "--repeats", "1",
                  "--brute-repeats", "1")
    for mode in ("packed", "prefix_cache"):
        assert re.search(rf"^tiny\s+{mode}\s+4\s.*\[\S+\]", text, re.M), text


def test_ab_grouped_attention_prints_each_variant(tiny_dir):
    """The tiny model groups 4 query heads over 2 key/value heads, so every variant takes its own path; `gqa`
    is the same SDPA call without the copy (bit-identical values), so its greedy texts equal `sdpa`'s."""
    text = output("ab_grouped_attention.py", "--model", str(tiny_dir), "--n", "2", "--max-new-tokens", "4",
                  "--repeats", "1")
    for name in ("sdpa", "gqa", "fold"):
        assert re.search(rf"^{name}: batch 8 \S+ \[\S+\] items/s, batch 1 \S+ \[\S+\]; speedup \(batch 8 / "
                         r"batch 1\) \S+ \[\S+\]; batch 8 vs sdpa \S+ \[\S+\]; texts equal to sdpa's \d/3$",
                         text, re.M), text
    assert re.search(r"^gqa: .*texts equal to sdpa's 3/3$", text, re.M), text
    assert re.search(r"^sdpa: .*batch 8 vs sdpa 1\.00 \[1\.00-1\.00\]", text, re.M), text
