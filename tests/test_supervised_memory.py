"""The supervised regime's memory: its lean SFT forward (`cipr.train.supervised.lean_sft_forward`), the same
numbers as TRL's fused head bit for bit with the head applied to the target positions only and the trained
layers recomputed in backward, and the reader's recomputation (`ActionReaderConfig.recompute`), the same
distributions and gradients bit for bit in both modes; what they leave alone (a trained head, a model that
checkpoints already)."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import tiny_model
from trl.trainer.utils import add_fused_lm_head

from cipr.formats import get_format
from cipr.method.action_forward import recomputed_layers
from cipr.method.actions import ActionQuery, ActionReaderConfig, read_actions
from cipr.runtime.model import freeze_bottom
from cipr.train.supervised import SFT_OUTPUTS, _compactable, lean_sft_forward


def _model(freeze: int) -> torch.nn.Module:
    model = tiny_model(layers=3)
    if freeze:
        freeze_bottom(model, freeze)  # embeddings (tied to the head) and the first `freeze` layers
    add_fused_lm_head(model, outputs=SFT_OUTPUTS)  # as TRL's SFTTrainer does
    model.train()
    return model


def _batch() -> dict[str, torch.Tensor]:
    """Three right-padded rows (20, 15 and 9 tokens), labels on each row's last tokens only."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 480, (3, 20), generator=gen)
    attention = torch.zeros(3, 20, dtype=torch.long)
    labels = torch.full((3, 20), -100)
    for row, (length, target) in enumerate([(20, 6), (15, 4), (9, 3)]):
        attention[row, :length] = 1
        labels[row, length - target:length] = ids[row, length - target:length]
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def _step(model: torch.nn.Module, lean: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """TRL's SFT loss (sum of -log p over the targets / their count) and its gradients; also the bytes saved
    for backward."""
    model.zero_grad(set_to_none=True)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if lean:
            with lean_sft_forward(model, torch.device("cpu")):
                out = model(**_batch(), use_cache=False, fused_lm_head=True)
        else:
            out = model(**_batch(), use_cache=False, fused_lm_head=True)
    loss = -out.log_probs.sum() / out.label_mask.sum()
    loss.backward()
    fields = {"loss": loss.detach(), "log_probs": out.log_probs.detach(), "entropy": out.entropy.detach(),
              "is_top1": out.is_top1, "label_mask": out.label_mask}
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return fields, grads, sum(saved.values())


@pytest.mark.parametrize("freeze", [1, 0])
def test_lean_forward_is_bit_identical_to_trls_fused_head(freeze, monkeypatch):
    import trl.kernels.chunked_logprob as kernel
    import trl.trainer.utils as utils

    # several vocabulary and token tiles, so that the compact head's tiles differ from TRL's
    monkeypatch.setattr(utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 128)
    monkeypatch.setattr(kernel, "TOKEN_CHUNK_SIZE", 16)
    model = _model(freeze)
    assert _compactable(model, torch.device("cpu")) == bool(freeze)  # a trained head is left to TRL
    ref_fields, ref_grads, ref_saved = _step(model, lean=False)
    fields, grads, saved = _step(model, lean=True)
    for key, value in ref_fields.items():
        assert torch.equal(fields[key], value), key
    assert ref_grads.keys() == grads.keys() and len(grads) > 0
    for name, grad in ref_grads.items():
        assert torch.equal(grads[name], grad), name
    assert saved < ref_saved / 2  # the trained layers keep their inputs only


def test_lean_forward_restores_the_model():
    model = _model(1)
    forward = model.forward
    layers = model.get_decoder().layers
    with lean_sft_forward(model, torch.device("cpu")):
        assert model.forward is not forward
        assert "forward" not in layers[0].__dict__ and "forward" in layers[1].__dict__
    assert model.forward == forward
    assert not any("forward" in layer.__dict__ for layer in layers)
    with torch.no_grad(), lean_sft_forward(model, torch.device("cpu")):  # nothing to recompute without grad
        assert not any("forward" in layer.__dict__ for layer in layers)


def test_recomputed_layers_are_the_trained_ones_unless_the_model_checkpoints():
    model = _model(2)
    layers = list(model.get_decoder().layers)
    assert recomputed_layers(model) == layers[2:]
    whole = _model(0)
    assert recomputed_layers(whole) == list(whole.get_decoder().layers)
    model.gradient_checkpointing_enable()
    assert recomputed_layers(model) == []


def test_lean_forward_passes_other_calls_through():
    model = _model(1)
    batch = _batch()
    with torch.no_grad():
        plain = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        with lean_sft_forward(model, torch.device("cpu")):
            inside = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(plain, inside)


def _queries(tokenizer) -> list[ActionQuery]:
    """Compact-format targets: one call, two calls, an answer without a call (six decisions)."""
    from cipr.tools.interface import Call

    fmt = get_format("compact")
    tools = ("function_01", "function_02", "function_03")
    message = {"role": "user", "content": "Weather in Paris? " + ", ".join(tools)}
    prompt = tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=True)
    targets = [fmt.render_target([Call("function_02", {"city": "Paris"})]),
               fmt.render_target([Call("function_01", {}), Call("function_03", {"x": 1})]),
               fmt.render_target([], response="It is sunny.")]
    return [ActionQuery.from_format(fmt, prompt, t, tools) for t in targets]


@pytest.mark.parametrize("mode", ["prefix_cache", "packed"])
@pytest.mark.parametrize("freeze", [1, 0])
def test_reader_recomputation_is_bit_identical(mode, freeze):
    from support.tiny_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, layers=3)
    if freeze:
        freeze_bottom(model, freeze)
    model.train()
    queries = _queries(tokenizer)
    results, saved = [], []
    for recompute in (False, True):
        model.zero_grad(set_to_none=True)
        config = ActionReaderConfig(mode=mode, response_logprobs=True, recompute=recompute)
        sizes: dict[int, int] = {}

        def pack(t: torch.Tensor, sizes: dict[int, int] = sizes) -> torch.Tensor:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            reading = read_actions(model, tokenizer, queries, 3, config)
        saved.append(sum(sizes.values()))
        loss = reading.probs[:, 0].log().sum() - (reading.response_logprobs * reading.response_mask).sum()
        loss.backward()
        results.append((reading.probs.detach(), reading.response_logprobs.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        assert not any("forward" in layer.__dict__ for layer in model.get_decoder().layers)  # restored
    (probs, logprobs, grads), (probs_r, logprobs_r, grads_r) = results
    assert probs.shape[0] == 6
    assert saved[1] < saved[0] * 0.7  # the recomputed layers keep their inputs only
    assert torch.equal(probs, probs_r) and torch.equal(logprobs, logprobs_r)
    assert grads.keys() == grads_r.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.equal(grads_r[name], grad), name
