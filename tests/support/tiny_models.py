"""Tiny offline models for tests and CPU benchmarks: a byte-level BPE tokenizer and a 2-layer Qwen2.

Nothing here touches a hub. The tokenizer is trained with `tokenizers` in well under a second on a
small corpus of tool-calling text, carries Qwen's special tokens and TRL's Qwen2.5 chat template
(which renders `tools=`), so every call format can be rendered and parsed with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                 "<think>", "</think>", "<tool_response>", "</tool_response>"]

_CORPUS = [
    '<tool_call>\n{"name": "function_01", "arguments": {"arg_01": "Paris"}}\n</tool_call>',
    '<think>I should call a tool.</think>\n<tool_call>\n{"name": "get_weather", "parameters": {"city": "Rome"}}\n</tool_call>',
    "<response>The answer is 42.</response>",
    "Thought: I need to search.\nAction: search[red shoes]\nAction Input: {\"query\": \"red shoes\"}",
    "You are a helpful assistant with access to the following tools. function_02 function_03 function_10 arg_02",
    "The user asks about the weather in Paris tomorrow; the forecast tool returns temperature and rain.",
    "Name: calculate_area Description: Computes the area of a triangle. Parameters: base, height (integer).",
]


MERGED_CLOSERS_CORPUS = [
    '{"name": "foo.", "arguments": {}}\n{"name": "v2.", "arguments": {}}',
    'The list: ["a", "b"]. Done."} "]',
    "Action: click[item]\n\nAction: search[q]\n\n",
]
"""Extra training text that gives the tiny tokenizer closers merged with a name's last character
(`.",`, `."}`, but no `."`) and a double newline, for tests of how names are closed."""


def tiny_tokenizer(vocab_size: int = 512, extra_corpus: Sequence[str] = ()):
    """A byte-level BPE tokenizer (PreTrainedTokenizerFast) with Qwen specials and chat template.

    `extra_corpus` adds training text (e.g. `MERGED_CLOSERS_CORPUS`); the default tokenizer has none.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((_CORPUS + list(extra_corpus)) * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
    import trl

    template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    fast.chat_template = template.read_text()
    return fast


def tiny_model(tokenizer=None, *, hidden_size: int = 64, layers: int = 2, seed: int = 0):
    """A randomly initialized Qwen2ForCausalLM (about 200k parameters) sized to `tokenizer`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.eval()
    return model


def save_tiny(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny tokenizer + model folder that `from_pretrained(path)` loads (for CLI tests)."""
    path = Path(path)
    tok = tiny_tokenizer()
    tiny_model(tok, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@contextlib.contextmanager
def attention_as(model, name: str) -> Iterator[None]:
    """The block runs with the model's attention implementation set to `name`, then the old one is restored."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
