"""Arrays of more than 2**31 elements (64-bit index arithmetic everywhere).

Marked `bigmem` and deselected by default (pyproject.toml); run them with
``pytest -m bigmem tests/test_bigmem.py``. They need about 18 GB of free memory
(at most two arrays of 2**31+ float32, 8.6 GB each, are alive at once) and a
few minutes. Expected values are worked out by hand from the constructed inputs.
"""
import math

import numpy as np
import pytest

import fastattn

pytestmark = pytest.mark.bigmem

BIG = 2**31


def test_logsumexp_and_softmax_beyond_2_31_elements():
    nrows, n = 32769, 65536                  # 2**31 + 65536 elements
    x = np.zeros(nrows * n, np.float32)
    assert x.size > BIG
    hi, mid = x.size - 1, BIG + 7            # entries past the 2**31-th element
    x[hi], x[mid] = 5.0, 3.0
    # one row over everything
    total = (x.size - 2) + math.exp(5.0) + math.exp(3.0)
    lse = fastattn.logsumexp(x)
    np.testing.assert_allclose(lse, math.log(total), rtol=1e-6)
    # the same memory as rows: the last rows start beyond 2**31
    rows = fastattn.logsumexp(x.reshape(nrows, n), axis=-1)
    expect = np.full(nrows, math.log(n), np.float64)
    assert hi // n == mid // n == nrows - 1   # both in the last row
    expect[-1] = math.log(n - 2 + math.exp(5.0) + math.exp(3.0))
    np.testing.assert_allclose(rows, expect, rtol=1e-6)
    # softmax into a second big array
    out = np.empty_like(x)
    fastattn.softmax(x, out=out)
    for j, xj in ((hi, 5.0), (mid, 3.0), (0, 0.0), (BIG, 0.0), (x.size - 2, 0.0)):
        np.testing.assert_allclose(out[j], math.exp(xj) / total, rtol=1e-5)
    del out
    sm = fastattn.softmax(x.reshape(nrows, n), axis=-1)
    np.testing.assert_allclose(sm[-1, -1], math.exp(5.0) / (n - 2 + math.exp(5.0) + math.exp(3.0)),
                               rtol=1e-5)
    np.testing.assert_allclose(sm[-2, 0], 1.0 / n, rtol=1e-5)


def test_attention_with_k_and_v_beyond_2_31_elements():
    D = 64
    half = 2**24 + 1
    buf = np.zeros(2 * half * D, np.float32)  # 2**31 + 128 elements, k and v alike
    assert buf.size > BIG
    S = 2 * half
    k = buf.reshape(S, D)
    k[S - 1, 0] = 30.0                        # the one key that stands out, at the very end
    q = np.zeros((2, D), np.float32)
    q[:, 0] = 1.0
    e = math.exp(30.0)
    # scale 1: row 1 (p = S - 1) sees every key: scores 0 except 30 at the last
    # key; row 0 (causal, p = S - 2) sees only the zero keys.
    o, lse = fastattn.scaled_dot_product_attention(q, k, k, is_causal=True, scale=1.0,
                                                   return_lse=True)
    np.testing.assert_allclose(lse, [math.log(S - 1), math.log(S - 1 + e)], rtol=1e-6)
    np.testing.assert_array_equal(o[0], 0.0)
    np.testing.assert_allclose(o[1, 0], 30.0 * e / (S - 1 + e), rtol=1e-5)
    np.testing.assert_array_equal(o[1, 1:], 0.0)
    # the same memory as two batch items (heads): item 1 starts past 2**30 elements
    # and its last key past 2**31; GQA maps both query heads of group 1 to it.
    kb = buf.reshape(2, half, D)
    qb = np.zeros((4, 1, D), np.float32)
    qb[..., 0] = 1.0
    ob, lseb = fastattn.scaled_dot_product_attention(qb, kb, kb, scale=1.0, enable_gqa=True,
                                                     return_lse=True)
    np.testing.assert_allclose(lseb[:2, 0], math.log(half), rtol=1e-6)
    np.testing.assert_allclose(lseb[2:, 0], math.log(half - 1 + e), rtol=1e-6)
    np.testing.assert_allclose(ob[2:, 0, 0], 30.0 * e / (half - 1 + e), rtol=1e-5)
    np.testing.assert_array_equal(ob[:2], 0.0)
    # a window that reaches only the last 3 keys: offsets near the end of k
    ow = fastattn.scaled_dot_product_attention(q[1:], k, k, window=(2, 0), scale=1.0)
    np.testing.assert_allclose(ow[0, 0], 30.0 * e / (2 + e), rtol=1e-6)
