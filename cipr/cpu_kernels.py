"""CIPR's compiled float32 CPU kernels for decoding steps: the linear layers and the attention.

A decoding step streams every weight and every cached key and value from memory once; at a few rows the
arithmetic (about 2.2 GFLOP for a SmolLM2-135M step at 8 rows) should hide under that stream. torch's
kernels did not on this project's 2-core machines: MKL's packed GEMM (`cipr.packed_gemm`) took 1.4-1.5x
its 1-row time for all of a step's linears at 8 rows, and SDPA's fused kernel read an 8-row cache at
11-12 GB/s where a copy ran at ~21 GB/s (`scripts/bench_eval.py`'s timings of both on the model's
shapes). `csrc/cpu_kernels.cpp` holds two ops:

- `linear`: each weight packed once (`pack`) into 16-column panels; a block of rows' accumulators stays
  in registers over the whole inner dimension while the panels are prefetched 2 KB ahead.
- `decode_attention`: one query position per row; per (row, key/value head) the group's query heads
  score every cached position in one pass over the keys, a softmax per head (max subtracted, a
  vectorized exp: range reduction and a degree-6 polynomial, exactly 0 below -87), one pass over the
  values; rows prefetched 16 ahead. Head dims 64 and 128, up to 8 query heads per key/value head.

`scripts/bench_eval.py` times both against torch's kernels on the model's shapes in one run and prints
them. Each row's sums run in the same order whatever else is in the batch, so a row's outputs do not
depend on the batch size; against F.linear and SDPA they differ by float rounding (tested).

The library is compiled on first use on the machine that runs it (`torch.utils.cpp_extension.load`,
ninja and the C++ compiler, `-O3 -march=native`: register blocking for AVX-512 where the CPU has it,
else for 8-float vectors), into `$TORCH_EXTENSIONS_DIR` (default `~/.cache/torch_extensions`) under a
name keyed by the source, the torch version and this CPU's instruction-set flags, so a home directory
shared by different nodes keeps one build per CPU kind. `load` says whether it is usable; a failed
build (no compiler, say) is logged once with its error and callers fall back to torch's kernels
(MKL's packed GEMM, SDPA). `CIPR_CPU_KERNELS=0` turns the library off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "cpu_kernels.cpp"
PANEL = 16
"""Output columns per packed panel: a layer packs only if its out_features is a multiple of it."""
FLAGS = ["-O3", "-march=native", "-fopenmp"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_directory() -> Path:
    """Where this machine's build lives (see the module docstring)."""
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), torch.__version__.encode(),
                                     platform.machine().encode(), _cpu_flags().encode()])).hexdigest()[:16]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    return Path(root) / f"cipr_cpu_{key}"


@functools.cache
def load() -> bool:
    """Build (once per machine) and load the ops `torch.ops.cipr_cpu.{pack,linear,decode_attention}`;
    False, with the reason logged once, where it cannot be built or loaded or `CIPR_CPU_KERNELS=0`."""
    from torch.utils import cpp_extension

    if os.environ.get("CIPR_CPU_KERNELS", "1") == "0":
        log.info("cipr.cpu_kernels: off (CIPR_CPU_KERNELS=0)")
        return False
    if _registered():
        return True
    path = os.environ.get("PATH", "")
    try:
        import ninja  # the pip package: its binary is not on PATH when the venv is not activated

        if shutil.which("ninja") is None:
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
    except ImportError:
        pass
    start = time.perf_counter()
    try:
        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        cpp_extension.load("cipr_cpu", [str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                           build_directory=str(directory), is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - any build or load failure means: use MKL instead
        log.warning("cipr.cpu_kernels: the decoding kernels could not be built or loaded (%s: %s); decoding "
                    "uses torch's kernels instead", type(e).__name__, str(e).strip()[-2000:])
        return False
    finally:
        os.environ["PATH"] = path
    log.info("cipr.cpu_kernels: kernels ready in %.1f s (%s)", time.perf_counter() - start, directory)
    return True


def _registered() -> bool:
    try:
        torch.ops.cipr_cpu.decode_attention.default  # noqa: B018 - raises where the op is not registered
        return True
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float32, CPU, N a multiple of PANEL) -> its panels [N / PANEL, K, PANEL]."""
    return torch.ops.cipr_cpu.pack(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` [M, N] from x [M, K] and `packed` = `pack(weight)` (no autograd)."""
    return torch.ops.cipr_cpu.linear(x, packed, bias)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """softmax(scale q k^T + mask) v per query head, [B, H, D], from query [B, H, D] and key/value
    [B, Hk, T, D] (last dim contiguous; H a multiple of Hk, at most 8 times it; D 64 or 128) and an
    additive mask [B, T] (last stride 1) or None (no autograd)."""
    return torch.ops.cipr_cpu.decode_attention(query, key, value, mask, scale)
