"""Per-GPU memory of a run: model states under each strategy, activations, vLLM colocate's share, the verdict.

Notation: Ψ parameters, Ψt trained ones (Ψf = Ψ - Ψt frozen), W processes, b the bytes of the weights'
dtype (`model.dtype`: 2 for bfloat16, 4 for float32), GB = 2^30 bytes (as DeepSpeed's estimators print).

Model states (`model_states`), per process:

| strategy  | weights                          | gradients          | optimizer (AdamW) |
|-----------|----------------------------------|--------------------|-------------------|
| none, ddp | bΨ                               | bΨt                | 2bΨt              |
| zero2     | 2Ψ                               | 6Ψt/W              | 12Ψt/W            |
| zero3     | 2Ψ/W + 4L                        | 4Ψt/W              | 12Ψt/W            |
| fsdp      | (4Ψt + bΨf)/W + 4U + 2E          | 4Ψt/W + 2U         | 8Ψt/W             |

- none/ddp: the Trainer keeps the weights in `model.dtype` and torch's AdamW keeps m and v in the
  parameters' dtype (bf16 autocast on GPUs changes neither).
- zero2/zero3 (16-bit training): DeepSpeed's own accounting, `estimate_zero2_model_states_mem_needs` and
  `estimate_zero3_model_states_mem_needs` without offload: 2Ψ + 18Ψ/W and 4L + 18Ψ/W when everything
  trains. ZeRO-2: 18 = 16-bit gradients 2 + fp32 gradients 4 + fp32 master weights 4 + m and v 8 (its
  comment). ZeRO-3: 18 = the 16-bit weights' partition 2 + fp32 gradients 4 + master weights 4 + m and v
  8, the 16-bit gradients of the largest module counted with its gathered weights in 4L (L = the most
  parameters one module holds directly: the embedding).
- fsdp (FSDP2 under accelerate, bf16): accelerate upcasts the trained parameters to fp32 before sharding
  (fp32 master 4, gradients 4, m and v 8, all /W); the decoder layer being computed and the prefetched
  one are gathered in bf16 (4U, U = the largest decoder layer) with that layer's unsharded gradient (2U);
  the tail unit (embedding or head with the final norm) stays gathered from forward to backward (2E).
- With `precision=fp32` DeepSpeed keeps no 16-bit copy: 4Ψ (zero2) or 4Ψ/W + 8L (zero3), 4Ψt/W, 8Ψt/W.

Buffers (`buffers`): DDP's gradient buckets (bΨt when W > 1: gradients are copied into flat buckets);
DeepSpeed's default buckets, 16-bit: ZeRO-2 reduce_bucket_size + allgather_bucket_size (5e8 elements each),
ZeRO-3 reduce_bucket_size + stage3_prefetch_bucket_size (5e8 + 5e7). Not in the estimators' figures.

Activations (`activations`), one micro-batch of `batch` sequences of `seq` tokens, compute dtype c bytes
(2 under bf16 autocast, 4 in fp32), after Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4.1: 34·s·b·h per layer for GPT) recounted for a SwiGLU MLP (I), grouped KV (kv =
KV heads x head dim), no dropout and SDPA's memory-efficient kernel (no s x s scores):

    per layer   A1 = c·b·s·(12h + 3kv + 4I)
    stored      = L·c·b·s·h + 2·A1      with gradient checkpointing (layer inputs, one layer recomputed)
                = L·A1                  without
    logits      = 3·c·b·s_l·V + 4·s_l·V (logits, their temperature-scaled copy and gradient; one row's fp32
                                         log-softmax), s_l the positions scored (GRPO: the completion)
    tree mask   = c·b·s²                (algo=cipr's action read: an additive 4D mask)

vLLM colocate (`vllm_share`): the engine takes u x card (`rollout.gpu_memory_utilization`) for its weights
(bΨ/TP), its own activations and CUDA graphs (VLLM_OVERHEAD_GB, an allowance), and the KV cache:
2·La·kv·2 bytes per token over the La full-attention layers, plus each sequence's fixed linear-attention
state. vLLM refuses to start when the cache cannot hold one sequence of `max_model_len` tokens. The trainer
keeps card - u x card - CONTEXT_GB (CUDA context and NCCL, an allowance).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

GB = 2 ** 30
CONTEXT_GB = 1.0
"""Allowance for the CUDA context, NCCL buffers and allocator slack of a training process (not measured)."""
VLLM_OVERHEAD_GB = 2.0
"""Allowance for vLLM's profiled activation peak and CUDA graphs inside its share (not measured)."""
DS_REDUCE_BUCKET = 500_000_000
DS_ALLGATHER_BUCKET = 500_000_000
DS_PREFETCH_BUCKET = 50_000_000
"""DeepSpeed's default bucket sizes in elements (reduce_bucket_size, allgather_bucket_size,
stage3_prefetch_bucket_size), which the shipped distributed/zero*.yaml leave unset."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class _Parts:
    """Bytes in parts that add up (`PARTS`, summed in that order) to `total`."""

    PARTS: ClassVar[tuple[str, ...]] = ()

    @property
    def total(self) -> float:
        return sum(getattr(self, part) for part in self.PARTS)

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class ModelStates(_Parts):
    """Bytes per process of the weights, gradients and optimizer state (module docstring table)."""

    PARTS: ClassVar[tuple[str, ...]] = ("weights", "gradients", "optimizer")
    weights: float
    gradients: float
    optimizer: float


def model_states(strategy: str, world: int, params: int, trainable: int, weight_bytes: int, *,
                 sixteen_bit: bool = True, largest_module: int = 0, largest_block: int = 0,
                 tail: int = 0) -> ModelStates:
    """Model states per process under `strategy` on `world` processes (the module docstring's table)."""
    w, p, t = world, params, trainable
    frozen = p - t
    if strategy in ("none", "ddp"):
        return ModelStates(weight_bytes * p, weight_bytes * t, 2 * weight_bytes * t)
    if strategy in ("zero2", "zero3"):
        if sixteen_bit:
            if strategy == "zero2":
                return ModelStates(2 * p, 6 * t / w, 12 * t / w)
            return ModelStates(2 * p / w + 4 * largest_module, 4 * t / w, 12 * t / w)
        weights = 4 * p if strategy == "zero2" else 4 * p / w + 8 * largest_module
        return ModelStates(weights, 4 * t / w, 8 * t / w)
    if strategy == "fsdp":
        gathered = 2 if sixteen_bit else 4
        weights = (4 * t + weight_bytes * frozen) / w + 2 * gathered * largest_block + gathered * tail
        return ModelStates(weights, 4 * t / w + gathered * largest_block, 8 * t / w)
    raise ValueError(f"distributed.strategy={strategy}: not one of none, ddp, zero2, zero3, fsdp")


def buffers(strategy: str, world: int, trainable: int, weight_bytes: int) -> float:
    """Bytes of communication buffers per process (module docstring)."""
    if strategy in ("none", "ddp"):
        return weight_bytes * trainable if world > 1 else 0.0
    if strategy == "zero2":
        return 2.0 * (DS_REDUCE_BUCKET + DS_ALLGATHER_BUCKET)
    if strategy == "zero3":
        return 2.0 * (DS_REDUCE_BUCKET + DS_PREFETCH_BUCKET)
    return 0.0


@dataclass(frozen=True)
class Activations(_Parts):
    """Activation bytes of one micro-batch (module docstring formulas)."""

    PARTS: ClassVar[tuple[str, ...]] = ("layers", "logits", "mask")
    batch: int
    seq: int
    scored: int
    layers: float
    logits: float
    mask: float


def activations(*, batch: int, seq: int, scored: int, layers: int, hidden: int, intermediate: int,
                kv_dim: int, vocab: int, compute_bytes: int, checkpointing: bool,
                tree_mask: bool) -> Activations:
    """Activations of `batch` sequences of `seq` tokens, `scored` of them through the output head."""
    c, b, s = compute_bytes, batch, seq
    per_layer = c * b * s * (12 * hidden + 3 * kv_dim + 4 * intermediate)
    stored = layers * c * b * s * hidden + 2 * per_layer if checkpointing else layers * per_layer
    logits = 3 * c * b * scored * vocab + 4 * scored * vocab
    mask = c * b * s * s if tree_mask else 0
    return Activations(batch, seq, scored, float(stored), float(logits), float(mask))


@dataclass(frozen=True)
class VllmShare:
    """vLLM colocate's part of one card (module docstring): bytes, and what its KV cache holds."""

    share: float
    weights: float
    overhead: float
    kv_cache: float
    kv_bytes_per_token: int
    state_bytes_per_seq: int
    max_model_len: int
    seq_len: int
    concurrent: int
    seqs_per_process: int

    @property
    def waves(self) -> int:
        """Generation passes the rollout batch of one process needs (`concurrent` sequences at a time)."""
        return -(-self.seqs_per_process // self.concurrent) if self.concurrent else 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "waves": self.waves}


def vllm_share(*, card: float, utilization: float, weights: float, kv_bytes_per_token: int,
               state_bytes_per_seq: int, max_model_len: int, seq_len: int,
               seqs_per_process: int) -> VllmShare:
    """vLLM's share u x card, its KV cache after weights and overhead, and how many sequences of `seq_len`
    tokens it holds at once: kv_cache / (seq_len x kv_bytes_per_token + state_bytes_per_seq)."""
    share = utilization * card
    overhead = VLLM_OVERHEAD_GB * GB
    kv = share - weights - overhead
    per_seq = seq_len * kv_bytes_per_token + state_bytes_per_seq
    concurrent = max(0, int(kv // per_seq)) if per_seq else seqs_per_process
    return VllmShare(share, weights, overhead, kv, kv_bytes_per_token, state_bytes_per_seq, max_model_len,
                     seq_len, concurrent, seqs_per_process)


def gb(x: float) -> float:
    """Bytes in GB (2^30), rounded to 0.01."""
    return round(x / GB, 2)
