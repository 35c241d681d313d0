"""causal_attention, sliding_window_attention, attention_weights and the
conversion table of the docs.

causal_attention is scaled_dot_product_attention with is_causal=True;
sliding_window_attention(..., window_size) lets each query see itself and the
window_size - 1 keys before it, window=(window_size - 1, 0); attention_weights
returns the softmax weights of the same computation (rows with no allowed key
all 0). The conversions: FlashAttention's window_size with -1 for unbounded,
ONNX Runtime's local_window_size, PyTorch's top-left causal mask for L != S
and its enable_gqa."""

import numpy as np
import pytest

import fastattn
from fastattn import _core
from fastattn import reference as ref

from conftest import (SDPA_TOL, allowed_keys, assert_close, assert_new_c_float32,
                      assert_same_bits, naive_sdpa, qkv, randn)

sdpa = fastattn.scaled_dot_product_attention


# --------------------------------------------------------- causal_attention

@pytest.mark.parametrize("L,S", [(6, 6), (3, 8), (8, 3)])
def test_causal_attention_is_sdpa_causal(rng, L, S):
    q, k, v = qkv(rng, (2, L, 4), (2, S, 4), (2, S, 3))
    mask = rng.random((L, S)) < 0.7
    assert_same_bits(fastattn.causal_attention(q, k, v), sdpa(q, k, v, is_causal=True))
    got = fastattn.causal_attention(q, k, v, mask, scale=0.3, window=(2, None), return_lse=True)
    expected = sdpa(q, k, v, mask, is_causal=True, scale=0.3, window=(2, None), return_lse=True)
    assert_same_bits(got[0], expected[0])
    assert_same_bits(got[1], expected[1])
    assert_close(got[0], ref.causal_attention(q, k, v, mask, scale=0.3, window=(2, None)))
    assert_same_bits(fastattn.causal_attention(q, k, v, attn_mask=mask), sdpa(q, k, v, mask, is_causal=True))


# ------------------------------------------------- sliding_window_attention

@pytest.mark.parametrize("W", [1, 2, 3, 5, 100])
@pytest.mark.parametrize("L,S", [(7, 7), (4, 9), (9, 4)])
def test_sliding_window_is_window_w_minus_1_0(rng, W, L, S):
    q, k, v = qkv(rng, (2, L, 4), (2, S, 4), (2, S, 3))
    got = fastattn.sliding_window_attention(q, k, v, W, return_lse=True)
    expected = sdpa(q, k, v, window=(W - 1, 0), return_lse=True)
    assert_same_bits(got[0], expected[0])
    assert_same_bits(got[1], expected[1])
    assert_close(got[0], ref.sliding_window_attention(q, k, v, W))
    # each query sees itself and the W - 1 keys before it (Mistral / HF sliding_window=W)
    w = fastattn.attention_weights(q, k, window=(W - 1, 0))
    allowed = np.array([[i + S - L - W < j <= i + S - L for j in range(S)] for i in range(L)])
    np.testing.assert_array_equal(w > 0, np.broadcast_to(allowed, w.shape))


def test_sliding_window_numpy_int_and_mask(rng):
    q, k, v = qkv(rng, (6, 4), (6, 4), (6, 3))
    mask = rng.random((6, 6)) < 0.8
    assert_same_bits(fastattn.sliding_window_attention(q, k, v, np.int64(3), mask),
                     sdpa(q, k, v, mask, window=(2, 0)))
    assert_same_bits(fastattn.sliding_window_attention(q, k, v, 3, attn_mask=mask, is_causal=True),
                     sdpa(q, k, v, mask, window=(2, 0), is_causal=True))


@pytest.mark.parametrize("L,S", [(5, 5), (3, 7)])
def test_window_size_one_attends_only_itself(rng, L, S):
    q, k, v = qkv(rng, (2, L, 4), (2, S, 4), (2, S, 3))
    o, lse = fastattn.sliding_window_attention(q, k, v, 1, return_lse=True)
    # a single allowed key: weight 1, output its v row, lse its score
    np.testing.assert_allclose(o, v[:, S - L:], rtol=1e-6, atol=0)
    scores = np.einsum("bld,bld->bl", q.astype(np.float64), k[:, S - L:].astype(np.float64)) / 2.0
    assert_close(lse, scores)


def test_window_size_at_least_s_is_causal(rng):
    q, k, v = qkv(rng, (2, 5, 4), (2, 8, 4), (2, 8, 3))
    assert_close(fastattn.sliding_window_attention(q, k, v, 8),
                 fastattn.causal_attention(q, k, v), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------- conversions (the docs' table)

@pytest.mark.parametrize("w", [0, 1, 3])
def test_onnx_local_window_size(rng, w):
    # ONNX Runtime GroupQueryAttention local_window_size=w  ->  window=(w, 0):
    # the query sees itself and the w keys before it
    L = S = 7
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    got = sdpa(q, k, v, window=(w, 0))
    assert_same_bits(got, fastattn.sliding_window_attention(q, k, v, w + 1))
    allowed = np.array([[i - w <= j <= i for j in range(S)] for i in range(L)])
    on, _, _ = naive_sdpa(q, k, v, allowed)
    assert_close(got, on)


@pytest.mark.parametrize("fa_window", [(2, 0), (1, 3), (-1, 0), (3, -1), (-1, -1)], ids=str)
def test_flash_attention_window_size(rng, fa_window):
    # FlashAttention window_size=(l, r), -1 unbounded  ->  window with None
    L, S = 5, 9
    window = tuple(None if x == -1 else x for x in fa_window)
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    l, r = fa_window
    # FlashAttention's own rule, bottom-right aligned: key j for query i iff
    # i + S - L - l <= j <= i + S - L + r, a side with -1 unbounded
    allowed = np.array([[(l < 0 or i + S - L - l <= j) and (r < 0 or j <= i + S - L + r)
                         for j in range(S)] for i in range(L)])
    on, _, _ = naive_sdpa(q, k, v, allowed)
    assert_close(sdpa(q, k, v, window=window), on)


@pytest.mark.parametrize("L,S", [(3, 7), (7, 3), (5, 5)])
def test_pytorch_top_left_causal_conversion(rng, L, S):
    # PyTorch is_causal=True means j <= i (top-left) even when L != S
    q, k, v = qkv(rng, (2, L, 4), (2, S, 4), (2, S, 3))
    torch_mask = np.tril(np.ones((L, S), bool))
    got = sdpa(q, k, v, attn_mask=torch_mask)
    top_left = np.array([[j <= i for j in range(S)] for i in range(L)])
    for b in range(2):
        on, _, _ = naive_sdpa(q[b], k[b], v[b], top_left)
        assert_close(got[b], on)
    bottom_right = sdpa(q, k, v, is_causal=True)
    if L == S:
        assert_close(got, bottom_right, rtol=1e-6, atol=1e-7)
    else:
        assert not np.allclose(got, bottom_right)
        # bottom-right is tril with diagonal offset S - L
        assert_close(bottom_right, sdpa(q, k, v, np.tril(np.ones((L, S), bool), S - L)),
                     rtol=1e-6, atol=1e-7)


def test_pytorch_gqa_conversion(rng):
    # torch enable_gqa: k, v heads repeated with repeat_interleave(Hq // Hkv, dim=-3)
    q, k, v = qkv(rng, (2, 6, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3))
    got = sdpa(q, k, v, enable_gqa=True)
    expected = sdpa(q, np.repeat(k, 3, axis=-3), np.repeat(v, 3, axis=-3))
    assert_same_bits(got, expected)


# -------------------------------------------------------- attention_weights

@pytest.mark.parametrize("kw", [
    {}, {"is_causal": True}, {"window": (2, 1)}, {"scale": -0.4}, {"is_causal": True, "window": (1, None)},
], ids=str)
@pytest.mark.parametrize("L,S", [(5, 5), (3, 8), (8, 3)])
def test_attention_weights(rng, kw, L, S):
    q, k, v = qkv(rng, (2, 3, L, 6), (2, 3, S, 6), (2, 3, S, 4))
    mask = rng.random((L, S)) < 0.7
    w = fastattn.attention_weights(q, k, mask, **kw)
    assert_new_c_float32(w)
    assert w.shape == (2, 3, L, S)
    assert_close(w, ref.attention_weights(q, k, mask, **kw))
    sums = w.sum(-1, dtype=np.float64)
    empty = (w == 0).all(-1)
    np.testing.assert_allclose(sums[~empty], 1.0, rtol=1e-5)
    allowed = allowed_keys(L, S, is_causal=kw.get("is_causal", False), window=kw.get("window"), mask=mask)
    np.testing.assert_array_equal(empty, np.broadcast_to(~allowed.any(-1), empty.shape))
    # weights @ v is the attention output
    o = sdpa(q, k, v, mask, **kw)
    assert_close(o, w.astype(np.float64) @ v)


def test_attention_weights_gqa_and_broadcast(rng):
    q, k = randn(rng, 2, 6, 4, 5), randn(rng, 3, 7, 5)
    w = fastattn.attention_weights(q, k, enable_gqa=True)
    assert w.shape == (2, 6, 4, 7)
    assert_close(w, ref.attention_weights(q, k, enable_gqa=True))
    for h in range(6):
        assert_same_bits(w[:, h], fastattn.attention_weights(q[:, h], k[h // 2]))


def test_attention_weights_float_mask_and_empty_shapes(rng):
    q, k = randn(rng, 4, 3), randn(rng, 6, 3)
    fm = randn(rng, 4, 6)
    fm[2] = -np.inf
    w = fastattn.attention_weights(q, k, fm)
    assert_close(w, ref.attention_weights(q, k, fm))
    assert (w[2] == 0).all()
    assert fastattn.attention_weights(q, k[:0]).shape == (4, 0)
    assert fastattn.attention_weights(q[:0], k).shape == (0, 6)


def test_attention_weights_nonfinite_rows(rng):
    q, k = randn(rng, 4, 3), randn(rng, 5, 3)
    fm = np.zeros((4, 5), np.float32)
    fm[0, 1] = np.nan
    fm[1, 2] = np.inf
    fm[2] = -np.inf
    w = fastattn.attention_weights(q, k, fm)
    assert np.isnan(w[0]).all() and np.isnan(w[1]).all()
    assert (w[2] == 0).all()
    assert np.isfinite(w[3]).all()
    np.testing.assert_allclose(w[3].sum(), 1.0, rtol=1e-6)


def test_attention_weights_match_naive(rng):
    L, S = 4, 7
    q, k = randn(rng, L, 5), randn(rng, S, 5)
    allowed = allowed_keys(L, S, is_causal=True, window=(3, 0))
    _, _, wn = naive_sdpa(q, k, np.zeros((S, 1)), allowed)
    assert_close(fastattn.attention_weights(q, k, is_causal=True, window=(3, 0)), wn, **SDPA_TOL)


def test_core_attention_takes_keywords_and_the_weights_no_values(rng):
    # _core.attention takes every argument after q, k, v by keyword only (two
    # dozen of them could not be told apart by position); the weights kernel
    # reads no values, so v and v_off are None for it, not a made-up array.
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 7, 8)).astype(np.float32)
    offs = np.array([0, 40], np.int64), np.array([0, 56], np.int64)
    kw = dict(k_dtype=_core.DTYPE_F32, v_dtype=_core.DTYPE_F32, q_off=offs[0], k_off=offs[1],
              q_rs=8, k_rs=8, v_rs=0, nbatch=2, L=5, S=7, D=8, Dv=0, scale=0.5, nthreads=2,
              weights=True)
    got = np.full(2 * 5 * 7, np.nan, np.float32)
    _core.attention(q, k, None, v_off=None, out=got, **kw)
    want = fastattn.attention_weights(q, k, scale=0.5)
    np.testing.assert_array_equal(got.reshape(2, 5, 7), want)
    with pytest.raises(TypeError):
        _core.attention(q, k, None, _core.DTYPE_F32, _core.DTYPE_F32)
    with pytest.raises(ValueError):  # no values but Dv > 0
        _core.attention(q, k, None, v_off=None, out=got, **dict(kw, Dv=8))
