"""softmax, log_softmax, logsumexp: the dtype, axis and non-finite rules.

- Inputs of any real floating dtype (and array-likes of them) compute in
  float32; the result is a new C-contiguous float32 array, or `out`.
- `axis` is an int, negative from the end, any axis on any strides; out of
  range or a 0-d input: AxisError; another type: TypeError.
- Finite inputs never overflow or underflow to NaN at any magnitude; each
  element is within a few float32 ulps of the float64 value.
- Non-finite values follow IEEE arithmetic on the max-shifted formula: a NaN
  makes its slice NaN; a +inf makes softmax and log_softmax NaN and logsumexp
  +inf; -inf entries next to a finite one get weight 0 (log_softmax -inf); an
  all -inf slice gives softmax and log_softmax NaN, logsumexp -inf.
- Empty arrays give empty results (logsumexp of an empty slice: -inf); a
  length-1 axis gives exactly 1 (log_softmax 0) for finite entries.
"""

import math

import numpy as np
import pytest
import scipy.special

import fastattn
from fastattn import reference as ref

from conftest import (FMAX, IMPL_IDS, IMPLS, assert_new_c_float32, assert_same_bits, readonly,
                      softmax64, ulp_error)

NAMES = ["softmax", "log_softmax", "logsumexp"]

# Accuracy bound (the docs: "within a few float32 ulps of the float64
# value; the tests fix the bound").  Relative to eps32 * |exact|; for
# log_softmax and logsumexp the scale is max(|exact|, 1), because
# log(sum) is computed from a sum rounded to float32 (absolute error ~eps
# even when the result is near 0) and logsumexp = m + log(sum) may cancel.
ULPS = 4


def moderate(rng, *shape):
    """Moderate-spread float32 data: every exp(x - max) in [e^-4, 1]."""
    return rng.uniform(-2.0, 2.0, shape).astype(np.float32)


def call(name, x, **kw):
    return getattr(fastattn, name)(x, **kw)


def exact64(name, x, axis):
    sm, ls, lse = softmax64(x, axis)
    return {"softmax": sm, "log_softmax": ls, "logsumexp": lse}[name]


def assert_accurate(name, got, x, axis, ulps=ULPS):
    floor = 0.0 if name == "softmax" else 1.0
    err = ulp_error(got, exact64(name, x, axis), floor=floor)
    assert err <= ulps, f"{name}: {err:.2f} ulp > {ulps}"


# --------------------------------------------------------------- correctness

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_every_axis_matches_reference(rng, name, axis):
    x = moderate(rng, 5, 6, 7)
    got = call(name, x, axis=axis)
    expected = getattr(ref, name)(x, axis=axis)
    assert_new_c_float32(got)
    assert got.shape == np.asarray(expected).shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert_accurate(name, got, x, axis)


@pytest.mark.parametrize("name", NAMES)
def test_default_axis_is_last(rng, name):
    x = moderate(rng, 4, 9)
    assert_same_bits(call(name, x), call(name, x, axis=-1))


@pytest.mark.parametrize("name", NAMES)
def test_numpy_integer_axis(rng, name):
    x = moderate(rng, 4, 9)
    assert_same_bits(call(name, x, axis=np.int64(0)), call(name, x, axis=0))


@pytest.mark.parametrize("name", NAMES)
def test_array_like_float_input(name):
    x = [[0.5, -1.0, 2.0], [3.0, 3.0, 3.0]]
    assert_same_bits(call(name, x), call(name, np.array(x, np.float32)))


def _layouts(x32):
    """Same float32 values in other layouts / dtypes."""
    f = np.asfortranarray(x32)
    big = np.zeros((x32.shape[0] * 2, x32.shape[1] * 3), np.float32)
    big[::2, 1::3] = x32
    strided = big[::2, 1::3]
    assert not strided.flags.c_contiguous
    return {
        "F-order": f,
        "strided": strided,
        "transposed-view": np.ascontiguousarray(x32.T).T,
        "read-only": readonly(x32),
        "float64": x32.astype(np.float64),
        "longdouble": x32.astype(np.longdouble),
    }


@pytest.mark.parametrize("layout", ["F-order", "strided", "transposed-view", "read-only", "float64",
                                    "longdouble"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [0, -1])
def test_layouts_and_dtypes_equal_contiguous_float32(rng, layout, name, axis):
    x32 = moderate(rng, 9, 13)
    x = _layouts(x32)[layout]
    before = x.copy()
    got = call(name, x, axis=axis)
    assert_new_c_float32(got)
    assert_same_bits(got, call(name, x32, axis=axis))
    np.testing.assert_array_equal(x, before)  # input untouched
    assert_accurate(name, got, x32, axis)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_float16_input(rng, name, axis):
    x16 = moderate(rng, 6, 5, 11).astype(np.float16)
    x32 = x16.astype(np.float32)  # exact
    got = call(name, x16, axis=axis)
    assert_new_c_float32(got)
    assert_same_bits(got, call(name, x32, axis=axis))
    np.testing.assert_allclose(got, getattr(ref, name)(x16, axis=axis), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_logsumexp_keepdims(rng, axis):
    x = moderate(rng, 3, 4, 5)
    kd = fastattn.logsumexp(x, axis=axis, keepdims=True)
    plain = fastattn.logsumexp(x, axis=axis)
    expected_shape = list(x.shape)
    expected_shape[axis] = 1
    assert kd.shape == tuple(expected_shape)
    assert plain.shape == np.squeeze(kd, axis=axis).shape
    assert_same_bits(np.squeeze(kd, axis=axis), plain)
    np.testing.assert_allclose(kd, ref.logsumexp(x, axis=axis, keepdims=True), rtol=1e-6)


def test_logsumexp_1d_gives_0d(rng):
    x = moderate(rng, 10)
    got = np.asarray(fastattn.logsumexp(x))
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(got, scipy.special.logsumexp(x.astype(np.float64)), rtol=1e-6)


# ---------------------------------------------------------------- accuracy

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 16, 17, 33, 100, 513])
def test_accuracy_few_ulp(rng, name, n):
    x = moderate(rng, 64, n)
    assert_accurate(name, call(name, x), x, -1)


@pytest.mark.parametrize("name", NAMES)
def test_accuracy_along_first_axis(rng, name):
    x = moderate(rng, 257, 31)
    assert_accurate(name, call(name, x, axis=0), x, 0)


@pytest.mark.parametrize("offset", [0.0, 80.0, -80.0, 1e4])
def test_accuracy_shift_invariance(rng, offset):
    # softmax depends on differences only: a large common offset must not
    # cost accuracy (x - max is exact when both are close).
    x = moderate(rng, 32, 50) + np.float32(offset)
    assert_accurate("softmax", fastattn.softmax(x), x, -1)
    assert_accurate("logsumexp", fastattn.logsumexp(x), x, -1)


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
def test_log_softmax_near_zero_is_accurate(simd, mod):
    # log_softmax([0, -35])[0] = -log1p(e**-35), about -6.3e-16: log(1 + tiny)
    # would round the tiny part away.
    x = np.array([0.0, -35.0], np.float32)
    want = -math.log1p(math.exp(-35.0))
    got = mod.log_softmax(x)[0]
    assert abs(got - want) <= 2 * np.spacing(np.float32(abs(want)))
    got = mod.logsumexp(x)
    assert abs(got + want) <= 2 * np.spacing(np.float32(abs(want)))


# -------------------------------------------------------- shapes: empty, 1

@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0), (2, 0, 3)])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_empty_softmax(shape, name):
    x = np.empty(shape, np.float32)
    for axis in range(-len(shape), len(shape)):
        got = call(name, x, axis=axis)
        assert got.shape == shape and got.dtype == np.float32


@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0), (2, 0, 3)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_empty_logsumexp(shape, keepdims):
    x = np.empty(shape, np.float32)
    for axis in range(-len(shape), len(shape)):
        got = np.asarray(fastattn.logsumexp(x, axis=axis, keepdims=keepdims))
        expected_shape = np.sum(x, axis=axis, keepdims=keepdims).shape
        assert got.shape == expected_shape and got.dtype == np.float32
        if shape[axis] == 0:
            assert (got == -np.inf).all()  # empty slice: -inf


SINGLE_VALUES = [0.0, 1.0, -3.5, 1e-45, 1e30, -1e30, FMAX, -FMAX, 88.0, -104.0]


@pytest.mark.parametrize("axis", [0, -1])
def test_length_one_axis_exact(axis):
    x = np.array(SINGLE_VALUES, np.float32)
    x = x[None, :] if axis == 0 else x[:, None]
    sm = fastattn.softmax(x, axis=axis)
    ls = fastattn.log_softmax(x, axis=axis)
    lse = fastattn.logsumexp(x, axis=axis)
    assert (sm == 1.0).all(), sm
    assert (ls == 0.0).all(), ls
    # m + log(exp(0)) = m exactly
    np.testing.assert_array_equal(lse, np.squeeze(x, axis=axis))


# ------------------------------------------------------------- magnitudes

HUGE_ROWS = [
    [1e30, 1e30],
    [1e30, -1e30],
    [1e30, 0.0, -1e30],
    [FMAX, FMAX],
    [FMAX, -FMAX],
    [-FMAX, -FMAX],
    [FMAX, 0.0, -FMAX],
    [FMAX, FMAX * 0.999999],
    [-FMAX, -FMAX * 0.999999, -FMAX],
    [3e38, 1e-45, -3e38],
]


@pytest.mark.parametrize("row", HUGE_ROWS, ids=lambda r: ",".join(f"{v:.3g}" for v in r))
def test_huge_magnitudes_no_overflow(row):
    x = np.array([row, row[::-1]], np.float32)
    x64 = x.astype(np.float64)
    sm = fastattn.softmax(x)
    assert np.isfinite(sm).all(), sm
    np.testing.assert_allclose(sm.sum(-1), 1.0, rtol=1e-6)
    assert (sm.max(-1) > 0).all()
    np.testing.assert_allclose(sm, scipy.special.softmax(x64, axis=-1), rtol=1e-6, atol=1e-30)
    lse = fastattn.logsumexp(x)
    assert np.isfinite(lse).all(), lse
    np.testing.assert_allclose(lse, scipy.special.logsumexp(x64, axis=-1), rtol=1e-6)
    ls = fastattn.log_softmax(x)
    assert not np.isnan(ls).any(), ls
    with np.errstate(over="ignore"):
        # the float64 value may lie beyond float32's range (-2 * FMAX): then -inf
        expected = scipy.special.log_softmax(x64, axis=-1).astype(np.float32)
    np.testing.assert_allclose(ls, expected, rtol=1e-6)


def test_huge_random_scale(rng):
    x = (rng.standard_normal((50, 40)) * 1e30).astype(np.float32)
    sm = fastattn.softmax(x)
    assert np.isfinite(sm).all()
    np.testing.assert_allclose(sm, ref.softmax(x), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(fastattn.logsumexp(x), ref.logsumexp(x), rtol=1e-6)


# ------------------------------------------------------ non-finite rules

def _put(x, axis, row, values):
    """Write values into slice `row` along `axis` of 2-D x."""
    if axis in (-1, 1):
        x[row, : len(values)] = values
    else:
        x[: len(values), row] = values


def _slice(a, axis, row):
    return a[row] if axis in (-1, 1) else a[:, row]


@pytest.mark.parametrize("axis", [0, -1])
def test_nan_slice(rng, axis):
    x = moderate(rng, 6, 6)
    _put(x, axis, 2, [1.0, np.nan])
    _put(x, axis, 4, [np.nan, np.inf, -np.inf])
    for name in ("softmax", "log_softmax"):
        got = call(name, x, axis=axis)
        assert np.isnan(_slice(got, axis, 2)).all()
        assert np.isnan(_slice(got, axis, 4)).all()
        others = [r for r in range(6) if r not in (2, 4)]
        assert not np.isnan(_slice(got, axis, others)).any()
    lse = fastattn.logsumexp(x, axis=axis)
    assert np.isnan(lse[[2, 4]]).all()
    assert np.isfinite(lse[[0, 1, 3, 5]]).all()


@pytest.mark.parametrize("axis", [0, -1])
def test_posinf_slice(rng, axis):
    x = moderate(rng, 5, 5)
    _put(x, axis, 1, [np.inf])
    _put(x, axis, 3, [np.inf, -np.inf, np.inf])
    for name in ("softmax", "log_softmax"):
        got = call(name, x, axis=axis)
        assert np.isnan(_slice(got, axis, 1)).all()
        assert np.isnan(_slice(got, axis, 3)).all()
        assert np.isfinite(_slice(got, axis, [0, 2, 4])).all()
    lse = fastattn.logsumexp(x, axis=axis)
    assert lse[1] == np.inf and lse[3] == np.inf
    assert np.isfinite(lse[[0, 2, 4]]).all()


@pytest.mark.parametrize("axis", [0, -1])
def test_neginf_with_finite_gets_zero_weight(rng, axis):
    rows = moderate(rng, 7, 9)  # each row is one slice
    rows[3, [0, 4, 8]] = -np.inf
    rows[5, :8] = -np.inf  # a single finite entry left
    x = rows if axis == -1 else rows.T.copy()

    def as_rows(a):
        return a if axis == -1 else a.T

    sm = as_rows(fastattn.softmax(x, axis=axis))
    ls = as_rows(fastattn.log_softmax(x, axis=axis))
    lse = fastattn.logsumexp(x, axis=axis)
    assert (sm[3, [0, 4, 8]] == 0.0).all()
    assert (ls[3, [0, 4, 8]] == -np.inf).all()
    assert (sm[5, :8] == 0.0).all() and sm[5, 8] == 1.0
    assert (ls[5, :8] == -np.inf).all() and ls[5, 8] == 0.0
    assert lse[5] == rows[5, 8]
    # the finite entries get the softmax of the finite entries alone
    keep = [1, 2, 3, 5, 6, 7]
    fs, fl, flse = softmax64(rows[3, keep], -1)
    assert ulp_error(sm[3, keep], fs) <= ULPS
    assert ulp_error(ls[3, keep], fl, floor=1.0) <= ULPS
    assert ulp_error(lse[3], flse, floor=1.0) <= ULPS
    # the other slices are unaffected
    others = [0, 1, 2, 4, 6]
    assert_accurate("softmax", sm[others], rows[others], -1)


@pytest.mark.parametrize("axis", [0, -1])
def test_all_neginf_slice(rng, axis):
    x = moderate(rng, 4, 4)
    _put(x, axis, 0, [-np.inf] * 4)
    for name in ("softmax", "log_softmax"):
        got = call(name, x, axis=axis)
        assert np.isnan(_slice(got, axis, 0)).all()
        assert np.isfinite(_slice(got, axis, [1, 2, 3])).all()
    lse = fastattn.logsumexp(x, axis=axis)
    assert lse[0] == -np.inf and np.isfinite(lse[1:]).all()


def test_nonfinite_agree_with_reference():
    inf, nan = np.inf, np.nan
    x = np.array([[0.0, nan, 1.0], [inf, 0.0, 1.0], [inf, -inf, nan], [-inf, 0.0, 2.0],
                  [-inf, -inf, -inf], [inf, inf, 0.0]], np.float32)
    for name in NAMES:
        got = call(name, x)
        np.testing.assert_allclose(got, getattr(ref, name)(x), rtol=1e-6)


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [2, -3, 100])
def test_axis_out_of_range(rng, name, axis):
    with pytest.raises(np.exceptions.AxisError, match="axis"):
        call(name, moderate(rng, 3, 4), axis=axis)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [0, -1])
def test_zero_d_input_axis_error(name, axis):
    with pytest.raises(np.exceptions.AxisError):
        call(name, np.float32(1.5), axis=axis)
    with pytest.raises(np.exceptions.AxisError):
        call(name, np.array(1.5, np.float32), axis=axis)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [1.0, True, None, "0"])
def test_axis_wrong_type(rng, name, axis):
    with pytest.raises(TypeError, match="axis"):
        call(name, moderate(rng, 3, 4), axis=axis)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("x", [
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.arange(6, dtype=np.int64).reshape(2, 3),
    np.ones((2, 3), dtype=bool),
    np.ones((2, 3), dtype=np.complex64),
    np.ones((2, 3), dtype=object),
    [[1, 2, 3]],
], ids=["int32", "int64", "bool", "complex64", "object", "int-list"])
def test_bad_dtype_type_error(name, x):
    with pytest.raises(TypeError, match=r"\bx\b"):
        call(name, x)
