"""fastattn.torch: torch's scaled_dot_product_attention, computed by fastattn,
differentiable, as a torch.library custom operator.

Its values and gradients match torch's own function and autograd (and, for
the options torch lacks, autograd of the same math written in float64 torch
operations); torch's causal rule (top-left when L != S) is kept; float16 and
bfloat16 inputs give their dtype back; dropout is refused; the operators pass
``torch.library.opcheck`` and run under ``torch.compile``; float32 tensors
are read in place; the gradients have the same bits for every thread count;
and the example that trains a small transformer follows the same loss curve
with either attention. Skipped without PyTorch.
"""
import doctest
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastattn.torch as ft  # noqa: E402

from conftest import load_example  # noqa: E402

F = torch.nn.functional
TOL = dict(atol=2e-5, rtol=2e-5)  # float32 rounding (two float32 computations)


def tensors(shapes, seed=0, dtype=torch.float32, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float32).to(dtype).requires_grad_(requires_grad)
            for s in shapes]


def grads(fn, inputs, seed=1):
    """fn(*inputs) and the gradients of <fn(*inputs), w> for a random w."""
    out = fn(*inputs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return out, torch.autograd.grad(out, [t for t in inputs if t.requires_grad], w)


def explicit_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                  window=None, softcap=None, alibi_slopes=None, sinks=None):
    """The math of fastattn.torch's function in float64 torch operations
    (scores, then the soft cap, ALiBi, the masks; sinks join the softmax),
    differentiable by torch's autograd: the oracle of the extra options.
    Causal is top-left (torch's), window and ALiBi place query i at key
    position i + S - L (fastattn's). Returns (out, lse)."""
    q, k, v = q.double(), k.double(), v.double()
    L, S = q.shape[-2], k.shape[-2]
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * q @ k.transpose(-2, -1)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    p = i + S - L
    if alibi_slopes is not None:
        s = s - alibi_slopes.double()[..., None, None] * (p - j).abs()
    allowed = torch.ones(L, S, dtype=torch.bool)
    if is_causal:
        allowed &= j <= i
    if window is not None:
        if window[0] is not None:
            allowed &= j >= p - window[0]
        if window[1] is not None:
            allowed &= j <= p + window[1]
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            s = s + attn_mask.double()
    s = s.masked_fill(~allowed, -torch.inf)
    if sinks is not None:
        sink = sinks.double()[..., None, None].expand(s.shape[:-1] + (1,))
        s = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.exp(s - lse[..., None])[..., :S] @ v
    return out, lse


def assert_close(a, b, atol=TOL["atol"], rtol=TOL["rtol"]):
    torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=rtol)


# ---- values and gradients against torch's own function

CASES = {  # name: (q, k, v shapes, keywords)
    "plain": ([(2, 3, 17, 8), (2, 3, 23, 8), (2, 3, 23, 5)], {}),
    "causal": ([(2, 3, 33, 8)] * 3, {"is_causal": True}),
    "causal_fewer_queries": ([(2, 3, 7, 8), (2, 3, 70, 8), (2, 3, 70, 8)], {"is_causal": True}),
    "causal_more_queries": ([(2, 3, 70, 8), (2, 3, 9, 8), (2, 3, 9, 8)], {"is_causal": True}),
    "scale": ([(1, 2, 12, 16)] * 3, {"scale": 0.37}),
    "broadcast_batch": ([(2, 3, 10, 8), (1, 3, 14, 8), (3, 14, 4)], {}),
    "gqa": ([(2, 6, 19, 8), (2, 2, 19, 8), (2, 2, 19, 8)], {"enable_gqa": True}),
    "gqa_causal": ([(1, 4, 21, 8), (1, 1, 21, 8), (1, 1, 21, 8)],
                   {"enable_gqa": True, "is_causal": True}),
    "unbatched": ([(13, 8), (15, 8), (15, 6)], {}),
}


def _masks(L, S, seed):
    """A bool mask (1, 1, L, S), a float one (L, S) with -inf where the bool
    one is False, and a finite float one (L, S)."""
    g = torch.Generator().manual_seed(seed)
    bool_mask = torch.rand(1, 1, L, S, generator=g) > 0.4
    bool_mask[..., 0] = True  # every row keeps a key (the float64 oracle gives NaN rows)
    finite = torch.randn(L, S, generator=g)
    return bool_mask, finite.masked_fill(~bool_mask[0, 0], -torch.inf), finite


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_and_gradients_match_torch(case):
    shapes, kw = CASES[case]
    inputs = tensors(shapes)
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, **kw), inputs)
    ref, g_ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), inputs)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert_close(out, ref)
    for a, b in zip(g, g_ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert_close(a, b)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("L,S", [(16, 16), (9, 40), (40, 9)])
def test_masks_match_torch(kind, L, S):
    inputs = tensors([(2, 2, L, 8), (2, 2, S, 8), (2, 2, S, 8)], seed=L)
    mask = _masks(L, S, seed=S)[["bool", "float"].index(kind)]
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, mask), inputs)
    ref, g_ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask), inputs)
    assert_close(out, ref)
    for a, b in zip(g, g_ref):
        assert_close(a, b)


def test_layouts_of_a_model():
    # (B, L, H, D) projections viewed as (B, H, L, D): rows contiguous, heads strided
    q, k, v = (t.transpose(1, 2) for t in tensors([(2, 11, 4, 8)] * 3))
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, is_causal=True),
                   [q, k, v])
    ref, g_ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       [q, k, v])
    assert_close(out, ref)
    for a, b in zip(g, g_ref):
        assert_close(a, b)


# ---- torch's causal rule: top-left when L != S

@pytest.mark.parametrize("L,S", [(5, 70), (70, 5), (1, 9), (64, 200), (200, 64)])
def test_causal_is_top_left_as_torch(L, S):
    q, k, v = tensors([(1, 2, L, 8), (1, 2, S, 8), (1, 2, S, 8)])
    allowed = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, ft.scaled_dot_product_attention(q, k, v, allowed))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_bottom_right_causal_is_window_none_zero():
    q, k, v = tensors([(1, 2, 6, 8), (1, 2, 20, 8), (1, 2, 20, 8)], requires_grad=False)
    allowed = torch.ones(6, 20, dtype=torch.bool).tril(diagonal=20 - 6)
    out = ft.scaled_dot_product_attention(q, k, v, window=(None, 0))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, allowed))
    # the window's sides as NumPy integers or 0-d integer tensors, as ints
    for zero in (np.int64(0), torch.tensor(0)):
        assert torch.equal(ft.scaled_dot_product_attention(q, k, v, window=(None, zero)), out)


def test_second_derivatives_are_refused_clearly():
    q, k, v = tensors([(2, 4, 8)] * 3)
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        dq.sum().backward()


TOP_LEFT = {  # the combinations of is_causal (L != S) with the other options
    "cut_with_mask": (9, 30, {"attn_mask": "float"}),
    "cut_with_bool_mask": (9, 30, {"attn_mask": "bool"}),
    "cut_with_window": (9, 30, {"window": (25, 3)}),
    "cut_with_alibi": (9, 30, {"alibi_slopes": True}),
    "cut_with_sinks": (9, 30, {"sinks": True}),
    "mask_rule_alibi_and_sinks": (9, 30, {"alibi_slopes": True, "sinks": True}),
    "cut_with_window_and_mask": (9, 30, {"window": (24, None), "attn_mask": "finite"}),
    "more_queries_with_window": (30, 9, {"window": (3, 30), "alibi_slopes": True,
                                         "sinks": True}),
    "more_queries_with_mask": (30, 9, {"attn_mask": "bool", "softcap": 2.0}),
}


@pytest.mark.parametrize("case", sorted(TOP_LEFT))
def test_top_left_causal_with_options(case):
    L, S, kw = TOP_LEFT[case]
    H = 3
    q, k, v, slopes, sinks = tensors([(2, H, L, 8), (2, H, S, 8), (2, H, S, 4), (H,), (H,)],
                                     seed=len(case))
    kw = dict(kw)
    if kw.get("alibi_slopes"):
        kw["alibi_slopes"] = slopes.detach().abs() * 0.3
    if kw.get("sinks"):
        kw["sinks"] = sinks
    if "attn_mask" in kw:
        # (every row keeps key 0, which the top-left rule allows to all)
        kinds = ["bool", "float", "finite"]
        kw["attn_mask"] = _masks(L, S, seed=3)[kinds.index(kw["attn_mask"])]
    inputs = [q, k, v] + ([sinks] if "sinks" in kw else [])

    def fa(q, k, v, *s):
        return ft.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)

    def ex(q, k, v, *s):
        return explicit_sdpa(q, k, v, is_causal=True, **kw)[0]

    out, g = grads(fa, inputs)
    ref, g_ref = grads(ex, inputs)
    assert not out.isnan().any()
    assert_close(out, ref)
    for a, b in zip(g, g_ref):
        assert_close(a, b)
    if L < S:  # keys past L: no row sees them
        assert not g[1][..., L:, :].any() and not g[2][..., L:, :].any()


def test_top_left_causal_with_a_window_that_leaves_no_key():
    # L < S: row i may see keys j <= i, a window of left 10 keys j >= i + 20 - 10
    q, k, v = tensors([(1, 2, 4, 8), (1, 2, 24, 8), (1, 2, 24, 8)])
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  window=(10, None)), [q, k, v])
    assert not out.any() and not any(x.any() for x in g)


# ---- fastattn's options: against autograd of the math in float64

OPTIONS = {
    "softcap": {"softcap": 1.5, "scale": 1.0},
    "sinks": {"sinks": True},
    "alibi_causal": {"alibi_slopes": True, "is_causal": True},
    "window": {"window": (4, 2)},
    "all": {"softcap": 3.0, "sinks": True, "alibi_slopes": True, "window": (6, 0),
            "attn_mask": "float"},
    "gqa_sinks": {"enable_gqa": True, "sinks": True, "is_causal": True},
}


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_options_gradients_match_autograd_of_the_math(case):
    kw = dict(OPTIONS[case])
    Hq, Hkv = (4, 2) if kw.get("enable_gqa") else (4, 4)
    L = S = 24
    q, k, v, sinks = tensors([(2, Hq, L, 8), (2, Hkv, S, 8), (2, Hkv, S, 8), (Hq,)], seed=7)
    if kw.get("sinks"):
        kw["sinks"] = sinks
    if kw.get("alibi_slopes"):
        kw["alibi_slopes"] = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    if "attn_mask" in kw:
        kw["attn_mask"] = _masks(L, S, seed=1)[1]
    inputs = [q, k, v] + ([sinks] if "sinks" in kw else [])
    out, g = grads(lambda q, k, v, *s: ft.scaled_dot_product_attention(q, k, v, **kw), inputs)
    ref, g_ref = grads(lambda q, k, v, *s: explicit_sdpa(q, k, v, **kw)[0], inputs)
    assert_close(out, ref)
    assert len(g) == len(inputs)
    for a, b, x in zip(g, g_ref, inputs):
        assert a.shape == x.shape and a.dtype == x.dtype
        assert_close(a, b)


def test_lse_gradient_of_the_operator():
    # the operator returns (out, lse); a loss through lse has its gradient too
    q, k, v, sinks = tensors([(2, 3, 10, 8), (2, 3, 12, 8), (2, 3, 12, 8), (3,)], seed=5)
    slopes = torch.tensor([0.3, 0.2, 0.1])
    args = (None, True, 0.5, False, 3, None, 2.0, slopes)

    def loss(fn, *ts):
        out, lse = fn(*ts)
        return (out * torch.linspace(-1, 1, out.shape[-1])).sum() + 0.7 * lse.sum()

    fa = loss(lambda q, k, v, s: torch.ops.fastattn.sdpa(q, k, v, *args, s), q, k, v, sinks)
    ex = loss(lambda q, k, v, s: explicit_sdpa(
        q, k, v, scale=0.5, window=(3, None), softcap=2.0, alibi_slopes=slopes, sinks=s,
        attn_mask=torch.ones(10, 12, dtype=torch.bool).tril(2)), q, k, v, sinks)
    assert_close(fa, ex, atol=1e-4, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(fa, (q, k, v, sinks)),
                    torch.autograd.grad(ex, (q, k, v, sinks))):
        assert_close(a, b)
    # lse alone (the output's gradient is None)
    lse = torch.ops.fastattn.sdpa(q, k, v, None, False, None, False, None, None, None, None,
                                  None)[1]
    lse_ref = explicit_sdpa(q, k, v)[1]
    for a, b in zip(torch.autograd.grad(lse.sum(), (q, k)),
                    torch.autograd.grad(lse_ref.sum(), (q, k))):
        assert_close(a, b)


def test_array_like_slopes_and_sinks():
    q, k, v = tensors([(2, 5, 8), (2, 7, 8), (2, 7, 8)], requires_grad=False)
    slopes, sinks = [0.5, 0.25], np.array([0.1, -0.3])
    out = ft.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, sinks=sinks)
    ref = explicit_sdpa(q, k, v, alibi_slopes=torch.tensor(slopes), sinks=torch.tensor(sinks))[0]
    assert_close(out, ref)


def test_rows_without_keys_give_zeros_as_torch():
    q, k, v = tensors([(1, 4, 8), (1, 6, 8), (1, 6, 8)])
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, mask), [q, k, v])
    ref, g_ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask), [q, k, v])
    assert not out[0, 1].any() and not g[0][0, 1].any()
    assert_close(out, ref)
    for a, b in zip(g, g_ref):
        assert_close(a, b)


# ---- half precision

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    q, k, v = tensors([(2, 2, 20, 16), (2, 2, 20, 16), (2, 2, 20, 16)], dtype=dtype)
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, is_causal=True),
                   [q, k, v])
    assert out.dtype == dtype and all(x.dtype == dtype for x in g)
    # the same values upcast: computed in float32, rounded once at the end
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, g_ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       [q32, k32, v32])
    eps = torch.finfo(dtype).eps
    assert_close(out, ref.to(dtype), atol=eps, rtol=eps)
    for a, b in zip(g, g_ref):
        assert_close(a, b, atol=4 * eps, rtol=2 * eps)


def test_mixed_dtypes_half_kv_cache():
    q, = tensors([(1, 2, 3, 8)])
    k, v = tensors([(1, 2, 30, 8), (1, 2, 30, 8)], dtype=torch.bfloat16)
    out, g = grads(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v), [q, k, v])
    assert out.dtype == torch.float32 and g[1].dtype == torch.bfloat16
    ref, g_ref = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k.float(), v.float()),
                       [q, k, v])
    assert_close(out, ref)
    assert_close(g[0], g_ref[0])


# ---- refusals

def test_dropout_is_refused():
    q, k, v = tensors([(2, 4, 8)] * 3)
    with pytest.raises(ValueError, match="no dropout"):
        ft.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    ft.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    ft.scaled_dot_product_attention(q, k, v, None, 0.0, True)  # torch's positional order


def test_refusals():
    q, k, v = tensors([(2, 4, 8)] * 3)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        ft.scaled_dot_product_attention(q.double(), k, v)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ft.scaled_dot_product_attention(q.detach().numpy(), k, v)
    with pytest.raises(ValueError, match="CPU"):
        ft.scaled_dot_product_attention(q.to("meta"), k, v)
    with pytest.raises(ValueError, match="requires grad"):
        ft.scaled_dot_product_attention(q, k, v, torch.zeros(4, 4, requires_grad=True))
    for bad in ((-1, 0), (True, 0), (1.0, 0), (np.int64(-2), None), 3):
        with pytest.raises(ValueError, match="window"):
            ft.scaled_dot_product_attention(q, k, v, window=bad)
    with pytest.raises(ValueError, match="D=8"):  # fastattn's own checks come through
        ft.scaled_dot_product_attention(q, k[..., :4], v)


def test_docstring_example():
    result = doctest.testmod(ft, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_import_leaves_torch_optional():
    code = ("import sys, fastattn; assert 'torch' not in sys.modules; "
            "assert 'fastattn.torch' not in sys.modules; "
            "import fastattn.torch, torch; assert torch.nn.functional.softmax; "
            "assert fastattn.torch.torch is torch")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- the operators: opcheck, torch.compile

def _opcheck_samples():
    q, k, v, sinks = tensors([(2, 4, 9, 8), (2, 2, 13, 8), (2, 2, 13, 6), (4,)], seed=3)
    mask = torch.randn(9, 13)
    slopes = torch.rand(4)
    yield (q, k, v, None, False, None, True, None, None, None, None, None)
    yield (q, k, v, mask, True, 0.3, True, None, 4, 2.0, slopes, sinks)
    yield (q[:, :2], k, v, mask > 0, False, None, False, 3, 1, None, None, sinks[:2])
    q16, k16, v16 = tensors([(3, 5, 8), (3, 7, 8), (3, 7, 4)], dtype=torch.bfloat16)
    yield (q16, k16, v16, None, True, None, False, None, None, None, None, None)


@pytest.mark.parametrize("sample", range(4))
def test_opcheck(sample):
    args = list(_opcheck_samples())[sample]
    result = torch.library.opcheck(torch.ops.fastattn.sdpa.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_backward_operator():
    q, k, v = tensors([(2, 5, 8), (2, 7, 8), (2, 7, 4)], requires_grad=False)
    out, lse = torch.ops.fastattn.sdpa(q, k, v, None, True, None, False, None, None, None, None,
                                       None)
    args = (torch.randn_like(out), torch.randn_like(lse), q, k, v, out, lse, None, True, None,
            False, None, None, None, None, None)
    result = torch.library.opcheck(torch.ops.fastattn.sdpa_backward.default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(q, k, v, sinks, mask):
        o = ft.scaled_dot_product_attention(q, k, v, mask, is_causal=True, enable_gqa=True,
                                            sinks=sinks, softcap=5.0)
        return (o * o).sum()

    q, k, v, sinks = tensors([(2, 4, 12, 8), (2, 2, 20, 8), (2, 2, 20, 8), (4,)], seed=9)
    mask = torch.randn(12, 20)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    loss, loss_ref = compiled(q, k, v, sinks, mask), f(q, k, v, sinks, mask)
    g = torch.autograd.grad(loss, (q, k, v, sinks))
    g_ref = torch.autograd.grad(loss_ref, (q, k, v, sinks))
    assert torch.equal(loss, loss_ref)
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)


# ---- no copies, the same bits for every thread count

def test_float32_tensors_are_read_in_place(monkeypatch):
    seen = {}
    real = ft._np_sdpa

    def spy(q, k, v, attn_mask=None, **kw):
        seen.update(q=q, k=k, v=v, attn_mask=attn_mask)
        return real(q, k, v, attn_mask, **kw)

    monkeypatch.setattr(ft, "_np_sdpa", spy)
    q, k, v = (t.transpose(1, 2) for t in tensors([(2, 9, 3, 8)] * 3))  # (B, L, H, D) views
    mask = torch.rand(9, 9) > 0.5
    ft.scaled_dot_product_attention(q, k, v, mask)
    for name, t in (("q", q), ("k", k), ("v", v), ("attn_mask", mask)):
        a = seen[name]
        assert a.__array_interface__["data"][0] == t.data_ptr(), name
        assert a.strides == tuple(s * t.element_size() for s in t.stride()), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_kv_is_read_in_place(dtype):
    pytest.importorskip("ml_dtypes")
    t = torch.randn(2, 3, 8).to(dtype)
    a = ft._as_numpy(t)
    assert a.__array_interface__["data"][0] == t.data_ptr() and a.itemsize == 2
    assert np.array_equal(a.astype(np.float32), t.float().numpy())


def test_gradients_have_the_same_bits_for_any_thread_count(threads):
    q, k, v, sinks = tensors([(2, 4, 150, 16), (2, 2, 150, 16), (2, 2, 150, 16), (4,)], seed=4)
    results = []
    for n in (1, 2, 3):
        threads(n)
        results.append(grads(lambda q, k, v, s: ft.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True, sinks=s, softcap=8.0), [q, k, v, sinks]))
    (o1, g1), *others = results
    for o, g in others:
        assert torch.equal(o1, o)
        for a, b in zip(g1, g):
            assert torch.equal(a, b)


# ---- the example: a transformer trained with either attention

def test_train_char_transformer_example(threads):
    example = load_example("train_char_transformer")
    curves, start = {}, time.perf_counter()
    # one thread each: a tiny model's many small parallel regions crawl when
    # the machine's cores are busy with something else
    torch_threads = torch.get_num_threads()
    try:
        for attention in ("fastattn", "torch"):
            args = example.parse_args(["--attention", attention, "--steps", "12",
                                       "--log-every", "4", "--context", "32", "--dim", "32",
                                       "--batch-size", "8", "--sample", "0", "--threads", "1"])
            curves[attention] = example.train(args, log=lambda *a: None)
    finally:
        torch.set_num_threads(torch_threads)
    fa, to = (np.array([loss for _, loss in curves[a]]) for a in ("fastattn", "torch"))
    assert [s for s, _ in curves["fastattn"]] == [1, 4, 8, 12]
    assert fa[0] == pytest.approx(to[0], rel=1e-6)  # the same seed: the same first loss
    assert fa[-1] < fa[0] - 0.3  # it learns
    np.testing.assert_allclose(fa, to, rtol=1e-3)
    assert time.perf_counter() - start < 15
