"""CIPR's float32 CPU kernel for the linear layers of decoding steps: a few rows times a packed weight.

A decoding step multiplies one row per sequence by every weight matrix: the weights stream from
memory once per step, and at 8 rows the multiply-adds (about 9 ms of a SmolLM2-135M step on 2 cores)
should hide under that stream. MKL's packed GEMM (`cipr.packed_gemm`) does not overlap them: on this
project's 2-core machines its 8-row products took about the 1-row stream time plus the compute time.
`csrc/skinny_gemm.cpp` packs each weight once into 16-column panels and keeps a block of rows'
accumulators in registers over the whole inner dimension while prefetching the panels 2 KB ahead;
`scripts/bench_eval.py` times every linear layer of the model with it, with MKL and with F.linear in
one run and prints the ratios.

Each row's sums run in the same order whatever else is in the batch, so a row's outputs do not depend
on the batch size (MKL's and F.linear's can); against F.linear they differ by float rounding (another
summation order; tested).

The kernel is compiled on first use on the machine that runs it (`torch.utils.cpp_extension.load`,
ninja and the C++ compiler; `-O3 -march=native`, about 10 s on 2 cores), into
`$TORCH_EXTENSIONS_DIR` (default `~/.cache/torch_extensions`) under a name keyed by the source, the
torch version and this CPU's instruction-set flags, so a home directory shared by different nodes keeps
one build per CPU kind. `load` says whether it is usable; a failed build (no compiler, say) is logged
once with its error and the callers fall back to MKL's packed GEMM.
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

SOURCE = Path(__file__).parent / "csrc" / "skinny_gemm.cpp"
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
    return Path(root) / f"cipr_gemm_{key}"


@functools.cache
def load() -> bool:
    """Build (once per machine) and load the kernel's ops `torch.ops.cipr_gemm.{pack,linear}`; False,
    with the reason logged once, where it cannot be built or loaded."""
    from torch.utils import cpp_extension

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
        cpp_extension.load("cipr_gemm", [str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                           build_directory=str(directory), is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - any build or load failure means: use MKL instead
        log.warning("cipr.skinny_gemm: the decoding kernel could not be built or loaded (%s: %s); decoding "
                    "uses MKL's packed GEMM or F.linear instead", type(e).__name__, str(e).strip()[-2000:])
        return False
    finally:
        os.environ["PATH"] = path
    log.info("cipr.skinny_gemm: kernel ready in %.1f s (%s)", time.perf_counter() - start, directory)
    return True


def _registered() -> bool:
    try:
        torch.ops.cipr_gemm.linear.default  # noqa: B018 - raises where the op is not registered
        return True
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float32, CPU, N a multiple of PANEL) -> its panels [N / PANEL, K, PANEL]."""
    return torch.ops.cipr_gemm.pack(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` [M, N] from x [M, K] and `packed` = `pack(weight)` (no autograd)."""
    return torch.ops.cipr_gemm.linear(x, packed, bias)
