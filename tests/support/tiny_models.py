"""Tiny offline models for tests and CPU benchmarks: a byte-level BPE tokenizer and a 2-layer Qwen2.

Nothing here touches a hub. The tokenizer is trained with `tokenizers` in well under a second on a
small corpus of tool-calling text, carries Qwen's special tokens and TRL's Qwen2.5 chat template
(which renders `tools=`), so every call format can be rendered and parsed with it. `template=` builds
the same kind of tokenizer for another template family TRL ships (Qwen3, Llama 3.1/3.2, gpt-oss), with
that family's control tokens and a few lines of its call text in the corpus.
"""

from __future__ import annotations

import contextlib
import importlib.resources
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                 "<think>", "</think>", "<tool_response>", "</tool_response>"]

_CORPUS = [
    '<tool_call>\n{"name": "function_01", "arguments": {"arg_01": "Paris"}}\n</tool_call>',
    '<think>I should call a tool.</think>\n<tool_call>\n'
    '{"name": "get_weather", "parameters": {"city": "Rome"}}\n</tool_call>',
    "<response>The answer is 42.</response>",
    "Thought: I need to search.\nAction: search[red shoes]\nAction Input: {\"query\": \"red shoes\"}",
    "You are a helpful assistant with access to the following tools. function_02 function_03 function_10 "
    "arg_02",
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


@dataclass(frozen=True)
class TemplateFamily:
    """A chat template family's control tokens (pad first), its eos, pad and bos, and extra corpus text."""

    specials: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None = None
    corpus: tuple[str, ...] = ()


_QWEN = TemplateFamily(tuple(QWEN_SPECIALS), "<|im_end|>", "<|endoftext|>")
_LLAMA = TemplateFamily(
    ("<|finetune_right_pad_id|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
     "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"), "<|eot_id|>",
    "<|finetune_right_pad_id|>", "<|begin_of_text|>",
    ('{"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "function_1", "parameters": {}}',
     "Given the following functions, please respond with a JSON for a function call with its proper "
     "arguments.",
     "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"))
_GPTOSS = TemplateFamily(
    ("<|endoftext|>", "<|startoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
     "<|constrain|>", "<|return|>", "<|call|>"), "<|return|>", "<|endoftext|>", "<|startoftext|>",
    (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>',
     "<|channel|>analysis<|message|>I need the weather.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>Sunny.",
     "namespace functions {\n// Get the weather.\ntype get_weather = (_: {\ncity: string,\n}) => any;\n}"))
TEMPLATE_FAMILIES: dict[str, TemplateFamily] = {"qwen2_5": _QWEN, "qwen3": _QWEN, "llama3_1": _LLAMA,
                                                "llama3_2": _LLAMA, "gptoss": _GPTOSS}
"""TRL chat templates (`trl/chat_templates/<name>.jinja`) a tiny tokenizer can be built with."""


def trl_template(name: str) -> str:
    """The text of TRL's chat template `name` (read from the installed package)."""
    return (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def tiny_tokenizer(vocab_size: int = 512, extra_corpus: Sequence[str] = (), template: str = "qwen2_5"):
    """A byte-level BPE tokenizer (PreTrainedTokenizerFast) with a template family's specials and chat
    template.

    `extra_corpus` adds training text (e.g. `MERGED_CLOSERS_CORPUS`); the default tokenizer has none.
    `template`: a key of `TEMPLATE_FAMILIES` (default Qwen2.5, the tokenizer every other test uses).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    family = TEMPLATE_FAMILIES[template]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(family.specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((_CORPUS + list(family.corpus) + list(extra_corpus)) * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=family.eos, pad_token=family.pad,
                                   bos_token=family.bos, unk_token=None)
    fast.add_special_tokens({"additional_special_tokens": [t for t in family.specials if t != family.pad]})
    fast.chat_template = trl_template(template)
    return fast


def tiny_model(tokenizer=None, *, hidden_size: int = 64, layers: int = 2, seed: int = 0):
    """A randomly initialized Qwen2ForCausalLM (about 200k parameters) sized to `tokenizer`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
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
    """The block runs with the model's attention implementation set to `name`, then the old one is
    restored."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
