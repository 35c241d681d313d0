"""GGUF q8_0 / q4_0 blocks (fastattn._quant): byte identity with gguf-py, the
QuantizedArray view (wrapping, slicing, integer-array indexing, writing in
place, rearranging the leading axes, refusing ufuncs) and the errors.

gguf-py (``gguf.quants``) is the oracle: every expected byte and value is
computed by it from the same input, never written down by hand.
"""
import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastattn._quant import FORMATS, QuantizedArray, quantize_kv

gguf = pytest.importorskip("gguf")
from gguf import quants as gq  # noqa: E402

QTYPE = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
FMTS = ["q8_0", "q4_0"]
BYTES = {"q8_0": 34, "q4_0": 18}
# the largest |x| whose block scale stays finite in float16, as gguf computes it
LIMIT = {"q8_0": 65520 * 127, "q4_0": 65520 * 8}


def gguf_quantize(x, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gguf's 1/d overflows on tiny blocks
        return gq.quantize(np.asarray(x).astype(np.float32), QTYPE[fmt])


def gguf_dequantize(blocks, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0 * an inf scale, in foreign bytes
        return gq.dequantize(np.asarray(blocks), QTYPE[fmt])


def _nonfinite_cast_is_zero():
    # ggml and gguf-py convert the inf/NaN products of a block whose 1/d
    # overflows float32 to an integer, which the machine decides: 0 on x86-64.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)
        return not bad.astype(np.int8).any() and not bad.astype(np.uint8).any()


NONFINITE_CAST_IS_ZERO = _nonfinite_cast_is_zero()


def overflowing_blocks(x, fmt):
    """Mask (..., D // 32) of the blocks whose float32 1/d is infinite."""
    xb = np.asarray(x).astype(np.float32).reshape(-1, 32)
    with np.errstate(all="ignore"):
        if fmt == "q8_0":
            d = np.abs(xb).max(axis=1) / np.float32(127)
        else:
            m = xb[np.arange(len(xb)), np.abs(xb).argmax(axis=1)]
            d = m / np.float32(-8)
        return (d != 0) & np.isinf(np.float32(1) / d)


def assert_same_as_gguf(x, fmt):
    """quantize_kv(x) is a QuantizedArray of x's shape over gguf's bytes, and
    dequantizes to gguf's values; returns it."""
    qa = quantize_kv(x, fmt)
    assert isinstance(qa, QuantizedArray) and qa.format == fmt
    assert qa.shape == np.shape(x)
    ours = qa.blocks
    theirs = gguf_quantize(x, fmt)
    assert ours.dtype == np.uint8 and ours.flags.c_contiguous
    assert ours.shape == theirs.shape
    if NONFINITE_CAST_IS_ZERO:
        np.testing.assert_array_equal(ours, theirs)
    else:  # elsewhere compare all but the machine-dependent q of those blocks
        bad = overflowing_blocks(x, fmt)
        ob, tb = ours.reshape(-1, BYTES[fmt]), theirs.reshape(-1, BYTES[fmt])
        np.testing.assert_array_equal(ob[~bad], tb[~bad])
        np.testing.assert_array_equal(ob[bad, :2], tb[bad, :2])
    ours_values = qa.dequantize()
    np.testing.assert_array_equal(ours_values.view(np.uint32),
                                  gguf_dequantize(ours, fmt).view(np.uint32))
    return qa


# --- byte identity with gguf-py --------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("shape", [(32,), (3, 64), (2, 5, 128)])
def test_bytes_match_gguf_random(fmt, scale, shape, rng):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    out = assert_same_as_gguf(x, fmt)
    assert out.shape == shape
    assert out.blocks.shape == shape[:-1] + (shape[-1] // 32 * BYTES[fmt],)


@pytest.mark.parametrize("fmt", FMTS)
def test_bytes_match_gguf_ties_for_the_largest(fmt, rng):
    a = np.float32(3.25)
    rows = []
    for first in (a, -a):
        row = (rng.standard_normal(32) * 0.5).astype(np.float32)
        row[4], row[20] = first, -first  # +a and -a in one block, either order
        rows.append(row)
    rows.append(np.full(32, a, np.float32))  # all equal
    rows.append(np.full(32, -a, np.float32))
    row = np.zeros(32, np.float32)
    row[[1, 7, 31]] = -a  # several equal largest values, then a tie of signs
    row[[2, 30]] = a
    rows.append(row)
    assert_same_as_gguf(np.stack(rows), fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_q4_0_tie_takes_the_first(fmt):
    # independent of gguf: with +a first the scale is a / -8, with -a first a / 8
    x = np.zeros((2, 32), np.float32)
    x[0, 3], x[0, 9] = 4.0, -4.0
    x[1, 3], x[1, 9] = -4.0, 4.0
    d = quantize_kv(x, "q4_0").blocks[:, :2].copy().view("<f2")[:, 0]
    assert d.tolist() == [-0.5, 0.5]


@pytest.mark.parametrize("fmt", FMTS)
def test_zero_blocks(fmt, rng):
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 32:64] = -0.0
    x[2] = 0.0
    values = assert_same_as_gguf(x, fmt).dequantize()
    assert not values[0, :32].any() and not values[1, 32:64].any() and not values[2].any()


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("d", [1.0, 3.0, 0.1])
def test_rounding_halfway_points(fmt, d):
    # blocks whose largest value gives the scale d and whose others sit at
    # x * id = k + 0.5 (and next to it), where rounding and trunc decide
    if fmt == "q8_0":
        top = np.float32(127 * d)
        ks = np.arange(-30, 30) + 0.5
    else:
        top = np.float32(-8 * d)
        ks = np.arange(-8, 8) - 0.5
    inv = np.float32(1) / (top / np.float32(127 if fmt == "q8_0" else -8))
    half = (ks.astype(np.float32) / inv).astype(np.float32)
    vals = np.concatenate([half, np.nextafter(half, np.float32(np.inf)),
                           np.nextafter(half, np.float32(-np.inf))]).astype(np.float32)
    vals = vals[np.abs(vals) < abs(top)]
    nrows = -(-len(vals) // 31)
    x = np.zeros((nrows, 32), np.float32)
    x[:, 0] = top
    x.reshape(-1)[np.flatnonzero(np.arange(nrows * 32) % 32)[:len(vals)]] = vals
    assert_same_as_gguf(x, fmt)


def test_q8_0_halves_round_away_from_zero():
    # d = 1 exactly (max 127): q is round-half-away-from-zero of x itself
    x = np.zeros(32, np.float32)
    x[0] = 127.0
    halves = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5], np.float32)
    x[1:9] = halves
    q = quantize_kv(x, "q8_0").blocks[2:].view(np.int8)
    expected = [math.copysign(math.floor(abs(float(v)) + 0.5), float(v)) for v in halves]
    assert q[1:9].tolist() == expected
    np.testing.assert_array_equal(quantize_kv(x, "q8_0").blocks, gguf_quantize(x, "q8_0"))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
def test_other_input_dtypes(fmt, dtype, rng):
    x = (rng.standard_normal((4, 64)) * 50).astype(dtype)
    assert_same_as_gguf(x, fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_bfloat16_input(fmt, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.standard_normal((2, 64)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(quantize_kv(x, fmt).blocks,
                                  gguf_quantize(x.astype(np.float32), fmt))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("scale", [1e-45, 1e-40, 1e-38, 1e-37, 1e-36, 1e-30, 1e-8])
def test_subnormal_scale_blocks(fmt, scale, rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[0, :32] *= np.float32(scale)  # a tiny block next to ordinary ones
    x[2] = (x[2] * scale).astype(np.float32)
    values = assert_same_as_gguf(x, fmt).dequantize()
    assert np.abs(values[0, :32]).max() <= 2 * np.abs(x[0, :32]).max() + 6e-8


@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64])),
                    elements=st.floats(-5e5, 5e5, width=32, allow_subnormal=True)),
       fmt=st.sampled_from(FMTS))
def test_property_bytes_match_gguf(x, fmt):
    assert_same_as_gguf(x, fmt)


# --- dequantization ----------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_arbitrary_bytes_like_gguf(fmt, rng):
    # any bytes, NaN and inf scales included, give gguf's values bit for bit
    blocks = rng.integers(0, 256, size=(6, 4 * BYTES[fmt]), dtype=np.uint8)
    blocks[0, :2] = [0x00, 0x7C]  # +inf scale
    blocks[1, :2] = [0x01, 0x7E]  # NaN scale
    blocks[2, :2] = [0x01, 0x00]  # subnormal scale
    ours = QuantizedArray.from_blocks(blocks, fmt).dequantize()
    theirs = gguf_dequantize(blocks, fmt)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous and ours.shape == (6, 128)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_dequantize_is_close(fmt, scale, rng):
    x = (rng.standard_normal((4, 8, 128)) * scale).astype(np.float32)
    qa = quantize_kv(x, fmt)
    err = np.abs(qa.dequantize() - x).reshape(-1, 32)
    xb = x.reshape(-1, 32).astype(np.float64)
    rows = qa.blocks.reshape(-1, BYTES[fmt])
    d16 = rows[:, :2].copy().view("<f2")[:, 0].astype(np.float64)
    if fmt == "q8_0":
        d = np.abs(xb).max(axis=1) / 127
        q = rows[:, 2:].view(np.int8).astype(np.float64)
        bound = d / 2
    else:
        d = np.abs(xb).max(axis=1) / 8
        nib = np.concatenate([rows[:, 2:] & 15, rows[:, 2:] >> 4], axis=1)
        q = nib.astype(np.float64) - 8
        bound = d
    # within d/2 (q8_0) or d (q4_0) of the float32 scale, plus what rounding
    # the scale to float16 moves each value
    slack = np.abs(q) * np.abs(np.abs(d16)[:, None] - d[:, None]) + 1e-6 * d[:, None]
    assert (err <= bound[:, None] + slack).all()


def test_dequantize_exact_scale_bound():
    # scales exactly representable in float16: the plain d/2 and d bounds
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (64, 32)).astype(np.float32) * np.float32(127 / 128)
    x[:, 0] = np.float32(127 / 128)  # d = 1/128 for q8_0
    err = np.abs(quantize_kv(x, "q8_0").dequantize() - x)
    assert err.max() <= 1 / 256
    x[:, 0] = np.float32(-1.0)  # d = 1/8 for q4_0
    x[:, 1:] = np.clip(x[:, 1:], -1, 1)
    err = np.abs(quantize_kv(x, "q4_0").dequantize() - x)
    assert err.max() <= 1 / 8


# --- from_blocks ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_from_blocks_wraps_without_copy(fmt, rng):
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    blocks = gguf_quantize(x, fmt)
    qa = QuantizedArray.from_blocks(blocks, fmt)
    assert qa.blocks is blocks and np.shares_memory(qa.blocks, blocks)
    assert qa.shape == x.shape and qa.ndim == 3 and qa.size == x.size and len(qa) == 2
    assert qa.dtype == np.dtype(np.float32) and qa.format == fmt
    assert qa.block_size == 32 and qa.block_bytes == BYTES[fmt] == FORMATS[fmt][0]
    assert qa.nbytes == blocks.nbytes
    assert repr(qa) == f"QuantizedArray(shape=(2, 3, 64), format='{fmt}', nbytes={blocks.nbytes})"
    np.testing.assert_array_equal(np.asarray(qa), gguf_dequantize(blocks, fmt))
    assert QuantizedArray(blocks, fmt).blocks is blocks


@pytest.mark.parametrize("fmt", FMTS)
def test_from_blocks_strided_view_of_a_cache(fmt, rng):
    cache = quantize_kv(rng.standard_normal((3, 10, 64)), fmt).blocks
    view = cache[:, ::2]
    qa = QuantizedArray.from_blocks(view, fmt)
    assert qa.shape == (3, 5, 64) and np.shares_memory(qa.blocks, cache)
    full = QuantizedArray.from_blocks(cache, fmt).dequantize()
    np.testing.assert_array_equal(qa.dequantize(), full[:, ::2])
    np.testing.assert_array_equal(qa.dequantize(), gguf_dequantize(np.ascontiguousarray(view), fmt))
    # a transposed cache: leading strides in any order
    qt = QuantizedArray.from_blocks(cache.transpose(1, 0, 2), fmt)
    np.testing.assert_array_equal(qt.dequantize(), full.transpose(1, 0, 2))
    c = qa.copy()
    assert c.blocks.flags.c_contiguous and not np.shares_memory(c.blocks, cache)
    np.testing.assert_array_equal(c.blocks, view)


@pytest.mark.parametrize("fmt", FMTS)
def test_from_blocks_errors(fmt):
    nb = BYTES[fmt]
    with pytest.raises(TypeError, match="blocks.*uint8"):
        QuantizedArray.from_blocks(np.zeros((2, nb), np.int8), fmt)
    with pytest.raises(TypeError, match="blocks.*uint8"):
        QuantizedArray.from_blocks(np.zeros((2, nb), np.float32), fmt)
    with pytest.raises(ValueError, match=f"blocks.*{nb + 1}.*multiple of {nb}"):
        QuantizedArray.from_blocks(np.zeros((2, nb + 1), np.uint8), fmt)
    with pytest.raises(ValueError, match="blocks.*contiguous"):
        QuantizedArray.from_blocks(np.zeros((2, 4 * nb), np.uint8)[:, ::2], fmt)
    with pytest.raises(ValueError, match="blocks.*0-d"):
        QuantizedArray.from_blocks(np.uint8(3), fmt)
    with pytest.raises(ValueError, match="q8_0.*q4_0"):
        QuantizedArray.from_blocks(np.zeros((2, nb), np.uint8), "q5_0")
    with pytest.raises(TypeError, match="format"):
        QuantizedArray.from_blocks(np.zeros((2, nb), np.uint8), None)


# --- slicing -------------------------------------------------------------------

KEYS = [0, -1, (1,), slice(1, 3), (0, slice(None, None, 2)), Ellipsis, (Ellipsis, slice(None)),
        (1, Ellipsis), (-1, 2), (slice(None), 3), (), (0, 1), (np.int64(1), slice(4, 0, -2)),
        (slice(None), slice(None), slice(0, 64)), (Ellipsis, 2, slice(None))]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_slicing(fmt, key, rng):
    qa = quantize_kv(rng.standard_normal((3, 5, 64)), fmt)
    full = qa.dequantize()
    part = qa[key]
    assert isinstance(part, QuantizedArray)
    assert part.shape == full[key].shape
    assert np.shares_memory(part.blocks, qa.blocks)
    np.testing.assert_array_equal(part.dequantize(), full[key])


def test_slicing_all_leading_ints_gives_a_row(rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 96)))
    row = qa[1, 2]
    assert row.ndim == 1 and row.shape == (96,) and len(row) == 96
    np.testing.assert_array_equal(row.dequantize(), qa.dequantize()[1, 2])
    assert [r.shape for r in qa] == [(3, 96), (3, 96)]
    with pytest.raises(TypeError, match="1-d"):
        iter(row).__next__()


@pytest.mark.parametrize("key", [(0, 0, 0), (Ellipsis, 0), (slice(None), slice(None), slice(1, 5)),
                                 (Ellipsis, slice(None, None, 2)), (0, 0, slice(0, 32)),
                                 (Ellipsis, [0, 1]), (0, 0, np.array([3])),
                                 ([0], [0], [0])],
                         ids=repr)
def test_slicing_refuses_the_last_axis(key, rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 64)))
    with pytest.raises(IndexError, match="last axis"):
        qa[key]
    with pytest.raises(IndexError, match="last axis"):
        qa[key] = 0.0


@pytest.mark.parametrize("key, match", [
    (None, "None"), ((0, None), "None"), ((Ellipsis, None), "None"),
    (np.array([True, False]), "no boolean indexing"), ([True, False], "no boolean indexing"),
    ((0, np.array([True, False, True])), "no boolean indexing"),
    (True, "no boolean indexing"), (np.bool_(False), "no boolean indexing"),
    ((0, 1.5), "not float"), (np.array([0.0, 1.0]), "not float64"), ("a", "not str"),
], ids=repr)
def test_slicing_refuses_boolean_none_and_non_integers(key, match, rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 64)))
    before = qa.blocks.copy()
    with pytest.raises(IndexError, match=match):
        qa[key]
    with pytest.raises(IndexError, match=match):
        qa[key] = 0.0
    np.testing.assert_array_equal(qa.blocks, before)


# integer arrays (and lists) of the leading axes of a (3, 4, 5, 64) array,
# alone, with ints, slices and Ellipsis, broadcast against each other
FANCY_KEYS = [
    [0, 2], np.array([2, 0, 2]), (np.array([-1, 0]),), np.array([1], dtype=np.uint8), [],
    (1, [3, 0]), ([0, 2], [1, 3]), (slice(None), [3, 1]), (Ellipsis, [4, 0], slice(None)),
    ([0, 1], slice(None), [1, 2]),  # arrays split by a slice: their axis goes first
    (np.array([[0], [2]]), np.array([1, 3, 0])),  # 2-D broadcast
    (slice(1, None), np.array([[0, 1], [2, 3]]), Ellipsis),
    (np.array([0, 2]), slice(None), slice(None), slice(None)),
    (np.int64(2), np.array([3]), np.array([[4], [0]])),
]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("key", FANCY_KEYS, ids=repr)
def test_fancy_getitem_is_numpy_fancy_indexing(fmt, key, rng):
    qa = quantize_kv(rng.standard_normal((3, 4, 5, 64)), fmt)
    blocks_before = qa.blocks.copy()
    full = qa.dequantize()
    part = qa[key]
    expected = full[key]  # numpy's own fancy indexing of the values
    assert isinstance(part, QuantizedArray) and part.format == fmt
    assert part.shape == expected.shape
    np.testing.assert_array_equal(part.dequantize().view(np.uint32), expected.view(np.uint32))
    # the blocks are numpy's fancy indexing of the bytes, copied
    np.testing.assert_array_equal(part.blocks, qa.blocks[key])
    assert not np.shares_memory(part.blocks, qa.blocks)
    if part.size:
        part[...] = 1.0  # the copy is independent of qa
        np.testing.assert_array_equal(qa.blocks, blocks_before)


# integer-array keys of a (2, 16) cache of rows of 64, as a KV cache writes
# them (rows[:, None], positions) included
FANCY_SET_KEYS = [
    ([0, 1], [3, 7]),
    (np.arange(2)[:, None], np.array([[5, 6, 7], [9, 10, 11]])),  # per-row positions
    (np.arange(2)[:, None], np.array([12, 13])),
    (slice(None), [2, 4]),
    (1, np.array([15, 0])),
    (Ellipsis, [8], slice(None)),
    ([1],),
    np.array([-2]),
]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("key", FANCY_SET_KEYS, ids=repr)
def test_fancy_setitem_writes_quantized_rows_in_place(fmt, key, rng):
    cache = quantize_kv(rng.standard_normal((2, 16, 64)), fmt)
    blocks = cache.blocks
    before = blocks.copy()
    values = rng.standard_normal(np.empty((2, 16, 64))[key].shape) * 3
    cache[key] = values
    assert cache.blocks is blocks
    expected = quantize_kv(values, fmt).blocks
    np.testing.assert_array_equal(blocks[key], expected)
    np.testing.assert_array_equal(blocks[key], gguf_quantize(values, fmt))
    touched = np.zeros((2, 16, 1), bool)
    touched[key] = True
    touched = touched[..., 0]
    assert touched.any()
    np.testing.assert_array_equal(blocks[~touched], before[~touched])


@pytest.mark.parametrize("fmt", FMTS)
def test_fancy_setitem_broadcasts_into_a_strided_view(fmt, rng):
    big = np.zeros((3, 12, 2 * BYTES[fmt]), np.uint8)
    cache = QuantizedArray.from_blocks(big[:, ::3], fmt)  # (3, 4, 64), positions 0, 3, 6, 9
    row = rng.standard_normal(64)
    cache[[0, 2], [1, 3]] = row  # one row broadcast to both
    expected = quantize_kv(row, fmt).blocks
    np.testing.assert_array_equal(big[0, 3], expected)
    np.testing.assert_array_equal(big[2, 9], expected)
    # a KV cache append: each batch row at its own position
    pos = np.array([0, 2, 1])
    new = rng.standard_normal((3, 1, 64))
    cache[np.arange(3)[:, None], pos[:, None]] = new
    np.testing.assert_array_equal(big[np.arange(3), 3 * pos], quantize_kv(new[:, 0], fmt).blocks)
    touched = np.zeros((3, 12), bool)
    touched[[0, 2], [3, 9]] = True
    touched[np.arange(3), 3 * pos] = True
    assert not big[~touched].any()


def test_slicing_other_index_errors(rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 64)))
    with pytest.raises(IndexError, match="too many"):
        qa[0, 0, :, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        qa[..., 0, ...]
    with pytest.raises(IndexError):
        qa[5]
    with pytest.raises(IndexError):
        qa[[0, 2]]  # out of bounds in an integer array
    with pytest.raises(IndexError):
        qa[[0, 1], [0, 1, 2]]  # arrays that do not broadcast
    row = qa[0, 0]
    with pytest.raises(IndexError, match="last axis"):
        row[0]
    assert row[...].shape == (64,) and row[:].shape == (64,)


def test_array_protocol(rng):
    x = rng.standard_normal((2, 64))
    qa = quantize_kv(x)
    assert np.asarray(qa).dtype == np.float32
    as64 = np.asarray(qa, dtype=np.float64)
    assert as64.dtype == np.float64
    np.testing.assert_array_equal(as64, qa.dequantize())
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        with pytest.raises(ValueError, match="copy"):
            np.asarray(qa, copy=False)
    with pytest.raises(ValueError, match="copy"):
        qa.__array__(copy=False)
    assert qa == qa and qa != QuantizedArray.from_blocks(qa.blocks, "q8_0")  # identity


def test_arithmetic_and_ufuncs_are_refused(rng):
    qa = quantize_kv(rng.standard_normal((2, 64)))
    ones = np.ones((2, 64), np.float32)
    for op in (lambda: qa + 1, lambda: 1 + qa, lambda: qa * 2.0, lambda: -qa,
               lambda: ones + qa, lambda: qa + ones, lambda: np.add(qa, 1),
               lambda: np.add(ones, qa), lambda: np.exp(qa), lambda: np.multiply(qa, qa)):
        with pytest.raises(TypeError):
            op()
    with pytest.raises(TypeError):
        qa += 1
    # np.asarray still dequantizes, bit for bit what gguf gives
    np.testing.assert_array_equal(np.asarray(qa).view(np.uint32),
                                  gguf_dequantize(qa.blocks, "q8_0").view(np.uint32))
    np.testing.assert_array_equal(np.exp(np.asarray(qa)), np.exp(qa.dequantize()))


# --- rearranging the leading axes ------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("a1, a2", [(0, 1), (0, 2), (1, -2), (-4, 2), (1, 1)])
def test_swapaxes_is_a_view(fmt, a1, a2, rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 4, 64)), fmt)
    full = qa.dequantize()
    sw = qa.swapaxes(a1, a2)
    expected = full.swapaxes(a1, a2)
    assert isinstance(sw, QuantizedArray) and sw.format == fmt and sw.shape == expected.shape
    np.testing.assert_array_equal(sw.dequantize().view(np.uint32), expected.view(np.uint32))
    assert np.shares_memory(sw.blocks, qa.blocks)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("args, np_axes", [
    ((), (2, 1, 0, 3)),  # none: the leading axes reversed, the last stays
    ((1, 0, 2, 3), (1, 0, 2, 3)), (((2, 0, 1, 3),), (2, 0, 1, 3)), (([1, 2, 0, 3],), (1, 2, 0, 3)),
    ((-3, -4, -2, -1), (1, 0, 2, 3)), ((0, 1, 2, 3), (0, 1, 2, 3)),
], ids=repr)
def test_transpose_is_a_view(fmt, args, np_axes, rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 4, 64)), fmt)
    full = qa.dequantize()
    tr = qa.transpose(*args)
    expected = full.transpose(np_axes)
    assert isinstance(tr, QuantizedArray) and tr.shape == expected.shape
    np.testing.assert_array_equal(tr.dequantize().view(np.uint32), expected.view(np.uint32))
    assert np.shares_memory(tr.blocks, qa.blocks)


@pytest.mark.parametrize("fmt", FMTS)
def test_rearranged_views_write_through(fmt, rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 4, 64)), fmt)
    rows = rng.standard_normal((2, 64))
    qa.swapaxes(0, 2)[3, 1] = rows  # qa[:, 1, 3]
    np.testing.assert_array_equal(qa.blocks[:, 1, 3], quantize_kv(rows, fmt).blocks)
    qa.transpose(2, 0, 1, 3)[0, 1, 2] = rows[0]  # qa[1, 2, 0]
    np.testing.assert_array_equal(qa.blocks[1, 2, 0], quantize_kv(rows[0], fmt).blocks)
    qa.reshape(-1, 64)[5] = rows[1]  # qa[0, 1, 1]
    np.testing.assert_array_equal(qa.blocks[0, 1, 1], quantize_kv(rows[1], fmt).blocks)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("args", [
    (6, 4, 64), ((6, 4, 64),), ([24, 64],), (-1, 64), (2, -1, 64), (24, 1, 64), (1, 2, 3, 4, 64),
    (np.int64(4), 6, 64),
], ids=repr)
def test_reshape(fmt, args, rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 4, 64)), fmt)
    full = qa.dequantize()
    r = qa.reshape(*args)
    expected = full.reshape(*args)
    assert isinstance(r, QuantizedArray) and r.shape == expected.shape
    np.testing.assert_array_equal(r.dequantize().view(np.uint32), expected.view(np.uint32))
    assert np.shares_memory(r.blocks, qa.blocks)  # C-contiguous blocks: a view
    # of non-contiguous leading axes a merge copies, as numpy's reshape
    t = qa.swapaxes(0, 1)
    merged = t.reshape(-1, 4, 64)
    np.testing.assert_array_equal(merged.dequantize().view(np.uint32),
                                  full.swapaxes(0, 1).reshape(-1, 4, 64).view(np.uint32))
    assert not np.shares_memory(merged.blocks, qa.blocks)


def test_rearranging_refuses_the_last_axis(rng):
    qa = quantize_kv(rng.standard_normal((2, 3, 4, 64)))
    for a1, a2 in [(0, 3), (-1, 0), (3, 3), (2, -1)]:
        with pytest.raises(ValueError, match="last axis"):
            qa.swapaxes(a1, a2)
    with pytest.raises(ValueError, match="out of range"):
        qa.swapaxes(0, 4)
    with pytest.raises(ValueError, match="out of range"):
        qa.swapaxes(-5, 0)
    with pytest.raises(TypeError, match="int"):
        qa.swapaxes(0, 1.0)
    for axes in [(0, 1, 3, 2), (3, 0, 1, 2), (0, 1, 2), (0, 0, 1, 3), (0, 1, 2, 3, 4),
                 (5, 1, 2, 3)]:
        with pytest.raises(ValueError, match="permutation"):
            qa.transpose(*axes)
    for shape in [(6, 4, -1), (2, 3, 4, 2, 32), (12, 128), (-1,), (6144,), ()]:
        with pytest.raises(ValueError, match="last axis"):
            qa.reshape(*shape)
    with pytest.raises(ValueError):
        qa.reshape(5, 5, 64)  # the leading sizes do not match
    with pytest.raises(ValueError, match="last axis"):
        qa[0, 0, 0].swapaxes(0, 0)  # a row has only the packed axis


# --- writing in place ------------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_setitem_writes_blocks_in_place(fmt, rng):
    cache_bytes = quantize_kv(rng.standard_normal((2, 16, 64)), fmt).blocks
    before = cache_bytes.copy()
    cache = QuantizedArray.from_blocks(cache_bytes, fmt)
    new_rows = rng.standard_normal((16, 64)) * 3
    cache[0, 10:12] = new_rows[:2]
    cache[1, 3] = new_rows[2]
    cache[1, ..., 5:7, :] = new_rows[3:5].astype(np.float16)
    assert cache.blocks is cache_bytes
    np.testing.assert_array_equal(cache_bytes[0, 10:12], gguf_quantize(new_rows[:2], fmt))
    np.testing.assert_array_equal(cache_bytes[1, 3], gguf_quantize(new_rows[2], fmt))
    np.testing.assert_array_equal(cache_bytes[1, 5:7],
                                  gguf_quantize(new_rows[3:5].astype(np.float16), fmt))
    touched = np.zeros((2, 16), bool)
    touched[0, 10:12] = touched[1, 3] = True
    touched[1, 5:7] = True
    np.testing.assert_array_equal(cache_bytes[~touched], before[~touched])


@pytest.mark.parametrize("fmt", FMTS)
def test_setitem_broadcasts_and_strided_views(fmt, rng):
    big = np.zeros((4, 8, 2 * BYTES[fmt]), np.uint8)
    cache = QuantizedArray.from_blocks(big[:, ::2], fmt)  # a strided view
    row = rng.standard_normal(64)
    cache[:, 1] = row  # one row to every head
    expected = gguf_quantize(row, fmt)
    for head in range(4):
        np.testing.assert_array_equal(big[head, 2], expected)
    assert not big[:, [0, 1, 3, 4, 5, 6, 7]].any()
    cache[2] = 0.5  # a scalar
    expected = gguf_quantize(np.full(64, 0.5), fmt)
    for pos in range(4):
        np.testing.assert_array_equal(big[2, 2 * pos], expected)
    assert not big[2, 1::2].any()


@pytest.mark.parametrize("fmt", FMTS)
def test_setitem_errors_leave_the_blocks(fmt, rng):
    blocks = quantize_kv(rng.standard_normal((2, 4, 64)), fmt).blocks
    before = blocks.copy()
    cache = QuantizedArray.from_blocks(blocks, fmt)
    bad = rng.standard_normal((2, 64))
    bad[1, 7] = np.nan
    with pytest.raises(ValueError, match="value has non-finite"):
        cache[0, :2] = bad
    with pytest.raises(ValueError, match="value has values too large"):
        cache[0, :2] = np.full((2, 64), 1e10)
    with pytest.raises(ValueError, match="value.*broadcast"):
        cache[0, :2] = np.zeros((3, 64))
    with pytest.raises(TypeError, match="value"):
        cache[0, :2] = np.zeros((2, 64), complex)
    # with integer arrays too
    with pytest.raises(ValueError, match="value has non-finite"):
        cache[[0, 1], [3, 0]] = bad
    with pytest.raises(ValueError, match="value.*broadcast"):
        cache[[0, 1], [3, 0]] = np.zeros((3, 64))
    with pytest.raises(IndexError):
        cache[[0, 2], [3, 0]] = 0.0  # out of bounds
    with pytest.raises(IndexError, match="boolean"):
        cache[np.array([True, False])] = 0.0
    np.testing.assert_array_equal(blocks, before)
    ro = blocks.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        QuantizedArray.from_blocks(ro, fmt)[0] = 0.0
    with pytest.raises(ValueError, match="read-only"):
        QuantizedArray.from_blocks(ro, fmt)[[0, 1], [1, 2]] = 0.0


# --- quantize_kv's errors -----------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_errors(fmt):
    with pytest.raises(ValueError, match="x's last axis has length 48"):
        quantize_kv(np.zeros((2, 48)), fmt)
    with pytest.raises(ValueError, match="x's last axis has length 33, not a multiple of 32"):
        quantize_kv(np.zeros((2, 33)), fmt)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros((2, 64))
        x[1, 40] = bad
        with pytest.raises(ValueError, match="x has non-finite values"):
            quantize_kv(x, fmt)
    with pytest.raises(ValueError, match="x has values too large"):
        quantize_kv(np.full(32, 1e10), fmt)
    with pytest.raises(ValueError, match="x has values too large"):
        quantize_kv(np.full(32, 1e300), fmt)  # inf only once float32
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        quantize_kv(np.float32(1.0), fmt)
    with pytest.raises(TypeError, match="x"):
        quantize_kv(np.zeros(32, complex), fmt)
    with pytest.raises(ValueError, match="'q8_0', 'q4_0'"):
        quantize_kv(np.zeros(32), "q5_0")
    with pytest.raises(ValueError, match="unknown format"):
        quantize_kv(np.zeros(32), "Q8_0")
    with pytest.raises(TypeError, match="format must be a str"):
        quantize_kv(np.zeros(32), 8)


@pytest.mark.parametrize("fmt", FMTS)
def test_scale_overflow_limit_is_gguf_float16_inf(fmt):
    # just below the limit gguf's scale is finite and ours equal; from it on,
    # gguf's scale is float16 inf (0x7c00) and quantize_kv refuses
    ok = np.full(32, np.nextafter(np.float32(LIMIT[fmt]), np.float32(0)), np.float32)
    if fmt == "q4_0":
        ok = -ok
    while np.isinf(gguf_quantize(ok, fmt)[:2].copy().view("<f2")[0]):
        ok = np.nextafter(ok, np.float32(0))
    np.testing.assert_array_equal(quantize_kv(ok, fmt).blocks, gguf_quantize(ok, fmt))
    over = np.nextafter(ok, np.float32(np.inf) * np.sign(ok))
    assert np.isinf(gguf_quantize(over, fmt)[:2].copy().view("<f2")[0])
    with pytest.raises(ValueError, match="too large"):
        quantize_kv(over, fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_nbytes(fmt):
    shape = (8, 1024, 128)
    qa = quantize_kv(np.ones(shape, np.float32), fmt)
    assert qa.shape == shape and qa.blocks.shape == (8, 1024, 4 * BYTES[fmt])
    assert qa.nbytes == 8 * 1024 * 4 * BYTES[fmt] == math.prod(shape) * BYTES[fmt] // 32
    empty = quantize_kv(np.zeros((0, 64)), fmt)
    assert empty.shape == (0, 64) and empty.blocks.shape == (0, 2 * BYTES[fmt])


def test_from_blocks_of_a_quantized_array_and_transpose_none():
    qa = quantize_kv(np.ones((2, 3, 32), np.float32))
    with pytest.raises(TypeError, match="QuantizedArray already"):
        QuantizedArray.from_blocks(qa, "q8_0")
    assert qa.transpose(None).shape == (3, 2, 32)
    assert np.array_equal(qa.transpose(None).dequantize(), qa.dequantize().transpose(1, 0, 2))
    # a QuantizedArray assigned into one of its format: its bytes, as they are
    other = quantize_kv(np.full((3, 32), 5.0, np.float32))
    qa[1] = other
    assert np.array_equal(qa.blocks[1], other.blocks)
