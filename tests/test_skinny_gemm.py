"""CIPR's decoding kernel (`cipr.skinny_gemm`): it builds here, equals F.linear to float rounding at every
row count and panel split, gives a row the same bits whatever batch it is in, rejects bad shapes with a
message, and `PackedLinears(kernel="cipr")` routes, falls back and repacks as documented."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cipr import packed_gemm, skinny_gemm
from cipr.packed_gemm import PackedLinears, cipr_linear


@pytest.fixture(scope="module", autouse=True)
def built():
    """Every machine this project runs on has a C++ compiler (the README's set-up): a build failure is a
    failure here, not a skip."""
    assert skinny_gemm.load(), "cipr.skinny_gemm did not build: see the warning logged above"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 8, 9, 13, 20])
@pytest.mark.parametrize("n,k", [(16, 7), (48, 40), (64, 33), (192, 576)])
def test_linear_equals_f_linear(m, n, k, bias):
    """x [m, k] times weight [n, k]: [m, n], F.linear's values to float rounding; n = 16 and 48 leave a
    single panel after the pairs (AVX-512 blocking), m > 8 takes several row chunks."""
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    packed = skinny_gemm.pack(w)
    assert packed.shape == (n // skinny_gemm.PANEL, k, skinny_gemm.PANEL)
    out = skinny_gemm.linear(x, packed, b)
    assert out.shape == (m, n)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_hand_computed_values():
    """A 2 x 3 input times a 16 x 3 weight whose row j is (j, 1, 0), bias j/2: out[r, j] = j x[r, 0] + x[r, 1] + j/2."""
    x = torch.tensor([[1.0, 2.0, 5.0], [-1.0, 0.5, 3.0]])
    j = torch.arange(16, dtype=torch.float32)
    w = torch.stack([j, torch.ones(16), torch.zeros(16)], dim=1)
    out = skinny_gemm.linear(x, skinny_gemm.pack(w), j / 2)
    expect = torch.stack([j * 1.0 + 2.0 + j / 2, j * -1.0 + 0.5 + j / 2])
    assert torch.equal(out, expect)


def test_a_row_does_not_depend_on_its_batch():
    """Each row's sums run in one order whatever the other rows are: rows computed alone, in any batch of
    1..20 rows, give the same bits (F.linear and MKL need not)."""
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(20, 576, generator=g), torch.randn(192, 576, generator=g), torch.randn(192, generator=g)
    packed = skinny_gemm.pack(w)
    alone = torch.cat([skinny_gemm.linear(x[i:i + 1], packed, b) for i in range(20)])
    for m in (2, 8, 13, 20):
        assert torch.equal(skinny_gemm.linear(x[:m], packed, b), alone[:m])


def test_bad_shapes_are_rejected_with_a_message():
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        skinny_gemm.pack(torch.randn(10, 4))
    with pytest.raises(RuntimeError, match="float32"):
        skinny_gemm.pack(torch.randn(16, 4, dtype=torch.float64))
    packed = skinny_gemm.pack(torch.randn(16, 4))
    with pytest.raises(RuntimeError, match="does not match"):
        skinny_gemm.linear(torch.randn(2, 5), packed, None)
    with pytest.raises(RuntimeError, match="bias"):
        skinny_gemm.linear(torch.randn(2, 4), packed, torch.randn(3))


def test_cipr_linear_routes_and_falls_back():
    """Leading dims flatten; more than MAX_ROWS rows and a trainable weight under grad go through F.linear
    (whose backward then works)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 12, generator=g, requires_grad=True)
    b = torch.randn(32, generator=g)
    packed = skinny_gemm.pack(w.detach())
    with torch.no_grad():
        x = torch.randn(2, 3, 12, generator=g)
        torch.testing.assert_close(cipr_linear(x, w, b, packed), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        big = torch.randn(packed_gemm.MAX_ROWS + 1, 12, generator=g)
        assert torch.equal(cipr_linear(big, w, b, packed), F.linear(big, w, b))
    y = cipr_linear(torch.randn(4, 12, generator=g), w, b, packed)
    y.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_packed_linears_cipr_packs_once_for_any_rows():
    """`cipr` packs only layers whose out_features is a multiple of 16, once for every row count, again
    after an in-place weight update."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    packer = PackedLinears(model, "cipr")
    assert packer.layers == [model[0]]
    with torch.no_grad():
        x = torch.randn(3, 12)
        expect = model(x)
        for rows in (8, 1, 4):
            packer.pack(rows)
            torch.testing.assert_close(model(x), expect, rtol=1e-5, atol=1e-5)
        assert packer.packs == 1
        model[0].weight.mul_(2)
        packer.pack(4)
        assert packer.packs == 2
        torch.testing.assert_close(model(x), model[2](F.relu(F.linear(x, model[0].weight, model[0].bias))),
                                   rtol=1e-5, atol=1e-5)
    packer.release()
    assert "forward" not in vars(model[0])
    with pytest.raises(ValueError, match="kernel"):
        PackedLinears(model, "blas")


def test_choose_resolves_and_rejects():
    assert packed_gemm.choose("auto") == "cipr"
    assert packed_gemm.choose("cipr") == "cipr"
    if packed_gemm.available():
        assert packed_gemm.choose("mkl") == "mkl"
    with pytest.raises(ValueError, match="gemm_kernel"):
        packed_gemm.choose("fast")


def test_build_directory_is_keyed_by_machine_and_root(monkeypatch, tmp_path):
    """Under $TORCH_EXTENSIONS_DIR, named by a key of the source, flags, torch version and CPU flags."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    first = skinny_gemm.build_directory()
    assert first.parent == tmp_path and first.name.startswith("cipr_gemm_")
    monkeypatch.setattr(skinny_gemm, "_cpu_flags", lambda: "flags : sse2")
    assert skinny_gemm.build_directory() != first
