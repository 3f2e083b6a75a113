"""How rollouts are generated: HF `generate` (CPU or GPU), or vLLM through TRL (colocate or server).

`rollout=hf` is the only backend that needs nothing beyond the pinned stack. `rollout=vllm_colocate`
runs vLLM inside the training process (TRL syncs the weights every step); `rollout=vllm_server`
talks to `trl vllm-serve --model <model>` on another GPU or node. vLLM is never imported here: the
check looks for the package with `importlib.util.find_spec` and for a CUDA device, and fails before
any work with the command that fixes it. TRL imports vLLM itself, only when `use_vllm` is set.

With vLLM, TRL's importance-sampling correction (`vllm_importance_sampling_correction`) reweights
each token by π_train / π_vLLM; it needs the generated token ids as the loss sees them, so the
CIPR trainer does not re-tokenize rollouts in that case (see `grpo.py`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

import torch

from cipr.train.config import ConfigError


@dataclass
class RolloutConfig:
    """Sampling of the G responses per prompt (G = `num_generations`; the paper and ToolRL use 4).

    `share_prompt_prefill` (HF backend): compute each prompt's prefill once for its G samples instead
    of G times (see `cipr.train.grpo.shared_prefill_generate`); same distribution, less CPU time.
    """

    backend: Literal["hf", "vllm_colocate", "vllm_server"] = "hf"
    num_generations: int = 4
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_length: int | None = None
    enable_sleep_mode: bool = False
    server_host: str = "0.0.0.0"
    server_port: int = 8000
    server_base_url: str | None = None
    server_timeout: float = 240.0
    importance_sampling_correction: bool = True
    share_prompt_prefill: bool = True

    @property
    def uses_vllm(self) -> bool:
        return self.backend != "hf"


def check_backend(cfg: RolloutConfig) -> None:
    """Fail before any work when the backend cannot run on this machine."""
    if cfg.num_generations < 2:
        raise ConfigError("rollout.num_generations must be >= 2 (GRPO normalizes rewards within each group)")
    if cfg.max_completion_length < 1:
        raise ConfigError("rollout.max_completion_length must be >= 1")
    if not cfg.uses_vllm:
        return
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"rollout={cfg.backend} needs vLLM, which is not installed here: `pip install -e .[gpu]` "
                          f"on a GPU machine, or use rollout=hf")
    if cfg.backend == "vllm_colocate" and not torch.cuda.is_available():
        raise ConfigError("rollout=vllm_colocate needs a CUDA device; none is visible. Use rollout=hf on CPU")


def grpo_kwargs(cfg: RolloutConfig) -> dict[str, Any]:
    """The GRPOConfig fields this config sets."""
    kwargs: dict[str, Any] = {
        "num_generations": cfg.num_generations,
        "max_completion_length": cfg.max_completion_length,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "repetition_penalty": cfg.repetition_penalty,
        "use_vllm": cfg.uses_vllm,
    }
    if cfg.uses_vllm:
        kwargs.update({
            "vllm_mode": "colocate" if cfg.backend == "vllm_colocate" else "server",
            "vllm_gpu_memory_utilization": cfg.gpu_memory_utilization,
            "vllm_tensor_parallel_size": cfg.tensor_parallel_size,
            "vllm_max_model_length": cfg.max_model_length,
            "vllm_enable_sleep_mode": cfg.enable_sleep_mode,
            "vllm_server_host": cfg.server_host,
            "vllm_server_port": cfg.server_port,
            "vllm_server_base_url": cfg.server_base_url,
            "vllm_server_timeout": cfg.server_timeout,
            "vllm_importance_sampling_correction": cfg.importance_sampling_correction,
        })
    return kwargs
