"""Packed GEMM (MKL's; CIPR's kernel itself is tested in test_cpu_kernels.py): the packed product equals
`F.linear`; other row counts and training fall back to it; layers are switched and restored; the HF
backend's greedy texts do not change with either kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cipr import packed_gemm
from cipr.packed_gemm import PackedLinears, packed_linear

needs_mkl = pytest.mark.skipif(not packed_gemm.available(), reason="this torch build has no MKL packed linear")


def test_available_matches_the_build():
    """x86 CPU wheels (the pinned torch) ship MKL; the flag must say so rather than silently disable packing."""
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert packed_gemm.available()


@needs_mkl
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(8, 48), (2, 4, 48)])
def test_packed_linear_equals_f_linear(bias, shape):
    """x [..., in=48] times weight [out=40, in]: the same values at the packed row count (8 rows in both
    shapes), another summation order only."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    w = torch.randn(40, 48, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 8)
    out = packed_linear(x, w, b, packed, 8)
    assert out.shape == shape[:-1] + (40,)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@needs_mkl
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_packed_linear_pads_fewer_rows(n):
    """Packed for 4 rows: 2-3 rows are zero-padded through the packed product, 1 row goes through
    F.linear; all equal F.linear, shape [n, out]."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(16, 12, generator=g), torch.randn(16, generator=g)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 4)
    x = torch.randn(n, 12, generator=g)
    out = packed_linear(x, w, b, packed, 4)
    assert out.shape == (n, 16)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@needs_mkl
def test_packed_linear_falls_back_on_more_rows_and_under_grad():
    w = torch.randn(16, 12, requires_grad=True)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), 4)
    x = torch.randn(5, 12)  # 5 rows (a prefill), packed for 4
    with torch.no_grad():
        torch.testing.assert_close(packed_linear(x, w, None, packed, 4), F.linear(x, w))
    y = packed_linear(torch.randn(4, 12), w, None, packed, 4)  # grad on, weight trainable: F.linear
    y.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


@needs_mkl
def test_packed_linears_pack_once_repack_on_change_restore_release():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8, bias=False),
                                torch.nn.Linear(8, 8).double(), torch.nn.Linear(8, 8))
    hooked = model[4]
    hooked.forward = lambda x: x  # an instance-level wrapper, like accelerate's hooks: left alone
    packer = PackedLinears(model)
    assert packer.layers == [model[0], model[2]]

    def net(x):
        return model[2](F.relu(model[0](x)))

    with torch.no_grad():
        x = torch.randn(5, 12)
        expect = net(x)
        packer.pack(8)
        packer.restore()
        packer.pack(8)  # kept: no second pass over the weights
        assert packer.packs == 1 and all("forward" in vars(m) for m in packer.layers)
        torch.testing.assert_close(net(x), expect, rtol=1e-5, atol=1e-5)
        packer.pack(5)
        assert packer.packs == 2
        torch.testing.assert_close(net(x), expect, rtol=1e-5, atol=1e-5)
        model[0].weight.mul_(2)  # an in-place update (an optimizer step): the packed copy is stale
        packer.pack(5)
        assert packer.packs == 3
        torch.testing.assert_close(net(x), model[2](F.relu(F.linear(x, model[0].weight, model[0].bias))))
    packer.restore()
    assert packer.rows == 5 and all("forward" not in vars(m) for m in packer.layers)
    assert "forward" in vars(hooked)
    packer.release()
    assert packer.rows == 0 and not packer._packed
    with PackedLinears(model) as p:
        p.pack(3)
        assert "forward" in vars(model[0])
    assert "forward" not in vars(model[0]) and not p._packed


@pytest.mark.parametrize("kernel", ["cipr", "mkl"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_hf_backend_same_texts_with_and_without_packing(tiny_tokenizer, batch_size, kernel):
    """Greedy texts of the sharpened tiny model (outputs vary with prompt and step) are the same with
    packed weights (either kernel) and without; the layers are restored after generation; the weights
    are packed once per backend (`mkl` only for batches of two or more rows)."""
    from cipr.eval.backends import GenRequest, HFBackend, HFBackendConfig
    from cipr.formats.toolrl import ToolRLFormat
    from cipr.interface import Example, Interface, Message, Tool
    from cipr.testing import tiny_model

    model = tiny_model(tiny_tokenizer, seed=2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(10)
    tool = Tool("get_weather", "Weather for a city.", {"type": "object", "properties": {"city": {"type": "string"}}})
    reqs = [GenRequest(Example(id=q, messages=(Message("user", q),), interface=Interface((tool,))))
            for q in ["Rome?", "What is the weather like in Paris tomorrow?", "Oslo", "Lima and its weather"]]

    if kernel == "mkl" and not packed_gemm.available():
        pytest.skip("this torch build has no MKL packed linear")

    def texts(packed: bool) -> list[str]:
        cfg = HFBackendConfig(batch_size=batch_size, max_new_tokens=12, packed_gemm=packed, gemm_kernel=kernel)
        return [g.text for g in HFBackend(model, tiny_tokenizer, ToolRLFormat(), cfg).generate(reqs)]

    plain = texts(False)
    assert texts(True) == plain and len(set(plain)) > 1
    assert all("forward" not in vars(m) for m in model.modules())
    cfg = HFBackendConfig(batch_size=batch_size, max_new_tokens=12, gemm_kernel=kernel)
    backend = HFBackend(model, tiny_tokenizer, ToolRLFormat(), cfg)
    backend.generate(reqs)
    backend.generate(reqs[:3])  # a short batch: padded to the packed row count (mkl), not repacked
    packs = backend._packer.packs if backend._packer else 0
    assert packs == (1 if batch_size > 1 or kernel == "cipr" else 0)
    assert (backend._packer.kernel if backend._packer else None) == (kernel if packs else None)


def test_eval_config_reaches_the_backend(tiny_model, tiny_tokenizer):
    """`cipr-eval packed_gemm=false` turns it off in the HF backend it builds."""
    from cipr.eval.config import EvalConfig
    from cipr.eval.evaluate import make_backend
    from cipr.formats.toolrl import ToolRLFormat

    for flag in (True, False):
        backend = make_backend(EvalConfig(packed_gemm=flag), ToolRLFormat(), model=tiny_model, tokenizer=tiny_tokenizer)
        assert backend.config.packed_gemm is flag
    backend = make_backend(EvalConfig(gemm_kernel="mkl"), ToolRLFormat(), model=tiny_model, tokenizer=tiny_tokenizer)
    assert backend.config.gemm_kernel == "mkl"


def test_fits_compares_with_free_memory():
    assert packed_gemm.fits(1)
    assert not packed_gemm.fits(10**18)


def test_backend_skips_packing_that_does_not_fit(tiny_model, tiny_tokenizer, monkeypatch, caplog):
    """When the packed copy would not fit in memory the backend decodes with F.linear and says so."""
    from cipr.eval.backends import GenRequest, HFBackend, HFBackendConfig
    from cipr.formats.toolrl import ToolRLFormat
    from cipr.interface import Example, Interface, Message

    monkeypatch.setattr(packed_gemm, "fits", lambda nbytes, fraction=0.5: False)
    reqs = [GenRequest(Example(id=q, messages=(Message("user", q),), interface=Interface(()))) for q in ("a", "bb")]
    backend = HFBackend(tiny_model, tiny_tokenizer, ToolRLFormat(), HFBackendConfig(batch_size=2, max_new_tokens=3))
    with caplog.at_level("WARNING"):
        gens = backend.generate(reqs)
    assert all(g.error is None for g in gens) and backend.timing["pack_seconds"] == 0
    if packed_gemm.available():
        assert backend._packer is False and "more than half the free memory" in caplog.text
