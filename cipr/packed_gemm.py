"""Packed float32 weights for the linear layers of decoding on CPU: CIPR's kernel or MKL's packed GEMM.

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

Two kernels (`PackedLinears(model, kernel)`; `choose` picks): `cipr`, `cipr.cpu_kernels`'s kernel
built on first use, which streams the weights once per step at any row count up to `MAX_ROWS` and is
also used at one row; and `mkl`, the pair of MKL ops above, for two or more rows. `auto` is `cipr`
where it builds, else `mkl` where torch has it.

Used only under `torch.no_grad`/`inference_mode` (generation): a layer whose weight requires grad
while grad is on, or an input of more rows than packed (`mkl`) or than `MAX_ROWS` (`cipr`: a prefill,
say), goes through `F.linear`, as does one row under `mkl` (MKL's matrix-vector product is already
near the bandwidth). Values agree with `F.linear` to float rounding
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


KERNELS = ("auto", "cipr", "mkl")
MAX_ROWS = 32
"""Most input rows the `cipr` kernel takes (more, a prefill say, go through F.linear)."""


def choose(kernel: str) -> str | None:
    """The kernel `kernel` (one of KERNELS) resolves to here: `cipr` or `mkl`, or None where `auto` finds
    neither. Asking for one that cannot run is an error that says why."""
    from cipr import cpu_kernels

    if kernel not in KERNELS:
        raise ValueError(f"gemm_kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel in ("auto", "cipr") and cpu_kernels.load():
        return "cipr"
    if kernel == "cipr":
        raise RuntimeError("gemm_kernel=cipr: cipr.cpu_kernels's kernel could not be built or loaded (the "
                           "warning logged above says why); use gemm_kernel=auto or mkl")
    if available():
        return "mkl"
    if kernel == "mkl":
        raise RuntimeError("gemm_kernel=mkl: this torch build has no MKL packed linear")
    return None


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
    """Route a model's float32 CPU `nn.Linear` layers through packed weights (`kernel` `cipr` or `mkl`).

    `pack(rows)` packs (only if a weight was modified or replaced since, or, for `mkl`, whose packing
    serves one row count, if `rows` changed) and routes each layer's forward through `packed_linear`
    (`mkl`) or `cipr_linear`; `cipr` routes only layers whose out_features is a multiple of
    `cipr.cpu_kernels.PANEL`; `restore()` gives the layers their own forward back
    and keeps the packed weights for the next `pack`; `release()` also frees them. A context manager
    (releases on exit). Layers that already carry an instance-level forward (accelerate's offloading
    hooks, another wrapper) are left alone.
    """

    def __init__(self, model: Any, kernel: str = "mkl"):
        from cipr.cpu_kernels import PANEL

        if kernel not in ("cipr", "mkl"):
            raise ValueError(f"PackedLinears: kernel must be 'cipr' or 'mkl', got {kernel!r}")
        self.kernel = kernel
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)
                       and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"
                       and (kernel == "mkl" or m.weight.shape[0] % PANEL == 0)]
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
        from cipr import cpu_kernels

        if (rows != self.rows and self.kernel == "mkl") or self._stamp() != self._stamps:
            self.release()
            with torch.no_grad():
                self._packed = [cpu_kernels.pack(m.weight.detach()) if self.kernel == "cipr" else
                                torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), rows)
                                for m in self.layers]
            self._stamps = self._stamp()
            self.packs += 1
        self.rows = rows
        for m, packed in zip(self.layers, self._packed, strict=True):
            if "forward" not in vars(m):
                m.forward = (functools.partial(_cipr_forward, m, packed) if self.kernel == "cipr" else
                             functools.partial(_forward, m, packed, rows))

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


def cipr_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                packed: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight, bias)` [..., out] from x [..., in], with `packed` = `cipr.cpu_kernels.pack(weight)`.

    1..MAX_ROWS rows (leading dims flattened) go through the `cipr` kernel; more rows, or autograd
    needing the weight's gradient, through `F.linear`.
    """
    from cipr import cpu_kernels

    n = x.numel() // max(x.shape[-1], 1)
    if not 0 < n <= MAX_ROWS or (torch.is_grad_enabled() and weight.requires_grad) or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    out = cpu_kernels.linear(x.reshape(n, x.shape[-1]), packed, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _forward(module: torch.nn.Linear, packed: torch.Tensor, rows: int, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(x, module.weight, module.bias, packed, rows)


def _cipr_forward(module: torch.nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return cipr_linear(x, module.weight, module.bias, packed)
