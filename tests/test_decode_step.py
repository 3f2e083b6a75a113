"""A decoding step that calls the layers directly gives `model.forward`'s logits bit for bit."""

from __future__ import annotations

import pytest
import torch

from cipr.attention import GROUPED, use_grouped
from cipr.decode_step import decode_step, supports
from cipr.kv_cache import growing_cache


def family_model(family: str, **extra):
    """A float32 random model of `family` (2 layers, 4 query heads on 2 key/value heads), with cipr_grouped."""
    import transformers

    config_class = getattr(transformers, f"{family}Config")
    if family == "Mistral":
        extra = {"sliding_window": None, **extra}  # its config's default is a window of 4096
    config = config_class(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).float().eval()
    with torch.no_grad():  # sharper logits, so that greedy tokens vary with the step
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4)
    assert use_grouped(model)
    return model


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Qwen2"])
@pytest.mark.parametrize("padded", [False, True])
def test_decode_step_equals_the_models_forward(family, padded):
    """Rows of 6, 4 and 6 prompt tokens (left padding when `padded`, else all 6), prefilled by the model,
    then 5 greedy steps through each path on its own cache: equal logits [B, V] at every step."""
    model = family_model(family)
    assert supports(model)
    torch.manual_seed(1)
    ids = torch.randint(3, 97, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    if padded:
        mask[1, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        caches = [growing_cache(model.config), growing_cache(model.config)]
        outs = [model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=c, use_cache=True)
                for c in caches]
        toks = [o.logits[:, -1].argmax(-1) for o in outs]
        next_pos = pos[:, -1] + 1
        seen = set()
        for _ in range(5):
            mask = torch.cat([mask, mask.new_ones(3, 1)], dim=1)
            want = model(input_ids=toks[0][:, None], attention_mask=mask, position_ids=next_pos[:, None],
                         past_key_values=caches[0], use_cache=True).logits[:, -1]
            got = decode_step(model, toks[1], next_pos, caches[1], mask)  # unpadded: applied as no mask
            assert got.shape == (3, model.config.vocab_size)
            assert torch.equal(got, want)
            toks = [want.argmax(-1), got.argmax(-1)]
            seen.update(toks[0].tolist())
            next_pos = next_pos + 1
    assert len(seen) > 1  # the steps decoded different tokens: the comparison is not of a constant


def test_supports_only_the_structures_it_reproduces():
    llama = family_model("Llama")
    assert supports(llama)
    llama.set_attn_implementation("eager")
    assert not supports(llama)  # its mask and attention are not the ones decode_step builds
    assert not supports(family_model("Mistral", sliding_window=4))
    qwen3 = family_model("Qwen3", head_dim=8)  # q/k norms: another structure
    assert qwen3.config._attn_implementation == GROUPED and not supports(qwen3)


def test_the_backend_decodes_the_same_texts_either_way(tiny_tokenizer):
    """The evaluation backend with and without `direct_decode`, batch sizes 1 and 3: the same greedy texts."""
    from cipr.eval.backends import GenRequest, HFBackend, HFBackendConfig
    from cipr.formats.toolrl import ToolRLFormat
    from cipr.interface import Example, Interface, Message, Tool
    from cipr.testing import tiny_model

    model = tiny_model(tiny_tokenizer, seed=1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(10)
    assert use_grouped(model) and supports(model)
    tool = Tool("f", "A tool.", {"type": "object", "properties": {"x": {"type": "string"}}})
    reqs = [GenRequest(Example(id=q, messages=(Message("user", q),), interface=Interface((tool,))))
            for q in ("a", "a longer question here", "mid length")]

    def texts(bs: int, direct: bool) -> list[str]:
        cfg = HFBackendConfig(batch_size=bs, max_new_tokens=8, direct_decode=direct)
        return [g.text for g in HFBackend(model, tiny_tokenizer, ToolRLFormat(), cfg).generate(reqs)]

    direct = texts(3, True)
    assert direct == texts(3, False) == texts(1, True) == texts(1, False)
    assert len(set(direct)) == len(direct)
