"""Half-precision k and v (float16, bfloat16).

k and v of dtype float16 or bfloat16 are read as stored and converted exactly
inside the kernels: every result must be bitwise that of the same call on
``k.astype(np.float32)``, ``v.astype(np.float32)``, on every SIMD path, and
no float32 copy of them may be made. Other inputs of those dtypes (q, masks)
are converted to float32; `out` must be float32; other k and v dtypes are
refused. (Strided and misaligned half-precision k and v: test_layouts.py;
paged caches of them: test_flash_attn.py.)
"""
import numpy as np
import pytest

import fastattn

from conftest import (HALF, HALF_IDS, assert_new_c_float32, assert_same_bits, ml_dtypes, qkv,
                      randn, traced_peak)

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
    peak = traced_peak(lambda: sdpa(q, k, v))
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


