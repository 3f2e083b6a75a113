"""Process memory on CPU: keep glibc from holding freed tensor memory (peak RSS of a GRPO step halves).

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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 20  # 1 MiB: tensors this size and up are mmapped and given back on free
TRIM_THRESHOLD = 64 << 20  # 64 MiB of free heap top is returned to the OS


def limit_heap_growth() -> bool:
    """With `CIPR_LOW_MEMORY=1`: set glibc's mmap and trim thresholds for this process (module docstring) and, through the
    environment glibc reads at start-up, for the processes it starts (launchers, workers). Left alone
    when the user set either (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`); False where there
    is no glibc or nothing was changed."""
    if os.environ.get("CIPR_LOW_MEMORY") != "1":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return False
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(TRIM_THRESHOLD)
    return True
