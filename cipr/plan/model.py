"""The model without its weights: architecture from a config.json, built on the meta device, and a tokenizer.

Where the architecture comes from, first found: a local model folder (`model.name_or_path`), the local
Hugging Face cache, or a config.json the configs ship (`configs/models/*.json`, the published file of each
named model plus a `_cipr` entry: the names it answers to, its TRL chat template, and where each number
came from). `AutoModelForCausalLM.from_config` under `torch.device("meta")` builds the module tree with
shapes and no storage, so a 4B model costs no memory; `ModelShape` reads what the memory and time
estimates need from it.

Tokens are counted with the model's own tokenizer when it is here (a local folder, the cache, or the
embedded model); otherwise with a stand-in, clearly labelled an estimate: the embedded SmolLM2-135M's
byte-level BPE (49,152 tokens), given the family's chat template (TRL's copy) and its control tokens as
single tokens (as the family's own vocabulary has them). Qwen's BPE vocabularies are larger (151,936 and
248,320), so the stand-in's counts are not calibrated against them; the lengths it reports are an estimate.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cipr.core.config import CONFIG_ROOT, ConfigError
from cipr.runtime.model import ModelConfig

MODELS_DIR = CONFIG_ROOT / "models"
CONTROL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]+\|>|</?(?:tool_call|tool_response|think)>")


@dataclass(frozen=True)
class Architecture:
    """A model's config.json (`config`, the `_cipr` entry removed) and where it came from."""

    name: str
    config: dict[str, Any]
    source: str
    chat_template: str | None


def _known(name: str) -> Path | None:
    for path in sorted(MODELS_DIR.glob("*.json")):
        entry = json.loads(path.read_text()).get("_cipr") or {}
        if name in entry.get("names", ()):
            return path
    return None


def model_name(cfg: ModelConfig) -> str:
    """The model's identity: `name_or_path`, or `package/file` of an embedded GGUF."""
    return cfg.name_or_path or f"{cfg.gguf_package}/{cfg.gguf_file}"


def architecture(cfg: ModelConfig) -> Architecture:
    """The config.json of `cfg`'s model (module docstring); ConfigError naming the option when there is
    none."""
    name = model_name(cfg)
    if cfg.name_or_path:
        folder = Path(cfg.name_or_path).expanduser()
        if (folder / "config.json").is_file():
            return Architecture(name, json.loads((folder / "config.json").read_text()), str(folder), None)
        from cipr.runtime import hub

        if not hub.looks_like_path(cfg.name_or_path) and hub.in_cache(cfg.name_or_path, cfg.revision):
            from huggingface_hub import try_to_load_from_cache

            cached = str(try_to_load_from_cache(cfg.name_or_path, "config.json", revision=cfg.revision))
            return Architecture(name, json.loads(Path(cached).read_text()), f"the local cache ({cached})",
                                None)
    shipped = _known(name)
    if shipped is None:
        raise ConfigError(f"model.name_or_path={name}: no config.json for it here (not a local folder, not "
                          f"in the Hugging Face cache, not among {MODELS_DIR}/*.json): add its published "
                          f"config.json there, with a _cipr entry naming it")
    data = json.loads(shipped.read_text())
    entry = data.pop("_cipr")
    return Architecture(name, data, str(shipped), entry.get("chat_template"))


@functools.lru_cache(maxsize=8)
def _meta_model(config_json: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(config_json)
    model_type = data.pop("model_type")
    config = AutoConfig.for_model(model_type, **data)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def meta_model(arch: Architecture) -> Any:
    """The model built from `arch` on the meta device (shapes, no storage; cached by config)."""
    try:
        return _meta_model(json.dumps(arch.config, sort_keys=True))
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"the config.json of {arch.name} ({arch.source}) does not build a model: "
                          f"{e}") from e


@dataclass(frozen=True)
class ModelShape:
    """What the estimates read from a model (counts in parameters, dimensions from its text config).

    `params`: unique parameters (a tied output head counted once); `trainable`: those the run trains
    (`model.freeze_bottom_layers`, LoRA); `largest_module`: DeepSpeed's `largest_layer_params`, the most
    parameters one module holds directly (the embedding); `largest_block`: the largest decoder layer (an
    FSDP unit); `kv_bytes_per_token`: K and V of every full-attention layer at 2 bytes; `state_bytes_per_seq`:
    the fixed recurrent state of each linear-attention layer (fp32) and its convolution window (bf16).
    """

    params: int
    trainable: int
    embedding: int
    tied: bool
    largest_module: int
    largest_block: int
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int
    vocab: int
    attention_layers: int
    kv_bytes_per_token: int
    state_bytes_per_seq: int
    max_positions: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lora_params(model: Any, cfg: ModelConfig) -> int:
    """LoRA's trainable parameters: r x (in + out) for every Linear named in `lora.target_modules`."""
    targets = set(cfg.lora.target_modules)
    return sum(cfg.lora.r * (m.in_features + m.out_features) for name, m in model.named_modules()
               if name.rsplit(".", 1)[-1] in targets and hasattr(m, "in_features"))


def shape(model: Any, cfg: ModelConfig) -> ModelShape:
    """`ModelShape` of a (meta) model under the run's freezing and LoRA options."""
    unique = {id(p): p for p in model.parameters()}
    params = sum(p.numel() for p in unique.values())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    layers = list(model.get_decoder().layers)
    k = cfg.freeze_bottom_layers
    if k and not 0 < k < len(layers):
        raise ConfigError(f"model.freeze_bottom_layers={k} must be between 1 and {len(layers) - 1} "
                          f"(the model has {len(layers)} layers)")
    if cfg.lora.enabled:
        trainable = _lora_params(model, cfg)
    else:
        frozen = {id(embed): embed} if k else {}
        for layer in layers[:k]:
            frozen.update({id(p): p for p in layer.parameters()})
        trainable = params - sum(p.numel() for p in frozen.values())
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_dim = getattr(text, "num_key_value_heads", heads) * head_dim
    kinds = list(getattr(text, "layer_types", None) or ["full_attention"] * len(layers))
    attention = sum(kind in ("full_attention", "sliding_attention") for kind in kinds)
    linear = len(kinds) - attention
    state = 0
    if linear:
        n_k, n_v = text.linear_num_key_heads, text.linear_num_value_heads
        d_k, d_v = text.linear_key_head_dim, text.linear_value_head_dim
        conv_dim = 2 * n_k * d_k + n_v * d_v
        state = linear * (n_v * d_k * d_v * 4 + conv_dim * (text.linear_conv_kernel_dim - 1) * 2)
    largest_module = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return ModelShape(
        params=params, trainable=trainable, embedding=embed.numel(), tied=tied, largest_module=largest_module,
        largest_block=max(sum(p.numel() for p in layer.parameters()) for layer in layers), layers=len(layers),
        hidden=text.hidden_size, intermediate=text.intermediate_size, kv_dim=kv_dim, vocab=text.vocab_size,
        attention_layers=attention, kv_bytes_per_token=2 * attention * kv_dim * 2,
        state_bytes_per_seq=state, max_positions=text.max_position_embeddings)


def template_text(spec: str) -> str:
    """A chat template by TRL name (`qwen2_5`) or `.jinja` path."""
    import trl

    path = Path(spec).expanduser()
    if path.suffix != ".jinja":
        path = Path(trl.__file__).parent / "chat_templates" / f"{spec}.jinja"
    if not path.is_file():
        raise ConfigError(f"chat template {spec!r}: neither a .jinja file nor a TRL template ({path.parent})")
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Tokenizer:
    """A tokenizer to render and count with: `exact` when it is the model's own; `template` names its chat
    template in messages."""

    tokenizer: Any
    exact: bool
    label: str
    template: str


_TOKENIZERS: dict[tuple[Any, ...], Any] = {}


def _own_tokenizer(cfg: ModelConfig, source: Any) -> Any:
    """`load_tokenizer` once per source and tokenizer options (a test plans many configs of one model)."""
    from cipr.runtime.model import load_tokenizer

    key = (source.path, source.gguf_file, cfg.revision, cfg.chat_template, cfg.eos_token, cfg.pad_token,
           cfg.padding_side)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(cfg, source)
    return _TOKENIZERS[key]


def tokenizer_for(cfg: ModelConfig, arch: Architecture) -> Tokenizer:
    """The model's own tokenizer when it is here, else the stand-in (module docstring)."""
    import copy

    from cipr.runtime.model import resolve_source

    try:
        source = resolve_source(cfg)
    except ConfigError:
        source = None
    if source is not None:
        return Tokenizer(_own_tokenizer(cfg, source), True, f"the model's own tokenizer ({source.path})",
                         cfg.chat_template or "the model's own")
    spec = cfg.chat_template or arch.chat_template
    if spec is None:
        raise ConfigError(f"model.chat_template: {arch.name} is not here and {arch.source} names no chat "
                          f"template: set model.chat_template to a TRL template name or a .jinja file")
    key = ("stand-in", spec)
    if key not in _TOKENIZERS:
        text = template_text(spec)
        embedded = ModelConfig()
        tok = copy.deepcopy(_own_tokenizer(embedded, resolve_source(embedded)))
        tok.add_special_tokens({"additional_special_tokens": sorted(set(CONTROL_TOKEN.findall(text)))})
        tok.chat_template = text
        _TOKENIZERS[key] = tok
    return Tokenizer(_TOKENIZERS[key], False, "stand-in: SmolLM2-135M's byte-level BPE with the family's "
                     "control tokens (estimate)", f"{spec} (TRL's copy)")
