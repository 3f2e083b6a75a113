"""Process memory on CPU: glibc's malloc thresholds, set for memory (training) or for speed (evaluation).

Training, `limit_heap_growth`: keep glibc from holding freed tensor memory (peak RSS of a GRPO step halves).

PyTorch's CPU allocator is glibc malloc. glibc serves blocks above a threshold with mmap and returns
them to the OS on free, but it raises that threshold (up to 32 MB) each time such a block is freed,
so the next tensors of a few MB come from the heap, whose freed space is kept and fragments. A
training step allocates and frees many such tensors (attention masks, MLP activations, logits
chunks), and the process's resident memory grows to about twice what is live. `limit_heap_growth`
fixes the mmap threshold at 1 MiB and the heap's trim threshold at 64 MiB (fixed values also stop
glibc's adjustment). The cost is page faults on every fresh mmapped tensor: the update is slower.
`scripts/bench_memory.py` measures both sides (peak RSS an update adds, update time) in one run.

Opt-in (`CIPR_LOW_MEMORY=1`), because the page faults cost time: the README main job with a 30-step warm
start ran in 15 min 29 s on 2 idle cores at 4.63 GB peak RSS, of which 587 s were system time (1,201 s
user); the CPU ladder's training process (docs/results/cpu_ladder.md), without it, peaked at 9.9 GB.

Evaluation, `retain_freed_memory` (the other way): glibc's defaults still mmap a block above the
current threshold afresh and unmap it on free, and hand the free top of the heap back past the trim
threshold, so a CPU forward (activations of a few MB per layer: 3.5 MB per MLP product for a
563-token prompt on SmolLM2-135M) can fault fresh pages in again, one fault per 4 KB; how many depends
on how far glibc has raised its thresholds in that process so far. Raising both thresholds keeps those
blocks in the heap for the next forward; the process keeps its peak heap, small next to the weights
when generating. `cipr-eval` does it on CPU (`retain_heap`, on by default); `scripts/bench_eval.py`
prints the prefill seconds and page faults per item with it and, with `--no-retain-heap`, without it
(there, after its warm-up, the faults it removes cost less than the run-to-run noise).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 20  # 1 MiB: tensors this size and up are mmapped and given back on free
TRIM_THRESHOLD = 64 << 20  # 64 MiB of free heap top is returned to the OS


RETAIN_MMAP_THRESHOLD = 1 << 30  # blocks under 1 GiB come from the heap
RETAIN_TRIM_THRESHOLD = (1 << 31) - 1  # free heap is kept (glibc takes an int)


def _mallopt() -> Any:
    """glibc's `mallopt(int, int) -> int`, or None where there is none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def retain_freed_memory() -> bool:
    """Keep freed tensor memory in this process (module docstring); whether it was set. Not with
    `CIPR_LOW_MEMORY=1` (which asks for the opposite) or where the user set glibc's thresholds
    (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`), nor without glibc. This process only: the
    processes it starts keep glibc's defaults."""
    if os.environ.get("CIPR_LOW_MEMORY") == "1" or "MALLOC_MMAP_THRESHOLD_" in os.environ or \
            "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, RETAIN_MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, RETAIN_TRIM_THRESHOLD))


def limit_heap_growth() -> bool:
    """With `CIPR_LOW_MEMORY=1`: set glibc's mmap and trim thresholds for this process (module docstring) and, through the
    environment glibc reads at start-up, for the processes it starts (launchers, workers). Left alone
    when the user set either (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`); False where there
    is no glibc or nothing was changed."""
    if os.environ.get("CIPR_LOW_MEMORY") != "1":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    if mallopt is None or not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return False
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(TRIM_THRESHOLD)
    return True
