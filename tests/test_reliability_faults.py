"""Faults found by the reliability work, each held by a test.

The kernel fault (NaN value rows of allowed keys with an underflowing weight)
was fixed in csrc/kernels.inc; the Python-side ones in fastattn._validate.
"""
import numpy as np
import pytest

import fastattn
from fastattn import reference

IMPLS = [fastattn, reference]
IDS = ["fastattn", "reference"]


def _two_allowed_keys(nan_key_first, S=200):
    """One query, two allowed keys (bool mask) in different key tiles: one with
    score -100 and a NaN value row, one with score +100. The NaN key's weight
    exp(-200) is positive (about 1e-87), so o = w0 * NaN + w1 * 5 is NaN."""
    q = np.ones((1, 1), np.float32)
    k = np.zeros((S, 1), np.float32)
    v = np.zeros((S, 1), np.float32)
    lo, hi = (0, S - 1) if nan_key_first else (S - 1, 0)
    k[lo], k[hi] = -1.0, 1.0
    v[lo], v[hi] = np.nan, 5.0
    mask = np.zeros((1, S), bool)
    mask[0, [lo, hi]] = True
    return q, k, v, mask


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
@pytest.mark.parametrize("nan_key_first", [True, False], ids=["nan-key-first", "nan-key-last"])
@pytest.mark.parametrize("scale", [100.0, 1e30])
def test_nan_value_row_with_underflowing_weight(mod, nan_key_first, scale):
    # documented: o_i = sum over allowed j of w_ij v_j; only keys that are not
    # allowed (or score -inf, D3) are skipped. An allowed key with a finite
    # score has a positive weight, so a NaN in its value row makes o_i NaN,
    # whatever the key order. (The kernel used to skip value rows whose float32
    # weight had underflowed to 0 when it saw the underflow in the key tile
    # being processed, so the result depended on the key order.)
    q, k, v, mask = _two_allowed_keys(nan_key_first)
    o = mod.scaled_dot_product_attention(q, k, v, mask, scale=scale)
    assert np.isnan(o).all()


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
@pytest.mark.parametrize("scale", [10**400, -10**400])
def test_scale_beyond_float64_is_a_value_error(mod, scale):
    # was OverflowError from float(scale)
    q = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="scale"):
        mod.scaled_dot_product_attention(q, q, q, scale=scale)


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
@pytest.mark.parametrize("mask", [{}, object(), [[1.0, 2.0], [3.0]], "ab"],
                         ids=["dict", "object", "ragged", "str"])
def test_mask_that_is_no_array_is_a_type_error_naming_attn_mask(mod, mask):
    # dict / object() gave AttributeError; a ragged list gave numpy's ValueError
    # without the argument's name
    q = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="attn_mask"):
        mod.scaled_dot_product_attention(q, q, q, mask)


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
@pytest.mark.parametrize("value", [True, False, 0.5, -np.inf])
def test_zero_d_masks_broadcast(mod, value):
    # A 0-d mask broadcasts to every (i, j): False / -inf masks everything (o = 0),
    # True / a constant leaves the weights of no mask.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    got = mod.scaled_dot_product_attention(q, k, v, np.array(value))
    if value is False or value == -np.inf:
        np.testing.assert_array_equal(got, 0.0)
    else:
        np.testing.assert_allclose(got, reference.scaled_dot_product_attention(q, k, v),
                                   rtol=3e-5, atol=3e-6)
