"""Check the oracle itself against independent computations.

Everything else in the suite trusts ``fastattn.reference``; these tests make
sure it computes what the docs say, using SciPy, the worked example and
loop-based SDPA written here.
"""

import math

import numpy as np
import pytest
import scipy.special

from fastattn import reference as ref

from conftest import allowed_keys, naive_sdpa, randn


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_reference_softmax_matches_scipy(rng, axis):
    x = randn(rng, 5, 7, scale=3.0)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(ref.softmax(x, axis=axis),
                               scipy.special.softmax(x64, axis=axis), rtol=1e-6)
    np.testing.assert_allclose(ref.log_softmax(x, axis=axis),
                               scipy.special.log_softmax(x64, axis=axis), rtol=1e-6)
    np.testing.assert_allclose(ref.logsumexp(x, axis=axis),
                               scipy.special.logsumexp(x64, axis=axis), rtol=1e-6)
    np.testing.assert_allclose(ref.logsumexp(x, axis=axis, keepdims=True),
                               scipy.special.logsumexp(x64, axis=axis, keepdims=True),
                               rtol=1e-6)


def test_reference_returns_float32(rng):
    x = randn(rng, 3, 4)
    for f in (ref.softmax, ref.log_softmax, ref.logsumexp):
        assert np.asarray(f(x)).dtype == np.float32
    q, k, v = randn(rng, 2, 3), randn(rng, 4, 3), randn(rng, 4, 5)
    o, lse = ref.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert ref.attention_weights(q, k).dtype == np.float32


def test_reference_float32_overflow_is_an_infinity_without_a_warning():
    # log_softmax of (3e38, -3e38): -6e38 is beyond float32, -inf there, as
    # fastattn gives it; the float64 result's cast does not warn
    import warnings
    import fastattn
    x = np.array([[3e38, -3e38]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ref.log_softmax(x, axis=-1)
    assert got.tolist() == [[0.0, -np.inf]]
    assert np.array_equal(got, fastattn.log_softmax(x, axis=-1))


def test_reference_nonfinite_rules_match_scipy():
    inf, nan = np.inf, np.nan
    x = np.array([[1.0, nan, 2.0],
                  [1.0, inf, 2.0],
                  [-inf, 0.0, 1.0],
                  [-inf, -inf, -inf]], dtype=np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(ref.softmax(x), scipy.special.softmax(x.astype(float), axis=-1), rtol=1e-6)
        # SciPy's log_softmax gives -inf (not NaN) beside a +inf; the docs say the
        # whole slice is NaN, so row 1 is checked below instead.
        np.testing.assert_allclose(ref.log_softmax(x)[[0, 2, 3]],
                                   scipy.special.log_softmax(x[[0, 2, 3]].astype(float), axis=-1), rtol=1e-6)
        np.testing.assert_allclose(ref.logsumexp(x), scipy.special.logsumexp(x.astype(float), axis=-1),
                                   rtol=1e-6)
    sm = ref.softmax(x)
    assert np.isnan(sm[0]).all() and np.isnan(sm[1]).all() and np.isnan(sm[3]).all()
    assert sm[2, 0] == 0.0
    ls = ref.log_softmax(x)
    assert np.isnan(ls[1]).all() and np.isnan(ls[3]).all() and ls[2, 0] == -np.inf
    np.testing.assert_allclose(ref.logsumexp(x), [nan, inf, math.log(1 + math.e), -inf], rtol=1e-6)


def test_reference_worked_example():
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
    a = math.exp(1 / math.sqrt(2))
    w = np.array([a, 1.0, a]) / (2 * a + 1)
    np.testing.assert_allclose(ref.attention_weights(q, k)[0], w, rtol=1e-6)
    out = ref.scaled_dot_product_attention(q, k, v)
    assert out.shape == (1, 2)
    np.testing.assert_allclose(out[0], w @ v, rtol=1e-6)
    np.testing.assert_allclose(out[0], [6.0167, 3.9833], atol=5e-5)


@pytest.mark.parametrize("L,S", [(4, 4), (3, 6), (6, 3), (1, 5)])
@pytest.mark.parametrize("is_causal,window", [
    (False, None), (True, None), (False, (1, 1)), (True, (2, None)), (False, (None, 0)), (False, (0, 2)),
])
def test_reference_sdpa_matches_loop(rng, L, S, is_causal, window):
    q, k, v = randn(rng, L, 3), randn(rng, S, 3), randn(rng, S, 2)
    mask = rng.random((L, S)) < 0.8
    allowed = allowed_keys(L, S, is_causal=is_causal, window=window, mask=mask)
    o_ref, lse_ref = ref.scaled_dot_product_attention(
        q, k, v, mask, is_causal=is_causal, window=window, return_lse=True)
    o, lse, w = naive_sdpa(q, k, v, allowed)
    np.testing.assert_allclose(o_ref, o, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.isneginf(lse_ref), np.isneginf(lse))
    np.testing.assert_allclose(lse_ref, lse, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        ref.attention_weights(q, k, mask, is_causal=is_causal, window=window), w, rtol=1e-6, atol=1e-7)


def test_reference_float_mask_and_scale_match_loop(rng):
    L, S = 4, 6
    q, k, v = randn(rng, L, 3), randn(rng, S, 3), randn(rng, S, 4)
    fm = randn(rng, L, S)
    fm[0, :3] = -np.inf
    fm[2, :] = -np.inf  # fully masked row
    o_ref, lse_ref = ref.scaled_dot_product_attention(q, k, v, fm, scale=-0.7, return_lse=True)
    o, lse, _ = naive_sdpa(q, k, v, float_mask=fm, scale=-0.7)
    np.testing.assert_allclose(o_ref, o, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse_ref, lse, rtol=1e-6, atol=1e-7)
    assert lse_ref[2] == -np.inf and (o_ref[2] == 0).all()


def test_reference_gqa_matches_per_head_loop(rng):
    q, k, v = randn(rng, 4, 3, 2), randn(rng, 2, 5, 2), randn(rng, 2, 5, 3)
    o_ref = ref.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    for h in range(4):
        o, _, _ = naive_sdpa(q[h], k[h // 2], v[h // 2])
        np.testing.assert_allclose(o_ref[h], o, rtol=1e-6, atol=1e-7)


def test_reference_top_left_causal_conversion(rng):
    # PyTorch's is_causal with L != S means j <= i (top-left); the docs say
    # that is attn_mask=np.tril(np.ones((L, S), bool)).
    L, S = 3, 5
    q, k, v = randn(rng, L, 2), randn(rng, S, 2), randn(rng, S, 2)
    top_left = np.array([[j <= i for j in range(S)] for i in range(L)])
    o, _, _ = naive_sdpa(q, k, v, top_left)
    np.testing.assert_allclose(
        ref.scaled_dot_product_attention(q, k, v, np.tril(np.ones((L, S), bool))), o, rtol=1e-6, atol=1e-7)
