"""MKL's packed float32 GEMM for the linear layers of batched decoding on CPU.

A decoding step multiplies one row per sequence by every weight matrix. At batch size 1 MKL runs a
matrix-vector product near the memory bandwidth; at a few rows its general `sgemm` repacks the weight
into its kernel layout on every call, and the step's matrix products cost about twice the batch-1 ones
(`scripts/bench_eval.py` times all of a model's linears at 1 and 8 rows, plain and packed).
`cblas_sgemm_pack` does that packing once; `torch.ops.mkl._mkl_linear` then multiplies by the packed
weight. It is the pair of ops torch.compile's CPU backend uses for float32 linears (inductor's
`mkldnn_fusion` pass).

Packing is not free: a pass over all weights that allocates a packed copy (the benchmark prints its
time; it exceeded a second on a loaded 2-core machine), so it is done once per row count and kept. A
packed weight serves one row count; `packed_linear` pads an input with fewer rows (a batch whose
finished sequences left it, or a short last batch) with zero rows up to it, so a whole evaluation packs
once. The padded rows are computed and thrown away; their cost was not measured apart from the step's.

Used only under `torch.no_grad`/`inference_mode` (generation): a layer whose weight requires grad
while grad is on, an input of one row (a matrix-vector product is already at the bandwidth) or of more
rows than packed (a prefill) goes through `F.linear`. Values agree with `F.linear` to float rounding
(another summation order; tested). Memory: the packed copies add about the float32 weights' size
while kept (`PackedLinears.release` frees them); `fits` tells whether that much memory is free.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch build has MKL's packed linear (x86 wheels do; ARM and ROCm builds may not)."""
    mkl = getattr(torch.ops, "mkl", None)
    return bool(torch._C.has_mkl) and hasattr(mkl, "_mkl_linear") and hasattr(mkl, "_mkl_reorder_linear_weight")


def fits(nbytes: int, fraction: float = 0.5) -> bool:
    """Whether `nbytes` more is at most `fraction` of the memory available now (psutil's estimate)."""
    import psutil

    return nbytes <= fraction * psutil.virtual_memory().available


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor,
                  rows: int) -> torch.Tensor:
    """`F.linear(x, weight, bias)` [..., out] from x [..., in], with `packed` = weight packed for `rows` rows.

    x with 2..`rows` rows (leading dims flattened) is multiplied by `packed`, zero-padded to `rows`;
    one row, more rows, or autograd needing the weight's gradient (the packed op has no backward) go
    through `F.linear`.
    """
    n = x.numel() // max(x.shape[-1], 1)
    if not 1 < n <= rows or (torch.is_grad_enabled() and weight.requires_grad):
        return F.linear(x, weight, bias)
    flat = x.reshape(n, x.shape[-1])
    if n < rows:
        flat = torch.cat([flat, flat.new_zeros(rows - n, flat.shape[1])])
    out = torch.ops.mkl._mkl_linear(flat, packed, weight, bias, rows)
    return out[:n].reshape(*x.shape[:-1], out.shape[-1])


class PackedLinears:
    """Route a model's float32 CPU `nn.Linear` layers through weights packed for a given row count.

    `pack(rows)` packs (only if `rows` changed or a weight was modified or replaced since) and routes
    each layer's forward through `packed_linear`; `restore()` gives the layers their own forward back
    and keeps the packed weights for the next `pack`; `release()` also frees them. A context manager
    (releases on exit). Layers that already carry an instance-level forward (accelerate's offloading
    hooks, another wrapper) are left alone.
    """

    def __init__(self, model: Any):
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)
                       and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
        self.nbytes = sum(m.weight.numel() * 4 for m in self.layers)
        """About what the packed copies take (MKL's layout pads a little)."""
        self.rows = 0
        self.packs = 0
        """How many times the weights were packed (each a pass over all of them)."""
        self._packed: list[torch.Tensor] = []
        self._stamps: list[tuple[int, int]] = []

    def _stamp(self) -> list[tuple[int, int]]:
        return [(id(m.weight), m.weight._version) for m in self.layers]

    def pack(self, rows: int) -> None:
        """Route the layers through weights packed for `rows` input rows, packing only if needed."""
        if rows != self.rows or self._stamp() != self._stamps:
            self.release()
            with torch.no_grad():
                self._packed = [torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), rows)
                                for m in self.layers]
            self.rows, self._stamps = rows, self._stamp()
            self.packs += 1
        for m, packed in zip(self.layers, self._packed, strict=True):
            if "forward" not in vars(m):
                m.forward = functools.partial(_forward, m, packed, rows)

    def restore(self) -> None:
        """Every layer back to its own forward; the packed weights are kept for the next `pack`."""
        for m in self.layers:
            vars(m).pop("forward", None)

    def release(self) -> None:
        """`restore`, and free the packed weights."""
        self.restore()
        self._packed, self._stamps, self.rows = [], [], 0

    def __enter__(self) -> PackedLinears:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _forward(module: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(x, module.weight, module.bias, packed, rows)
