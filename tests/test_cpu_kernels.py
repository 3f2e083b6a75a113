"""CIPR's compiled CPU kernels (`cipr.cpu_kernels`): they build here; `linear` equals F.linear and
`decode_attention` a loop over heads to float rounding (every row count, panel split, head grouping and
head dim; masks and strided caches); a row gets the same bits whatever batch it is in; bad shapes are
rejected with a message; `PackedLinears(kernel="cipr")` routes, falls back and repacks as documented."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cipr import cpu_kernels, packed_gemm
from cipr.packed_gemm import PackedLinears, cipr_linear


@pytest.fixture(scope="module", autouse=True)
def built():
    """Every machine this project runs on has a C++ compiler (the README's set-up): a build failure is a
    failure here, not a skip."""
    assert cpu_kernels.load(), "cipr.cpu_kernels did not build: see the warning logged above"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7, 8, 9, 13, 20])
@pytest.mark.parametrize("n,k", [(16, 7), (48, 40), (64, 33), (192, 576)])
def test_linear_equals_f_linear(m, n, k, bias):
    """x [m, k] times weight [n, k]: [m, n], F.linear's values to float rounding; n = 16 and 48 leave a
    single panel after the pairs (AVX-512 blocking), m > 8 takes several row chunks."""
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    packed = cpu_kernels.pack(w)
    assert packed.shape == (n // cpu_kernels.PANEL, k, cpu_kernels.PANEL)
    out = cpu_kernels.linear(x, packed, b)
    assert out.shape == (m, n)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_hand_computed_values():
    """A 2 x 3 input times a 16 x 3 weight whose row j is (j, 1, 0), bias j/2: out[r, j] = j x[r, 0] + x[r, 1] + j/2."""
    x = torch.tensor([[1.0, 2.0, 5.0], [-1.0, 0.5, 3.0]])
    j = torch.arange(16, dtype=torch.float32)
    w = torch.stack([j, torch.ones(16), torch.zeros(16)], dim=1)
    out = cpu_kernels.linear(x, cpu_kernels.pack(w), j / 2)
    expect = torch.stack([j * 1.0 + 2.0 + j / 2, j * -1.0 + 0.5 + j / 2])
    assert torch.equal(out, expect)


def test_a_row_does_not_depend_on_its_batch():
    """Each row's sums run in one order whatever the other rows are: rows computed alone, in any batch of
    1..20 rows, give the same bits (F.linear and MKL need not)."""
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(20, 576, generator=g), torch.randn(192, 576, generator=g), torch.randn(192, generator=g)
    packed = cpu_kernels.pack(w)
    alone = torch.cat([cpu_kernels.linear(x[i:i + 1], packed, b) for i in range(20)])
    for m in (2, 8, 13, 20):
        assert torch.equal(cpu_kernels.linear(x[:m], packed, b), alone[:m])


def test_bad_shapes_are_rejected_with_a_message():
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        cpu_kernels.pack(torch.randn(10, 4))
    with pytest.raises(RuntimeError, match="float32"):
        cpu_kernels.pack(torch.randn(16, 4, dtype=torch.float64))
    packed = cpu_kernels.pack(torch.randn(16, 4))
    with pytest.raises(RuntimeError, match="does not match"):
        cpu_kernels.linear(torch.randn(2, 5), packed, None)
    with pytest.raises(RuntimeError, match="bias"):
        cpu_kernels.linear(torch.randn(2, 4), packed, torch.randn(3))


def test_cipr_linear_routes_and_falls_back():
    """Leading dims flatten; more than MAX_ROWS rows and a trainable weight under grad go through F.linear
    (whose backward then works)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 12, generator=g, requires_grad=True)
    b = torch.randn(32, generator=g)
    packed = cpu_kernels.pack(w.detach())
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
    first = cpu_kernels.build_directory()
    assert first.parent == tmp_path and first.name.startswith("cipr_cpu_")
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: "flags : sse2")
    assert cpu_kernels.build_directory() != first


def _reference_attention(q, key, value, mask, scale):
    """softmax(scale q k^T + mask) v by a loop over query heads, float64: [B, H, D]."""
    b, h, d = q.shape
    g = h // key.shape[1]
    out = torch.empty(b, h, d, dtype=torch.float64)
    for j in range(h):
        s = scale * torch.einsum("bd,btd->bt", q[:, j].double(), key[:, j // g].double())
        if mask is not None:
            s = s + mask.double()
        out[:, j] = torch.einsum("bt,btd->bd", torch.softmax(s, -1), value[:, j // g].double())
    return out


@pytest.mark.parametrize("b,h,hk,d,t", [(2, 9, 3, 64, 37), (1, 14, 2, 64, 5), (3, 12, 2, 128, 100), (2, 4, 4, 64, 1),
                                        (2, 8, 1, 128, 16), (2, 7, 1, 64, 250)])
@pytest.mark.parametrize("masked", [True, False])
def test_decode_attention_equals_a_loop_over_heads(b, h, hk, d, t, masked):
    """[B, H, D] from query [B, H, D] and key/value views into a longer cache (the in-place cache's layout):
    a float64 loop over heads' values to float rounding; left-padded positions (finfo.min) weigh nothing."""
    g = torch.Generator().manual_seed(b * 100 + h + d + t)
    cache_k, cache_v = torch.randn(b, hk, t + 9, d, generator=g), torch.randn(b, hk, t + 9, d, generator=g)
    key, value = cache_k[:, :, :t], cache_v[:, :, :t]
    q = 3 * torch.randn(b, h, d, generator=g)
    mask = None
    if masked:
        mask = torch.zeros(b, t + 4)[:, :t]  # a view with row stride t + 4
        mask[-1, :t // 2] = torch.finfo(torch.float32).min
    out = cpu_kernels.decode_attention(q, key, value, mask, d ** -0.5)
    assert out.shape == (b, h, d)
    torch.testing.assert_close(out.double(), _reference_attention(q, key, value, mask, d ** -0.5), rtol=1e-5, atol=1e-5)
    if masked and t > 1:  # the padded row equals its unpadded suffix alone
        alone = cpu_kernels.decode_attention(q[-1:], key[-1:, :, t // 2:], value[-1:, :, t // 2:], None, d ** -0.5)
        torch.testing.assert_close(out[-1:], alone, rtol=1e-5, atol=1e-6)


def test_decode_attention_hand_computed():
    """Two positions, one head, D 64: scores (scale 1) 0 and ln 3, so weights 1/4 and 3/4 of values 4 and 8: 7."""
    q = torch.zeros(1, 1, 64)
    q[0, 0, 0] = 1.0
    key = torch.zeros(1, 1, 2, 64)
    key[0, 0, 1, 0] = float(torch.log(torch.tensor(3.0)))
    value = torch.stack([torch.full((64,), 4.0), torch.full((64,), 8.0)])[None, None]
    out = cpu_kernels.decode_attention(q, key, value, None, 1.0)
    torch.testing.assert_close(out, torch.full((1, 1, 64), 7.0), rtol=1e-6, atol=1e-6)


def test_decode_attention_row_does_not_depend_on_its_batch():
    g = torch.Generator().manual_seed(5)
    q, key, value = torch.randn(6, 9, 64, generator=g), torch.randn(6, 3, 50, 64, generator=g), torch.randn(6, 3, 50, 64, generator=g)
    batch = cpu_kernels.decode_attention(q, key, value, None, 0.125)
    for i in range(6):
        assert torch.equal(cpu_kernels.decode_attention(q[i:i + 1], key[i:i + 1], value[i:i + 1], None, 0.125), batch[i:i + 1])


def test_decode_attention_rejects_unsupported_shapes():
    q, kv = torch.randn(1, 9, 32), torch.randn(1, 3, 5, 32)
    with pytest.raises(RuntimeError, match="unsupported shapes"):
        cpu_kernels.decode_attention(q, kv, kv, None, 1.0)  # head dim 32
    q, kv = torch.randn(1, 18, 64), torch.randn(1, 2, 5, 64)
    with pytest.raises(RuntimeError, match="unsupported shapes"):
        cpu_kernels.decode_attention(q, kv, kv, None, 1.0)  # 9 query heads per key/value head
    with pytest.raises(RuntimeError, match="mask"):
        cpu_kernels.decode_attention(torch.randn(1, 2, 64), torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64),
                                     torch.zeros(1, 4), 1.0)


def test_cpu_kernels_can_be_turned_off(monkeypatch):
    """CIPR_CPU_KERNELS=0: load says no (the ops already loaded in this process stay, unused by callers)."""
    monkeypatch.setenv("CIPR_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is False
        assert packed_gemm.choose("auto") == ("mkl" if packed_gemm.available() else None)
    finally:
        cpu_kernels.load.cache_clear()
