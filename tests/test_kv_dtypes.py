"""Half-precision k and v (float16, bfloat16) and strided q, k, v.

k and v of dtype float16 or bfloat16 are read as stored and converted exactly
inside the kernels: every result must be bitwise that of the same call on
``k.astype(np.float32)``, ``v.astype(np.float32)``, on every SIMD path. Arrays
whose rows (last axis) are contiguous are read in place, whatever their other
strides: the result must be bitwise that of their contiguous copies, and no
copy of their size may be made.
"""
import tracemalloc

import numpy as np
import pytest

import fastattn
from fastattn import _core

from conftest import HALF, HALF_IDS, assert_new_c_float32, assert_same_bits, ml_dtypes, qkv, randn

sdpa = fastattn.scaled_dot_product_attention


def f32(a):
    return a.astype(np.float32)


def both(kw, q, k, v, mask=None):
    """The call on (k, v) as given and on their float32 conversions."""
    got = sdpa(q, k, v, mask, return_lse=True, **kw)
    want = sdpa(q, f32(k), f32(v), mask, return_lse=True, **kw)
    return got, want


OPTIONS = {
    "plain": {},
    "causal": dict(is_causal=True),
    "window": dict(window=(13, 2)),
    "causal-window": dict(is_causal=True, window=(70, None)),
    "scale0": dict(scale=0.0),
    "scale": dict(scale=0.7),
}


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("opt", list(OPTIONS))
@pytest.mark.parametrize("shape", [(9, 130, 13, 5), (1, 300, 128, 128), (70, 70, 64, 16),
                                   (100, 65, 8, 17), (3, 1, 1, 1), (0, 5, 4, 4), (4, 0, 4, 4),
                                   (4, 6, 4, 0)],
                         ids=lambda s: "L%d-S%d-D%d-Dv%d" % s)
def test_half_kv_equals_float32_converted(simd, rng, dtype, opt, shape):
    L, S, D, Dv = shape
    q, k, v = qkv(rng, (2, 3, L, D), (2, 3, S, D), (2, 3, S, Dv))
    got, want = both(OPTIONS[opt], q, k.astype(dtype), v.astype(dtype))
    assert_new_c_float32(got[0])
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


def _score_options(rng, Hq, L, S):
    """Every score option at once, and each alone."""
    seg = np.sort(rng.integers(0, 3, S))
    return {
        "softcap": dict(softcap=7.5),
        "alibi": dict(alibi_slopes=rng.random(Hq).astype(np.float32)),
        "sinks": dict(sinks=randn(rng, Hq)),
        "segments": dict(segment_ids=(seg[S - L:], seg)),
        "all": dict(softcap=3.0, alibi_slopes=rng.random(Hq).astype(np.float32),
                    sinks=randn(rng, Hq), segment_ids=(seg[S - L:], seg), is_causal=True,
                    window=(50, None)),
    }


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("opt", ["softcap", "alibi", "sinks", "segments", "all"])
@pytest.mark.parametrize("L", [1, 37])
def test_half_kv_with_score_options(simd, rng, dtype, opt, L):
    Hq, S = 6, 140
    kw = _score_options(rng, Hq, L, S)[opt]
    q, k, v = qkv(rng, (2, Hq, L, 24), (2, 2, S, 24), (2, 2, S, 20))
    got, want = both(dict(kw, enable_gqa=True), q, k.astype(dtype), v.astype(dtype))
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])
    # and the same options on (B, L, H, D) views of half-precision k and v
    kb, vb = (np.ascontiguousarray(a.astype(dtype).swapaxes(1, 2)).swapaxes(1, 2) for a in (k, v))
    qb = np.ascontiguousarray(q.swapaxes(1, 2)).swapaxes(1, 2)
    got = sdpa(qb, kb, vb, enable_gqa=True, return_lse=True, **kw)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_kv_varlen(simd, rng, dtype):
    if not hasattr(fastattn, "varlen_attention"):
        pytest.skip("varlen_attention is not there yet")
    cu_q = np.array([0, 3, 3, 20, 21])
    cu_k = np.array([0, 50, 60, 150, 300])
    q, k, v = qkv(rng, (21, 4, 16), (300, 2, 16), (300, 2, 12))
    for kw in ({}, dict(is_causal=True, softcap=5.0), dict(window=(10, 0))):
        got = fastattn.varlen_attention(q, k.astype(dtype), v.astype(dtype), cu_q, cu_k,
                                        return_lse=True, **kw)
        want = fastattn.varlen_attention(q, f32(k.astype(dtype)), f32(v.astype(dtype)), cu_q,
                                         cu_k, return_lse=True, **kw)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("mask_kind", ["bool", "float", "bool-broadcast", "float-broadcast"])
def test_half_kv_with_masks(simd, rng, dtype, mask_kind):
    q, k, v = qkv(rng, (2, 3, 37, 24), (2, 1, 150, 24), (2, 1, 150, 20))
    if mask_kind.startswith("bool"):
        mask = rng.random((2, 3, 37, 150)) < 0.7
    else:
        mask = randn(rng, 2, 3, 37, 150)
        mask[rng.random(mask.shape) < 0.3] = -np.inf
    if mask_kind.endswith("broadcast"):
        mask = mask[0, 0]
    for kw in ({}, dict(is_causal=True), dict(window=(20, 20))):
        got, want = both(kw, q, k.astype(dtype), v.astype(dtype), mask)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("L", [1, 5, 200])
def test_half_kv_grouped_query_heads(simd, rng, dtype, L):
    # 8 query heads over 2 kv heads; S spans several 1024-key chunks, so the
    # decode case (L = 1) splits the chunks over threads.
    q, k, v = qkv(rng, (1, 8, L, 32), (1, 2, 2500, 32), (1, 2, 2500, 32))
    got, want = both(dict(enable_gqa=True, is_causal=True), q, k.astype(dtype), v.astype(dtype))
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("kdt,vdt", [("float16", "bfloat16"), ("bfloat16", "float16"),
                                     ("float32", "float16"), ("bfloat16", "float32")])
def test_k_and_v_of_different_dtypes(simd, rng, kdt, vdt):
    if ml_dtypes is None and "bfloat16" in (kdt, vdt):
        pytest.skip("ml_dtypes is not installed")
    dt = {"float16": np.float16, "float32": np.float32,
          "bfloat16": getattr(ml_dtypes, "bfloat16", None)}
    q, k, v = qkv(rng, (2, 11, 40), (2, 90, 40), (2, 90, 24))
    k, v = k.astype(dt[kdt]), v.astype(dt[vdt])
    got, want = both(dict(is_causal=True), q, k, v)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_kv_attention_weights(simd, rng, dtype):
    q, k = randn(rng, 2, 19, 40), randn(rng, 2, 77, 40)
    for kw in ({}, dict(is_causal=True), dict(window=(3, 3))):
        assert_same_bits(fastattn.attention_weights(q, k.astype(dtype), **kw),
                         fastattn.attention_weights(q, f32(k.astype(dtype)), **kw))


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_kv_non_finite_values(simd, rng, dtype):
    # NaN and inf in v rows of masked keys never reach the output; allowed
    # ones reach their column. The same on both paths.
    q, k, v = qkv(rng, (1, 70, 16), (1, 70, 16), (1, 70, 19))
    v[0, 5, 3] = np.inf
    v[0, 40, 0] = np.nan
    k[0, 60, 2] = -np.inf
    got, want = both(dict(is_causal=True), q, k.astype(dtype), v.astype(dtype))
    assert np.isnan(got[0][0, 45, 0]) and np.isfinite(got[0][0, :5]).all()
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("Dv", [64, 40])
def test_half_kv_non_finite_values_while_decoding(simd, rng, dtype, Dv):
    # Decoding (one query row per head, a GQA group of 4 rows): half-precision
    # values are read in place and checked only when a tile's products are not
    # finite; a NaN in a key that a window leaves out must not reach the
    # output, an inf in an allowed key must, and each row's bits are those of
    # the float32 call.
    q, k, v = qkv(rng, (2, 8, 1, 32), (2, 2, 300, 32), (2, 2, 300, Dv))
    v[0, 0, 100, 3] = np.nan   # outside the window of every row (keys >= 236)
    v[0, 1, 250, 5] = np.inf   # allowed
    v[1, 0, 299, 0] = -np.inf  # allowed (the last, partial tile)
    kw = dict(window=(63, 0), enable_gqa=True)
    got, want = both(kw, q, k.astype(dtype), v.astype(dtype))
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])
    assert np.isfinite(got[0][0, :4]).all()  # the NaN never arrives
    assert not np.isfinite(got[0][0, 4:, 0, 5]).any()
    assert not np.isfinite(got[0][1, :4, 0, 0]).any()
    # unmasked, the NaN reaches its column in every row of its group
    got, want = both(dict(enable_gqa=True), q, k.astype(dtype), v.astype(dtype))
    assert np.isnan(got[0][0, :4, 0, 3]).all()
    assert_same_bits(got[0], want[0])


def _all_bit_patterns(dtype):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    return bits.view(dtype)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("Dv", [256, 255])
def test_every_value_converts_exactly_through_v(simd, dtype, Dv):
    # One key: its weight is exactly 1, so the output row is v's row itself,
    # converted. Every one of the 65536 bit patterns (subnormals, +-0, +-inf,
    # NaN), through the vector conversion and the scalar tail (Dv = 255).
    vals = _all_bit_patterns(dtype)
    n = -(-vals.size // Dv)
    v = np.zeros(n * Dv, dtype)
    v[:vals.size] = vals
    v = v.reshape(n, 1, Dv)
    q = np.ones((n, 1, 4), np.float32)
    k = np.zeros((n, 1, 4), dtype)
    o = sdpa(q, k, v)
    want = v.astype(np.float32)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(o[finite], want[finite])  # exactly the values (0 * -0 = +0)
    nan_cols = np.isnan(want)
    assert np.isnan(o[nan_cols]).all()
    inf = np.isinf(want)
    assert_same_bits(o[inf], want[inf])
    assert_same_bits(o, sdpa(q, f32(k), want))


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_every_value_converts_exactly_through_k(simd, dtype):
    # D = 1, q = 1, one key: lse = s * log2(e) * ln 2 with s = k exactly, a
    # one-to-one image of each finite k; the same bits as the float32 path for
    # all 65536 patterns.
    k = _all_bit_patterns(dtype).reshape(-1, 1, 1)
    q = np.ones_like(k, dtype=np.float32)
    v = np.zeros_like(q)
    _, lse = sdpa(q, k, v, scale=1.0, return_lse=True)
    _, want = sdpa(q, f32(k), v, scale=1.0, return_lse=True)
    assert_same_bits(lse, want)
    kf = f32(k).ravel()
    moderate = (np.abs(kf) > 1e-30) & (np.abs(kf) < 1e30)  # s * log2(e) stays a normal float
    assert np.unique(lse.ravel()[moderate]).size == np.unique(kf[moderate]).size


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_kv_are_not_copied_to_float32(rng, dtype):
    q = randn(rng, 1, 4, 1, 64)
    k = randn(rng, 1, 4, 8192, 64).astype(dtype)  # 4 MiB; 8 MiB as float32
    v = randn(rng, 1, 4, 8192, 64).astype(dtype)
    sdpa(q, k, v)
    tracemalloc.start()
    sdpa(q, k, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < k.nbytes // 8, f"{peak} bytes traced: k or v was copied"


def test_half_q_and_masks_are_converted_to_float32(rng):
    q, k, v = qkv(rng, (2, 9, 8), (2, 12, 8), (2, 12, 8))
    mask = randn(rng, 9, 12)
    q16, m16 = q.astype(np.float16), mask.astype(np.float16)
    assert_same_bits(sdpa(q16, k, v, m16), sdpa(f32(q16), k, v, f32(m16)))
    if ml_dtypes is not None:
        qb, mb = q.astype(ml_dtypes.bfloat16), mask.astype(ml_dtypes.bfloat16)
        assert_same_bits(sdpa(qb, k, v, mb), sdpa(f32(qb), k, v, f32(mb)))
        assert_same_bits(fastattn.softmax(qb), fastattn.softmax(f32(qb)))


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_half_out_is_rejected(rng, dtype):
    q, k, v = qkv(rng, (2, 3, 4), (2, 5, 4), (2, 5, 4))
    out = np.zeros((2, 3, 4), dtype)
    with pytest.raises(TypeError, match="out must have dtype float32"):
        sdpa(q, k.astype(dtype), v.astype(dtype), out=out)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.complex64, bool])
def test_other_kv_dtypes_are_rejected(rng, dtype):
    q, k, v = qkv(rng, (2, 3, 4), (2, 5, 4), (2, 5, 4))
    with pytest.raises(TypeError, match="k must have a real floating dtype"):
        sdpa(q, k.astype(dtype), v)
    with pytest.raises(TypeError, match="v must have a real floating dtype"):
        sdpa(q, k, v.astype(dtype))


def test_half_kv_match_the_reference(rng):
    from conftest import compare_sdpa
    q, k, v = qkv(rng, (2, 3, 17, 16), (2, 3, 40, 16), (2, 3, 40, 8))
    for dt in HALF:
        compare_sdpa(q, k.astype(dt), v.astype(dt), is_causal=True)


# ------------------------------------------------------------- strided views

def _blhd(rng, B, L, H, D, dtype=np.float32):
    """A (B, L, H, D) array (as a projection's output is laid out) and its
    (B, H, L, D) view."""
    x = randn(rng, B, L, H, D).astype(dtype)
    return x, x.swapaxes(-3, -2)


@pytest.mark.parametrize("kvdtype", [np.float32] + HALF, ids=["float32"] + HALF_IDS)
@pytest.mark.parametrize("gqa", [False, True])
def test_blhd_views_are_read_in_place(simd, rng, kvdtype, gqa):
    Hq, Hkv = (6, 2) if gqa else (4, 4)
    _, q = _blhd(rng, 2, 33, Hq, 24)
    _, k = _blhd(rng, 2, 150, Hkv, 24, kvdtype)
    _, v = _blhd(rng, 2, 150, Hkv, 20, kvdtype)
    assert not q.flags.c_contiguous
    for kw in ({}, dict(is_causal=True), dict(window=(9, 0))):
        got = sdpa(q, k, v, enable_gqa=gqa, return_lse=True, **kw)
        want = sdpa(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                    enable_gqa=gqa, return_lse=True, **kw)
        assert_new_c_float32(got[0])
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])
    assert_same_bits(fastattn.attention_weights(q, k, enable_gqa=gqa),
                     fastattn.attention_weights(np.ascontiguousarray(q), np.ascontiguousarray(k),
                                                enable_gqa=gqa))


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("kvdtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_units_that_copy_their_value_tiles_keep_the_bits(simd, rng, threads, gqa, kvdtype):
    # Value rows 1 KiB apart (4 kv heads of 64 floats, a (B, L, H, D) view)
    # or in float16 are copied tile by tile, and such units take up to 192
    # query rows where the contiguous float32 call's take up to 96: each
    # row's bits are the same, whatever rows share its unit and on any
    # number of threads.
    Hq, Hkv = (8, 4) if gqa else (4, 4)
    for L, S in [(400, 400), (250, 300)]:
        _, q = _blhd(rng, 2, L, Hq, 64)
        _, k = _blhd(rng, 2, S, Hkv, 64, kvdtype)
        _, v = _blhd(rng, 2, S, Hkv, 64, kvdtype)
        assert v.strides[-2] * 4 // v.itemsize % 1024 == 0
        args = [np.ascontiguousarray(x, np.float32) for x in (q, k, v)]
        for kw in ({}, dict(is_causal=True), dict(window=(70, 5))):
            want = sdpa(*args, enable_gqa=gqa, return_lse=True, **kw)
            for n in (1, 2, 3):
                threads(n)
                got = sdpa(q, k, v, enable_gqa=gqa, return_lse=True, **kw)
                assert_same_bits(got[0], want[0])
                assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("view", ["reversed-rows", "reversed-heads", "row-step", "broadcast-k",
                                  "sliced-features", "padded-rows", "length-1-rows"])
def test_other_row_contiguous_views(simd, rng, view):
    q, k, v = qkv(rng, (2, 3, 21, 16), (2, 3, 70, 16), (2, 3, 70, 12))
    if view == "reversed-rows":
        q, k, v = q[..., ::-1, :], k[..., ::-1, :], v[..., ::-1, :]
    elif view == "reversed-heads":
        q, k, v = q[:, ::-1], k[::-1, ::-1], v[::-1, ::-1]
    elif view == "row-step":
        q, k, v = q[..., ::2, :], k[..., ::3, :], v[..., ::3, :]
    elif view == "broadcast-k":
        k = np.broadcast_to(k[:, :1], k.shape)
        v = np.broadcast_to(v[:1], v.shape)
    elif view == "sliced-features":  # a row is a contiguous slice of a longer one
        k = np.concatenate([k, k], axis=-1)[..., 3:19]
        v = np.concatenate([v, v], axis=-1)[..., 1:13]
    elif view == "padded-rows":
        big = np.zeros((2, 3, 70, 40), np.float32)
        big[..., 5:21] = k
        k = big[..., 5:21]
    else:
        q = q[..., :1, :]
    got = sdpa(q, k, v, is_causal=True, return_lse=True)
    want = sdpa(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                is_causal=True, return_lse=True)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


def test_unaligned_and_odd_stride_inputs_are_copied(rng):
    # Rows that are not whole aligned elements cannot be read in place: the
    # one copy gives the same result.
    q, k, v = qkv(rng, (2, 7, 8), (2, 9, 8), (2, 9, 8))
    raw = np.zeros(k.nbytes + 1, np.uint8)
    ku = raw[1:].view(np.float32).reshape(k.shape)  # misaligned by one byte
    ku[...] = k
    assert not ku.flags.aligned
    assert_same_bits(sdpa(q, ku, v), sdpa(q, k, v))
    rec = np.zeros((2, 9, 8), [("x", np.float32), ("pad", np.int8)])  # strides of 5 bytes
    rec["x"] = k
    assert_same_bits(sdpa(q, rec["x"], v), sdpa(q, k, v))


@pytest.mark.parametrize("kvdtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_blhd_views_make_no_copy(rng, kvdtype):
    # the documented promise: (B, L, H, D) viewed as (B, H, L, D) is not copied.
    _, q = _blhd(rng, 1, 512, 8, 64)    # 1 MiB each
    _, k = _blhd(rng, 1, 512, 8, 64, kvdtype)
    _, v = _blhd(rng, 1, 512, 8, 64, kvdtype)
    out = np.empty((1, 8, 512, 64), np.float32)
    sdpa(q, k, v, out=out)
    tracemalloc.start()
    sdpa(q, k, v, out=out, is_causal=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    smallest = min(q.nbytes, k.nbytes, v.nbytes)
    assert peak < smallest // 4, f"{peak} bytes traced: an input was copied"


def test_row_non_contiguous_inputs_are_copied_once_and_equal(rng):
    q, k, v = qkv(rng, (2, 7, 8), (2, 9, 8), (2, 9, 6))
    kt = np.ascontiguousarray(k.swapaxes(-1, -2)).swapaxes(-1, -2)  # features strided
    got = sdpa(np.asfortranarray(q), kt, v.astype(np.float16))
    assert_same_bits(got, sdpa(q, k, f32(v.astype(np.float16))))


# ------------------------------------------------------------- paged caches

@pytest.mark.parametrize("kvdtype", [np.float32] + HALF, ids=["float32"] + HALF_IDS)
@pytest.mark.parametrize("block_size,S,L", [(64, 300, 1), (128, 256, 5), (256, 1000, 40),
                                            (64, 0, 3), (64, 1, 1)])
def test_paged_cache_equals_the_gathered_cache(simd, rng, kvdtype, block_size, S, L):
    from fastattn._api import _paged_sdpa
    B, Hq, Hkv, D, Dv, P = 3, 4, 2, 24, 16, 20
    k_cache = randn(rng, P, block_size, Hkv, D).astype(kvdtype)
    v_cache = randn(rng, P, block_size, Hkv, Dv).astype(kvdtype)
    pages = max(1, -(-S // block_size))
    table = np.stack([rng.permutation(P)[:pages + 1] for _ in range(B)]).astype(np.int32)
    q = randn(rng, B, L, Hq, D).swapaxes(1, 2)  # (B, Hq, L, D) view
    for kw in ({}, dict(is_causal=True), dict(window=(7, 0), scale=0.3)):
        got = _paged_sdpa(q, k_cache, v_cache, table, S, return_lse=True, **kw)
        # the gathered cache, (B, Hkv, S, D), contiguous
        k = k_cache[table].reshape(B, -1, Hkv, D)[:, :S].swapaxes(1, 2).copy()
        v = v_cache[table].reshape(B, -1, Hkv, Dv)[:, :S].swapaxes(1, 2).copy()
        want = sdpa(np.ascontiguousarray(q), k, v, enable_gqa=True, return_lse=True, **kw)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


def test_paged_cache_bad_tables(rng):
    from fastattn._api import _paged_sdpa
    k_cache = randn(rng, 4, 64, 2, 8)
    q = randn(rng, 1, 2, 1, 8)
    with pytest.raises(ValueError, match="outside the cache"):
        _paged_sdpa(q, k_cache, k_cache, np.array([[0, 4]]), 100)
    with pytest.raises(ValueError, match="outside the cache"):
        _paged_sdpa(q, k_cache, k_cache, np.array([[-1]]), 10)
    with pytest.raises(ValueError, match="does not cover"):
        _paged_sdpa(q, k_cache, k_cache, np.array([[0]]), 100)
    with pytest.raises(ValueError, match="multiple of 64"):
        _paged_sdpa(q, k_cache[:, :48], k_cache[:, :48], np.array([[0]]), 10)
    # the kernel checks the table itself too (the private core entry)
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention(q, k_cache, k_cache, k_dtype=_core.DTYPE_F32, v_dtype=_core.DTYPE_F32,
                        q_off=np.zeros(2, np.int64), k_off=np.zeros(2, np.int64),
                        v_off=np.zeros(2, np.int64), q_rs=8, k_rs=16, v_rs=16, nbatch=2, L=1,
                        S=100, D=8, Dv=8, scale=1.0, out=np.zeros(16, np.float32), nthreads=1,
                        block_table=np.array([0, 9], np.int64), bt_off=np.zeros(2, np.int64),
                        block_size=64, num_pages=4, k_ps=64 * 16, v_ps=64 * 16)


def test_bench_kv_dtype_and_layout_options(capsys):
    from fastattn.__main__ import main
    for kv in ["float16"] + (["bfloat16"] if ml_dtypes is not None else []):
        assert main(["bench", "-H", "4", "--kv-heads", "2", "-L", "1", "-S", "64", "-D", "8",
                     "--repeat", "1", "--no-torch", "--kv-dtype", kv, "--layout", "blhd"]) == 0
        out = capsys.readouterr().out
        assert f"sdpa B=1 H=4/2 L=1 S=64 D=8 kv={kv} blhd" in out and "f32/fa" in out
