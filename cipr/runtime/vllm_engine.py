"""vLLM engine options that fit the machine: compile or not, and how much memory the KV cache takes.

Compiling pays on a GPU (CUDA graphs), but vLLM's CPU build compiles with inductor at every engine
start, which costs far more than it saves in decoding (docs/benchmarks.md). So `None` (the default of
every `enforce_eager` option) means eager on CPU and vLLM's own default elsewhere.

KV cache on CPU. Without `VLLM_CPU_KVCACHE_SPACE`, vLLM's CPU worker reserves `gpu_memory_utilization`
of the machine's memory (85% by default) and refuses to start when that much is not free.
`cpu_kv_cache_bytes` sizes the cache from what the run needs instead: every layer's keys and values for
`max_model_len` tokens of `max_num_seqs` concurrent sequences, at least `FLOOR_BYTES`; the figure is
logged. `$VLLM_CPU_KVCACHE_SPACE` (GiB) still overrides. On GPUs `gpu_memory_utilization` applies.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

FLOOR_BYTES = 256 * 2**20
ENV = "VLLM_CPU_KVCACHE_SPACE"


def enforce_eager(choice: bool | None) -> bool:
    """`choice` if given, else whether vLLM runs on CPU (imports vLLM's platform module)."""
    if choice is not None:
        return choice
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def kv_bytes_per_token(config: Any, dtype_bytes: int = 4) -> int:
    """Bytes of keys and values one token holds across all layers of a transformers `config`."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def cpu_kv_cache_bytes(config: Any, max_model_len: int | None, max_num_seqs: int) -> tuple[int, int]:
    """(bytes, model length used): `max_num_seqs` sequences of `max_model_len` tokens (the model's own
    context when None), float32, at least `FLOOR_BYTES`."""
    length = max_model_len or getattr(config, "max_position_embeddings", 4096)
    return max(FLOOR_BYTES, kv_bytes_per_token(config) * length * max_num_seqs), length


def engine_memory(model: str, max_model_len: int | None, max_num_seqs: int, gpu_memory_utilization: float,
                  cpu_kv_cache_gb: float | None = None) -> dict[str, Any]:
    """The memory options of an `LLM(...)` for `model` (a folder vLLM loads) on this machine."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {"gpu_memory_utilization": gpu_memory_utilization}
    if os.environ.get(ENV):
        log.info("vLLM on CPU: KV cache %s GiB from $%s", os.environ[ENV], ENV)
        return {}
    if cpu_kv_cache_gb is not None:
        size, why = int(cpu_kv_cache_gb * 2**30), "vllm.cpu_kv_cache_gb"
    else:
        from transformers import AutoConfig

        size, length = cpu_kv_cache_bytes(AutoConfig.from_pretrained(model), max_model_len, max_num_seqs)
        why = f"{max_num_seqs} sequences x {length} tokens; set vllm.cpu_kv_cache_gb or ${ENV} to change it"
    log.info("vLLM on CPU: KV cache %.2f GiB (%s)", size / 2**30, why)
    return {"kv_cache_memory_bytes": size}

