"""out=: written and returned, and every way of getting it wrong.

`out` must be a writeable, C-contiguous float32 ndarray of exactly the
result's shape (another dtype: TypeError; another shape, layout or a
read-only array: ValueError) that shares no memory with an input (ValueError);
nothing is ever cast into it, and when given it is returned. On every error
`out` is left unchanged."""

import numpy as np
import pytest

import fastattn

from conftest import assert_same_bits, randn

SENTINEL = np.float32(-1234.5)


def _rowwise(name, **kw):
    def make(rng):
        return {"x": randn(rng, 4, 5)}

    def call(a, out):
        return getattr(fastattn, name)(a["x"], axis=0, out=out, **kw)

    return make, call


def _attention(fn, return_lse=False, **kw):
    def make(rng):
        return {"q": randn(rng, 2, 4, 3), "k": randn(rng, 2, 6, 3), "v": randn(rng, 2, 6, 5),
                "attn_mask": randn(rng, 4, 6)}

    def call(a, out):
        res = fn(a["q"], a["k"], a["v"], a["attn_mask"], out=out, return_lse=return_lse, **kw)
        return res[0] if return_lse else res

    return make, call


CASES = {
    "softmax": _rowwise("softmax"),
    "log_softmax": _rowwise("log_softmax"),
    "logsumexp": _rowwise("logsumexp"),
    "logsumexp-keepdims": _rowwise("logsumexp", keepdims=True),
    "sdpa": _attention(fastattn.scaled_dot_product_attention),
    "sdpa-lse": _attention(fastattn.scaled_dot_product_attention, return_lse=True),
    "sdpa-causal-window": _attention(fastattn.scaled_dot_product_attention, is_causal=True, window=(1, 0)),
    "causal_attention": _attention(fastattn.causal_attention),
    "sliding_window_attention": _attention(
        lambda q, k, v, m, **kw: fastattn.sliding_window_attention(q, k, v, 2, m, **kw)),
}


@pytest.fixture(params=list(CASES))
def case(request, rng):
    make, call = CASES[request.param]
    inputs = make(rng)
    expected = call(inputs, None)
    return inputs, call, expected


def _sentinel(shape):
    return np.full(shape, SENTINEL, np.float32)


def _raises_and_untouched(exc, call, inputs, out):
    before = out.copy()
    saved = {n: a.copy() for n, a in inputs.items()}
    with pytest.raises(exc, match="out"):
        call(inputs, out)
    assert_same_bits(out, before)
    for n, a in inputs.items():
        assert_same_bits(a, saved[n])


def test_out_written_and_returned(case):
    inputs, call, expected = case
    out = _sentinel(expected.shape)
    res = call(inputs, out)
    assert res is out
    assert_same_bits(out, expected)


def test_out_sdpa_return_lse_tuple(rng):
    q, k, v = randn(rng, 3, 4), randn(rng, 5, 4), randn(rng, 5, 2)
    out = _sentinel((3, 2))
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, out=out, return_lse=True)
    assert o is out
    assert lse.shape == (3,) and lse.dtype == np.float32
    assert_same_bits(out, fastattn.scaled_dot_product_attention(q, k, v))


def test_out_zero_d_for_logsumexp(rng):
    x = randn(rng, 7)
    out = _sentinel(())
    assert fastattn.logsumexp(x, out=out) is out
    assert_same_bits(out, np.asarray(fastattn.logsumexp(x), np.float32))


def test_out_empty(rng):
    out = _sentinel((0, 5))
    assert fastattn.softmax(np.empty((0, 5), np.float32), out=out) is out


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.complex64])
def test_out_wrong_dtype_type_error(case, dtype):
    inputs, call, expected = case
    out = np.full(expected.shape, 7, dtype=dtype)
    _raises_and_untouched(TypeError, call, inputs, out)


@pytest.mark.parametrize("kind", ["list", "memoryview"])
def test_out_not_an_ndarray_type_error(case, kind):
    inputs, call, expected = case
    with pytest.raises(TypeError, match="out"):
        if kind == "list":
            call(inputs, _sentinel(expected.shape).tolist())
        else:
            call(inputs, memoryview(_sentinel(expected.shape)))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (np.matrix itself)
def test_out_a_numpy_matrix_type_error():
    # an ndarray subclass whose reshape stays 2-d: refused by name
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="out must be a numpy.ndarray, not a matrix"):
        fastattn.scaled_dot_product_attention(x, x, x, out=np.matrix(np.zeros((3, 4), np.float32)))


def test_out_a_masked_array_type_error():
    # refused, as a masked input is: its mask would hide values written under it
    x = np.zeros((3, 4), np.float32)
    out = np.ma.array(np.zeros((3, 4), np.float32), mask=np.eye(3, 4, dtype=bool))
    for call in (lambda: fastattn.softmax(x, out=out),
                 lambda: fastattn.scaled_dot_product_attention(x, x, x, out=out)):
        with pytest.raises(TypeError, match="out must be a numpy.ndarray, not a MaskedArray"):
            call()
    assert not out.data.any()


@pytest.mark.parametrize("change", ["extra-dim", "missing-dim", "longer", "shorter", "reversed"])
def test_out_wrong_shape_value_error(case, change):
    inputs, call, expected = case
    shape = expected.shape
    if change == "extra-dim":
        shape = (1,) + shape
    elif change == "missing-dim":
        if len(shape) < 2:
            pytest.skip("no dim to drop")
        shape = shape[1:]
    elif change == "longer":
        shape = shape[:-1] + (shape[-1] + 1,)
    elif change == "shorter":
        shape = shape[:-1] + (shape[-1] - 1,)
    else:
        if shape == shape[::-1]:
            pytest.skip("symmetric shape")
        shape = shape[::-1]
    _raises_and_untouched(ValueError, call, inputs, _sentinel(shape))


@pytest.mark.parametrize("layout", ["F-order", "strided"])
def test_out_not_c_contiguous_value_error(case, layout):
    inputs, call, expected = case
    shape = expected.shape
    if layout == "F-order":
        if sum(n > 1 for n in shape) < 2:
            pytest.skip("F-order of this shape is also C-contiguous")
        out = np.asfortranarray(_sentinel(shape))
    else:
        big = _sentinel(shape[:-1] + (2 * shape[-1],))
        out = big[..., ::2]
    assert not out.flags.c_contiguous
    _raises_and_untouched(ValueError, call, inputs, out)


def test_out_read_only_value_error(case):
    inputs, call, expected = case
    out = _sentinel(expected.shape)
    out.setflags(write=False)
    _raises_and_untouched(ValueError, call, inputs, out)


@pytest.mark.parametrize("offset", ["same-start", "overlap-one"])
def test_out_overlapping_an_input_value_error(case, offset):
    inputs, call, expected = case
    for name, a in inputs.items():
        n_out = expected.size
        start = 0 if offset == "same-start" else a.size - 1
        buf = np.zeros(max(a.size, start + n_out), np.float32)
        buf[: a.size] = a.ravel()
        shared = dict(inputs)
        shared[name] = buf[: a.size].reshape(a.shape)
        out = buf[start: start + n_out].reshape(expected.shape)
        assert np.shares_memory(out, shared[name])
        _raises_and_untouched(ValueError, call, shared, out)


def test_out_is_the_input_itself(rng):
    x = randn(rng, 3, 4)
    before = x.copy()
    for f in (fastattn.softmax, fastattn.log_softmax):
        with pytest.raises(ValueError, match="out"):
            f(x, out=x)
        assert_same_bits(x, before)
    q = randn(rng, 3, 4)
    k, v = randn(rng, 5, 4), randn(rng, 5, 4)
    saved = q.copy()
    with pytest.raises(ValueError, match="out"):
        fastattn.scaled_dot_product_attention(q, k, v, out=q)
    assert_same_bits(q, saved)


def test_out_with_converted_input(rng):
    # an input that is converted (copied) shares nothing with out
    x = randn(rng, 3, 4).astype(np.float64)
    out = _sentinel((3, 4))
    assert fastattn.softmax(x, out=out) is out
    assert_same_bits(out, fastattn.softmax(x))


# ------------------------------------- out overlapping the score options

@pytest.mark.parametrize("mod", [fastattn, fastattn.reference], ids=["fastattn", "reference"])
@pytest.mark.parametrize("option", ["sinks", "alibi_slopes"])
def test_out_sharing_memory_with_a_score_option_is_an_error(rng, mod, option):
    # a float32 per-head array of the right shape is read in place by the
    # kernels: out over it would be written while it is read
    q, k, v = (rng.standard_normal((4, 1, 4)).astype(np.float32) for _ in range(3))
    out = np.zeros((4, 1, 4), np.float32)
    values = out.reshape(-1)[:4]
    values[:] = [0.5, 0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match=f"out must not share memory with {option}"):
        mod.scaled_dot_product_attention(q, k, v, out=out, **{option: values})
    want = mod.scaled_dot_product_attention(q, k, v, **{option: values.copy()})
    got = mod.scaled_dot_product_attention(q, k, v, out=np.zeros_like(out),
                                           **{option: values})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mod", [fastattn, fastattn.reference], ids=["fastattn", "reference"])
@pytest.mark.parametrize("option", ["sinks", "alibi_slopes"])
def test_varlen_out_sharing_memory_with_a_score_option_is_an_error(rng, mod, option):
    q, k, v = (rng.standard_normal((5, 2, 4)).astype(np.float32) for _ in range(3))
    cu = np.array([0, 2, 5])
    out = np.zeros((5, 2, 4), np.float32)
    values = out.reshape(-1)[:4].reshape(2, 2)  # (B, Hq)
    values[:] = 0.25
    with pytest.raises(ValueError, match=f"out must not share memory with {option}"):
        mod.varlen_attention(q, k, v, cu, cu, out=out, **{option: values})
