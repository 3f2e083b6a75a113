"""Make a model's configs agree with its tokenizer on end of turn, padding and start of text.

Chat models disagree on these points and a wrong choice silently breaks generation (`generate()`,
vLLM and its server all stop at the generation config's eos). Used where a model is loaded for
training (`cipr.runtime.model`), converted from GGUF (`cipr.runtime.embedded`) and exported
(`cipr.runtime.export`).
"""

from __future__ import annotations

from typing import Any


def align_generation_config(model: Any, tokenizer: Any) -> None:
    """Make the model's generation config stop at the tokenizer's eos (end of turn) and pad with its pad."""
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids = [tokenizer.eos_token_id, *eos_ids]
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None)
    if tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    if tokenizer.bos_token_id is not None:
        gen.bos_token_id = tokenizer.bos_token_id
