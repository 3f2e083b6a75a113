"""MKL's packed float32 GEMM for the linear layers of batched decoding on CPU.

A decoding step multiplies one row per sequence by every weight matrix. At batch size 1 MKL runs a
matrix-vector product near the memory bandwidth; at a few rows its general `sgemm` repacks the weight
into its kernel layout on every call, and the step costs about twice the batch-1 one (SmolLM2-135M on
2 cores: ~63 ms vs ~31 ms of `mm` per step at 8 rows vs 1, torch.profiler). `cblas_sgemm_pack` does
that packing once; `torch.ops.mkl._mkl_linear` then multiplies by the packed weight. It is the path
torch.compile's CPU backend (inductor's mkldnn fusion pass) and IPEX take for float32 linears. A
packed weight is packed for one row count, so `PackedLinears.pack` repacks when the batch shrinks
(finished sequences leave it): a pass over the weights, ~0.03 s for 212 MB here.

Used only under `torch.no_grad`/`inference_mode` (generation): a layer whose weight requires grad
while grad is on, or an input with another row count (a prefill), goes through `F.linear`. Values
agree with `F.linear` to float rounding (another summation order; tested). Memory: the packed copies
add about the float32 weights' size while packed.
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


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor,
                  rows: int) -> torch.Tensor:
    """`F.linear(x, weight, bias)` [..., out] from x [..., in], with `packed` = weight packed for `rows` rows.

    Falls back to `F.linear` when x does not have `rows` rows (flattened leading dims) or autograd
    would need the weight's gradient (the packed op has no backward).
    """
    if x.numel() // max(x.shape[-1], 1) != rows or (torch.is_grad_enabled() and weight.requires_grad):
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


class PackedLinears:
    """Switch a model's float32 CPU `nn.Linear` layers to packed weights for a given row count.

    `pack(rows)` packs (or repacks, when `rows` changed) and routes each layer's forward through
    `packed_linear`; `restore()` gives the layers their own forward back and frees the packed weights.
    Also a context manager (restores on exit). Layers that already carry an instance-level forward
    (accelerate's offloading hooks, another wrapper) are left alone.
    """

    def __init__(self, model: Any):
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)
                       and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
        self.rows = 0

    def pack(self, rows: int) -> None:
        """Route the layers through weights packed for `rows` input rows (no-op if already so)."""
        if rows == self.rows:
            return
        with torch.no_grad():
            for m in self.layers:
                packed = torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), rows)
                m.forward = functools.partial(_forward, m, packed, rows)
        self.rows = rows

    def restore(self) -> None:
        """Every layer back to its own forward; the packed weights are freed."""
        for m in self.layers:
            vars(m).pop("forward", None)
        self.rows = 0

    def __enter__(self) -> PackedLinears:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def _forward(module: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(x, module.weight, module.bias, packed, rows)
