"""Issue #18: the fused centring of shaped attention (``attended + v - token_mean(v)`` as one
autograd operation) equals the explicit matrix form, in value and gradient."""

import pytest
import torch

from shapedtx import _compiled_centring
from shapedtx.attention import (
    CUMSUM_BLOCK,
    _causal_centring,
    causal_centring,
    causal_uniform,
    centred_sum,
    shaped_attention,
    shaped_attention_heads,
    shaped_attention_matrix,
    token_cumsum,
    token_mean,
)
from shapedtx.blocks import merge_heads, split_heads


def _centre(m: int, causal: bool) -> torch.Tensor:
    if causal:
        return causal_uniform(m, dtype=torch.float64)
    return torch.full((m, m), 1.0 / m, dtype=torch.float64)


def _assert_same_value_and_gradients(fused, explicit, inputs, gen):
    """fused == explicit to 1e-10, and their gradients w.r.t. every input for a random
    cotangent (float64)."""
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-10)
    g = torch.randn(fused.shape, generator=gen, dtype=torch.float64)
    for x, y in zip(
        torch.autograd.grad(fused, inputs, g), torch.autograd.grad(explicit, inputs, g), strict=True
    ):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-10)


@pytest.mark.parametrize("m", [1, 5, 2 * CUMSUM_BLOCK - 1, 2 * CUMSUM_BLOCK, 37, 128])
@pytest.mark.parametrize("reverse", [False, True])
def test_token_cumsum_equals_triangular_product(m, reverse):
    """``token_cumsum`` is ``T x`` with T the (m, m) lower (upper, if reverse) triangle of
    ones, for the m of the causal_centring tests (token_cumsum itself has no blocked path)
    and a strided input (the per-head view of merged values)."""
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(3, m, 2, 5, generator=gen, dtype=torch.float64).transpose(-3, -2)
    ones = torch.ones(m, m, dtype=torch.float64)
    T = ones.triu() if reverse else ones.tril()
    torch.testing.assert_close(token_cumsum(x, reverse=reverse), T @ x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("m", [1, 5, 2 * CUMSUM_BLOCK - 1, 2 * CUMSUM_BLOCK, 37, 128])
@pytest.mark.parametrize("transpose", [False, True])
def test_causal_centring_equals_matrix_form(m, transpose):
    """``causal_centring`` is ``(I - C) x`` (``(I - C)^T x``), C the causal uniform matrix, for
    m below, at and above the blocked path's threshold, m not a multiple of the block, and a
    strided input; float64 to 1e-10, and float32 close."""
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(3, m, 2, 5, generator=gen, dtype=torch.float64).transpose(-3, -2)
    M = torch.eye(m, dtype=torch.float64) - causal_uniform(m, dtype=torch.float64)
    expected = (M.T if transpose else M) @ x
    torch.testing.assert_close(
        causal_centring(x, transpose=transpose), expected, rtol=0, atol=1e-10
    )
    torch.testing.assert_close(
        causal_centring(x.float(), transpose=transpose), expected.float(), rtol=1e-4, atol=1e-5
    )


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap fallback
@pytest.mark.parametrize("m", [5, 40])
@pytest.mark.parametrize("transpose", [False, True])
def test_causal_centring_and_token_mean_are_differentiable(m, transpose):
    """Gradients of ``causal_centring`` (both paths; m = 40 is blocked) and of the causal
    ``token_mean`` equal those of the matrix form to 1e-10; second order through gradcheck;
    ``torch.func.grad`` and ``vmap`` work."""
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(2, m, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    M = torch.eye(m, dtype=torch.float64) - causal_uniform(m, dtype=torch.float64)
    M = M.T if transpose else M
    _assert_same_value_and_gradients(causal_centring(x, transpose=transpose), M @ x, (x,), gen)
    mean = causal_uniform(m, dtype=torch.float64) @ x
    _assert_same_value_and_gradients(token_mean(x, causal=True), mean, (x,), gen)
    assert torch.autograd.gradgradcheck(lambda y: causal_centring(y, transpose=transpose), (x,))
    # function transforms: torch.func.grad and vmap
    w = torch.randn(2, m, 3, generator=gen, dtype=torch.float64)
    grad = torch.func.grad(lambda y: (causal_centring(y, transpose=transpose) * w).sum())
    torch.testing.assert_close(grad(x.detach()), M.T @ w, rtol=0, atol=1e-10)
    batched = torch.func.vmap(lambda y: causal_centring(y, transpose=transpose))(x.detach())
    torch.testing.assert_close(batched, M @ x.detach(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("m", [4 * CUMSUM_BLOCK, 4 * CUMSUM_BLOCK + 5])
@pytest.mark.parametrize("transpose", [False, True])
def test_fused_centring_returns_base_tensors(transpose, m):
    """The fused centring's blockwise form (forward and backward of ``centred_sum``) returns
    a fresh tensor that is not a view, also when m is not a multiple of the block, so that
    autograd adds the SDPA gradient of the values into it in place; the public form's output
    may be modified in place under autograd."""
    x = torch.randn(2, m, 3, dtype=torch.float64, requires_grad=True)
    out = _causal_centring(x.detach(), transpose, fresh=True)
    assert out._base is None and out.is_contiguous()
    torch.testing.assert_close(out, causal_centring(x.detach(), transpose=transpose))
    causal_centring(x, transpose=transpose).mul_(2.0).sum().backward()


@pytest.mark.parametrize("transpose", [False, True])
def test_blocked_causal_centring_float32_error_does_not_grow_with_m(transpose):
    """Float32 at m = 4096 with a common offset (mean 10): error within 1.5e-6 of max |x|
    against float64, as a running sum's. Recovering block totals from the product by
    cancellation instead gave 3.6e-6, growing with m."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4096, 8, generator=gen, dtype=torch.float64) + 10.0
    M_x = causal_centring(x, transpose=transpose)  # float64 reference (error ~1e-15)
    err = (causal_centring(x.float(), transpose=transpose).double() - M_x).abs().max()
    assert err <= 1.5e-6 * x.abs().max()


@pytest.fixture(params=["compiled", "torch"])
def centring_form(request, monkeypatch):
    """Run a test with the compiled centring kernels (the CPU default) and with the torch
    forms used on other devices and in half precision."""
    if request.param == "torch":
        monkeypatch.setattr(_compiled_centring, "applies", lambda *tensors: False)
    return request.param


@pytest.mark.parametrize("m", [9, 40])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_centring_equals_matrix_form(causal, m, centring_form):
    """Value and both gradients of ``attended + (I - C) v`` to 1e-10 in float64, compiled and
    torch forms (m = 40 takes the torch form's blocked running sum)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 2, m, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 2, m, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    fused = centred_sum(a, v, causal=causal)
    explicit = a + (torch.eye(m, dtype=torch.float64) - _centre(m, causal)) @ v
    _assert_same_value_and_gradients(fused, explicit, (a, v), gen)
    assert torch.autograd.gradcheck(lambda x, y: centred_sum(x, y, causal=causal), (a, v))


@pytest.mark.parametrize("causal", [False, True])
def test_fused_shaped_attention_equals_matrix_form(causal):
    """The whole fused shaped attention (SDPA + fused centring) against ``A v`` with the
    explicit ``A = I + Softmax(Y / tau) - C``, value and gradients, float64."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(2, 3, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    tau = 1.7
    fused = shaped_attention(q, k, v, tau, causal=causal)
    explicit = shaped_attention_matrix(q @ k.mT, tau, causal=causal) @ v
    _assert_same_value_and_gradients(fused, explicit, (q, k, v), gen)


@pytest.mark.parametrize("m", [6, 40])
@pytest.mark.parametrize("causal", [False, True])
def test_shaped_attention_heads_equals_per_head_matrix_form(causal, m, centring_form):
    """Shaped attention on the merged head layout equals the per-head explicit ``A_h v_h``
    side by side, in value and gradients (float64, 1e-10)."""
    gen = torch.Generator().manual_seed(2)
    h, d = 3, 4
    q, k = (
        torch.randn(2, h, m, 5, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    values = torch.randn(2, m, h * d, generator=gen, dtype=torch.float64, requires_grad=True)
    tau = 2.3
    fused = shaped_attention_heads(q, k, values, tau, causal=causal)
    A = shaped_attention_matrix(q @ k.mT, tau, causal=causal)
    explicit = merge_heads(A @ split_heads(values, h))
    _assert_same_value_and_gradients(fused, explicit, (q, k, values), gen)


def test_centring_without_gradient_and_float32():
    v = torch.randn(4, 7, 3)
    out = centred_sum(torch.zeros_like(v), v, causal=True)
    torch.testing.assert_close(out, v - v.cumsum(-2) / torch.arange(1, 8)[:, None])
    assert out.dtype == torch.float32 and not out.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_centring_gives_fresh_tensors_into_which_gradients_add(dtype):
    """The compiled forward and backward return fresh contiguous tensors that are not views
    (autograd adds SDPA's gradient of the values into the backward's in place), from inputs
    in any layout: values not contiguous, attended as per-head strided views."""
    gen = torch.Generator().manual_seed(3)
    v = torch.randn(2, 3, 12, 8, generator=gen, dtype=dtype).transpose(-1, -2)  # (2, 3, 8, 12)
    a = torch.randn(2, 3, 4, 8, 3, generator=gen, dtype=dtype).transpose(-3, -2)  # (.., 8, 4, 3)
    out = _compiled_centring.causal_centred_sum(a, v)
    assert out._base is None and out.is_contiguous() and out.shape == v.shape
    torch.testing.assert_close(out, causal_centring(v) + a.reshape(v.shape))
    grad = _compiled_centring.causal_centring_transpose(v)
    assert grad._base is None and grad.is_contiguous() and grad.dtype == dtype
    torch.testing.assert_close(grad, causal_centring(v, transpose=True))


@pytest.mark.parametrize("transpose", [False, True])
def test_compiled_centring_float32_is_rounded_once(transpose):
    """Float32 at m = 4096 with a common offset (mean 10): the compiled kernels keep their
    running sums in float64, so the only error is the final rounding, within one float32
    epsilon of max |result| (the torch form's blocked float32 sums: up to 1.5e-6 of max |x|);
    in float64 within 1e-13 of max |result|."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4096, 8, generator=gen, dtype=torch.float64) + 10.0
    for dtype in (torch.float32, torch.float64):
        xd = x.to(dtype)
        reference = causal_centring(xd.double(), transpose=transpose)  # blocked, float64
        if transpose:
            out = _compiled_centring.causal_centring_transpose(xd)
        else:
            out = _compiled_centring.causal_centred_sum(torch.zeros_like(xd), xd)
        bound = torch.finfo(torch.float32).eps if dtype == torch.float32 else 1e-13
        assert (out.double() - reference).abs().max() <= bound * reference.abs().max()


def test_centring_in_half_precision_takes_the_torch_form():
    """bfloat16 on CPU (no compiled kernel) through the fused operation, against float64."""
    gen = torch.Generator().manual_seed(4)
    a, v = (torch.randn(2, 64, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    assert not _compiled_centring.applies(v.bfloat16())
    out = centred_sum(a.bfloat16(), v.bfloat16(), causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), a + causal_centring(v), rtol=0, atol=0.05)


@pytest.mark.parametrize("shape", [(2, 0, 3), (0, 4, 3), (2, 1, 3), (3, 0)])
def test_centring_of_empty_and_single_token_inputs(shape, centring_form):
    """No tokens, no samples, one token (``(I - C) v = 0``), no leading dimension."""
    v = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    a = torch.randn(shape, dtype=torch.float64)
    out = centred_sum(a, v, causal=True)
    torch.testing.assert_close(out, a + causal_centring(v), rtol=0, atol=1e-12)
    out.sum().backward()
    torch.testing.assert_close(v.grad, causal_centring(torch.ones(shape).double(), transpose=True))


def test_compiled_kernels_take_cpu_float32_and_float64(monkeypatch):
    """``applies``: CPU float32/64 tensors of two or more dimensions, not half precision or
    other devices; the fused centring then calls the kernels, forward and backward."""
    for dtype in (torch.float32, torch.float64):
        assert _compiled_centring.applies(torch.zeros(5, 3, dtype=dtype))
        assert _compiled_centring.applies(torch.zeros(2, 5, 3, dtype=dtype))
    assert not _compiled_centring.applies(torch.zeros(5))
    assert not _compiled_centring.applies(torch.zeros(5, 3, dtype=torch.float16))
    assert not _compiled_centring.applies(torch.zeros(5, 3, device="meta"))
    x = torch.zeros(5, 3)
    assert _compiled_centring.applies(x, x) and not _compiled_centring.applies(x, x.double())
    assert not _compiled_centring.applies(x, x.to("meta"))
    calls = []
    for name in ("causal_centred_sum", "causal_centring_transpose"):
        kernel = getattr(_compiled_centring, name)
        monkeypatch.setattr(
            _compiled_centring, name, lambda *x, k=kernel, n=name: calls.append(n) or k(*x)
        )
    v = torch.randn(6, 4, requires_grad=True)
    centred_sum(torch.zeros(6, 4), v, causal=True).sum().backward()
    assert calls == ["causal_centred_sum", "causal_centring_transpose"]


def test_centring_of_mixed_precision_operands_takes_the_torch_form():
    """Values in float32 and SDPA's output in bfloat16 (as under autocast): no compiled
    kernel (it would need one dtype); the torch form adds them, in float32."""
    gen = torch.Generator().manual_seed(5)
    a, v = (torch.randn(2, 40, 6, generator=gen) for _ in range(2))
    out = centred_sum(a.bfloat16(), v, causal=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, a.bfloat16().float() + causal_centring(v))
